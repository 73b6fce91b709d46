"""Query-KL at θ0 on a real model, per dtype: exactly 0 with no signal, and drift still pulled back. Prints JSON.

Two measurements for each `--dtypes` entry, both with exact query scoring (the default) and no tolerance:

- `zero_signal`: `erpo fit` as a user runs it (the real CLI, QueryDataModule's cache build, HF engine) on the toy
  task's first `--queries` problems through the model's chat template, with `ThinkFormatReward` and responses cut at 3
  tokens, too short for `<think>…</think>`: every reward is 0, no group has signal, so only the regulariser (and the
  optimizer's state, here none, as weight decay is 0) could move the policy. Reports token-k3 Query-KL at every step;
  it should be exactly 0 at the first step and stay ≤ 1e-9.
- `pulled_back`: the same model, every weight perturbed by Gaussian noise of `--noise` times its tensor's standard
  deviation, then `--pull-back-steps` (default `--steps`) updates on a replayed batch whose rewards are all 0 (every
  advantage 0, so the only gradient is Query-KL's). Reports token-k3 at every step; the regulariser works if it falls.

    .venv/bin/python bench/bench_theta0.py --model-path "$(.venv/bin/python -m erpo_lightning.real_model)"
    .venv/bin/python bench/bench_theta0.py --model-path erpo_lightning/toy/shipped --chat-template false
    # bfloat16's backward is slow on a CPU without bf16 matrix units: its pull-back alone, with fewer updates
    .venv/bin/python bench/bench_theta0.py --model-path "$(.venv/bin/python -m erpo_lightning.real_model)" \
        --dtypes bfloat16 --measurements pulled_back --pull-back-steps 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
import yaml
from bench_step import attach_reference_cache, fit_replayed, rollout_batch
from transformers import AutoConfig

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "erpo_lightning" / "toy" / "shipped" / "train.jsonl"


def zero_signal_fit(args, dtype: str, workdir: Path) -> list[float]:
    """token-k3 Query-KL of each step of a zero-signal `erpo fit` (see the module docstring)."""
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_steps": args.steps, "accelerator": "cpu", "default_root_dir": str(workdir), "log_every_n_steps": 1,
            "enable_checkpointing": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(workdir)}},
        },
        "model": {"model_path": args.model_path, "algorithm": "erpo", "dtype": dtype, "learning_rate": 1e-5,
                  "micro_batch_tokens": 512, "weight_decay": 0.0},
        "data": {"train": [{"path": str(TRAIN), "label": "toy_train", "limit": args.queries}], "template": "plain",
                 "use_chat_template": args.chat_template, "max_prompt_length": 128, "batch_size": 8,
                 "cache_dir": str(workdir / "cache")},
        "rollout": {"engine": {"class_path": "erpo_lightning.rollout.HFEngine"},
                    "reward": {"class_path": "erpo_lightning.rewards.ThinkFormatReward"},
                    "group_size": 4, "max_new_tokens": 3, "temperature": 1.0, "seed": 0},
    }  # fmt: skip
    path = workdir / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    erpo = str(Path(sys.executable).with_name("erpo"))
    done = subprocess.run([erpo, "fit", "--config", str(path)], capture_output=True, text=True, cwd=workdir)
    if done.returncode != 0:
        sys.exit(f"erpo fit ({dtype}) failed:\n{done.stderr[-4000:]}")
    import pandas as pd

    metrics = pd.read_csv(next(workdir.rglob("metrics.csv"))).dropna(subset=["train/query_kl_token_k3"])
    if (metrics["rollout/reward_mean"] != 0).any():
        sys.exit(f"a reward was not 0 ({dtype}): the run had a learning signal, so it measures nothing here")
    return metrics["train/query_kl_token_k3"].tolist()


def pulled_back(args, dtype: str) -> list[float]:
    """token-k3 Query-KL of each step after perturbing the policy (see the module docstring)."""
    from erpo_lightning.modules.erpo_module import ERPOModule

    shape = argparse.Namespace(queries=8, group_size=4, prompt_len=64, response_len=16)
    batch = rollout_batch(shape, AutoConfig.from_pretrained(args.model_path).vocab_size)
    batch.rollout = replace(batch.rollout, rewards=torch.zeros_like(batch.rollout.rewards))
    module = ERPOModule(args.model_path, algorithm="erpo", dtype=dtype, learning_rate=1e-5, micro_batch_tokens=512)
    module.configure_model()
    attach_reference_cache(module, batch)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in module.policy.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * parameter.float().std().nan_to_num()
            parameter.add_((args.noise * noise).to(parameter.dtype))
    logged: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, *_):
            logged.append(float(trainer.callback_metrics["train/query_kl_token_k3"]))

    fit_replayed(module, batch, args.pull_back_steps - 1, callbacks=[Record()])
    return logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="a Hugging Face model folder")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=10, help="steps of the zero-signal fit")
    parser.add_argument("--pull-back-steps", type=int, help="updates of the perturbed policy (default: --steps)")
    parser.add_argument(
        "--measurements",
        nargs="+",
        choices=["zero_signal", "pulled_back"],
        default=["zero_signal", "pulled_back"],
        help="which measurements to run, each per dtype",
    )
    parser.add_argument("--queries", type=int, default=64, help="training problems of the zero-signal fit")
    parser.add_argument("--chat-template", type=lambda text: text == "true", default=True)
    parser.add_argument("--noise", type=float, default=0.1, help="perturbation, in units of each tensor's std")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.model_path = str(Path(args.model_path).resolve())  # the fit runs in its own work folder
    args.pull_back_steps = args.pull_back_steps or args.steps
    if args.pull_back_steps < 2:
        parser.error("--pull-back-steps must be at least 2: the first and the last step are compared")
    torch.set_num_threads(args.threads)
    results = {}
    for dtype in args.dtypes:
        start = time.perf_counter()
        result = {}
        # Each measurement is printed as it ends, so that a stopped run keeps what it measured (a bfloat16 backward
        # on a CPU without bf16 matrix units can take hours).
        if "zero_signal" in args.measurements:
            workdir = Path(tempfile.mkdtemp(prefix="bench_theta0_"))
            try:
                zero = zero_signal_fit(args, dtype, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            print(f"{dtype} zero_signal token_k3: {zero}", file=sys.stderr, flush=True)
            result |= {"zero_signal_token_k3": zero, "zero_signal_first_is_exactly_0": zero[0] == 0.0,
                       "zero_signal_max": max(zero)}  # fmt: skip
        if "pulled_back" in args.measurements:
            back = pulled_back(args, dtype)
            print(f"{dtype} pulled_back token_k3: {back}", file=sys.stderr, flush=True)
            result |= {"pulled_back_token_k3": back,
                       "pulled_back_ratio_last_over_first": back[-1] / back[0] if back[0] else None}  # fmt: skip
        results[dtype] = result | {"seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps({"config": vars(args), "torch": torch.__version__, "results": results}, indent=2))


if __name__ == "__main__":
    main()
