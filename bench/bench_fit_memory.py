"""Memory of a real `erpo fit`, phase by phase: resident set, its peak and glibc's heap after the reference cache,
the engine build (and start sweep), each step's rollout (weight sync + generation) and optimizer steps, and the end
sweep; prints JSON.

Each side is one `erpo fit --config CONFIG` in a fresh process with bench/memory_probe.py's PhaseProbe appended to
the trainer's callbacks (see that file for the phases and what each figure means), interleaved over `--rounds`.
Sides differ by environment and flags (SIDES): `package` is the command and config as shipped, `before` the code and
config before the memory work, the others the candidates measured to choose the setting. The
JSON gives, per side, every phase record of the last round, the whole run's peak resident set (the largest phase
peak), the median step time (rollout + optimizer steps, the first step left out), the seconds from launching the
command to the start of the first training step (the reference cache is built in the first run and read after), the
wall time, and what the last round learned (each step's Query-KL, reward and accuracy, and the held-out sweep's avg@k
before and after training, from its metrics.csv).

    .venv/bin/python bench/bench_fit_memory.py --config configs/smollm2_arith.yaml \\
        --model "$(.venv/bin/python -m erpo_lightning.real_model)" --steps 4 --sweep-problems 25

`--built-vocab` swaps the model for a randomly initialised Qwen2 with SmolLM2-135M's body (30 layers, hidden 576, 9
heads, 3 KV heads, MLP 1,536) and either the byte tokenizer (`bytes`: 320 tokens) or `--model`'s tokenizer (`model`:
49,152 for SmolLM2), built into the run's temporary folder with its own reference cache: the two differ only in the
vocabulary, which is what the planning table in docs/real_model.md compares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interleave import alternating
from transformers import AutoTokenizer

from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, build_tiny_qwen2

REPO = Path(__file__).resolve().parent.parent
ERPO = str(Path(sys.executable).with_name("erpo"))
# Each side: environment and extra `erpo fit` flags. `package`: the command and config as shipped. `untuned`: without
# the heap release between phases (ERPO_MALLOC_TRIM=0, erpo_lightning/common/memory.py). `before`: also the example's
# micro-batch token budget before 2026-12-02 (4,096), i.e. the code and config before the memory work. The other two
# are the candidates measured first, through glibc's own environment variables (read at process start): a fixed
# 1 MiB mmap threshold (blocks from 1 MiB up mapped one by one and unmapped on free; fixing it also stops glibc
# raising it after each large free), and two arenas instead of eight per core. The last four are the candidates for
# a step's own peak, on top of the package: half the micro-batch (activations and logits scale with its tokens), half
# the KV cache (vLLM's preallocated block pool), and recomputing each layer's activations in backward (alone and with
# half the KV cache). `lora`: LoRA adapters instead of full fine-tuning (docs/lora.md), at r = 16 on every linear
# layer with docs/lora.md's learning rate (1e-4, ten times the example's: adapters start at B = 0 and are commonly
# trained at a larger rate than the full model), everything else as shipped.
UNTUNED = {"ERPO_MALLOC_TRIM": "0"}
MICRO_512 = ["--model.micro_batch_tokens", "512"]
KV_512MIB = ["--rollout.engine.init_args.kv_cache_memory_bytes", str(2**29)]
CHECKPOINTING = ["--model.gradient_checkpointing", "true"]
SIDES: dict[str, dict] = {
    "package": {"env": {}, "flags": []},
    "untuned": {"env": UNTUNED, "flags": []},
    "before": {"env": UNTUNED, "flags": ["--model.micro_batch_tokens", "4096"]},
    "mmap_1mib": {"env": {**UNTUNED, "MALLOC_MMAP_THRESHOLD_": str(2**20)}, "flags": []},
    "arenas_2": {"env": {**UNTUNED, "MALLOC_ARENA_MAX": "2"}, "flags": []},
    "micro_512": {"env": {}, "flags": MICRO_512},
    "micro_512_kv_512mib": {"env": {}, "flags": [*MICRO_512, *KV_512MIB]},
    "checkpointing": {"env": {}, "flags": CHECKPOINTING},
    "checkpointing_kv_512mib": {"env": {}, "flags": [*CHECKPOINTING, *KV_512MIB]},
    "lora": {"env": {}, "flags": ["--model.peft.r", "16", "--model.learning_rate", "1e-4"]},
}
# What the run learned, from its metrics.csv: per-step columns reported as lists, and the held-out sweep's columns
# (before and after training) as they were logged.
STEP_COLUMNS = ("train/query_kl_token_k3", "train/query_kl", "rollout/reward_mean", "rollout/accuracy")
SWEEP_PREFIX = "val/avg@k/mean"  # the sweep's Avg@k over benchmarks: overall and per temperature (/T=...)


SMOLLM2_BODY = {"hidden_size": 576, "num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "intermediate_size": 1536}


def build_model(vocab: str, tokenizer_path: str | None, folder: Path) -> Path:
    """SmolLM2-135M's body, randomly initialised, with the byte tokenizer or `tokenizer_path`'s, saved in `folder`."""
    if vocab == "model" and not tokenizer_path:
        sys.exit("--built-vocab model takes the tokenizer of --model: give --model")
    tokenizer = build_byte_tokenizer() if vocab == "bytes" else AutoTokenizer.from_pretrained(tokenizer_path)
    model = build_tiny_qwen2(tokenizer, **SMOLLM2_BODY)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def fit_command(args: argparse.Namespace, run_dir: Path, side: str, model: str | None) -> list[str]:
    command = [
        ERPO, "fit", "--config", args.config, "--trainer.max_steps", str(args.steps),
        "--trainer.default_root_dir", str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir),
    ]  # fmt: skip
    if model:
        command += ["--model.model_path", model]
    if args.built_vocab:
        command += ["--data.cache_dir", str(run_dir / "reference")]
    if args.sweep_problems is not None:
        command += ["--trainer.callbacks.init_args.sweep.max_problems", str(args.sweep_problems)]
    if args.batch_size is not None:
        command += ["--data.batch_size", str(args.batch_size)]
    if args.max_new_tokens is not None:
        command += ["--rollout.max_new_tokens", str(args.max_new_tokens)]
    # Last: `--trainer.callbacks.init_args...` above applies to the last callback listed so far (the sweep's).
    return [*command, *args.extra, *SIDES[side]["flags"], "--trainer.callbacks+=memory_probe.PhaseProbe"]


def one_run(side: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"fit-memory-{side}-") as folder:
        run_dir, probe = Path(folder) / "run", Path(folder) / "probe.jsonl"
        model = args.model
        if args.built_vocab:
            model = str(build_model(args.built_vocab, args.model, Path(folder) / "model"))
        python_path = os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, **SIDES[side]["env"], "ERPO_MEMORY_PROBE": str(probe), "PYTHONPATH": python_path}
        started, launched = time.perf_counter(), time.time()
        command = fit_command(args, run_dir, side, model)
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"side {side} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        records = [json.loads(line) for line in probe.read_text().splitlines()]
        learned = training_metrics(run_dir)
    starts = {r["step"]: r["seconds"] for r in records if r["phase"] == "step_start"}
    step_seconds = [r["seconds"] - starts[r["step"]] for r in records if r["phase"] == "train"]
    first_step = next(r["unix_time"] for r in records if r["phase"] == "step_start")
    return {
        "wall_seconds": round(wall, 1),
        "launch_to_first_step_seconds": round(first_step - launched, 1),
        "peak_rss_gib": round(max(r["peak"] for r in records) / 2**30, 3),
        "median_step_seconds": round(statistics.median(step_seconds[1:] or step_seconds), 2),
        "phases": records,
        "metrics": learned,
    }


def training_metrics(run_dir: Path) -> dict[str, list[float]]:
    """STEP_COLUMNS per training step and the sweep's `SWEEP_PREFIX` columns (start, end) of the run's metrics.csv."""
    import pandas as pd

    found = sorted(run_dir.rglob("metrics.csv"))
    if len(found) != 1:
        sys.exit(f"expected one metrics.csv under {run_dir}, found {len(found)}: set a CSVLogger in the config")
    table = pd.read_csv(found[0])
    steps = table.dropna(subset=["train/query_kl_token_k3"])
    learned = {name: [round(float(value), 6) for value in steps[name]] for name in STEP_COLUMNS if name in steps}
    for name in (column for column in table.columns if column.startswith(SWEEP_PREFIX)):
        learned[name] = [round(float(value), 4) for value in table[name].dropna()]
    return learned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/smollm2_arith.yaml")
    parser.add_argument("--model", help="model.model_path (e.g. the SmolLM2 directory)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sweep-problems", type=int, help="max_problems of the config's sweep callback")
    parser.add_argument("--batch-size", type=int, help="data.batch_size (queries per step)")
    parser.add_argument("--max-new-tokens", type=int, help="rollout.max_new_tokens")
    parser.add_argument("--built-vocab", choices=["bytes", "model"], help="a built model instead (see above)")
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=["package", "before"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="more `erpo fit` flags, after --")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    for _, side in alternating(args.sides, args.rounds):
        results[side].append(one_run(side, args))
        print(f"{side}: peak {results[side][-1]['peak_rss_gib']} GiB", file=sys.stderr, flush=True)
    summary = {
        side: {
            "peak_rss_gib": [r["peak_rss_gib"] for r in runs],
            "median_step_seconds": [r["median_step_seconds"] for r in runs],
            "wall_seconds": [r["wall_seconds"] for r in runs],
            "launch_to_first_step_seconds": [r["launch_to_first_step_seconds"] for r in runs],
            "metrics_last_round": runs[-1]["metrics"],
            "phases_last_round": runs[-1]["phases"],
        }
        for side, runs in results.items()
    }
    settings = {"config": args.config, "steps": args.steps, "rounds": args.rounds, "batch_size": args.batch_size}
    print(json.dumps({**settings, "built_vocab": args.built_vocab, "sides": summary}, indent=1))


if __name__ == "__main__":
    main()
