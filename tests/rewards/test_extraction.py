"""The answer read from a response (`rewards/extraction.py`), after issue 54's hostile round (item 12): a value
retracted in the same sentence, two boxes offered as alternatives, digits set side by side and a number with a
comment for a unit are no answer; a corrected box is. In-process graders (no worker pool)."""

from __future__ import annotations

import pytest

from erpo_lightning.rewards import MathReward, extract_answer


@pytest.fixture(scope="module")
def strict():
    with MathReward(num_workers=0) as reward:
        yield reward


def _boxed(answers: list[str]) -> list[str]:
    return [f"So the final answer is $\\boxed{{{answer}}}$." for answer in answers]


def test_a_value_retracted_in_the_same_sentence_is_no_answer(strict):
    hedges = ["The answer is 7 unless it is 19.", "The answer is 7, but maybe it is 19.", "Answer: 19 unless it is 7"]
    assert [extract_answer(h) for h in hedges] == [None, None, None]
    assert strict(hedges, ["19", "19", "7"]) == [0.0, 0.0, 0.0]
    # A sentence that names other numbers before its " is " without hedging still gives its value.
    assert strict(["Therefore, the sum of 5 and 9 is 14."], ["14"]) == [1.0]


def test_two_boxes_offered_as_alternatives_are_no_answer_but_a_corrected_box_is(strict):
    """A box followed, in the same breath, by a hedge and another box offers two values: no answer, whichever value
    is the gold. A correction (no hedging word between the boxes) keeps the last box, and so does a repeated box."""
    hedges = [
        "\\boxed{7} or perhaps \\boxed{19}",
        "\\boxed{7}. Hmm, maybe \\boxed{19}.",
        "\\boxed{7}, possibly \\boxed{19}",
        "\\boxed{7} or alternatively \\boxed{19} and \\boxed{20}",
    ]
    assert [extract_answer(h) for h in hedges] == [None] * len(hedges)
    assert strict(hedges, ["19"] * len(hedges)) == strict(hedges, ["7"] * len(hedges)) == [0.0] * len(hedges)
    kept = [
        "First I got \\boxed{7}. Wait, that is wrong: 12 + 7 = 19, so the answer is \\boxed{19}.",
        "\\boxed{7}\n\nLet me recheck. 12 + 7 = 19. Final answer: \\boxed{19}",
        "\\boxed{19}. Hmm, maybe \\boxed{19}.",
        "An earlier attempt gave \\boxed{7}, which does not check out when substituted back into the equation; "
        "or so it seems. Recomputing gives \\boxed{19}",  # the hedge word is far from the last box
    ]
    assert [extract_answer(k) for k in kept] == ["19"] * len(kept)
    assert strict(kept, ["19"] * len(kept)) == [1.0] * len(kept)
    # Boxes joined by a plain connector still form one list answer.
    assert extract_answer("\\boxed{2} or \\boxed{3}") == "2, 3"
    assert strict(["\\boxed{2} and \\boxed{3}"], ["2, 3"]) == [1.0]


JUXTAPOSED = ["1 9", "1\\,9", "1\\;9", "1\\ 9", "1~9", "1\\quad 9", "1\u20099", "1\u202f9"]


def test_digits_set_side_by_side_are_not_one_number(strict):
    assert strict(_boxed(JUXTAPOSED), ["19"] * len(JUXTAPOSED)) == [0.0] * len(JUXTAPOSED)
    assert strict(["1 9", "The answer is 1 9."], ["19", "19"]) == [0.0, 0.0]
    # Groups of three digits are a thousands grouping, read under the named `thousands` convention.
    verdicts = strict.grade(_boxed(["1 000", "10\\,080", "7 425 000"]), ["1000", "10080", "7425000"])
    assert all(v.correct and "thousands" in v.conventions for v in verdicts), verdicts
    assert strict(_boxed(["19"]), ["19"]) == [1.0]


COMMENTS = [
    "8 \\text{ or more}",
    "8 \\text{ is wrong}",
    "8\\text{ at least}",
    "8 \\text{ or less}",
    "8 \\mbox{ more or less}",
    "8 \\text{ (not sure)}",
    "8 or more",
    "8 is wrong",
    "8 \\text{ approximately}",
]


def test_a_retraction_or_a_bound_after_a_number_is_not_its_unit(strict):
    assert strict(_boxed(COMMENTS), ["8"] * len(COMMENTS)) == [0.0] * len(COMMENTS)
    units = ["8 \\text{ cm}", "8\\text{ square meters}", "8 \\mbox{ cm}^2", "8 dollars", "8\\textnormal{ miles}"]
    verdicts = strict.grade(_boxed(units), ["8"] * len(units))
    assert all(v.correct and "units" in v.conventions for v in verdicts), verdicts
