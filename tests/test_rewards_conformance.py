"""Conformance of MathReward on the shared peer cases and on every benchmark gold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.rewards import MathReward

PEER_CASES = Path(__file__).parent / "data" / "grader" / "peer_cases.jsonl"
BENCHMARKS = sorted(BENCHMARK_DIR.glob("*.jsonl"))
# Tags whose verdict is one project's design choice; the rest are "plain maths" cases.
CONVENTION_PREFIXES = ("convention", "extraction_policy", "config", "reasoning_tags")


def _is_plain(case: dict) -> bool:
    return not any(tag.split(":")[0] in CONVENTION_PREFIXES for tag in case["tags"])


@pytest.fixture(scope="module")
def reward():
    with MathReward(timeout_s=5.0, num_workers=2) as reward_fn:
        yield reward_fn


def test_peer_cases_agreement_and_no_plain_false_positive(reward):
    cases = [json.loads(line) for line in PEER_CASES.read_text().splitlines()]
    verdicts = reward.verdicts([c["pred"] for c in cases], [c["gold"] for c in cases])
    agree = [v == c["expected"] for v, c in zip(verdicts, cases, strict=True)]
    plain = [i for i, c in enumerate(cases) if _is_plain(c)]
    plain_false_positives = [cases[i]["id"] for i in plain if verdicts[i] and not cases[i]["expected"]]
    print(f"peer cases: {sum(agree)}/{len(cases)}, plain {sum(agree[i] for i in plain)}/{len(plain)}")
    assert len(cases) == 361 and len(plain) == 216
    assert sum(agree) >= 345
    assert sum(agree[i] for i in plain) >= 212
    assert plain_false_positives == []
    assert reward.counters()["timeouts"] == 0


def test_every_benchmark_gold_agrees_with_itself(reward):
    golds = [str(json.loads(line)["answer"]) for path in BENCHMARKS for line in path.read_text().splitlines()]
    responses = [f"Some reasoning. The final answer is $\\boxed{{{g}}}$." for g in golds]
    scores = reward(responses, golds)
    failures = [g for g, s in zip(golds, scores, strict=True) if s != 1.0]
    assert len(golds) == 2836
    assert failures == []
