"""A study's runs: the `erpo fit` command of one (arm, seed), training it (or skipping it when a run with the same
command finished before), and finding the finished runs of a study's run directory.

A run lives in `<out>/<arm slug>/seed<k>`: `callbacks.yaml` (the final sweep), `run.json` (the command and that
sweep, to tell whether a run there is this run), `fit.log`, the CSVLogger directory `erpo/version_<n>` and, once it
ends, `timing.json` (its start, end, seconds and code commit: file times do not survive a git clone, and a study
whose runs span sessions commits its finished runs). It is finished when its final sweep is written
(`sweep_summary.json`) and its timing recorded. A study spans sessions that may be killed mid-run: on a rerun a
finished run with the same command is skipped, any other run directory is cleared and trained again. A damaged run (a
file of it that cannot be read: a `metrics.csv` cut short, a `run.json` or `sweep_summary.json` that does not parse)
counts as unfinished: a rerun says so and trains it again, and the report (`--report-only` too) refuses it, naming
the run and the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from studies.engine.definition import Study, StudySettings
from studies.engine.report import (
    SWEEP_KEYS,
    VALIDATION,
    DamagedRunFile,
    RunRecord,
    check_metrics_reach,
    read_mapping,
    read_metrics,
)

ERPO = str(Path(sys.executable).with_name("erpo"))
RUN_FILE = "run.json"
TIMING_FILE = "timing.json"
TIMING_KEYS = ("started", "ended", "seconds")
SWEEP_CALLBACK = "erpo_lightning.callbacks.TemperatureSweepCallback"


def run_slug(arm: str) -> str:
    """A directory name for an arm label."""
    return arm.replace(" + ", "_").replace("(", "").replace(")", "").replace("-", "_").replace(" ", "_").lower()


def base_sweep(workdir: Path, base_config: str) -> dict:
    """The `sweep` of the base config's TemperatureSweepCallback (its first benchmark is the study's held-out one)."""
    if not (workdir / base_config).is_file():
        raise SystemExit(f"the study's base config {base_config} is not in {workdir}")
    config = yaml.safe_load((workdir / base_config).read_text())
    for callback in config.get("trainer", {}).get("callbacks", []):
        if callback.get("class_path") == SWEEP_CALLBACK:
            return callback["init_args"]["sweep"]
    raise SystemExit(f"{base_config} has no {SWEEP_CALLBACK}: the study's held-out benchmark is its first benchmark")


def callback_config(sweep: dict, settings: StudySettings, run_at_start: bool) -> dict:
    """The `trainer.callbacks` override: a final (and optionally an initial) temperature sweep, and one every
    `settings.sweep_every` steps between when set (none otherwise); `save_completions` only when the study keeps them
    (a run of a study without it keeps the identity it ran with).

    Args:
        sweep: the base config's sweep (base_sweep); its first benchmark, limited to the study's eval problems at its
            eval k, at the study's temperatures.
    """
    source = {**sweep["benchmarks"][0]["source"], "limit": settings.eval_problems}
    options = {key: value for key, value in sweep.items() if key not in ("temperatures", "seed", "benchmarks")}
    options.pop("max_problems", None)  # the study's eval problems are the benchmark's limit
    sweep = {"temperatures": list(settings.temperatures), "seed": sweep.get("seed", 0),
             "benchmarks": [{"source": source, "k": settings.eval_k}], **options}  # fmt: skip
    if settings.validation is not None:
        sweep["benchmarks"].append({"source": {"path": settings.validation, "label": VALIDATION}, "k": settings.eval_k})
    init_args = {
        "every_n_steps": settings.sweep_every or settings.steps + 1,
        "run_at_start": run_at_start,
        "run_at_end": True,
        "train_sample_size": settings.train_sample_size,
        "train_k": settings.eval_k,
        "sweep": sweep,
    }
    if settings.save_completions:
        init_args["save_completions"] = True
    return {"trainer": {"callbacks": [{"class_path": SWEEP_CALLBACK, "init_args": init_args}]}}


def fit_command(study: Study, arm: str, seed: int, run_dir: Path, settings: StudySettings, model_path: str | None,
                extra: list[str]) -> list[str]:  # fmt: skip
    """The `erpo fit` command line of one (arm, seed) run; `run_dir` is relative to the work directory."""
    seeds = ["--seed_everything", str(seed), "--rollout.seed", str(seed), "--data.seed", str(seed)]
    model = ["--model.model_path", model_path] if model_path else []
    return [
        ERPO, "fit", "--config", study.base_config, "--config", str(run_dir / "callbacks.yaml"), *study.arms[arm],
        *seeds, *study.fit_flags, "--trainer.max_steps", str(settings.steps), "--trainer.default_root_dir",
        str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir), "--trainer.enable_checkpointing", "false",
        *model, *extra,
    ]  # fmt: skip


def latest_log_dir(run_dir: Path) -> Path | None:
    """The CSVLogger directory (`erpo/version_<n>`, highest n) of one run; None before the logger made one."""
    versions = list(run_dir.glob("erpo/version_*"))
    return max(versions, key=lambda p: int(p.name.split("_")[1])) if versions else None


def is_finished(run_dir: Path) -> bool:
    """Whether the run in `run_dir` wrote its final sweep."""
    log_dir = latest_log_dir(run_dir)
    return log_dir is not None and (log_dir / "sweep_summary.json").is_file() and (run_dir / TIMING_FILE).is_file()


def run_timing(run_dir: Path) -> dict:
    """A finished run's `timing.json`: `started` and `ended` (Unix seconds) and `seconds` (monotonic wall time)."""
    return read_mapping(run_dir / TIMING_FILE, TIMING_KEYS)


