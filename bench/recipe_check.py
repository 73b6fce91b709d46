"""The one-GPU recipe's own training step, a few steps of it, with no network; prints JSON (bench/gpu_check.sh's
`recipe` part).

The recipe (`--config`, configs/one_gpu_qwen2.5_math_1.5b.yaml by default) is read when this runs, so the check
follows whatever it sets (precision, checkpointing, Query-KL scoring, output layer, rollout correction, micro-batch
budget, group size, response cap, ...). Only what needs the network or does not belong to a step is swapped:

- the model: randomly initialised at the recipe model's shape (its config.json when found locally, else the shape
  recorded here for the Hub id), with the byte-level tokenizer (`toy.tiny_qwen2`, ChatML template; the sampled ids
  past its 259 tokens decode to nothing, so the rewards are 0 and responses run to `max_new_tokens`: the longest,
  costliest step the recipe allows);
- the training data: the packaged GSM8K test split (`{name: gsm8k}`), twice as many problems as the steps use;
- the engine: the recipe's (vLLM) when vLLM imports here, else `HFEngine`, which samples from the policy itself;
- the callbacks: no sweeps, export or checkpoints; the package's `PhaseTimes` records each step.

Reported per step: wall time and its phases (`callbacks/phase_times.py`), peak CUDA memory (allocated, reset each
step), and from the run's metrics the engine–trainer log-prob gap (`train/logprob_abs_diff`: mean |engine log-prob −
trainer log-prob| over the sampled tokens, from the step's own forward) and the mean response length. `--smoke`:
the same path on CPU at a tiny size (2 layers, 2 queries × 2 responses, 8 new tokens).

    python bench/recipe_check.py --steps 3                       # on the GPU machine (bench/gpu_check.sh)
    .venv/bin/python bench/recipe_check.py --smoke               # on CPU
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from bench_step import SHAPE_FIELDS, SIZES
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "configs" / "one_gpu_qwen2.5_math_1.5b.yaml"
KNOWN_SHAPES = {"Qwen/Qwen2.5-Math-1.5B": "1.5b"}  # Hub id -> bench_step.SIZES: its body and vocabulary
SMOKE = {"batch_size": 2, "group_size": 2, "max_new_tokens": 8}  # data.batch_size, rollout's, rollout's
DROPPED_CALLBACKS = ("TemperatureSweepCallback", "HFExportCallback", "ModelCheckpoint")


def recipe_shape(model_path: str) -> dict:
    """The recipe model's Qwen2 shape (bench_step.SHAPE_FIELDS): its config.json if it is found without the
    network, else KNOWN_SHAPES."""
    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        return {field: getattr(config, field) for field in SHAPE_FIELDS}
    except OSError:
        pass
    if model_path not in KNOWN_SHAPES:
        sys.exit(f"no local config.json for {model_path} and no shape recorded for it (KNOWN_SHAPES)")
    return SIZES[KNOWN_SHAPES[model_path]]


def build_model(shape: dict, context: int, folder: Path, device: str) -> Path:
    """A randomly initialised Qwen2 of `shape` (seed 0) with the byte tokenizer, saved in `folder`."""
    tokenizer = build_byte_tokenizer()
    config = Qwen2Config(
        **shape, max_position_embeddings=context, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # a 1.5B model initialises in seconds on the GPU, a minute on CPU
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def checked_config(recipe: dict, model: Path, root: Path, steps: int, smoke: bool) -> tuple[dict, str]:
    """The recipe with the swaps of the module docstring, and the engine's class name."""
    config = json.loads(json.dumps(recipe))  # a deep copy
    trainer, data, rollout = config["trainer"], config["data"], config["rollout"]
    callbacks = [
        c for c in trainer.get("callbacks") or [] if c["class_path"].rsplit(".", 1)[-1] not in DROPPED_CALLBACKS
    ]
    callbacks.append({"class_path": "erpo_lightning.callbacks.PhaseTimes", "init_args": {"path": str(root / "phases")}})
    trainer.update(
        max_steps=steps, default_root_dir=str(root / "run"), enable_checkpointing=False, callbacks=callbacks,
        logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root / "run")}},
    )  # fmt: skip
    if smoke:
        trainer.update(accelerator="cpu", devices=1)
        data["batch_size"], rollout["group_size"] = SMOKE["batch_size"], SMOKE["group_size"]
        rollout["max_new_tokens"] = SMOKE["max_new_tokens"]
    config["model"]["model_path"] = str(model)
    # twice what the steps use: the byte tokenizer makes prompts longer, and those past max_prompt_length are dropped
    data["train"] = [{"name": "gsm8k", "limit": 2 * data["batch_size"] * steps, "label": "gsm8k_test"}]
    data["cache_dir"] = str(root / "cache")
    if smoke or importlib.util.find_spec("vllm") is None:
        rollout["engine"] = {"class_path": "erpo_lightning.rollout.HFEngine"}
    return config, rollout["engine"]["class_path"].rsplit(".", 1)[-1]


def read_steps(root: Path) -> list[dict]:
    """Each step's PhaseTimes line with its gap and mean response length from the run's metrics.csv (the n-th
    logged value of each is the n-th step's: one of each per step)."""
    lines = [json.loads(line) for line in (root / "phases").read_text().splitlines()]
    (metrics_file,) = (root / "run").rglob("metrics.csv")
    with metrics_file.open() as rows:
        rows = list(csv.DictReader(rows))
    for key, name in (
        ("train/logprob_abs_diff", "logprob_abs_diff"),
        ("rollout/response_length_mean", "response_length_mean"),
    ):
        values = [float(row[key]) for row in rows if row.get(key)]
        for line, value in zip(lines, values + [None] * len(lines), strict=False):
            line[name] = value
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--steps", type=int, default=3, help="training steps; the first is left out of the medians")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model and sizes")
    args = parser.parse_args()
    recipe = yaml.safe_load(Path(args.config).read_text())
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    shape = SIZES["tiny"] if args.smoke else recipe_shape(recipe["model"]["model_path"])
    with tempfile.TemporaryDirectory(prefix="recipe-check-") as folder:
        root = Path(folder)
        context = recipe["data"]["max_prompt_length"] + recipe["rollout"]["max_new_tokens"]
        started = time.perf_counter()
        model = build_model(shape, max(context, 1024), root / "model", device)
        built_s = time.perf_counter() - started
        config, engine = checked_config(recipe, model, root, args.steps, args.smoke)
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "erpo_lightning.cli", "fit", "--config", str(root / "config.yaml")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
        fit_s = time.perf_counter() - started
        sys.stderr.write(done.stderr[-20000:])
        if done.returncode != 0:
            sys.exit(f"erpo fit failed (exit {done.returncode})")
        steps = read_steps(root)
    timed = steps[1:] or steps
    gaps = [step["logprob_abs_diff"] for step in timed if step["logprob_abs_diff"] is not None]
    report = {
        "config": args.config, "smoke": args.smoke, "device": device, "engine": engine, "shape": shape,
        "model_settings": config["model"], "sizes": {
            "batch_size": config["data"]["batch_size"], "group_size": config["rollout"]["group_size"],
            "max_new_tokens": config["rollout"]["max_new_tokens"],
            "max_prompt_length": config["data"]["max_prompt_length"],
        },
        "model_build_s": built_s, "fit_s": fit_s, "steps": steps,
        "step_s_median": statistics.median(step["wall_s"] for step in timed),
        "cuda_peak_mib_max": max((step.get("cuda_peak_mib", 0.0) for step in steps), default=0.0) or None,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "logprob_abs_diff_median": statistics.median(gaps) if gaps else None,
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
