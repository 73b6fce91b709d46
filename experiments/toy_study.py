"""The toy study: GRPO, ERPO (the paper's and the released preset) and GRPO + Policy-KL on the quickstart's shipped
toy model and task.

Every training run is the real command line, `erpo fit --config configs/quickstart.yaml` with one flag set per method
(METHODS) and seed, plus a generated callback config: Policy-KL is monitored for every method, and one temperature
sweep on the held-out test problems (with the train-vs-eval gap on a fixed sample of training queries) runs after the
last step. The very first run also sweeps before its first step: that is the base model's row. Then
`toy_study_report` reads the runs' logs and writes the report, its figures and its claims (`toy_study_claims`).

    python experiments/toy_study.py            # the full study: 4 methods x 5 seeds (see FULL, DEFAULT_METHODS)
    python experiments/toy_study.py --quick    # 4 methods x 1 seed, 10 steps, a small sweep (CI smoke test)
    python experiments/toy_study.py --out runs/rerun --report runs/rerun/toy_study.md   # a rerun, to compare:
    python experiments/toy_study_compare.py runs/rerun
    python experiments/toy_study.py --report-only   # rewrite the report from the finished runs under --out

The full study writes docs/toy_study.md (+ PNGs and toy_study_claims.json beside it), --quick writes
runs/toy_study_quick/toy_study.md; every study writes `<out>/study.json` (methods, settings, model identity).

Paths (`--workdir`, and `--out` / `--report` relative to it) default to the repository root. The model and task
files are the shipped ones (erpo_lightning/toy/shipped under the work directory), checked against their manifest
before the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_study_report import RunRecord, write_report  # noqa: E402

from erpo_lightning.algorithms import ALGORITHMS  # noqa: E402
from erpo_lightning.toy.ship import verify_shipped  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ERPO = str(Path(sys.executable).with_name("erpo"))
BASE_CONFIG = "configs/quickstart.yaml"
SHIPPED = Path("erpo_lightning/toy/shipped")  # relative to the work directory, as in BASE_CONFIG
TEST_FILE = str(SHIPPED / "test.jsonl")
STUDY_FILE = "study.json"

# The study's methods: label -> `erpo fit` flags (README, "What ERPO changes"); the quickstart config is ERPO at lr
# 1e-4. Claims (toy_study_claims.CLAIMS) name methods by these labels. The default study runs DEFAULT_METHODS: GRPO,
# both ERPO presets and GRPO + Policy-KL. `--methods` adds the ablation GRPO + Query-KL (the term without w(q)); GRPO
# + w(q) alone is not offered: on this task the weights stay near 1 (the report prints the range erpo's runs logged).
METHODS: dict[str, list[str]] = {
    "grpo": ["--model.algorithm", "grpo"],
    "grpo + Query-KL": ["--model.algorithm", "grpo", "--model.query_kl_coef", "0.01"],
    "erpo": ["--model.algorithm", "erpo"],
    "erpo_released": ["--model.algorithm", "erpo_released"],
    "grpo_kl": ["--model.algorithm", "grpo_kl"],
}
DEFAULT_METHODS = ("grpo", "erpo", "erpo_released", "grpo_kl")


@dataclass(frozen=True)
class StudySettings:
    """What one study trains and measures."""

    steps: int
    seeds: tuple[int, ...]
    temperatures: tuple[float, ...] = (0.1, 0.6, 1.0, 1.5)
    eval_problems: int = 200  # held-out test problems in the final sweep
    eval_k: int = 4  # samples per problem and temperature
    train_sample_size: int = 64  # training queries for the train-vs-eval gap


# Measured on 2 cores: a 400-step run with its final sweep takes ~4 min with 2 threads, and `--jobs 2` (1 thread each)
# runs two in ~8 min, so the 20 runs of the full study take about 80 minutes either way.
FULL = StudySettings(steps=400, seeds=(0, 1, 2, 3, 4))
QUICK = StudySettings(steps=10, seeds=(0,), eval_problems=40, eval_k=2, train_sample_size=16)


def check_methods(methods: dict[str, list[str]]) -> None:
    """Refuse, before any run, a method whose `--model.algorithm` is not a preset of erpo_lightning.algorithms."""
    for label, flags in methods.items():
        algorithm = flags[flags.index("--model.algorithm") + 1] if "--model.algorithm" in flags else "erpo"
        if algorithm not in ALGORITHMS:
            raise SystemExit(f"method {label!r}: --model.algorithm {algorithm!r} is not one of {sorted(ALGORITHMS)}")


def study_description(methods: dict[str, list[str]], settings: StudySettings, model: dict, command: str) -> dict:
    """What `<out>/study.json` and the claims file record: methods, settings, the shipped model's identity."""
    return {
        "methods": methods,
        "settings": asdict(settings),
        "model": {key: model[key] for key in ("sha256", "weights_sha256")},
        "command": command,
    }