def run_record(arm: str, seed: int, run_dir: Path) -> RunRecord:
    """A finished run's record, its seconds from its `timing.json`."""
    return RunRecord(arm, seed, latest_log_dir(run_dir), run_timing(run_dir)["seconds"])


def damage(run_dir: Path) -> str | None:
    """Why a finished run's files cannot be read (the file, and what is wrong), or None when each reads as its format.

    Reads what the run holds: `run.json`, `timing.json`, `sweep_summary.json`, `hparams.yaml` and `metrics.csv`, which
    must reach the final sweep's step. What the report needs beyond that (a column, a key) it checks itself.
    """
    log_dir = latest_log_dir(run_dir)
    summary_path, metrics_path, hparams_path = (log_dir / "sweep_summary.json", log_dir / "metrics.csv",
                                                log_dir / "hparams.yaml")  # fmt: skip
    try:
        read_mapping(run_dir / TIMING_FILE, TIMING_KEYS)
        summary = read_mapping(summary_path)
        if (run_dir / RUN_FILE).is_file():
            read_mapping(run_dir / RUN_FILE)
        if hparams_path.is_file():
            read_mapping(hparams_path)
        if metrics_path.is_file():
            frame = read_metrics(metrics_path)
            if all(key in summary for key in SWEEP_KEYS):
                check_metrics_reach(frame, summary["last_step"], metrics_path)
    except DamagedRunFile as error:
        return str(error)
    return None


def run_identity(command: list[str], callbacks: dict) -> dict:
    """What makes a finished run the run asked for (`run.json`): its command (but the `erpo` executable's path, which
    may move between sessions) and its sweep settings (but whether it also swept the base model: the study's first
    run does, and which run is first depends on the arms and seeds one invocation asks for)."""
    sweep = {key: value for key, value in callbacks["trainer"]["callbacks"][0]["init_args"].items()
             if key != "run_at_start"}  # fmt: skip
    return {"command": command[1:], "sweep": sweep}


