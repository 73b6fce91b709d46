"""Differential test against Math-Verify: MathReward never accepts what Math-Verify rejects, except by a convention.

For every pair that MathReward marks correct and Math-Verify (default settings, a gold without LaTeX delimiters put in
a box) marks wrong, the verdict must name the conventions it relied on, and each must be enabled. Pairs: the peer
suite, every benchmark gold as its own answer, and >= 500 near misses generated from the benchmark golds (rounded,
truncated, sign-flipped, off by one, swapped tuple elements, reordered intervals, wrong units, decimals of exact
values), and issue 30's cases: digits past the rounding place, the two exploits Math-Verify pays for (refused unless
their convention is on) and invisible characters; issue 43's: wrapped restatements of a numeric gold (refused unless
`unevaluated_arithmetic` is on) and hedged answers; issue 54's: the same restatements against the problems they write
back, a retraction in the sentence of the answer and digits set side by side. The near misses run in the fast tier;
the peer suite and all 2,836 golds in the slow tier.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import signal
from pathlib import Path

import pytest
from math_verify import parse, verify

from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.rewards import MathReward

PEER_CASES = Path(__file__).parent / "data" / "grader" / "peer_cases.jsonl"
ISSUE_CASES = [("\\frac{1}{3}", "0.333"), ("\\sqrt{2}", "1.414"), ("e", "2.718"), ("12\\pi", "37.70")]
# Issue 30 item 8: (gold, answer, Math-Verify's verdict, the convention under which MathReward accepts it or None).
# Digits written past the rounding place are part of the answer; the two exploits are refused unless their
# convention is turned back on, although Math-Verify accepts them.
STRICTNESS_CASES = [
    ("0", "0.0000001", False, None),
    ("3", "3.0000001", False, None),
    ("19", "5 + 9 + 5", True, "unevaluated_arithmetic"),
    ("1024", "2^{10}", True, "unevaluated_arithmetic"),
    ("\\frac{7}{2}", "3 + \\frac{1}{2}", True, "unevaluated_arithmetic"),
    ("7", "5 = 7", True, "equation_right_side"),
    ("5", "2 + 3 = 5", True, "equation_right_side"),
]
# Issue 43 item 2: a numeric gold is paid through evaluation only for one literal number. Every other shape restates a
# computation (wrapped, with a Unicode minus, juxtaposed, a function of numbers, a division left to do); Math-Verify
# pays all of them, MathReward only with `unevaluated_arithmetic` on. Issue 54: each is refused against a problem it
# writes back ("Compute $38/2$."); without a problem, the unsimplified values among them restate nothing and are paid.
WRAPPED_CASES = [
    ("8", "\\lceil 8 - 2 + 2 \\rceil"),
    ("8", "\\lfloor 8 - 2 + 2 \\rfloor"),
    ("8", "|8 - 2 + 2|"),
    ("8", "\\left|8 - 2 + 2\\right|"),
    ("8", "(8 - 2 + 2)"),
    ("8", "8 - 2 + 2 + 0i"),
    ("8", "8 \u2212 2 + 2"),
    ("19", "5 9 5"),
    ("70", "\\binom{8}{4}"),
    ("10", "\\log_2 1024"),
    ("19", "38/2"),
    ("8", "\\frac{16}{2}"),
    ("\\frac{1}{2}", "\\frac{2}{4}"),
    ("4", "\\sqrt{16}"),
    ("120", "5!"),
]
# Arithmetic among them that restates nothing without a problem (issue 54): paid by its value then.
UNSIMPLIFIED_WRAPPED = {"(8 - 2 + 2)", "8 \u2212 2 + 2", "38/2", "\\frac{16}{2}", "\\frac{2}{4}", "\\sqrt{16}"}
# One literal number in any notation still passes, as does a non-numeric gold's equal value.
LITERAL_CASES = [
    ("-5", "\u22125"),
    ("8", "\\boxed{8}"),
    ("\\frac{1}{2}", "1/2"),
    ("-\\frac{1}{2}", "\\frac{1}{-2}"),
    ("1500", "1.5 \\times 10^{3}"),
    ("1000000", "10^{6}"),
    ("3.5", "3\\frac{1}{2}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
]
# Issue 43 item 3: (gold, response, Math-Verify's verdict, the convention under which MathReward pays it or None). A
# hedge between two values is no answer, whichever value the gold is (Math-Verify pays the first one: stricter here);
# the chain `x = 7 = 19` is read as its last side only with `equation_right_side` (Math-Verify reads it so).
HEDGED_CASES = [
    ("19", "The answer is either 7 or 19.", False, None),
    ("7", "The answer is either 7 or 19.", True, None),
    ("19", "Answer: 7 or possibly 19", False, None),
    ("19", "\\boxed{7} The answer is 7 or maybe 19", False, None),
    ("19", "\\boxed{x = 7 = 19}", True, "equation_right_side"),
    ("19", "The answer is 7 unless it is 19.", False, None),  # issue 54: a retraction in the same sentence
    ("19", "\\boxed{7} or perhaps \\boxed{19}", False, None),  # two boxes offered as alternatives
    ("19", "\\boxed{7}. Hmm, maybe \\boxed{19}.", False, None),
]
# Issue 54 item 12: digits set side by side (spaces, thin spaces, LaTeX spacing) are not one number.
JUXTAPOSED_CASES = [("19", "1 9"), ("19", "1\\,9"), ("19", "1\\;9"), ("19", "1~9"), ("19", "1\u20099")]
# Issue 30 item 9: invisible characters, ignored by default (a named convention), which Math-Verify does not do.
INVISIBLE_CASES = [("12", "1\u200b2"), ("12", "12\u200b"), ("x+1", "x\u200e+1"), ("\\frac{1}{2}", "\ufeff\\frac{1}{2}")]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_PAIR = re.compile(r"([(\[])\s*([^,()\[\]]+?)\s*,\s*([^,()\[\]]+?)\s*([)\]])")

logging.getLogger("math_verify").setLevel(logging.CRITICAL)


def math_verify_accepts(gold: str, response: str) -> bool:
    """Math-Verify's verdict, independently of the package (its defaults; a bare gold is boxed)."""
    if not re.search(r"\$|\\\(|\\\[|\\boxed", gold):
        gold = f"\\boxed{{{gold}}}"
    if signal.getsignal(signal.SIGALRM) is None:  # pragma: no cover - Math-Verify needs the main thread
        pytest.skip("Math-Verify's timeouts need signals")
    return bool(verify(parse(gold), parse(response)))


