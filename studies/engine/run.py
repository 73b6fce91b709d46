"""The study engine: trains a study's (arm, seed) runs and writes its report, for any study
(studies.engine.definition.Study).

Every run is the real command line, `erpo fit --config <base config>` with its arm's flags and seed, plus a generated
callback config: one temperature sweep on the held-out problems (with the train-vs-eval gap on a fixed sample of
training queries) after the last step, and every `sweep_every` steps before it when the study asks for a trajectory
(StudySettings); the very first run also sweeps before its first step (the base model's row).
Runs that finished before with the same command are skipped, others are cleared and rerun (studies.engine.runs), so a
study killed mid-way resumes where it stopped. Then the study's report is written from the logs of every finished run of
the arms asked for under `--out` (this call's or earlier ones'); `--report-only` rewrites it without training.
Every study writes `<out>/study.json` (arms, settings, model).

Each study's module runs it: `python -m studies.toy [--quick | --report-only | ...]`,
`python -m studies.real_model [...]`. Paths (`--workdir`, and `--out` / `--report` relative to it)
default to the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from studies.engine.definition import ReportInputs, Study, StudySettings
from studies.engine.runs import base_sweep, load_runs, study_minutes, train_one

REPO = Path(__file__).resolve().parents[2]
STUDY_FILE = "study.json"


def parse_args(study: Study, argv: list[str] | None) -> argparse.Namespace:
    """The study's command line; `--out` and `--report` default to the study's (quick or full) paths."""
    parser = argparse.ArgumentParser(description=f"python -m {study.module}: a study run by studies/engine/run.py")
    parser.add_argument("--quick", action="store_true", help="smoke-test settings (the study's quick settings)")
    parser.add_argument("--steps", type=int, help="RL steps per run (overrides the preset)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (overrides the preset)")
    parser.add_argument("--methods", "--arms", dest="methods", nargs="+", choices=list(study.arms),
                        help=f"arms to run (default {' '.join(study.default_arms)})")  # fmt: skip
    parser.add_argument("--eval-problems", type=int, help="held-out problems in the sweep (overrides the preset)")
    parser.add_argument("--train-sample-size", type=int, help="training queries for the gap (overrides the preset)")
    parser.add_argument("--jobs", type=int, default=study.jobs, help="runs in parallel (CPU threads split between)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rewrite the report from the finished runs under --out")  # fmt: skip
    parser.add_argument("--fit-args", default="", help="extra `erpo fit` arguments for every run, one string")
    parser.add_argument("--model-path", help="`--model.model_path` of every run (default: the study's)")
    parser.add_argument("--workdir", type=Path, default=REPO, help="directory holding configs/ and .cache/")
    parser.add_argument(
        "--out", type=Path, help=f"run directory under workdir ({study.out}, --quick: {study.quick_out})"
    )
    parser.add_argument("--report", type=Path, help=f"report under workdir ({study.report}; --quick: in --out)")
    args = parser.parse_args(argv)
    args.out = args.out or (study.quick_out if args.quick else study.out)
    args.report = args.report or (args.out / study.report.name if args.quick else study.report)
    return args


def chosen_settings(study: Study, args: argparse.Namespace) -> StudySettings:
    """The study's quick or full settings with the command line's overrides."""
    overrides = {"steps": args.steps, "seeds": tuple(args.seeds) if args.seeds else None,
                 "eval_problems": args.eval_problems, "train_sample_size": args.train_sample_size}  # fmt: skip
    return replace(study.settings(args.quick), **{key: value for key, value in overrides.items() if value is not None})


def model_path(study: Study, args: argparse.Namespace) -> str | None:
    """The model every run trains: `--model-path`, else the quick run's default, else the study's resolver (None:
    the base config's own)."""
    if args.model_path or args.quick:
        return args.model_path or study.model_path
    return None if study.resolve_model_path is None or args.report_only else study.resolve_model_path()


def model_identity(study: Study, args: argparse.Namespace, path: str | None) -> dict:
    """What identifies the model; `--report-only` of a study whose model is resolved keeps `study.json`'s."""
    previous = args.workdir / args.out / STUDY_FILE
    if args.report_only and not args.quick and not args.model_path and study.resolve_model_path and previous.is_file():
        return json.loads(previous.read_text())["model"]
    return study.model_identity(args.workdir, path)


def run_study(study: Study, args: argparse.Namespace, settings: StudySettings, path: str | None) -> None:
    """Train (or skip, when finished) every (arm, seed) run, seed-major; the first also sweeps the base model."""
    sweep = base_sweep(args.workdir, study.base_config)
    extra = [*(study.quick_fit_flags if args.quick else ()), *shlex.split(args.fit_args)]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    jobs = [(arm, seed) for seed in settings.seeds for arm in study.arms]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(train_one, study, arm, seed, args.workdir, args.out, settings, sweep, path, extra, i == 0,
                        threads)
            for i, (arm, seed) in enumerate(jobs)
        ]  # fmt: skip
        for future in futures:
            future.result()


def main_after_pilot(study: Study, pilot_done: bool, refusal: str, argv: list[str] | None = None) -> None:
    """`main` for a study whose pilot fixes part of it: until `pilot_done`, every command but `--quick` and `--help`
    stops with `refusal` (SystemExit), so that no main run starts on stand-in values."""
    args = sys.argv[1:] if argv is None else argv
    if not pilot_done and not {"--quick", "-h", "--help"} & set(args):
        raise SystemExit(refusal)
    main(study, argv)


def main(study: Study, argv: list[str] | None = None) -> None:
    """Run `study` as its command line says (module docstring)."""
    study.check()
    args = parse_args(study, argv)
    settings = chosen_settings(study, args)
    study = study.with_arms(args.methods or list(study.default_arms))
    path = model_path(study, args)
    command = " ".join(["python", "-m", study.module, *(sys.argv[1:] if argv is None else argv)])
    description = {"methods": study.arms, "settings": settings.record(),
                   "model": model_identity(study, args, path), "command": command}  # fmt: skip
    out = args.workdir / args.out
    start = time.monotonic()
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        (out / STUDY_FILE).write_text(json.dumps(description, indent=1) + "\n")
        run_study(study, args, settings, path)
    records = load_runs(out, list(study.arms), study.name)  # every finished run of these arms, this call's or not
    (out / STUDY_FILE).write_text(json.dumps(description, indent=1) + "\n")
    report = ReportInputs(records, settings, args.workdir / args.report, command, study_minutes(records), args.jobs,
                          description, study.base_config)  # fmt: skip
    study.write_report(report)
    if args.report_only:
        print(f"report rewritten from {len(records)} runs: {args.workdir / args.report}")
    else:
        print(f"study done in {(time.monotonic() - start) / 60:.1f} min: {args.workdir / args.report}")
