"""What a run's reward paid for: every graded (response, gold) pair of a run, and the conventions behind each verdict.

`GradedPairsReward` is `MathReward` that also appends each call's pairs to a JSON-lines file, one line per call
(training rollouts: one call per step; a temperature sweep: one call per temperature). Use it in place of the
config's reward, with the repository on the import path:

    PYTHONPATH=. .venv/bin/erpo fit --config configs/smollm2_arith.yaml --model.model_path <dir> \\
        --rollout.reward.class_path studies.graded_pairs.GradedPairsReward \\
        --rollout.reward.init_args.log_path runs/x/graded.jsonl --rollout.reward.init_args.num_workers 0
    .venv/bin/python -m studies.graded_pairs runs/x/graded.jsonl

The second command prints JSON: per call, the pairs graded, those graded correct, those correct only through a
convention the strict default refuses (`LENIENT_ONLY`), the count of each convention among the correct ones, and the
most common responses. docs/real_model.md uses it to show what the SmolLM2 example learned under each grader.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any

from erpo_lightning.rewards import MathReward
from erpo_lightning.rewards.conventions import make_settings
from erpo_lightning.rewards.math_reward import Verdict

# The conventions the `lenient` preset turns on over `strict`: a correct verdict that used one of them is wrong under
# the strict default.
LENIENT_ONLY = tuple(sorted(set(make_settings("lenient").enabled()) - set(make_settings("strict").enabled())))
COMMON_RESPONSES = 5  # most common responses listed per call


class GradedPairsReward(MathReward):
    """`MathReward` that appends `{"rows": [[response, gold, correct, status, conventions], ...]}` to `log_path` at
    every call (one JSON line per call, in call order)."""

    def __init__(self, log_path: str, **kwargs: Any) -> None:
        """Args:
        log_path: JSON-lines file the calls are appended to (remove it to start over). Its folder is made here, when
            the config is instantiated, so a path that cannot be written fails before the model loads.
        kwargs: `MathReward`'s arguments.
        """
        super().__init__(**kwargs)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path

    def grade(self, responses: list[str], golds: list[str], problems: list[str] | None = None) -> list[Verdict]:
        verdicts = super().grade(responses, golds, problems)
        rows = [
            [response, gold, verdict.correct, verdict.status, list(verdict.conventions)]
            for response, gold, verdict in zip(responses, golds, verdicts, strict=True)
        ]
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"rows": rows}) + "\n")
        return verdicts


def summarize(path: Path) -> list[dict[str, Any]]:
    """One summary per logged call of `path` (see the module docstring), in call order."""
    calls = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        rows = json.loads(line)["rows"]
        correct = [row for row in rows if row[2]]
        lenient_only = [row for row in correct if set(row[4]) & set(LENIENT_ONLY)]
        calls.append({
            "call": number,
            "pairs": len(rows),
            "correct": len(correct),
            "correct_only_by_lenient_conventions": len(lenient_only),
            "conventions_of_correct": dict(collections.Counter(name for row in correct for name in row[4])),
            "common_responses": collections.Counter(row[0] for row in rows).most_common(COMMON_RESPONSES),
        })  # fmt: skip
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the JSON-lines file a GradedPairsReward wrote")
    args = parser.parse_args()
    print(json.dumps({"lenient_only_conventions": list(LENIENT_ONLY), "calls": summarize(args.log)}, indent=1))


if __name__ == "__main__":
    main()