def _golds() -> list[str]:
    return [str(json.loads(line)["answer"]) for path in sorted(BENCHMARK_DIR.glob("*.jsonl"))
            for line in path.read_text().splitlines()]  # fmt: skip


def _value(gold: str) -> float | None:
    """The numeric value of a trusted gold (through Math-Verify's LaTeX parser), or None."""
    try:
        parsed = parse(f"${gold}$")
        value = complex(parsed[0].evalf()) if parsed else None
    except Exception:  # noqa: BLE001 - a gold that is not a number has no value
        return None
    return value.real if value is not None and value.imag == 0 and math.isfinite(value.real) else None


def _written(number: float) -> str:
    return str(int(number)) if number == int(number) else repr(number)


def near_misses(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (gold, wrong-or-reformatted answer) pairs, deterministic for a seed."""
    rng = random.Random(seed)
    golds = _golds()
    pairs: list[tuple[str, str]] = [(g, p) for g, p in ISSUE_CASES + INVISIBLE_CASES]
    pairs += [(gold, answer) for gold, answer, *_ in STRICTNESS_CASES]
    pairs += WRAPPED_CASES + LITERAL_CASES + JUXTAPOSED_CASES
    while len(pairs) < count:
        gold = rng.choice(golds)
        if (m := _PAIR.fullmatch(gold)) is not None:
            left, a, b, right = m.groups()
            pairs.append((gold, f"{left}{b}, {a}{right}"))  # swapped elements
            pairs.append((gold, f"{'[' if left == '(' else '('}{a}, {b}{']' if right == ')' else ')'}"))  # ends
            continue
        value = _value(gold)
        if value is None:
            continue
        if _NUMBER.fullmatch(gold):
            number = float(gold)
            pairs += [(gold, _written(-number) if number else "1"), (gold, _written(number + 1))]
            pairs += [(gold, _written(number - 1)), (gold, f"{number:g}")]  # the last one may be e-notation
            pairs.append((gold, f"{gold}\\text{{ cm}}"))  # units: a named convention
            if "." in gold and len(gold.split(".")[1]) > 1:
                pairs += [(gold, gold[:-1]), (gold, f"{round(number, len(gold.split('.')[1]) - 1)}")]
        else:  # an exact non-integer form: its decimals must not pass unless approximations are on
            digits = rng.choice([2, 3, 4, 5])
            pairs += [(gold, f"{value:.{digits}f}"), (gold, f"{math.floor(value * 10**digits) / 10**digits}")]
            pairs += [(gold, f"{-value:.6f}"), (gold, f"{value + 1:.6f}")]
    return pairs


def _check(reward: MathReward, pairs: list[tuple[str, str]], boxed: bool = True) -> dict[str, int]:
    """``boxed``: each answer is put in a box inside a sentence; else it is the whole response."""
    responses = [f"So the final answer is $\\boxed{{{p}}}$." if boxed else p for _, p in pairs]
    verdicts = reward.grade(responses, [g for g, _ in pairs])
    enabled = set(reward.enabled_conventions())
    looser = []
    for (gold, pred), response, verdict in zip(pairs, responses, verdicts, strict=True):
        if pred == gold:
            continue  # an answer written exactly as the gold is no leniency (Math-Verify rejects a few: "\\$36")
        if verdict.correct and not math_verify_accepts(gold, response):
            looser.append((gold, pred, verdict.conventions))
    uncovered = [case for case in looser if not case[2] or not set(case[2]) <= enabled]
    assert uncovered == [], uncovered[:20]
    by_convention: dict[str, int] = {}
    for *_, conventions in looser:
        for name in conventions:
            by_convention[name] = by_convention.get(name, 0) + 1
    print(f"{len(pairs)} pairs, {len(looser)} accepted only by MathReward, by convention {by_convention}")
    return by_convention


@pytest.fixture(scope="module")
def strict():
    with MathReward(timeout_s=5.0, num_workers=2) as reward_fn:
        yield reward_fn


def test_issue_cases_score_zero_by_default_and_one_with_approximations(strict):
    responses = [f"\\boxed{{{answer}}}" for _, answer in ISSUE_CASES]
    golds = [gold for gold, _ in ISSUE_CASES]
    assert strict(responses, golds) == [0.0] * 4
    assert not any(math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True))
    with MathReward(num_workers=1, accept_approximations=True) as lenient:
        verdicts = lenient.grade(responses, golds)
    assert [v.correct for v in verdicts] == [True] * 4
    assert all(v.conventions == ("approximations",) for v in verdicts)


def _boxed(pairs) -> tuple[list[str], list[str]]:
    return [f"So the final answer is $\\boxed{{{pair[1]}}}$." for pair in pairs], [pair[0] for pair in pairs]


def _restating(pairs) -> list[str]:
    """A problem for each pair that its answer writes back: "Compute $38/2$." for the answer `38/2` (issue 54: an
    unsimplified value is a restatement only against its problem's text)."""
    return [f"Compute ${pair[1]}$." for pair in pairs]


def test_strict_refuses_digits_past_the_rounding_place_and_the_two_exploits(strict):
    responses, golds = _boxed(STRICTNESS_CASES)
    assert [math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True)] == [
        case[2] for case in STRICTNESS_CASES
    ]
    assert strict(responses, golds, problems=_restating(STRICTNESS_CASES)) == [0.0] * len(STRICTNESS_CASES)
    # Digits within the rounding place, and a decimal for a value that has no short decimal, still pass.
    assert strict(*_boxed([("3", "3.000000"), ("\\frac{1}{3}", "0.3333333"), ("3.14159265", "3.141593")])) == [1.0] * 3


@pytest.mark.parametrize("name", ["unevaluated_arithmetic", "equation_right_side"])
def test_each_exploit_is_a_convention_a_user_can_turn_back_on(name):
    cases = [case for case in STRICTNESS_CASES if case[3] == name]
    with MathReward(num_workers=1, conventions={name: True}) as reward:
        verdicts = reward.grade(*_boxed(cases), problems=_restating(cases))
    assert all(v.correct and name in v.conventions for v in verdicts), verdicts
    with MathReward(num_workers=1, preset="lenient") as lenient:  # the grader's behaviour before it was named
        assert lenient(*_boxed(cases), problems=_restating(cases)) == [1.0] * len(cases)


def test_strict_pays_a_numeric_gold_only_for_one_literal_number(strict):
    """Issue 43 item 2: each wrapped restatement Math-Verify pays scores 0; 1 only under `unevaluated_arithmetic`.
    Issue 54: against its problem's text; without one, the arithmetic among them (a sum, a fraction not in lowest terms,
    the root of a perfect square) restates nothing and is paid by its value; the rest is still refused."""
    responses, golds = _boxed(WRAPPED_CASES)
    problems = _restating(WRAPPED_CASES)
    assert all(math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True))
    assert strict(responses, golds, problems=problems) == [0.0] * len(WRAPPED_CASES)
    with MathReward(num_workers=1, conventions={"unevaluated_arithmetic": True}) as evaluating:
        verdicts = evaluating.grade(responses, golds, problems=problems)
    assert all(v.correct and "unevaluated_arithmetic" in v.conventions for v in verdicts), verdicts
    assert strict(*_boxed(LITERAL_CASES)) == [1.0] * len(LITERAL_CASES)
    unknown = [v.conventions if v.correct else None for v in strict.grade(responses, golds)]
    assert unknown == [("unsimplified_values",) if p in UNSIMPLIFIED_WRAPPED else None for _, p in WRAPPED_CASES]


