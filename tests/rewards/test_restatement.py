"""Unsimplified values and restatements (`rewards/restatement.py`, issue 54 item 12): an unsimplified value is paid
by its value unless it restates the problem, decided from the problem's own text, also in the symbolic step;
arithmetic read by hand within bounds. In-process graders (no worker pool)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from erpo_lightning.rewards import MathReward
from erpo_lightning.rewards.restatement import ValueForm, problem_numbers, restates, unsimplified_value


@pytest.fixture(scope="module")
def strict():
    with MathReward(num_workers=0) as reward:
        yield reward


def _boxed(answers: list[str]) -> list[str]:
    return [f"So the final answer is $\\boxed{{{answer}}}$." for answer in answers]


# (gold, an unsimplified value equal to it): Math-Verify pays each one.
UNSIMPLIFIED = [
    ("\\frac{1}{2}", "\\frac{2}{4}"),
    ("1", "\\frac{3}{3}"),
    ("19", "38/2"),
    ("0.5", "\\frac{3}{6}"),
    ("4", "\\sqrt{16}"),
    ("3", "\\sqrt[3]{27}"),
    ("1024", "2^{10}"),
    ("-8", "(-2)^3"),
    ("-2", "-\\frac{4}{2}"),
    ("10", "(9+1)"),
    ("8", "8 - 2 + 2"),
    ("4.123105625617661", "\\sqrt{17}"),  # a decimal gold: compared at 6 places, as any decimal
]


def test_an_unsimplified_value_is_paid_by_its_value_without_a_problem(strict):
    answers, golds = _boxed([a for _, a in UNSIMPLIFIED]), [g for g, _ in UNSIMPLIFIED]
    verdicts = strict.grade(answers, golds)
    assert [v.conventions if v.correct else None for v in verdicts] == [("unsimplified_values",)] * len(UNSIMPLIFIED)
    wrong = [("\\frac{1}{2}", "\\frac{2}{6}"), ("4", "\\sqrt{25}"), ("1024", "2^{11}"), ("19", "38/3")]
    wrong.append(("4", "\\sqrt{17}"))  # an irrational root against an exact gold
    assert strict(_boxed([a for _, a in wrong]), [g for g, _ in wrong]) == [0.0] * len(wrong)
    with MathReward(num_workers=0, conventions={"unsimplified_values": False}) as literal_only:
        assert literal_only(answers, golds) == [0.0] * len(UNSIMPLIFIED)


def test_an_unsimplified_value_that_restates_the_problem_scores_zero(strict):
    answers, golds = [a for _, a in UNSIMPLIFIED], [g for g, _ in UNSIMPLIFIED]
    restating = [f"Compute ${answer}$." for answer in answers]
    assert strict(_boxed(answers), golds, problems=restating) == [0.0] * len(answers)
    worded = ["What is the cube root of 27?", "What is half of 38?", "Compute two to the tenth power."]
    worded_answers = _boxed(["\\sqrt[3]{27}", "\\frac{38}{2}", "2^{10}"])
    assert strict(worded_answers, ["3", "19", "1024"], problems=worded) == [0.0] * 3
    # The same forms for problems that do not write their numbers: answers, not restatements.
    other = ["A fair die is rolled. What is the chance of an even number?", "How many subsets has a 10-element set?"]
    assert strict(_boxed(["\\frac{3}{6}", "2^{10}"]), ["\\frac{1}{2}", "1024"], problems=other) == [1.0, 1.0]
    # A copied sum padded with numbers the problem does not write is still a restatement; other arithmetic is not.
    padded = _boxed(["0 + 2 + 8 + 1 - 1", "(9 + 4) - 3"])
    assert strict(padded, ["10", "10"], problems=["Compute 0 + 2 + 8."] * 2) == [0.0, 1.0]
    # A literal answer is paid whatever the problem says; lenient evaluates a restatement under its own convention.
    assert strict(_boxed(["19"]), ["19"], problems=["Compute $38/2$."]) == [1.0]
    with MathReward(num_workers=0, preset="lenient") as lenient:
        verdict = lenient.grade(_boxed(["38/2"]), ["19"], problems=["Compute $38/2$."])[0]
    assert verdict.correct and verdict.conventions == ("unevaluated_arithmetic",)
    with pytest.raises(ValueError, match="1 problems for 2 responses"):
        strict(["\\boxed{1}", "\\boxed{2}"], ["1", "2"], problems=["Compute 1."])


def test_a_pair_sent_to_the_symbolic_step_keeps_its_problem():
    """A tuple whose other entry needs sympy is compared in the verifier, which must see the problem's numbers too."""
    with MathReward(num_workers=0) as reward:
        response = ["\\boxed{(x + 1, \\sqrt{16})}"]
        assert reward(response, ["(1 + x, 4)"]) == [1.0]
        assert reward(response, ["(1 + x, 4)"], problems=["Simplify $1 + x$ and find $\\sqrt{16}$."]) == [0.0]
        assert reward.counters()["symbolic"] == 2


def test_arithmetic_is_read_by_hand_within_bounds():
    assert unsimplified_value("\\frac{16}{2}") == ValueForm(Fraction(8), (16, 2), 1)
    assert unsimplified_value("(8 - 2 + 2)") == ValueForm(Fraction(8), (8, 2, 2), 2)
    assert unsimplified_value("\\sqrt[3]{27}") == ValueForm(Fraction(3), (3, 27), 1)
    root = unsimplified_value("\\sqrt{17}")  # no perfect square: worked out to 40 digits, marked inexact
    assert not root.exact and abs(root.value - Fraction("4.1231056256176605498")) < Fraction(1, 10**19)
    not_arithmetic = ["8", "(8)", "\\frac{1}{2}", "10^{6}", "5 9 5", "2(3)", "2^10", "\\binom{8}{4}", "5!", "|8 - 2|",
                      "\\lceil 8 \\rceil", "8 - 2 + 0i", "x + 1", "1/0", "2^{1000}", "9^{9^{9}}", "10^{10^{10^{10}}}",
                      "\\sqrt[10^{10}]{10}", "\\frac{1}{" * 20 + "2" + "}" * 20, "1+" * 150 + "1"]  # fmt: skip
    for text in not_arithmetic:
        assert unsimplified_value(text) is None, text


def test_a_restatement_is_decided_from_the_numbers_the_problem_writes():
    numbers = problem_numbers("Twice 1,250 apples and half of 2.5 kg, then the cube of five.")
    assert {2, 1250, Fraction(5, 2), 3, 5} <= numbers
    assert restates(unsimplified_value("\\frac{1250}{2}"), numbers)  # one operation, all its numbers the problem's
    assert not restates(unsimplified_value("\\frac{1250}{4}"), numbers)
    assert restates(unsimplified_value("1250 + 1 - 1"), numbers)  # several: any of the problem's numbers
    assert not restates(unsimplified_value("\\frac{1250}{2}"), None)  # the problem is unknown