def run_slug(method: str) -> str:
    """A directory name for a method label."""
    return method.replace(" + ", "_").replace("(", "").replace(")", "").replace("-", "_").lower()


def callback_config(settings: StudySettings, run_at_start: bool) -> dict:
    """The `trainer.callbacks` override: a final (and optionally an initial) temperature sweep, no sweeps between."""
    sweep = {
        "temperatures": list(settings.temperatures),
        "seed": 0,
        "benchmarks": [{"source": {"path": TEST_FILE, "label": "toy_test", "limit": settings.eval_problems},
                        "k": settings.eval_k}],
    }  # fmt: skip
    init_args = {
        "every_n_steps": settings.steps + 1,
        "run_at_start": run_at_start,
        "run_at_end": True,
        "train_sample_size": settings.train_sample_size,
        "train_k": settings.eval_k,
        "sweep": sweep,
    }
    return {"trainer": {"callbacks": [{"class_path": "erpo_lightning.callbacks.TemperatureSweepCallback",
                                       "init_args": init_args}]}}  # fmt: skip


def fit_command(method: str, seed: int, run_dir: Path, settings: StudySettings, extra: list[str]) -> list[str]:
    """The `erpo fit` command line of one (method, seed) run; `run_dir` is relative to the work directory."""
    seeds = ["--seed_everything", str(seed), "--rollout.seed", str(seed), "--data.seed", str(seed)]
    return [
        ERPO, "fit", "--config", BASE_CONFIG, "--config", str(run_dir / "callbacks.yaml"), *METHODS[method], *seeds,
        "--model.monitor_policy_kl", "true", "--trainer.max_steps", str(settings.steps),
        "--trainer.default_root_dir", str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir),
        "--trainer.enable_checkpointing", "false", *extra,
    ]  # fmt: skip


