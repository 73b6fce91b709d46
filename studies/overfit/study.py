"""The overfitting study (issue 39): do ERPO's regularisers stop GRPO memorising its training queries?

On the shipped toy model (configs/quickstart.yaml) trained on only a few training queries at a high learning rate
(REGIME), GRPO memorises them: its held-out accuracy falls below the base model's while its training accuracy rises.
The pilot (studies/overfit/pilot.py) checks that this regime does so before any other arm runs; the plan
(studies/overfit/overfit_plan.md) fixes the arms, seeds, claims and decision rules before the main runs.

    python -m studies.overfit.pilot              # the GRPO-only pilot and its gate (overfit_plan.md, "Pilot")
    python -m studies.overfit                    # the main runs and the report (overfit_plan.md, "Plan")
    python -m studies.overfit --report-only      # rewrite the report from the finished runs
    python -m studies.overfit --quick            # CI smoke test: every arm, 1 seed, 4 steps, a small sweep

Every run is `erpo fit --config configs/quickstart.yaml` with the regime's flags (Regime.flags), its arm's flags and
seed, run by the study engine (studies/engine/run.py). Finished runs are committed under studies/overfit/runs (the
study spans sessions; a rerun skips them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from studies.engine.claims import BASE_ARM, Claim, Gate, KOfN, LearningGuard, SignTest
from studies.engine.definition import ALL_QUERIES, ReportInputs, Study, StudySettings
from studies.engine.run import main as run_study_main
from studies.overfit.report import overfit_report, overfit_table
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

    def describe(self) -> str:
        """The regime in words, as the report states it."""
        rows = f"the first {self.train_queries} rows of `{TRAIN_FILE}`"
        return f"{rows} as the training set, learning rate {self.learning_rate:g}"

    def flags(self) -> tuple[str, ...]:
        """`erpo fit` flags of the regime (its own reference cache: the training set differs from the quickstart's)."""
        train = [{"path": TRAIN_FILE, "label": "toy_train", "limit": self.train_queries}]
        return ("--data.train", json.dumps(train), "--model.learning_rate", f"{self.learning_rate:g}",
                "--data.cache_dir", f".cache/overfit/{self.name}/reference")  # fmt: skip


# The pilot's regimes, in the order it tries them (overfit_plan.md, "Pilot"); the first is the outside pilot's.
PILOT_REGIMES = (Regime(32, 3e-4, 150), Regime(16, 3e-4, 150), Regime(32, 3e-4, 300))
REGIME = PILOT_REGIMES[0]  # the regime the pilot chose (overfit_plan.md, "Pilot result")

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

# Decision rules (overfit_plan.md, "Claims and decision rules"): accuracies and gaps by SignTest (sign test over >= 8
# seeds, bootstrap interval of the mean margin), Query-KL ratios by k of n (>= 80% of seeds holds, <= 20% fails).
BEATS = SignTest(effect=3.0)  # a win counts from 3 points (mean paired margin)
NOT_BELOW_BASE = SignTest(effect=0.0)  # above the base model in nearly every seed; refuted when surely below

VALIDITY = Gate("valid.grpo_overfits", "grpo's held-out Avg@4 at T = 1.0 ends below the base model's", "grpo", "T=1",
                high=0.0, fails_as="invalid", minus_arm=BASE_ARM)  # fmt: skip
LEARNS = LearningGuard("guard.learns", "the method's mean gain on the training queries at T = 1.0 over the base "
                       "model is at least half of grpo's", "grpo")  # fmt: skip
RETENTION_DROPS = Gate("testable.grpo_retention", "grpo's retention (T = 1.5 over T = 1.0) ends at least 5 points "
                       "below the base model's", "grpo", "retention", high=-5.0, minus_arm=BASE_ARM)  # fmt: skip


def gap_claim(key: str, method: str, baseline: str) -> Claim:
    """`method`'s train–eval gap at T = 1.0 is smaller than `baseline`'s by >= 3 points; testable where the
    baseline's gap is at least 10 points in every seed."""
    testable = Gate(f"testable.{baseline}_gap", f"{baseline}'s train–eval gap at T = 1.0 is at least 10 points",
                    baseline, "gap T=1", low=10.0)  # fmt: skip
    text = f"{method}'s train–eval gap at T = 1.0 is smaller than {baseline}'s"
    return Claim(
        key, text, "gap T=1", method, baseline, "difference", "below", 0.0, BEATS, (VALIDITY, testable, LEARNS)
    )


def accuracy_claim(key: str, method: str, baseline: str) -> Claim:
    """`method` ends more accurate on the held-out problems at T = 1.0 than `baseline` (>= 3 points against an arm;
    above it in nearly every seed against the base model)."""
    rule = NOT_BELOW_BASE if baseline == BASE_ARM else BEATS
    text = f"{method}'s held-out Avg@4 at T = 1.0 ends above {baseline}'s"
    return Claim(key, text, "T=1", method, baseline, "difference", "above", 0.0, rule, (VALIDITY, LEARNS))


def retention_claim(key: str, method: str, baseline: str) -> Claim:
    """`method` keeps more of its accuracy at T = 1.5 (retention: T = 1.5 over T = 1.0) than `baseline`; testable
    only where grpo's retention falls at least 5 points below the base model's."""
    rule = NOT_BELOW_BASE if baseline == BASE_ARM else BEATS
    text = f"{method}'s retention (held-out Avg@4 at T = 1.5 over T = 1.0) is above {baseline}'s"
    return Claim(key, text, "retention", method, baseline, "difference", "above", 0.0, rule,
                 (VALIDITY, RETENTION_DROPS, LEARNS))  # fmt: skip


def query_kl_claim(key: str, method: str, baseline: str, side: str, bound: float) -> Claim:
    """`method`'s final Query-KL on token_k3 over `baseline`'s is `side` `bound`, by k of n seeds."""
    text = f"{method}'s final Query-KL (token_k3) is {side} {bound:g}× {baseline}'s"
    return Claim(key, text, "Query-KL (common)", method, baseline, "ratio", side, bound, KOfN())


SKIP = "grpo (skip zero-signal)"
CLAIMS: tuple[Claim, ...] = (
    # paper claim 3: the regulariser narrows the train–eval gap
    gap_claim("gap.erpo", "erpo", "grpo"),
    gap_claim("gap.erpo_released", "erpo_released", "grpo"),
    gap_claim("gap.erpo_vs_skip", "erpo", SKIP),
    gap_claim("gap.erpo_vs_grpo_kl", "erpo", "grpo_kl"),
    gap_claim("gap.query_weights_alone", "grpo + w(q)", "grpo"),
    # paper claim 4: held-out accuracy at the end (long-horizon stability)
    accuracy_claim("accuracy.erpo", "erpo", "grpo"),
    accuracy_claim("accuracy.erpo_released", "erpo_released", "grpo"),
    accuracy_claim("accuracy.erpo_vs_skip", "erpo", SKIP),
    accuracy_claim("accuracy.erpo_vs_grpo_kl", "erpo", "grpo_kl"),
    accuracy_claim("accuracy.query_weights_alone", "grpo + w(q)", "grpo"),
    accuracy_claim("accuracy.erpo_vs_base", "erpo", BASE_ARM),
    accuracy_claim("accuracy.erpo_released_vs_base", "erpo_released", BASE_ARM),
    # paper claim 2: high-temperature robustness, as retention, only where grpo loses it
    retention_claim("retention.erpo", "erpo", "grpo"),
    retention_claim("retention.erpo_released", "erpo_released", "grpo"),
    retention_claim("retention.erpo_vs_base", "erpo", BASE_ARM),
    # Query-KL on one estimator for every arm (token_k3), and the signed change of the queries' log-likelihood
    query_kl_claim("query_kl.erpo", "erpo", "grpo", "below", 0.1),
    query_kl_claim("query_kl.erpo_vs_skip", "erpo", SKIP, "below", 0.1),
    query_kl_claim("query_kl.erpo_released", "erpo_released", "grpo", "below", 0.1),
    query_kl_claim("query_kl.grpo_kl", "grpo_kl", "erpo", "above", 10.0),
    query_kl_claim("query_kl.query_weights_alone", "grpo + w(q)", "grpo", "below", 1.0),
    query_kl_claim("query_kl.skipping_lowers_drift", SKIP, "grpo", "below", 1.0),
    Claim("loglik.erpo", "erpo's training queries lose less log-likelihood than grpo's (final query_loglik_change, "
          "nats)", "query loglik change", "erpo", "grpo", "difference", "above", 0.0, KOfN()),
)  # fmt: skip


def write_overfit_report(inputs: ReportInputs) -> list[dict]:
    """The overfitting study's report (studies.overfit.report) on its claims."""
    return overfit_report(inputs, CLAIMS, REGIME.describe())


def overfit_study(regime: Regime, out: Path) -> Study:
    """The study in `regime`, its runs under `out` (the pilot's regimes each have their own)."""
    return Study(
        name="overfit-study",
        module="studies.overfit",
        base_config=BASE_CONFIG,
        arms=ARMS,
        default_arms=tuple(ARMS),
        full=replace(FULL, steps=regime.steps),
        quick=QUICK,
        claims=CLAIMS,
        out=out,
        quick_out=Path("runs/overfit_study_quick"),
        report=Path("studies/overfit/overfit_study.md"),
        model_identity=shipped_model,
        write_report=write_overfit_report,
        fit_flags=(*regime.flags(), *FIT_FLAGS),
        table=overfit_table,  # the base model's row and retention: what the compare command's claims read too
    )


# Tracked, not under runs/: the study spans sessions, so finished runs are committed where the next finds them.
OVERFIT = overfit_study(REGIME, Path("studies/overfit/runs"))


def main(argv: list[str] | None = None) -> None:
    run_study_main(OVERFIT, argv)


if __name__ == "__main__":
    main()
