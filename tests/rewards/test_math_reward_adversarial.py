"""Hostile model outputs: every one is scored within the deadline and nothing is executed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from helpers.grading import grade_one_by_one

from erpo_lightning.rewards import MathReward

TIMEOUT_S = 1.0


def _payloads(marker: Path) -> list[str]:
    """Code-execution attempts that would create ``marker`` if anything evaluated them."""
    command = f"touch {marker}"
    return [
        f"__import__('os').system('{command}')",
        f"eval(\"__import__('os').system('{command}')\")",
        f"exec('import os; os.system(\"{command}\")')",
        f"(lambda: __import__('subprocess').call(['touch', '{marker}']))()",
        f"x^{{__import__('os').system('{command}')}}",
        f"\\frac{{__import__('os').system('{command}')}}{{2}}",
        f"open('{marker}', 'w').write('1')",
    ]


def hostile_responses(marker: Path) -> list[str]:
    """At least 200 generated hostile responses of many families."""
    towers = [
        "\\boxed{10^{10^{10^{10}}}}",
        "\\boxed{9^{9^{9}}}",
        "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
        "\\boxed{10^{1000000000}}",
        "\\boxed{1e999999999}",
        "\\boxed{((10!)!)!}",
        "\\boxed{(10^{10})!}",
        "\\boxed{100000000!}",
        "\\boxed{\\sqrt[10^{10}]{10^{10^{10}}}}",
        "\\boxed{x^{10^{10}} - (x+1)^{10^{10}}}",
    ]
    nesting = ["\\boxed{" + "\\frac{1}{" * depth + "2" + "}" * depth + "}" for depth in (10, 30, 50, 80)] + [
        "\\boxed{" + "(" * depth + "1" + ")" * depth + "}" for depth in (50, 200)
    ]
    big = [
        "a" * 1_000_000,
        "\\boxed{" + "1+" * 300_000 + "1}",
        "\\boxed{" * 20_000 + "1",
        "{" * 100_000 + "\\boxed{5}",
        "The final answer is " + "9" * 100_000,
        "$" * 500_000,
    ]
    broken = [
        "\\boxed{5",
        "\\boxed{}",
        "\\boxed{{{{{}",
        "}}}}\\boxed{}}}}",
        "\\boxed{\\frac{1}{2}",
        "\\boxed{\\left( 1, 2 \\right}",
        "\ud800\udfff\\boxed{\udc00}",
        "\\boxed{1\ud800}",
        "\x00\x01\x02\\boxed{\x00}",
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 \\end{pmatrix}}",
    ]
    payloads = [f"\\boxed{{{p}}}" for p in _payloads(marker)] + _payloads(marker)
    base = towers + nesting + big + broken + payloads
    wrappers = [
        "{}",
        "Reasoning... The final answer is ${}$.",
        "<think>x</think> {}",
        "Answer: {}",
        "Thus, we get \\[ {} \\] so x = 1.",
    ]
    small = [b for b in base if len(b) < 10_000]
    return [w.format(b) for w, b in itertools.product(wrappers, small)] + big


@pytest.fixture(scope="module")
def reward():
    with MathReward(timeout_s=TIMEOUT_S, num_workers=2) as reward_fn:
        assert reward_fn(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"]) == [1.0]  # starts the pool once
        reward_fn.counters()
        yield reward_fn


def test_hostile_inputs_are_bounded_and_execute_nothing(reward, tmp_path):
    marker = tmp_path / "pwned"
    responses = hostile_responses(marker)
    assert len(responses) >= 200
    slowest = grade_one_by_one(reward, responses, "5", TIMEOUT_S + 1.0)
    assert not marker.exists()
    counters = reward.counters()
    assert counters["items"] == len(responses)
    assert counters["extraction_failures"] > 0
    # The pool is still healthy: a normal symbolic comparison still works.
    assert reward(["\\boxed{\\frac{x^2-1}{x-1}}", "\\boxed{x+2}"], ["x+1", "x+1"]) == [1.0, 0.0]
    print(f"{len(responses)} hostile responses, slowest {slowest:.2f} s")


def test_payload_that_would_create_a_file_is_not_run(tmp_path):
    marker = tmp_path / "created"
    with MathReward(timeout_s=TIMEOUT_S, num_workers=0) as in_process:
        scores = in_process([f"\\boxed{{{p}}}" for p in _payloads(marker)], ["0"] * len(_payloads(marker)))
    assert scores == [0.0] * len(scores)
    assert not marker.exists()
