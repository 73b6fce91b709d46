"""The real-model study: does ERPO beat GRPO on SmolLM2-135M-Instruct? grpo, erpo, erpo_released and
erpo_released's matched baseline (its preset without Query-KL and w(q)), seeds 0, 1 and 2, run by the study engine
(studies/engine/run.py) with the claims and decision rules pre-registered in studies/real_model/plan.md
(issue 26).

    python -m studies.real_model --model-path "$(.venv/bin/python -m erpo_lightning.real_model)"
    python -m studies.real_model --seeds 2 --model-path ...   # one seed of the plan (finished ones are skipped)
    python -m studies.real_model --report-only       # rewrite the report from the finished runs
    python -m studies.real_model --quick             # CI smoke test: the shipped toy model, HF engine
    python -m studies.engine.compare real_model runs/real_rerun   # does a rerun confirm the claims?

Without `--model-path`, `erpo_lightning.real_model.prepare_smollm2` finds SmolLM2's converted directory (it
downloads and converts it the first time). The study spans sessions: its run directories
(studies/real_model/runs/<arm>/seed<k>) are committed as they finish, and on a rerun of the same command the
finished runs are skipped and an unfinished one is cleared and trained again. It needs the whole machine: one run
at a time (`--jobs 1`). The full study writes studies/real_model/real_model_study.md (+ PNGs and
real_model_study_claims.json beside it) from every finished run of the arms asked for: after a third seed of
some arms only (`--arms erpo grpo --seeds 2`), `--report-only` rewrites it with every arm.
"""

from __future__ import annotations

from pathlib import Path

from erpo_lightning.real_model import prepare_smollm2
from erpo_lightning.toy.ship import file_sha256, files_sha256
from studies.engine.claims import Claim, Gate, KOfN, MeanMargin
from studies.engine.definition import ALL_QUERIES, ReportInputs, Study, StudySettings
from studies.engine.run import main as run_study_main
from studies.real_model.report import real_model_report

# The pilot's config (issue 26, item 1): SmolLM2-135M-Instruct on the harder arithmetic task; its first
# TemperatureSweepCallback benchmark is the held-out set the study sweeps.
BASE_CONFIG = "configs/study_smollm2.yaml"
TOY_MODEL = "erpo_lightning/toy/shipped"  # the quick study's stand-in for SmolLM2 (no download, no vLLM)

ARMS: dict[str, list[str]] = {
    "grpo": ["--model.algorithm", "grpo"],
    "erpo": ["--model.algorithm", "erpo"],
    "erpo_released": ["--model.algorithm", "erpo_released"],
    # erpo_released without its two ERPO terms: it differs from grpo in dual clip, aggregation and weight decay, so
    # a win of erpo_released is attributed to Query-KL and w(q) only against this arm.
    "erpo_released_matched": ["--model.algorithm", "erpo_released", "--model.query_kl_coef", "0",
                              "--model.use_query_weights", "false"],
}  # fmt: skip

STEPS = 40  # studies/real_model/plan.md, "Settings"
FULL = StudySettings(steps=STEPS, seeds=(0, 1, 2), temperatures=(0.6, 1.0, 1.5), eval_problems=100, eval_k=4,
                     train_sample_size=ALL_QUERIES)  # the gap on every training query  # fmt: skip
QUICK = StudySettings(steps=2, seeds=(0,), temperatures=(0.6, 1.0, 1.5), eval_problems=8, eval_k=2,
                      train_sample_size=8)  # fmt: skip
QUICK_FIT_FLAGS = ("--rollout.engine", "erpo_lightning.rollout.HFEngine", "--data.use_chat_template", "false")

# The study is valid only where grpo learns the task partly and high temperature hurts it (every seed).
VALIDITY = (
    Gate("valid.grpo_t1", "grpo's held-out accuracy at T = 1.0 is within 40–85%", "grpo", "T=1", low=40.0,
         high=85.0, fails_as="invalid"),
    Gate("valid.grpo_high_t_drop", "grpo's accuracy at T = 1.5 is at least 10 points below its T = 1.0", "grpo",
         "T=1.5", minus="T=1", high=-10.0, fails_as="invalid"),
)  # fmt: skip
PRE_REGISTERED = MeanMargin(confirm_mean=3.0, refute_mean=0.0, refute_seed=2.0)