def code_commit(workdir: Path) -> str:
    """The git commit of the code a run ran (its snapshot worktree's HEAD, `+dirty` when files differ from it): a
    study spanning sessions may run its seeds on different commits, and its report says which."""
    git = ["git", "-C", str(workdir)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def train_one(study: Study, arm: str, seed: int, workdir: Path, out: Path, settings: StudySettings, sweep: dict,
              model_path: str | None, extra: list[str], run_at_start: bool, threads: int) -> RunRecord:  # fmt: skip
    """Train and sweep one run from scratch (its directory cleared first), unless the same run finished there before;
    its log goes to `<run_dir>/fit.log`."""
    run_dir = out / run_slug(arm) / f"seed{seed}"
    config = callback_config(sweep, settings, run_at_start)
    command = fit_command(study, arm, seed, run_dir, settings, model_path, extra)
    identity = run_identity(command, config)
    run_file = workdir / run_dir / RUN_FILE
    if is_finished(workdir / run_dir):
        damaged = damage(workdir / run_dir)
        if damaged is not None:
            print(f"{arm:>16} seed {seed}: damaged, trained again: {damaged}", flush=True)
        elif run_file.is_file() and read_mapping(run_file) == identity:
            print(f"{arm:>16} seed {seed}: finished before, skipped", flush=True)
            return run_record(arm, seed, workdir / run_dir)
    shutil.rmtree(workdir / run_dir, ignore_errors=True)
    (workdir / run_dir).mkdir(parents=True)
    run_file.write_text(json.dumps(identity, indent=1) + "\n")
    (workdir / run_dir / "callbacks.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started, start = time.time(), time.monotonic()
    with open(workdir / run_dir / "fit.log", "w") as log:
        result = subprocess.run(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        tail = (workdir / run_dir / "fit.log").read_text()[-3000:]
        raise RuntimeError(f"{arm} seed {seed} failed (exit {result.returncode}):\n{tail}")
    timing = {"started": started, "ended": time.time(), "seconds": seconds, "commit": code_commit(workdir)}
    (workdir / run_dir / TIMING_FILE).write_text(json.dumps(timing, indent=1) + "\n")
    print(f"{arm:>16} seed {seed}: {seconds:6.1f} s", flush=True)
    return RunRecord(arm, seed, latest_log_dir(workdir / run_dir), seconds)


def load_runs(out: Path, arms: list[str], name: str) -> list[RunRecord]:
    """Every finished (arm, seed) run under a study's run directory (`<out>/<arm slug>/seed<k>`), in the order the
    study runs them (seed-major); unfinished ones are named and left out. A damaged one (a file the report reads that
    cannot be read) stops the report with an error naming the run and the file."""
    records = []
    for arm in arms:
        for seed_dir in sorted((out / run_slug(arm)).glob("seed*")):
            if is_finished(seed_dir):
                records.append(checked_record(arm, seed_dir))
            elif latest_log_dir(seed_dir) is not None:
                print(f"{arm} {seed_dir.name}: not finished (no final sweep), left out of the report", file=sys.stderr)
    if not records:
        raise SystemExit(f"no {name} runs under {out}")
    return sorted(records, key=lambda r: (r.seed, arms.index(r.method)))


def checked_record(arm: str, seed_dir: Path) -> RunRecord:
    """The record of the finished run in `seed_dir`, each file the report reads read once; SystemExit naming the run
    and the file when one cannot be."""
    try:
        record = run_record(arm, int(seed_dir.name[4:]), seed_dir)
        record.check()
    except DamagedRunFile as error:
        raise SystemExit(
            f"{arm} {seed_dir.name} is damaged: {error}; a rerun of the study without --report-only trains it again"
        ) from None
    return record


def study_minutes(records: list[RunRecord]) -> float:
    """Wall time of the runs behind `records`: first run's start to last run's end, in minutes."""
    timings = [run_timing(record.log_dir.parents[1]) for record in records]
    return (max(t["ended"] for t in timings) - min(t["started"] for t in timings)) / 60
