"""Does LoRA alone keep the queries near θ0? GRPO with and without LoRA, and ERPO without it, on the toy task; prints
JSON. Descriptive, not a pre-registered claim: one setting, a few seeds, no decision rule.

Each run is `erpo fit --config configs/quickstart.yaml` (the shipped 0.28M toy model and task, HF engine) for
`--steps` steps with no checkpoints and no sweeps, the arm's flags (ARMS) and the seed's flags (`seed_everything`,
`rollout.seed` and `data.seed`, as the studies set them), one run at a time, arms interleaved within each seed. The
JSON gives per arm and seed the final and largest token-k3 Query-KL (`train/query_kl_token_k3`: the same estimator
for every arm), the mean reward of the first and last 20 steps, the number of training parameters and the wall time.

    .venv/bin/python bench/bench_lora_drift.py --steps 40 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_fit_memory import training_metrics

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "quickstart.yaml"
ERPO = str(Path(sys.executable).with_name("erpo"))
# The LoRA arm: r = 4, alpha = 8 (scale 2, as docs/lora.md's r = 16, alpha = 32) on every linear layer (7.66% of the
# toy model's parameters train), at ten times the full model's learning rate (docs/lora.md's ratio for SmolLM2).
LORA = ["--model.peft.r", "4", "--model.peft.alpha", "8", "--model.learning_rate", "1e-3"]
ARMS: dict[str, list[str]] = {
    "grpo": ["--model.algorithm", "grpo"],
    "grpo_lora": ["--model.algorithm", "grpo", *LORA],
    "erpo": ["--model.algorithm", "erpo"],
}
WINDOW = 20  # steps averaged for the first and last reward


def base_config(folder: Path) -> Path:
    """The quickstart's config without its callbacks (checkpoints, export, sweeps) and logging under `folder`."""
    config = yaml.safe_load(CONFIG.read_text())
    config["trainer"].update({"callbacks": [], "enable_checkpointing": False, "default_root_dir": str(folder)})
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(folder)
    config["data"]["cache_dir"] = str(folder / "reference")  # built by the first run, reused by the others
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def one_run(config: Path, arm: str, seed: int, steps: int, folder: Path) -> dict:
    run_dir = folder / f"{arm}_seed{seed}"
    seeds = ["--seed_everything", str(seed), "--rollout.seed", str(seed), "--data.seed", str(seed)]
    command = [
        ERPO, "fit", "--config", str(config), "--trainer.max_steps", str(steps), *seeds, *ARMS[arm],
        "--trainer.default_root_dir", str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"{arm} seed {seed} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    learned = training_metrics(run_dir)
    kl, reward = learned["train/query_kl_token_k3"], learned["rollout/reward_mean"]
    trained = next((line for line in (done.stdout + done.stderr).splitlines() if "parameters train" in line), None)
    return {
        "steps": len(kl),
        "query_kl_token_k3_final": kl[-1],
        "query_kl_token_k3_max": max(kl),
        "reward_first": round(statistics.fmean(reward[:WINDOW]), 4),
        "reward_last": round(statistics.fmean(reward[-WINDOW:]), 4),
        "lora_line": trained,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    args = parser.parse_args()
    if args.steps < WINDOW:
        sys.exit(f"--steps must be >= {WINDOW} (the reward window), got {args.steps}")
    results: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    with tempfile.TemporaryDirectory(prefix="lora-drift-") as folder:
        config = base_config(Path(folder))
        for seed in args.seeds:
            for arm in args.arms:
                results[arm][seed] = one_run(config, arm, seed, args.steps, Path(folder))
                print(f"{arm} seed {seed}: {json.dumps(results[arm][seed])}", file=sys.stderr, flush=True)
    print(json.dumps({"config": str(CONFIG.relative_to(REPO)), "steps": args.steps, "arms": ARMS, "runs": results},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
