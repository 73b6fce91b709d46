"""Grader throughput: MathReward against Math-Verify called directly, side by side in one run.

Pairs: each MATH-500 gold as the reference, and that gold wrapped as a model response
(``... The final answer is $\\boxed{<gold>}$.``). Prints one JSON object to stdout:
pairs/second for MathReward (warm worker pool, the steady state of training), for its sympy
step alone in this process (no short-circuit: what a pair costs when cheap rules cannot decide),
and for Math-Verify's ``parse``+``verify`` in this process.

Usage: ``python bench/bench_grader.py [--data PATH] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from pathlib import Path

from math_verify import parse, verify

from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.rewards import MathReward
from erpo_lightning.rewards.symbolic import SympyBackend

DEFAULT_DATA = BENCHMARK_DIR / "math500.jsonl"


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else float("inf")


def bench_ours(responses: list[str], golds: list[str], workers: int) -> dict[str, float]:
    """MathReward on the batch, then its sympy step alone on the same pairs."""
    with MathReward(num_workers=workers) as reward:
        reward(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"])  # the pool starts once per training run
        start = time.perf_counter()
        scores = reward(responses, golds)
        elapsed = time.perf_counter() - start
    backend = SympyBackend()
    start = time.perf_counter()
    symbolic_agree = sum(backend(gold, gold) for gold in golds)
    symbolic_elapsed = time.perf_counter() - start
    return {
        "ours_pairs_per_s": _rate(len(golds), elapsed),
        "ours_agreement": sum(scores),
        "ours_sympy_step_only_pairs_per_s": _rate(len(golds), symbolic_elapsed),
        "ours_sympy_step_only_agreement": symbolic_agree,
    }


def bench_math_verify(responses: list[str], golds: list[str]) -> dict[str, float]:
    """Math-Verify in one process, gold without a LaTeX environment wrapped in ``\\boxed{}``."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    start = time.perf_counter()
    agree = 0
    for response, gold in zip(responses, golds, strict=True):
        if not re.search(r"\$|\\\(|\\\[|\\boxed", gold):
            gold = f"\\boxed{{{gold}}}"
        agree += bool(verify(parse(gold), parse(response)))
    return {"math_verify_pairs_per_s": _rate(len(golds), time.perf_counter() - start), "math_verify_agreement": agree}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    golds = [str(json.loads(line)["answer"]) for line in args.data.read_text().splitlines()]
    responses = [f"Some reasoning. The final answer is $\\boxed{{{g}}}$." for g in golds]
    result = {"pairs": len(golds), "workers": args.workers}
    result.update(bench_math_verify(responses, golds))  # first: nothing warmed up for it
    result.update(bench_ours(responses, golds, args.workers))
    result["ratio"] = round(result["ours_pairs_per_s"] / result["math_verify_pairs_per_s"], 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
