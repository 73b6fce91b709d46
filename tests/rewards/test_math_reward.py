"""Unit tests of the math reward: extraction, equivalence rules, pool life cycle, counters, and answers too deep or
too long counted zero."""

from __future__ import annotations

import copy
import pickle

import pytest

from erpo_lightning.rewards import MathReward, extract_answer, verify_answer
from erpo_lightning.rewards.protocol import score_responses
from erpo_lightning.rollout.engine import Sample
from erpo_lightning.rollout.sampler import RolloutSampler
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer


@pytest.fixture(scope="module")
def reward():
    with MathReward(timeout_s=5.0, num_workers=1) as reward_fn:
        yield reward_fn


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("So $x = \\boxed{3}$ and then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("The roots are \\boxed{2} and \\boxed{3}.", "2, 3"),
        ("I think \\boxed{4}. Final Answer: The final answer is $5$. I hope it is correct.", "$5$"),
        ("We get 12. The final answer is 12,000,023. I hope it is correct.", "12,000,023"),
        ("Work...\nAnswer: $\\frac{2}{3}$", "$\\frac{2}{3}$"),
        ("<think>\\boxed{1}</think> so the result is \\boxed{2}", "2"),
        ("7,425,000", "7,425,000"),
        ("The answer is either 7 or 19.", None),  # a hedge between two values is no answer (issue 43)
        ("Answer: 7 or possibly 19", None),
        ("\\boxed{7} The answer is 7 or maybe 19", "7"),
        ("\\boxed{\\boxed{8}}", "8"),
        ("\\boxed{5", None),
        ("\\boxed{}", None),
        ("Long reasoning without any marker. " * 20, None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_fallbacks_are_configurable():
    response = "Long reasoning. " * 20 + "Answer: 42"
    assert extract_answer(response) == "42"
    assert extract_answer(response, fallbacks=[]) is None
    with pytest.raises(ValueError, match="unknown"):
        MathReward(fallbacks=["no_such_rule"])


EQUIVALENT = [
    ("\\$18.90", "18.90"),
    ("864 \\mbox{ inches}^2", "864"),
    ("10\\text{ cm}^2", "10"),
    ("10,\\!080", "10080"),
    ("3\\frac{1}{2}", "3.5"),
    ("1 1/2", "\\frac{3}{2}"),
    (".35625", "0.35625"),
    ("52_8", "52_8"),
    ("52_8", "42"),
    ("\\text{(C)}", "C"),
    ("\\text{Evelyn}", "evelyn"),
    ("90^\\circ", "90"),
    ("5", "x = 5"),
    ("025", "25"),
    ("27.0", "27"),
    ("4.5e33", "4.5 \\times 10^{33}"),
    ("$\\frac{1}{2}$", "0.5"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
    ("(-\\infty, -3] \\cup [2, \\infty)", "(-\\infty,-3]\\cup[2,\\infty)"),
    ("\\{1, 2, 3\\}", "\\{3, 1, 2\\}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("28\\%", "28"),
    ("\\frac{1}{3}", "0.333333"),  # a decimal equals its value rounded to 6 places, as in Math-Verify
]

NOT_EQUIVALENT = [
    ("52_8", "52"),
    ("5", "5.001"),
    ("[1, 2, 3]", "(1, 3, 2)"),
    ("[-3, 2]", "(-3, 2)"),
    ("E", "E'"),
    ("\\text{odd}", "\\text{oddd}"),
    ("\\pm 2021", "2021"),
    ("\\frac{63}{400}", "\\frac{64}{400}"),
    ("3x-y+13=0", "3x+4y+14=0"),
    ("12:00", "1:00"),
    ("1331 \\text{ and } 1728", "1728"),
    ("7.78", "7.8"),
    ("x^2+2x+1", "x^3+2x+1"),
    ("\\sqrt{3}", "1.732"),  # an approximation: only with accept_approximations (see test_conventions.py)
    ("1000000", "1000000.4"),  # a relative tolerance is opt-in (rel_tol)
]


@pytest.mark.parametrize(("gold", "answer"), EQUIVALENT)
def test_equivalent_answers_score_one(reward, gold, answer):
    assert reward([f"The final answer is $\\boxed{{{answer}}}$."], [gold]) == [1.0]


@pytest.mark.parametrize(("gold", "answer"), NOT_EQUIVALENT)
def test_wrong_answers_score_zero(reward, gold, answer):
    assert reward([f"\\boxed{{{answer}}}"], [gold]) == [0.0]


def test_rewards_and_counters(reward):
    reward.counters()
    scores = reward(["\\boxed{2}", "\\boxed{3}", "no answer here " * 20], ["2", "2", "2"])
    assert scores == [1.0, 0.0, 0.0]
    counters = reward.counters()
    assert counters["items"] == 3 and counters["correct"] == 1
    assert counters["extraction_failures"] == 1
    assert reward.counters()["items"] == 0  # reset by the previous call


def test_custom_reward_values_and_protocol():
    custom = MathReward(num_workers=0, correct_reward=2.0, incorrect_reward=-1.0)
    assert score_responses(custom, ["\\boxed{\\sqrt{8}}", "\\boxed{1}"], ["2\\sqrt{2}", "2"]) == [2.0, -1.0]
    assert custom.counters()["items"] == 2  # the optional tallies of the Reward protocol


def test_pickle_and_deepcopy_drop_the_pool(reward):
    assert reward(["\\boxed{\\sqrt{18}}"], ["3\\sqrt{2}"]) == [1.0]  # the pool is running now
    for clone in (copy.deepcopy(reward), pickle.loads(pickle.dumps(reward))):
        assert clone._pool is None
        assert clone(["\\boxed{\\sqrt{18}}"], ["3\\sqrt{2}"]) == [1.0]
        clone.close()


def test_close_then_reuse_starts_a_new_pool():
    reward_fn = MathReward(num_workers=1)
    assert reward_fn(["\\boxed{\\sqrt{32}}"], ["4\\sqrt{2}"]) == [1.0]
    reward_fn.close()
    assert reward_fn._pool is None
    assert reward_fn(["\\boxed{\\sqrt{32}}"], ["4\\sqrt{2}"]) == [1.0]
    reward_fn.close()


def test_timeout_kills_and_replaces_the_worker():
    with MathReward(timeout_s=0.01, num_workers=1) as impatient:
        slow = "\\boxed{\\frac{(x+1)^{40} - (x-1)^{40}}{x^{3} + 3x}}"
        assert impatient([slow], ["\\frac{(x-1)^{40}}{x}"]) == [0.0]
        assert impatient.counters()["timeouts"] == 1
        assert impatient._pool.restarts == 1
        assert impatient(["\\boxed{7}"], ["7"]) == [1.0]  # cheap path, no worker needed


def test_verify_answer():
    assert verify_answer("The answer is \\boxed{\\dfrac{1}{2}}", "0.5")
    assert not verify_answer("The answer is \\boxed{\\dfrac{1}{3}}", "0.5")


def test_mismatched_lengths_raise(reward):
    with pytest.raises(ValueError):
        reward(["\\boxed{1}"], [])


class _EchoEngine:
    """Every sample of every prompt is the prompt itself, finished."""

    def generate(self, prompt_ids, settings):
        return [[Sample(list(ids), [0.0] * len(ids), "stop") for _ in range(settings.n)] for ids in prompt_ids]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda responses: [1.0] * (len(responses) - 1), "returned 5 values for 6 responses: it must return one per"),
        (lambda responses: [1.0] * (len(responses) + 2), "returned 8 values for 6 responses: it must return one per"),
        (lambda responses: 1.0, "returned a float, not a list of 6 numbers (one per response, in order)"),
    ],
)
def test_a_custom_reward_with_the_wrong_number_of_values_is_refused_with_the_counts(returned, message):
    """Issue 30 item 12: today a reshape fails later, naming neither the reward nor what it should have returned."""
    tokenizer = build_byte_tokenizer()

    class OffByOne:
        def __call__(self, responses, golds):
            return returned(responses)

    sampler = RolloutSampler(_EchoEngine(), OffByOne(), tokenizer=tokenizer)
    prompts = [tokenizer.encode("1 + 1"), tokenizer.encode("2 + 2")]
    with pytest.raises(ValueError) as error:
        sampler.sample_and_grade(prompts, ["2", "4"], n=3, temperature=1.0, seed=0)
    assert str(error.value).startswith(f"the reward {__name__}.{OffByOne.__qualname__} {message}")
    exact = RolloutSampler(_EchoEngine(), lambda responses, golds: [0.5] * len(responses), tokenizer=tokenizer)
    assert exact.sample_and_grade(prompts, ["2", "4"], n=3, temperature=1.0, seed=0).rewards.shape == (2, 3)


def test_deep_and_long_answers_are_counted_zero():
    with MathReward(num_workers=0, max_depth=8, max_answer_chars=50, max_response_chars=1_000) as reward:
        deep = "\\boxed{" + "(" * 9 + "5" + ")" * 9 + "}"
        shallow = "\\boxed{" + "(" * 8 + "5" + ")" * 8 + "}"
        assert reward([deep, shallow], ["5", "5"]) == [0.0, 1.0]
        assert reward(["\\boxed{" + "1" * 51 + "}", "x" * 1_001 + "\\boxed{5}"], ["1" * 51, "5"]) == [0.0, 0.0]
        counters = reward.counters()
    assert (counters["too_deep"], counters["too_long"], counters["items"]) == (1, 2, 4)