def train_one(method: str, seed: int, workdir: Path, out: Path, settings: StudySettings, extra: list[str],
              run_at_start: bool, threads: int) -> RunRecord:  # fmt: skip
    """Train and sweep one run from scratch (its directory is cleared first); its log goes to `<run_dir>/fit.log`."""
    run_dir = out / run_slug(method) / f"seed{seed}"
    shutil.rmtree(workdir / run_dir, ignore_errors=True)
    (workdir / run_dir).mkdir(parents=True)
    (workdir / run_dir / "callbacks.yaml").write_text(yaml.safe_dump(callback_config(settings, run_at_start)))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.monotonic()
    with open(workdir / run_dir / "fit.log", "w") as log:
        result = subprocess.run(fit_command(method, seed, run_dir, settings, extra), cwd=workdir, env=env,
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    seconds = time.monotonic() - start
    if result.returncode != 0:
        tail = (workdir / run_dir / "fit.log").read_text()[-3000:]
        raise RuntimeError(f"{method} seed {seed} failed (exit {result.returncode}):\n{tail}")
    print(f"{method:>16} seed {seed}: {seconds:6.1f} s", flush=True)
    return RunRecord(method, seed, latest_log_dir(workdir / run_dir), seconds)


def latest_log_dir(run_dir: Path) -> Path:
    """The CSVLogger directory (`erpo/version_<n>`, highest n) of one run."""
    return max(run_dir.glob("erpo/version_*"), key=lambda p: int(p.name.split("_")[1]))


def load_runs(out: Path, methods: list[str]) -> list[RunRecord]:
    """Every finished (method, seed) run under a study's run directory (`<out>/<method slug>/seed<k>`), in the order
    the study runs them (seed-major). A run's seconds are read from its files: `callbacks.yaml` is written just
    before `erpo fit` starts and `fit.log` last written when it ends."""
    records = []
    for method in methods:
        for seed_dir in (out / run_slug(method)).glob("seed*"):
            if (seed_dir / "erpo").is_dir():
                seconds = (seed_dir / "fit.log").stat().st_mtime - (seed_dir / "callbacks.yaml").stat().st_mtime
                records.append(RunRecord(method, int(seed_dir.name[4:]), latest_log_dir(seed_dir), seconds))
    if not records:
        raise SystemExit(f"no toy-study runs under {out}")
    return sorted(records, key=lambda r: (r.seed, methods.index(r.method)))


def study_minutes(records: list[RunRecord]) -> float:
    """Wall time of the runs behind `records`: first run's start to last run's end, in minutes."""
    dirs = [record.log_dir.parents[1] for record in records]
    start = min((d / "callbacks.yaml").stat().st_mtime for d in dirs)
    return (max((d / "fit.log").stat().st_mtime for d in dirs) - start) / 60


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test settings (QUICK instead of FULL)")
    parser.add_argument("--steps", type=int, help="RL steps per run (overrides the preset)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (overrides the preset)")
    parser.add_argument(
        "--methods", nargs="+", choices=list(METHODS), help=f"methods to run (default {' '.join(DEFAULT_METHODS)})"
    )
    parser.add_argument("--eval-problems", type=int, help="held-out problems in the sweep (overrides the preset)")
    parser.add_argument("--train-sample-size", type=int, help="training queries for the gap (overrides the preset)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (CPU threads are split between them)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rewrite the report from the finished runs under --out")  # fmt: skip
    parser.add_argument("--fit-args", default="", help="extra `erpo fit` arguments for every run, one string")
    parser.add_argument("--workdir", type=Path, default=REPO, help="directory holding configs/ and .cache/")
    parser.add_argument("--out", type=Path, help="run directory under workdir (runs/toy_study[_quick])")
    parser.add_argument("--report", type=Path, help="report under workdir (docs/toy_study.md; --quick: in --out)")
    args = parser.parse_args(argv)
    args.out = args.out or Path("runs/toy_study_quick" if args.quick else "runs/toy_study")
    args.report = args.report or (args.out / "toy_study.md" if args.quick else Path("docs/toy_study.md"))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    overrides = {"steps": args.steps, "seeds": tuple(args.seeds) if args.seeds else None,
                 "eval_problems": args.eval_problems, "train_sample_size": args.train_sample_size}  # fmt: skip
    settings = replace(settings, **{key: value for key, value in overrides.items() if value is not None})
    methods = {label: METHODS[label] for label in args.methods or DEFAULT_METHODS}
    check_methods(methods)
    model = verify_shipped(args.workdir / SHIPPED)
    command = " ".join(["python", "experiments/toy_study.py", *(sys.argv[1:] if argv is None else argv)])
    study = study_description(methods, settings, model, command)
    if args.report_only:
        records = load_runs(args.workdir / args.out, list(methods))
        (args.workdir / args.out / STUDY_FILE).write_text(json.dumps(study, indent=1) + "\n")
        minutes = study_minutes(records)
        write_report(records, settings, args.workdir / args.report, command, minutes, args.jobs, study)
        print(f"report rewritten from {len(records)} runs: {args.workdir / args.report}")
        return
    (args.workdir / args.out).mkdir(parents=True, exist_ok=True)
    (args.workdir / args.out / STUDY_FILE).write_text(json.dumps(study, indent=1) + "\n")
    extra = shlex.split(args.fit_args)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    jobs = [(method, seed) for seed in settings.seeds for method in methods]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(train_one, method, seed, args.workdir, args.out, settings, extra, i == 0, threads)
            for i, (method, seed) in enumerate(jobs)
        ]
        records = [future.result() for future in futures]
    minutes = (time.monotonic() - start) / 60
    write_report(records, settings, args.workdir / args.report, command, minutes, args.jobs, study)
    print(f"study done in {minutes:.1f} min: {args.workdir / args.report}")


if __name__ == "__main__":
    main()
