"""Where a real `erpo fit` step's time goes, phase by phase; prints JSON.

One `erpo fit --config CONFIG` (the quickstart's by default) for `--steps` steps with the package's `PhaseTimes`
callback appended (`erpo_lightning/callbacks/phase_times.py`), which records each training step's seconds in
generation, grading (decoding included), the engine's weight sync and wake/sleep, the rollout batch's assembly, the
old-log-prob recompute, per-step w(q), the Query-KL pass (forward and backward; under the shared prompt the prompt
forward and its closing backward), the micro-batches' forwards and backwards, the optimizer (clipping, step,
zeroing), the metrics, the heap release and in-training sweeps; `other` is the rest of the step's wall time
(Lightning's loop, loggers, checkpoints, progress lines). The JSON holds every step's record, and over the timed
steps (all but the first `--skip`) each phase's median seconds and its share of the summed wall time.

    .venv/bin/python bench/profile_fit.py --steps 12                     # the quickstart: toy model, HF engine
    .venv/bin/python bench/profile_fit.py --config configs/smollm2_arith.yaml \\
        --model "$(.venv/bin/python -m erpo_lightning.real_model)" --steps 6    # SmolLM2-135M, vLLM
    .venv/bin/python bench/profile_fit.py --steps 12 -- --model.query_kl_scoring shared_prompt   # any erpo flag

The run is the config's but for what runs outside the steps: its temperature sweep runs neither before nor after
training (`--sweep-every K`: every K steps inside it, its cost then the `sweep` phase) and its Hugging Face export is
left out. The run's folder is temporary; the reference cache is the config's (built by the first run, read after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def profiled_config(args: argparse.Namespace, folder: Path) -> Path:
    """`--config` with its temperature sweep moved inside training (every `--sweep-every` steps, none before or
    after: those run outside the steps) and without the end-of-run Hugging Face export, written into `folder`."""
    config = yaml.safe_load(Path(args.config).read_text())
    callbacks = []
    for callback in config.get("trainer", {}).get("callbacks") or []:
        name = callback.get("class_path", "") if isinstance(callback, dict) else ""
        if name.endswith("HFExportCallback"):
            continue
        if name.endswith("TemperatureSweepCallback"):
            init = {**callback.get("init_args", {}), "run_at_start": False, "run_at_end": False}
            if args.sweep_every is not None:
                init["every_n_steps"] = args.sweep_every
            callback = {**callback, "init_args": init}
        callbacks.append(callback)
    config.setdefault("trainer", {})["callbacks"] = callbacks
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fit_command(args: argparse.Namespace, config: Path, run_dir: Path, times: Path) -> list[str]:
    """`python -m erpo_lightning.cli fit` with the config, the step count, the run folder and the callback."""
    command = [
        sys.executable, "-m", "erpo_lightning.cli", "fit", "--config", str(config),
        "--trainer.max_steps", str(args.steps), "--trainer.default_root_dir", str(run_dir),
    ]  # fmt: skip
    if args.model:
        command += ["--model.model_path", args.model]
    return [
        *command, *args.extra,
        "--trainer.callbacks+=erpo_lightning.callbacks.PhaseTimes", "--trainer.callbacks.init_args.path", str(times),
    ]  # fmt: skip


def summarise(records: list[dict], skip: int) -> dict:
    """Each phase's median seconds over the timed steps (a phase absent from a step counts 0 there) and its share
    of their summed wall time."""
    timed = records[skip:]
    if not timed:
        return {}
    names = sorted({key for record in timed for key in record if key.endswith("_s") and key != "wall_s"})
    wall = sum(record["wall_s"] for record in timed)
    return {
        "timed_steps": len(timed),
        "wall_s_median": statistics.median(record["wall_s"] for record in timed),
        "median_s": {name[:-2]: statistics.median(record.get(name, 0.0) for record in timed) for name in names},
        "share_of_wall": {name[:-2]: sum(record.get(name, 0.0) for record in timed) / wall for name in names},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--model", help="model.model_path (e.g. SmolLM2's folder for configs/smollm2_arith.yaml)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=1, help="first steps left out of the summary (warm-up)")
    parser.add_argument("--sweep-every", type=int, help="sweep every this many steps inside training")
    parser.add_argument("--threads", type=int, help="torch threads (OMP_NUM_THREADS); default: torch's")
    parser.add_argument("extra", nargs="*", help="more `erpo fit` flags, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="profile-fit-") as folder:
        run_dir, times = Path(folder) / "run", Path(folder) / "phase_times.jsonl"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        command = fit_command(args, profiled_config(args, Path(folder)), run_dir, times)
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
        if done.returncode != 0:
            sys.exit(f"erpo fit failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        records = [json.loads(line) for line in times.read_text().splitlines()]
    report = {
        "config": {key: value for key, value in vars(args).items()},
        "command": command[1:],
        "steps": records,
        **summarise(records, args.skip),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
