"""Benchmark: reference score cache throughput vs a bare batched forward over the same tokens, in one run.

    .venv/bin/python bench/bench_cache.py                      # tiny Qwen2 built here, gsm8k + math500, CPU
    .venv/bin/python bench/bench_cache.py --model /path/to/Qwen2.5-0.5B --device cuda --dtype bfloat16

Prints one JSON object. Methods, all over the same queries (query tokens = real prompt tokens):
  bare_forward      `model(input_ids)` under no_grad on the cache's own length-sorted batches: the floor.
  cache             `compute_reference_logprobs` (the same batches + log-softmax gather, per-query split, chunk files
                    written for resumability, progress bar): what `erpo cache` spends after loading the model.
  naive_forward     `model(input_ids)` on batches in file order of the same row count (what sorting saves).
  end_to_end        `QueryDataModule.build_or_load_cache(force=True)`: hashing weights, loading the model,
                    computing and writing the cache.
  paired            the same comparison batch by batch: each batch runs bare, cache log-probs
                    (`batch_query_logprobs`), cache log-probs, bare (ABBA), so that load changes on a shared
                    machine hit both sides alike.
ratio_cache_vs_bare_forward = cache tokens/s ÷ bare_forward tokens/s over whole passes (goal ≥ 0.9);
ratio_paired = the same from the paired timings (the steadier number on a busy CPU).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from interleave import alternating

from erpo_lightning.data import QueryDataModule, compute_reference_logprobs, load_reference_model
from erpo_lightning.data.reference_logprobs import batch_query_logprobs, plan_batches, plan_chunks
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_interleaved(methods: dict, device: torch.device, repeats: int) -> dict[str, float]:
    """Best wall time (seconds) of each method over `repeats` interleaved rounds (interleave.alternating)."""
    best = dict.fromkeys(methods, float("inf"))
    for _, name in alternating(list(methods), repeats):
        synchronize(device)
        start = time.perf_counter()
        methods[name]()
        synchronize(device)
        best[name] = min(best[name], time.perf_counter() - start)
    return best


def right_padded(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """`rows` of token ids as one [len(rows), longest] tensor on `device`, right-padded with id 0."""
    padded = torch.zeros(len(rows), max(len(row) for row in rows), dtype=torch.long)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = torch.as_tensor(row)
    return padded.to(device)


@torch.no_grad()
def bare_forward(model, prompts, batches) -> None:
    device = next(model.parameters()).device
    for batch in batches:
        model(input_ids=right_padded([prompts[i] for i in batch], device))


def paired(model, prompts, batches, device: torch.device) -> dict[str, float]:
    """Total seconds of bare forwards and of cache scoring, run ABBA on every batch."""
    totals = {"bare_forward": 0.0, "cache_scoring": 0.0}
    runs = {
        "bare_forward": lambda batch: bare_forward(model, prompts, [batch]),
        "cache_scoring": lambda batch: batch_query_logprobs(model, [prompts[i] for i in batch]),
    }
    for batch in batches:
        for name in ("bare_forward", "cache_scoring", "cache_scoring", "bare_forward"):
            synchronize(device)
            start = time.perf_counter()
            runs[name](batch)
            synchronize(device)
            totals[name] += time.perf_counter() - start
    return {name: total / 2 for name, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: a tiny Qwen2 built in a temporary directory)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size of the built tiny model")
    parser.add_argument("--layers", type=int, default=2, help="layers of the built tiny model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--benchmarks", default=str(BENCHMARK_DIR), help="directory holding gsm8k.jsonl, math500.jsonl")
    parser.add_argument("--template", default="qwen25-math-cot")
    parser.add_argument("--max-prompt-length", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=16384, help="padded tokens per forward batch")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds per method (best is reported)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="erpo_bench_cache_"))
    model_path = args.model or str(
        save_tiny_model(
            workdir / "model",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.hidden // 64,
            num_kv_heads=max(1, args.hidden // 128),
            intermediate_size=4 * args.hidden,
            max_positions=max(1024, args.max_prompt_length),
        )
    )
    datamodule = QueryDataModule(
        model_path,
        train=[{"path": f"{args.benchmarks}/gsm8k.jsonl"}, {"path": f"{args.benchmarks}/math500.jsonl"}],
        template=args.template,
        max_prompt_length=args.max_prompt_length,
        cache_dir=str(workdir / "cache"),
        cache_dtype=args.dtype,
        cache_device=args.device,
        cache_max_tokens=args.max_tokens,
    )
    prompts = datamodule.prepare_queries().prompt_ids
    settings = datamodule.score_settings
    lengths = [len(ids) for ids in prompts]
    chunks = plan_chunks(lengths, settings.chunk_size)
    sorted_batches = [batch for chunk in chunks for batch in plan_batches(chunk, lengths, settings)]
    rows = -(-len(prompts) // len(sorted_batches))  # same number of batches, in file order
    naive_batches = [list(range(i, min(i + rows, len(prompts)))) for i in range(0, len(prompts), rows)]

    device = torch.device(args.device)
    model = load_reference_model(model_path, args.dtype, device)
    bare_forward(model, prompts, sorted_batches[:2])  # warm-up (kernels, allocator)
    chunk_root = workdir / "chunks"
    chunk_root.mkdir()

    def cache_run():
        chunk_dir = Path(tempfile.mkdtemp(dir=chunk_root))
        compute_reference_logprobs(model, prompts, chunk_dir=chunk_dir, settings=settings, progress=True)

    methods = {
        "bare_forward": lambda: bare_forward(model, prompts, sorted_batches),
        "cache": cache_run,
        "naive_forward": lambda: bare_forward(model, prompts, naive_batches),
    }
    seconds = timed_interleaved(methods, device, args.repeats)
    paired_seconds = paired(model, prompts, sorted_batches, device)
    model = None  # frees the weights before the end-to-end run; the closures above are done with them
    seconds.update(timed_interleaved({"end_to_end": lambda: datamodule.build_or_load_cache(force=True)}, device, 1))

    query_tokens = sum(lengths)
    padded = {
        "sorted": sum(len(b) * max(lengths[i] for i in b) for b in sorted_batches),
        "naive": sum(len(b) * max(lengths[i] for i in b) for b in naive_batches),
    }
    result = {
        "model": args.model or f"tiny Qwen2 (hidden {args.hidden}, {args.layers} layers, byte tokenizer)",
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "queries": len(prompts),
        "query_tokens": query_tokens,
        "padded_tokens_sorted_batches": padded["sorted"],
        "padded_tokens_naive_batches": padded["naive"],
        "batches": len(sorted_batches),
        **{
            name: {"seconds": round(s, 3), "query_tokens_per_s": round(query_tokens / s, 1)}
            for name, s in seconds.items()
        },
        "paired": {name: round(s, 3) for name, s in paired_seconds.items()},
        "ratio_cache_vs_bare_forward": round(seconds["bare_forward"] / seconds["cache"], 3),
        "ratio_paired": round(paired_seconds["bare_forward"] / paired_seconds["cache_scoring"], 3),
        "speedup_sorted_vs_naive_forward": round(seconds["naive_forward"] / seconds["bare_forward"], 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