def test_digits_set_side_by_side_are_not_one_number(strict):
    """Issue 54 item 12: `1 9` and its thin-spaced forms are not 19 (they were paid without naming a convention)."""
    responses, golds = _boxed(JUXTAPOSED_CASES)
    assert strict(responses, golds) == [0.0] * len(JUXTAPOSED_CASES)
    assert not any(math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True))


def test_hedged_answers_score_zero(strict):
    """Issue 43 item 3: a hedge between two values is paid by neither grader (the chain only by a named convention)."""
    golds, responses = [case[0] for case in HEDGED_CASES], [case[1] for case in HEDGED_CASES]
    assert [math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True)] == [c[2] for c in HEDGED_CASES]
    assert strict(responses, golds) == [0.0] * len(HEDGED_CASES)
    with MathReward(num_workers=1, preset="lenient") as lenient:
        verdicts = lenient.grade(responses, golds)
    assert [v.conventions if v.correct else None for v in verdicts] == [
        (case[3],) if case[3] else None for case in HEDGED_CASES
    ]


def test_invisible_characters_are_ignored_by_a_named_convention(strict):
    responses, golds = _boxed(INVISIBLE_CASES)
    assert not any(math_verify_accepts(g, r) for g, r in zip(golds, responses, strict=True))
    verdicts = strict.grade(responses, golds)
    assert all(v.correct and "invisible_characters" in v.conventions for v in verdicts), verdicts
    # In the gold too: a gold with a byte-order mark or a direction mark is matched by the plain answer.
    assert strict(["\\boxed{12}", "\\boxed{12}"], ["\ufeff12", "1\u200f2"]) == [1.0, 1.0]
    with MathReward(num_workers=1, conventions={"invisible_characters": False}) as literal:
        assert literal(responses, golds) == [0.0] * len(INVISIBLE_CASES)


def test_near_misses_are_never_looser_than_math_verify(strict):
    assert "approximations" not in _check(strict, near_misses(120))


@pytest.mark.slow
def test_500_near_misses_are_never_looser_than_math_verify(strict):
    pairs = near_misses(520, seed=2)
    assert len(pairs) >= 500
    assert "approximations" not in _check(strict, pairs)


@pytest.mark.slow
def test_lenient_preset_differences_are_all_named():
    with MathReward(num_workers=2, preset="lenient") as lenient:
        used = _check(lenient, near_misses(520, seed=1))
    assert used.get("approximations", 0) > 0  # the generated decimals of exact values do reach the convention


@pytest.mark.slow
def test_peer_suite_and_every_benchmark_gold(strict):
    cases = [json.loads(line) for line in PEER_CASES.read_text().splitlines()]
    _check(strict, [(c["gold"], c["pred"]) for c in cases], boxed=False)
    golds = _golds()
    verdicts = strict.grade([f"The final answer is $\\boxed{{{g}}}$." for g in golds], golds)
    assert [g for g, v in zip(golds, verdicts, strict=True) if not v.correct] == []
