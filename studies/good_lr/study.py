"""The good-learning-rate study (issue 68): with the learning rate already small, does ERPO add anything to GRPO?
And does a run's Query-KL warn of its held-out decline?

Two studies found GRPO at a smaller learning rate beating ERPO at the larger one; no run of ERPO at the smaller rate
existed. The core arms are grpo and erpo, both at the brake study's smaller rate (7e-5) in the brake regime (the toy
model, the first 32 training queries), swept every 20 steps on the test set, on a committed validation set of other
problems (studies/good_lr/validation.jsonl) and on the training queries. The plan, with every rule, was committed
before any run: studies/good_lr/good_lr_plan.md. The pilot (studies/good_lr/pilot.py) fixes only the run length.

    python -m studies.good_lr.pilot          # the pilot: fixes STEPS (good_lr_plan.md, "Pilot")
    python -m studies.good_lr                # the core runs, seeds 810-825, once STEPS is set
    python -m studies.good_lr --report-only  # the report from the finished runs
    python -m studies.good_lr --quick        # smoke test: both arms, 1 seed, 4 steps
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

from studies.engine.claims import BASE_ARM, Claim
from studies.engine.definition import ALL_QUERIES, StudySettings
from studies.engine.paired import MeanCheck, PairedInterval

BASE_CONFIG = "configs/quickstart.yaml"
TRAIN_FILE = "erpo_lightning/toy/shipped/train.jsonl"
TEST_FILE = "erpo_lightning/toy/shipped/test.jsonl"
VALIDATION_FILE = "studies/good_lr/validation.jsonl"  # rows 200-399 of TEST_FILE (the plan's "Regime")
TRAIN_QUERIES = 32  # the brake study's regime
LEARNING_RATE = 7e-5  # the brake study's smaller learning rate, for both core arms
SWEEP_EVERY = 20
WINDOW = 3  # sweeps averaged at the end of a run and in a drawdown
PILOT_LENGTHS = (300, 400, 500)  # the run lengths the pilot reads, shortest first
STEPS: int | None = 300  # the pilot's choice (good_lr_plan.md, "Pilot result"; pilot_runs/pilot.json)
CORE_SEEDS = tuple(range(810, 826))
PORTABILITY_SEEDS = tuple(range(810, 818))
COUNTS_FILE = "problem_correct.csv.gz"  # a run's per-problem correct counts, kept in place of its responses
RESPONSES_FILE = "sweep_completions.jsonl.gz"


def regime_flags() -> tuple[str, ...]:
    """`erpo fit` flags every core run shares but its preset and learning rate: the first TRAIN_QUERIES training rows
    with their own reference cache, Policy-KL monitored."""
    train = [{"path": TRAIN_FILE, "label": "toy_train", "limit": TRAIN_QUERIES}]
    return ("--data.train", json.dumps(train), "--data.cache_dir", f".cache/good_lr/q{TRAIN_QUERIES}/reference",
            "--model.monitor_policy_kl", "true")  # fmt: skip


def arm(algorithm: str, learning_rate: float = LEARNING_RATE) -> list[str]:
    """An arm's `erpo fit` flags: its preset and learning rate."""
    return ["--model.algorithm", algorithm, "--model.learning_rate", f"{learning_rate:g}"]


CORE_ARMS: dict[str, list[str]] = {"grpo": arm("grpo"), "erpo": arm("erpo")}


def settings(steps: int, seeds: tuple[int, ...]) -> StudySettings:
    """The core's sweeps (the plan's "Regime") for runs of `steps` steps."""
    return StudySettings(steps=steps, seeds=seeds, temperatures=(1.0, 1.5), eval_problems=200, eval_k=4,
                         train_sample_size=ALL_QUERIES, sweep_every=SWEEP_EVERY, save_completions=True,
                         validation=VALIDATION_FILE)  # fmt: skip


QUICK = StudySettings(steps=4, seeds=(810,), temperatures=(1.0, 1.5), eval_problems=16, eval_k=2,
                      train_sample_size=ALL_QUERIES, sweep_every=2, save_completions=True,
                      validation=VALIDATION_FILE)  # fmt: skip


