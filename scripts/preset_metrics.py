"""Every preset's first training steps on the quickstart's toy task, for checking that a change to the update moves no
number: run it before and after the change, on one machine, then compare the two folders.

    python scripts/preset_metrics.py run OUT [--steps 3] [--source DIR] [--presets grpo erpo]
    python scripts/preset_metrics.py compare OUT_BEFORE OUT_AFTER

`run` trains each preset of `algorithms.AlgorithmName` for `--steps` steps of `configs/quickstart.yaml` (float32,
seed 0, no sweep, no checkpoint), one `erpo fit` each, with the code of `--source` (a checkout or worktree; default
this one), and keeps each run's metrics.csv as OUT/<preset>.csv. `compare` prints JSON: per preset (per <name>.csv of
the first folder), whether every value both sides logged, but the wall-clock timings, is equal (bit for bit, as written
by the CSV logger), else the first differing row, its step and every metric that differs there; and the columns only
one side logged (an older commit logs fewer). On one
machine and one commit a run is bit-deterministic, so any difference is the change's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import get_args

REPOSITORY = Path(__file__).resolve().parent.parent
NO_CALLBACKS = "trainer:\n  callbacks: []\n  enable_checkpointing: false\n"
WALL_CLOCK = ("rollout/tokens_per_s", "rollout/weight_sync_ms")  # timings: they differ between any two runs


def run(out: Path, steps: int, source: Path, presets: list[str] | None = None) -> None:
    """Train every preset (or `presets`) for `steps` steps with the code of `source`; OUT/<preset>.csv each."""
    sys.path.insert(0, str(source))
    from erpo_lightning.objectives.algorithms import AlgorithmName

    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="preset_metrics_"))
    (work / "no_callbacks.yaml").write_text(NO_CALLBACKS)
    env = {**os.environ, "PYTHONPATH": str(source), "ERPO_CACHE_HOME": str(work / "cache")}
    for preset in presets or get_args(AlgorithmName):
        root = work / preset
        command = [
            sys.executable, "-m", "erpo_lightning.cli", "fit", "--config", "configs/quickstart.yaml",
            "--config", str(work / "no_callbacks.yaml"), "--model.algorithm", preset,
            "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root),
            "--data.cache_dir", str(work / "cache" / "reference"),
        ]  # fmt: skip
        result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{preset}: erpo fit failed:\n{result.stderr[-3000:]}")
        # An older commit's quickstart config fixes its logger's save_dir (runs/quickstart): then the newest there.
        found = (
            list(root.rglob("metrics.csv"))
            or sorted((source / "runs").rglob("metrics.csv"), key=lambda path: path.stat().st_mtime)[-1:]
        )
        (metrics,) = found
        (out / f"{preset}.csv").write_text(metrics.read_text())
        print(f"{preset}: {steps} steps", file=sys.stderr, flush=True)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


def compare(before: Path, after: Path) -> dict:
    """Per file name in `before` (<name>.csv): `equal` over the columns both logged (the wall-clock timings left out),
    else the first row that differs, its step and every metric that differs there (before, after); and the columns
    only one side logged."""
    verdicts = {}
    for path in sorted(before.glob("*.csv")):
        other = after / path.name
        if not other.exists():
            verdicts[path.stem] = {"equal": False, "missing": str(other)}
            continue
        first, second = rows(path), rows(other)
        names_a, names_b = list(first[0]) if first else [], list(second[0]) if second else []
        common = [name for name in names_a if name in names_b and name not in WALL_CLOCK]
        verdict = {"equal": len(first) == len(second), "rows": [len(first), len(second)]}
        verdict["only_before"] = [name for name in names_a if name not in names_b]
        verdict["only_after"] = [name for name in names_b if name not in names_a]
        for number, (a, b) in enumerate(zip(first, second, strict=False)):
            differing = {name: [a[name], b[name]] for name in common if a[name] != b[name]}
            if differing:
                verdict.update(equal=False, row=number, step=a.get("step"), differing=differing)
                break
        verdicts[path.stem] = verdict
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("out", type=Path)
    run_parser.add_argument("--steps", type=int, default=3)
    run_parser.add_argument("--source", type=Path, default=REPOSITORY)
    run_parser.add_argument("--presets", nargs="+", help="these presets only (default: every one)")
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("before", type=Path)
    compare_parser.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.steps, args.source.resolve(), args.presets)
    else:
        verdicts = compare(args.before, args.after)
        print(json.dumps(verdicts, indent=1))
        raise SystemExit(0 if all(v["equal"] for v in verdicts.values()) else 1)


if __name__ == "__main__":
    main()
