"""The overfitting study (issue 39): do ERPO's regularisers stop GRPO memorising its training queries?

On the shipped toy model (configs/quickstart.yaml) trained on only a few training queries at a high learning rate
(REGIME), GRPO memorises them: its held-out accuracy falls below the base model's while its training accuracy rises.
The pilot (studies/overfit/pilot.py) checks that this regime does so before any other arm runs; the plan
(studies/overfit/plan.md) fixes the arms, seeds, claims and decision rules before the main runs.

    python -m studies.overfit.pilot              # the GRPO-only pilot and its gate (plan.md, "Pilot")
    python -m studies.overfit                    # the main runs and the report (plan.md, "Plan")
    python -m studies.overfit --report-only      # rewrite the report from the finished runs
    python -m studies.overfit --quick            # CI smoke test: every arm, 1 seed, 4 steps, a small sweep

Every run is `erpo fit --config configs/quickstart.yaml` with the regime's flags (Regime.flags), its arm's flags and
seed, run by the study engine (studies/engine/run.py). Finished runs are committed under studies/overfit/runs (the
study spans sessions; a rerun skips them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from studies.engine.claims import Claim
from studies.engine.definition import ALL_QUERIES, ReportInputs, Study, StudySettings
from studies.engine.run import main as run_study_main
from studies.toy.study import shipped_model

BASE_CONFIG = "configs/quickstart.yaml"
TRAIN_FILE = "erpo_lightning/toy/shipped/train.jsonl"


@dataclass(frozen=True)
class Regime:
    """Where GRPO is to overfit: the first `train_queries` rows of the toy task's training file, at `learning_rate`,
    for `steps` RL steps (batches of the quickstart's 16 queries x 8 rollouts)."""

    train_queries: int
    learning_rate: float
    steps: int

    @property
    def name(self) -> str:
        return f"q{self.train_queries}_lr{self.learning_rate:g}_s{self.steps}"

    def flags(self) -> tuple[str, ...]:
        """`erpo fit` flags of the regime (its own reference cache: the training set differs from the quickstart's)."""
        train = [{"path": TRAIN_FILE, "label": "toy_train", "limit": self.train_queries}]
        return ("--data.train", json.dumps(train), "--model.learning_rate", f"{self.learning_rate:g}",
                "--data.cache_dir", f".cache/overfit/{self.name}/reference")  # fmt: skip


# The pilot's regimes, in the order it tries them (plan.md, "Pilot"); the first is the outside pilot's.
PILOT_REGIMES = (Regime(32, 3e-4, 150), Regime(16, 3e-4, 150), Regime(32, 3e-4, 300))
REGIME = PILOT_REGIMES[0]  # the regime the pilot chose (plan.md, "Pilot result")

ARMS: dict[str, list[str]] = {
    "grpo": ["--model.algorithm", "grpo"],
    # grpo that does not coast: a step with no signal (grad norm exactly 0) moves nothing, AdamW's momentum included
    "grpo (skip zero-signal)": ["--model.algorithm", "grpo", "--model.skip_zero_signal_steps", "true"],
    "grpo_kl": ["--model.algorithm", "grpo_kl"],  # the paper's Policy-KL baseline
    "grpo + w(q)": ["--model.algorithm", "grpo", "--model.use_query_weights", "true"],  # w(q) without Query-KL
    "erpo": ["--model.algorithm", "erpo"],
    "erpo_released": ["--model.algorithm", "erpo_released"],
}
FIT_FLAGS = ("--model.monitor_policy_kl", "true")

FULL = StudySettings(steps=REGIME.steps, seeds=tuple(range(8)), temperatures=(1.0, 1.5), eval_problems=200,
                     eval_k=4, train_sample_size=ALL_QUERIES)  # fmt: skip
QUICK = StudySettings(steps=4, seeds=(0,), temperatures=(1.0, 1.5), eval_problems=16, eval_k=2,
                      train_sample_size=ALL_QUERIES)  # fmt: skip

CLAIMS: tuple[Claim, ...] = ()  # plan.md, "Claims and decision rules": written with the plan, before the main runs


def write_overfit_report(inputs: ReportInputs) -> list[dict]:
    """The overfitting study's report (studies.overfit.report)."""
    from studies.overfit.report import overfit_report

    return overfit_report(inputs, CLAIMS)


def overfit_study(regime: Regime, out: Path) -> Study:
    """The study in `regime`, its runs under `out` (the pilot's regimes each have their own)."""
    return Study(
        name="overfit-study",
        module="studies.overfit",
        base_config=BASE_CONFIG,
        arms=ARMS,
        default_arms=tuple(ARMS),
        full=FULL if regime == REGIME else StudySettings(**{**FULL.__dict__, "steps": regime.steps}),
        quick=QUICK,
        claims=CLAIMS,
        out=out,
        quick_out=Path("runs/overfit_study_quick"),
        report=Path("studies/overfit/overfit_study.md"),
        model_identity=shipped_model,
        write_report=write_overfit_report,
        fit_flags=(*regime.flags(), *FIT_FLAGS),
    )


# Tracked, not under runs/: the study spans sessions, so finished runs are committed where the next finds them.
OVERFIT = overfit_study(REGIME, Path("studies/overfit/runs"))


def main(argv: list[str] | None = None) -> None:
    run_study_main(OVERFIT, argv)


if __name__ == "__main__":
    main()
