"""The toy study: GRPO, ERPO (the paper's and the released preset) and GRPO + Policy-KL on the quickstart's shipped
toy model and task, run by the study engine (studies/engine/run.py).

Every training run is the real command line, `erpo fit --config configs/quickstart.yaml` with one flag set per method
(METHODS) and seed, plus a generated callback config: Policy-KL is monitored for every method, and one temperature
sweep on the held-out test problems (with the train-vs-eval gap on a fixed sample of training queries) runs after the
last step. The very first run also sweeps before its first step: that is the base model's row. Then the report, its
figures and its claims (CLAIMS) are written from the runs' logs.

    python -m studies.toy            # the full study: 4 methods x 5 seeds (see FULL, DEFAULT_METHODS)
    python -m studies.toy --quick    # 4 methods x 1 seed, 10 steps, a small sweep (CI smoke test)
    python -m studies.toy --out runs/rerun --report runs/rerun/toy_study.md   # a rerun, to compare:
    python -m studies.toy.compare runs/rerun
    python -m studies.toy --report-only   # rewrite the report from the finished runs under --out

The full study writes studies/toy/toy_study.md (+ PNGs and toy_study_claims.json beside it), --quick writes
runs/toy_study_quick/toy_study.md; every study writes `<out>/study.json` (methods, settings, model identity). A run
that finished before with the same command is skipped (delete `--out` to train again from scratch).

Paths (`--workdir`, and `--out` / `--report` relative to it) default to the repository root. The model and task
files are the shipped ones (erpo_lightning/toy/shipped under the work directory), checked against their manifest
before the first run.
"""

from __future__ import annotations

from pathlib import Path

from erpo_lightning.toy.ship import verify_shipped
from studies.engine.claims import Claim
from studies.engine.definition import ReportInputs, Study, StudySettings
from studies.engine.run import main as run_study_main
from studies.toy.report import toy_report

SHIPPED = Path("erpo_lightning/toy/shipped")  # relative to the work directory, as in configs/quickstart.yaml

# The study's methods: label -> `erpo fit` flags (README, "What ERPO changes"); the quickstart config is ERPO at lr
# 1e-4. Claims (CLAIMS) name methods by these labels. The default study runs DEFAULT_METHODS: GRPO, both ERPO
# presets and GRPO + Policy-KL. `--methods` adds the ablation GRPO + Query-KL (the term without w(q)); GRPO + w(q)
# alone is not offered: on this task the weights stay near 1 (the report prints the range erpo's runs logged).
METHODS: dict[str, list[str]] = {
    "grpo": ["--model.algorithm", "grpo"],
    "grpo + Query-KL": ["--model.algorithm", "grpo", "--model.query_kl_coef", "0.01"],
    "erpo": ["--model.algorithm", "erpo"],
    "erpo_released": ["--model.algorithm", "erpo_released"],
    "grpo_kl": ["--model.algorithm", "grpo_kl"],
}
DEFAULT_METHODS = ("grpo", "erpo", "erpo_released", "grpo_kl")

# Measured on 2 cores: a 400-step run with its final sweep takes ~4 min with 2 threads, and `--jobs 2` (1 thread each)
# runs two in ~8 min, so the 20 runs of the full study take about 80 minutes either way.
FULL = StudySettings(steps=400, seeds=(0, 1, 2, 3, 4))
QUICK = StudySettings(steps=10, seeds=(0,), eval_problems=40, eval_k=2, train_sample_size=16)

# Paired per seed, verdict by k of n seeds (studies.engine.claims.KOfN: holds in >= 80% of seeds, fails in <= 20%).
CLAIMS: tuple[Claim, ...] = (
    Claim("query_kl.erpo", "erpo's final Query-KL is below 1/10 of grpo's", "Query-KL", "erpo", "grpo",
          "ratio", "below", 0.1),
    Claim("query_kl.erpo_released", "erpo_released's final Query-KL is below 1/10 of grpo's", "Query-KL",
          "erpo_released", "grpo", "ratio", "below", 0.1),
    Claim("query_kl.term_alone", "the Query-KL term alone (no w(q)) keeps Query-KL below 1/10 of grpo's", "Query-KL",
          "grpo + Query-KL", "grpo", "ratio", "below", 0.1),
    Claim("query_kl.policy_kl_does_not_hold_it", "grpo_kl (Policy-KL) ends with over 10× erpo's Query-KL",
          "Query-KL", "grpo_kl", "erpo", "ratio", "above", 10.0),
    Claim("policy_kl.grpo_kl", "grpo_kl ends with a lower Policy-KL than grpo", "Policy-KL", "grpo_kl", "grpo",
          "ratio", "below", 1.0),
    Claim("accuracy.erpo_high_t", "erpo is more accurate than grpo at T > 1.0", "T>1.0", "erpo", "grpo",
          "difference", "above", 0.0),
    Claim("accuracy.erpo_low_t", "erpo is more accurate than grpo at T ≤ 1.0", "T≤1.0", "erpo", "grpo",
          "difference", "above", 0.0),
    Claim("accuracy.erpo_released_high_t", "erpo_released is more accurate than grpo at T > 1.0", "T>1.0",
          "erpo_released", "grpo", "difference", "above", 0.0),
    Claim("gap.erpo", "erpo's train-vs-eval gap is smaller than grpo's", "gap", "erpo", "grpo",
          "difference", "below", 0.0),
)  # fmt: skip


def shipped_model(workdir: Path, model_path: str | None) -> dict:
    """The shipped toy model's identity (its manifest's sha256s), checked against its manifest first."""
    manifest = verify_shipped(workdir / SHIPPED)
    return {key: manifest[key] for key in ("sha256", "weights_sha256")}


def write_toy_report(inputs: ReportInputs) -> list[dict]:
    """The toy study's report (studies.toy.report.toy_report) on the toy study's claims."""
    return toy_report(inputs, CLAIMS)


TOY = Study(
    name="toy-study",
    module="studies.toy",
    base_config="configs/quickstart.yaml",
    arms=METHODS,
    default_arms=DEFAULT_METHODS,
    full=FULL,
    quick=QUICK,
    claims=CLAIMS,
    out=Path("runs/toy_study"),
    quick_out=Path("runs/toy_study_quick"),
    report=Path("studies/toy/toy_study.md"),
    model_identity=shipped_model,
    write_report=write_toy_report,
    fit_flags=("--model.monitor_policy_kl", "true"),
)


def main(argv: list[str] | None = None) -> None:
    run_study_main(TOY, argv)


if __name__ == "__main__":
    main()
