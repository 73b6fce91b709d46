"""A healthy toy run: one `erpo fit` of the shipped toy model, run once per test session, whose artifacts many tests
read (issue 53: one fit for every "run it, then read an artifact" test instead of a fit each).

12 steps of 2 queries x 2 rollouts (6 new tokens, HF engine, math reward), every metric logged at every step to a
CSV logger and a TensorBoard logger, sampled completions at the first step and every 5th, plain progress lines
every 5 steps (stderr is a pipe), each step's phase times (`PhaseTimes`, in the root's phase_times.jsonl) and the
default checkpoint at the end. Its stderr is kept. Tests must not change its files: one that needs to (the export
test perturbs the checkpoint, the plot writes beside the CSV) copies them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from erpo_lightning.toy import SHIPPED_DIR
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config

STEPS = 12
EVERY = 5  # steps between progress lines, and between sampled completions
TRAIN_FILE = SHIPPED_DIR / "train.jsonl"
TRAIN_ROWS = 16
STDERR_FILE = "fit.stderr"  # the run's stderr, kept beside its files
PHASE_TIMES = "phase_times.jsonl"  # each step's seconds per phase (PhaseTimes)


@dataclass(frozen=True)
class HealthyRun:
    """Where the healthy toy run put what it wrote.

    Attributes:
        root: the run's `trainer.default_root_dir` (its config file, cache and checkpoints are under it).
        log_dir: the CSV logger's version folder: metrics.csv, completions.jsonl, hparams.yaml.
        tensorboard_dir: the TensorBoard logger's version folder (its events file).
        checkpoint: the checkpoint written at the end of training.
        stderr: everything the run printed to stderr (progress lines and phases).
    """

    root: Path
    log_dir: Path
    tensorboard_dir: Path
    checkpoint: Path
    stderr: str


def healthy_run_config(root: Path) -> dict:
    """The run's `erpo fit` config, everything under `root`."""
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    tensorboard["init_args"] = {"save_dir": str(root / "tb")}
    progress = {"class_path": "erpo_lightning.callbacks.ProgressLines", "init_args": {"every_n_steps": EVERY}}
    completions = {"class_path": "erpo_lightning.callbacks.SampledCompletions", "init_args": {"every_n_steps": EVERY}}
    phase_times = {"class_path": "erpo_lightning.callbacks.PhaseTimes", "init_args": {"path": str(root / PHASE_TIMES)}}
    return fit_config(
        SHIPPED_DIR,
        [{"path": str(TRAIN_FILE), "limit": TRAIN_ROWS}],
        root,
        trainer={
            "max_steps": STEPS,
            "log_every_n_steps": 1,
            "logger": [csv_logger(root / "logs"), tensorboard],
            "callbacks": [progress, completions, phase_times],
        },
        data={"max_prompt_length": 64},
    )


def run_healthy(root: Path) -> HealthyRun:
    """Train the healthy toy run under `root` (AssertionError with its stderr's tail if it fails)."""
    config = write_config(root / "fit.yaml", healthy_run_config(root))
    result = run_erpo("fit", "--config", str(config), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    (root / STDERR_FILE).write_text(result.stderr)
    return read_healthy(root)


def read_healthy(root: Path) -> HealthyRun:
    """The finished healthy run under `root`, found by its files."""
    (metrics,) = (root / "logs").rglob("metrics.csv")
    (events,) = (root / "tb").rglob("events.out.tfevents.*")
    (checkpoint,) = root.rglob("*.ckpt")
    return HealthyRun(root, metrics.parent, events.parent, checkpoint, (root / STDERR_FILE).read_text())


def shared_healthy_run(root: Path) -> HealthyRun:
    """The healthy run under `root`, trained by whichever pytest-xdist worker asks first while the others wait: the
    workers of one session share `root`, so the run is trained once per session, not once per worker."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(root.with_suffix(".lock")):
        if (root / STDERR_FILE).exists():
            return read_healthy(root)
        shutil.rmtree(root, ignore_errors=True)  # a try that failed on another worker: start again from nothing
        root.mkdir()
        return run_healthy(root)