# Decision rules (good_lr_plan.md, "Claims (core)" and "The monitor claim").
BEATS = PairedInterval(effect=2.0)
PREDICTS = PairedInterval(effect=0.5)
VALID = MeanCheck("valid.grpo_learns", "grpo's training-query Avg@4 at T = 1.0 over its last three sweeps ends at "
                  "least 10 points above the base model's (mean over seeds)", "train T=1 end", arm="grpo",
                  minus_arm=BASE_ARM, low=10.0, fails_as="invalid")  # fmt: skip
PASSED_BEST = MeanCheck("testable.grpo_passed_best", "grpo's test-set Avg@4 at T = 1.0 ends at least 2 points below "
                        "its best three-sweep mean (mean over seeds)", "drawdown T=1", arm="grpo", low=2.0,
                        fails_as="untestable")  # fmt: skip
GUARD = MeanCheck("guard.learns", "erpo's training-query Avg@4 at T = 1.0 over its last three sweeps is at most 3 "
                  "points below grpo's (mean over seeds)", "train T=1 end", minus_arm="grpo", low=-3.0)  # fmt: skip
QUERY_KL_SIGNAL, SIMPLER_SIGNAL = "Query-KL signal", "best simpler signal"  # the monitor claim's derived rows
MONITOR_ERROR = "monitor error"  # a derived row's leave-one-seed-out mean absolute error (points of drawdown)


def core_claim(key: str, text: str, quantity: str, gates: tuple) -> Claim:
    """erpo against grpo, both at 7e-5: `quantity` above, by the interval rule."""
    return Claim(f"{key}.erpo_vs_grpo", text, quantity, "erpo", "grpo", "difference", "above", 0.0, BEATS, gates)


CORE_CLAIMS: tuple[Claim, ...] = (
    core_claim("final", "erpo's test-set Avg@4 at T = 1.0 over its last three sweeps is above grpo's", "T=1 end",
               (VALID, PASSED_BEST, GUARD)),
    core_claim("selected", "erpo's test-set Avg@4 at T = 1.0 at the sweep its validation set selects is above "
               "grpo's at the sweep grpo's selects", "T=1 selected", (VALID, GUARD)),
    core_claim("high_t", "erpo's test-set Avg@4 at T = 1.5 over its last three sweeps is above grpo's", "T=1.5 end",
               (VALID, PASSED_BEST, GUARD)),
    Claim("monitor.query_kl", "in grpo's runs, token-k3 Query-KL predicts the test-set drawdown at T = 1.0 better "
          "than Policy-KL, training accuracy or the step count (leave-one-seed-out mean absolute error, points)",
          MONITOR_ERROR, QUERY_KL_SIGNAL, SIMPLER_SIGNAL, "difference", "below", 0.0, PREDICTS, (PASSED_BEST,)),
)  # fmt: skip


def compact_completions(run_folder: Path, benchmark: str) -> Path:
    """Replace a run's kept sweep responses by each `benchmark` problem's number of correct samples per sweep and
    temperature (what the bootstrap over problems reads); returns the counts file. Idempotent: a run whose counts
    exist and whose responses are gone is left as it is.

    Columns: step (optimizer steps before the sweep), temperature, index (the problem's row in the benchmark),
    correct (samples graded right), k (samples drawn).
    """
    counts, responses = run_folder / COUNTS_FILE, run_folder / RESPONSES_FILE
    if not responses.is_file():
        if counts.is_file():
            return counts
        raise FileNotFoundError(f"{run_folder}: neither {RESPONSES_FILE} nor {COUNTS_FILE}")
    rows = []
    with gzip.open(responses, "rt") as lines:
        for line in lines:
            record = json.loads(line)
            if record["benchmark"] == benchmark:
                correct = record["correct"]
                rows.append((record["step"], record["temperature"], record["index"], sum(correct), len(correct)))
    with gzip.open(counts, "wt", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(("step", "temperature", "index", "correct", "k"))
        writer.writerows(sorted(rows))
    responses.unlink()
    return counts