def gap_testable(arm: str) -> Gate:
    """The gap claims are testable only where the baseline overfits: its train–eval gap ≥ 3 points in every seed."""
    return Gate(f"testable.{arm}_gap", f"{arm}'s train–eval gap is at least 3 points", arm, "gap", low=3.0)


def accuracy_claim(key: str, method: str, baseline: str, text: str) -> Claim:
    """`method` is more accurate than `baseline` at T = 1.5 (points), by the pre-registered rule."""
    return Claim(key, text, "T=1.5", method, baseline, "difference", "above", 0.0, PRE_REGISTERED, VALIDITY)


def gap_claim(key: str, method: str, baseline: str, text: str) -> Claim:
    """`method`'s train–eval gap is smaller than `baseline`'s (points), by the pre-registered rule, if testable."""
    gates = (*VALIDITY, gap_testable(baseline))
    return Claim(key, text, "gap", method, baseline, "difference", "below", 0.0, PRE_REGISTERED, gates)


CLAIMS: tuple[Claim, ...] = (
    accuracy_claim("accuracy.erpo_high_t", "erpo", "grpo", "erpo is more accurate than grpo at T = 1.5"),
    accuracy_claim("accuracy.erpo_released_high_t", "erpo_released", "grpo",
                   "erpo_released is more accurate than grpo at T = 1.5"),
    accuracy_claim("accuracy.erpo_released_vs_matched_high_t", "erpo_released", "erpo_released_matched",
                   "erpo_released is more accurate than its matched baseline at T = 1.5"),
    gap_claim("gap.erpo", "erpo", "grpo", "erpo's train–eval gap is smaller than grpo's"),
    gap_claim("gap.erpo_released_vs_matched", "erpo_released", "erpo_released_matched",
              "erpo_released's train–eval gap is smaller than its matched baseline's"),
    Claim("query_kl.erpo", "erpo's final Query-KL is below 1/10 of grpo's", "Query-KL", "erpo", "grpo", "ratio",
          "below", 0.1, KOfN()),
    Claim("query_kl.erpo_released_vs_matched", "erpo_released's final Query-KL is below 1/10 of its matched "
          "baseline's", "Query-KL", "erpo_released", "erpo_released_matched", "ratio", "below", 0.1, KOfN()),
)  # fmt: skip


def model_directory(workdir: Path, model_path: str | None) -> dict:
    """The model's directory and the sha256 of its files (each file's sha256 with its name, as the toy model's
    manifest identifies it)."""
    if model_path is None:
        raise SystemExit("the real-model study needs --model-path (or SmolLM2's, which the full study finds itself)")
    directory = workdir / model_path
    hashes = {path.name: file_sha256(path) for path in sorted(directory.iterdir()) if path.is_file()}
    return {"path": model_path, "sha256": files_sha256(hashes)}


def write_real_model_report(inputs: ReportInputs) -> list[dict]:
    """The real-model study's report (studies.real_model.report.real_model_report) on its claims."""
    return real_model_report(inputs, CLAIMS)


REAL_MODEL = Study(
    name="real-model-study",
    module="studies.real_model",
    base_config=BASE_CONFIG,
    arms=ARMS,
    default_arms=tuple(ARMS),
    full=FULL,
    quick=QUICK,
    claims=CLAIMS,
    # Tracked, not under runs/: the study spans sessions and each session's machine starts empty, so every finished
    # run's directory (its logs and sweeps, a few hundred kB, no checkpoints) is committed where the next session and
    # --report-only find it.
    out=Path("studies/real_model/runs"),
    quick_out=Path("runs/real_model_study_quick"),
    report=Path("studies/real_model/real_model_study.md"),
    model_identity=model_directory,
    write_report=write_real_model_report,
    quick_fit_flags=QUICK_FIT_FLAGS,
    model_path=TOY_MODEL,
    resolve_model_path=prepare_smollm2,  # SmolLM2-135M-Instruct, downloaded and converted the first time
    jobs=1,
)


def main(argv: list[str] | None = None) -> None:
    run_study_main(REAL_MODEL, argv)


if __name__ == "__main__":
    main()
