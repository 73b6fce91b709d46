"""Peak memory and time of one optimizer step on a 152,064-token vocabulary: the float32 log-prob path before the
chunked one (`old`, re-stated below) vs `erpo_lightning.scoring.logprobs` today; prints JSON.

The model is a Qwen2 with a small body (1 layer, hidden 64) and Qwen2.5's vocabulary size, so the [N, L, V] logits
dominate memory as they do in real training. One step = the trainer's micro-batch loss (prompt log-probs at T = 1,
response log-probs at the sampling temperature, PPO surrogate, Query-KL, response entropy), backward, AdamW.
Paths, each in its own subprocess (interleaved over `--rounds`, order reversed every round):

- `old`: `prompt_response_token_logprobs` and `token_entropy` as they were before the chunked path (float32 copies
  of the logits, the scaled one kept by `logsumexp` for backward; the entropy by whole rows), re-stated below;
- `new`: `logprobs.prompt_response_token_logprobs` (chunked autograd function) and `logprobs.token_entropy` (chunked
  by positions), two passes over the logits;
- `fused`: `logprobs.prompt_response_logprobs_and_entropy`, the entropy from the same pass: what the trainer calls.

Peak memory of a step is, on CPU, the rise of the process's resident-set high-water mark over the step (reset
through /proc/self/clear_refs just before it), on CUDA `max_memory_allocated` over the step. Each subprocess does one
warm-up step (Adam state allocated), then `--steps` measured steps; the JSON gives medians and ratios to `old`.

    .venv/bin/python bench/bench_memory.py --dtypes float32     # CPU, 4,096 tokens: the old step alone takes 10 GB
    .venv/bin/python bench/bench_memory.py --dtypes bfloat16 --tokens 512 --rounds 1 --steps 1  # bf16 is slow on CPU
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from pathlib import Path

import torch
from interleave import run_workers
from transformers import Qwen2Config, Qwen2ForCausalLM

from erpo_lightning.scoring.logprobs import (
    causal_lm_logits,
    prompt_response_logprobs_and_entropy,
    prompt_response_token_logprobs,
    token_entropy,
)

PATHS = ("old", "new", "fused")
QWEN25_VOCAB = 152_064


def old_prompt_response_token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, prompt_length: int, temperature: float
) -> torch.Tensor:
    """The log-prob path before chunking, for comparison only: float32 [N, L, V] copies that autograd keeps."""
    scale = torch.ones(logits.shape[1], 1, device=logits.device, dtype=torch.float32)
    scale[prompt_length - 1 :] = 1.0 / temperature
    scaled = (logits.float() * scale)[:, :-1]
    token_logprobs = scaled.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(token_logprobs, (1, 0), value=0.0)


@torch.no_grad()
def old_token_entropy(logits: torch.Tensor, temperature: float, chunk_tokens: int = 4096) -> torch.Tensor:
    """`token_entropy` before chunking by positions: whole rows, about 4,096 positions at a time (all 4,096 here)."""
    rows, length, _ = logits.shape
    entropy = torch.empty(rows, length, dtype=torch.float32, device=logits.device)
    rows_per_chunk = max(1, chunk_tokens // max(1, length))
    for start in range(0, rows, rows_per_chunk):
        log_probs = torch.log_softmax(logits[start : start + rows_per_chunk].float() / temperature, dim=-1)
        entropy[start : start + rows_per_chunk] = -(log_probs.exp() * log_probs).sum(-1)
    return entropy


def synthetic_batch(args) -> dict[str, torch.Tensor]:
    """Rows of random tokens: prompts left-padded to `--prompt-len`, responses right-padded, lengths varied."""
    generator = torch.Generator().manual_seed(0)
    width = args.prompt_len + args.response_len
    rows = args.tokens // width
    input_ids = torch.randint(0, args.vocab, (rows, width), generator=generator)
    attention_mask = torch.ones(rows, width, dtype=torch.long)
    for row in range(rows):
        prompt = int(torch.randint(args.prompt_len // 2, args.prompt_len + 1, (), generator=generator))
        response = int(torch.randint(args.response_len // 4, args.response_len + 1, (), generator=generator))
        attention_mask[row, : args.prompt_len - prompt] = 0
        attention_mask[row, args.prompt_len + response :] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "advantages": torch.randn(rows, generator=generator),
        "reference": -torch.rand(rows, args.prompt_len, generator=generator) - math.log(args.vocab),
    }


def step(model, optimizer, batch: dict, path: str, args) -> tuple[float, float]:
    """Forward, the trainer's loss terms, backward and an AdamW step on one micro-batch; (loss, mean entropy)."""
    ids, mask, prompt_length = batch["input_ids"], batch["attention_mask"], args.prompt_len
    logits = causal_lm_logits(model, ids, mask)
    if path == "fused":
        token_logprobs, entropy = prompt_response_logprobs_and_entropy(logits, ids, prompt_length, args.temperature)
        entropy = entropy[:, prompt_length:]
    elif path == "new":
        token_logprobs = prompt_response_token_logprobs(logits, ids, prompt_length, args.temperature)
        entropy = token_entropy(logits[:, prompt_length - 1 : -1], args.temperature)
    else:
        token_logprobs = old_prompt_response_token_logprobs(logits, ids, prompt_length, args.temperature)
        entropy = old_token_entropy(logits[:, prompt_length - 1 : -1], args.temperature)
    del logits
    # The trainer's terms, written out here: on-policy PPO surrogate (token mean) + 0.01 · per-token k3 Query-KL.
    response_mask = mask[:, prompt_length:].float()
    response_lp = token_logprobs[:, prompt_length:]
    surrogate = -torch.exp(response_lp - response_lp.detach()) * batch["advantages"][:, None]
    loss = (surrogate * response_mask).sum() / response_mask.sum()
    query_mask = mask[:, 1:prompt_length].float() * mask[:, : prompt_length - 1].float()  # tokens with a context
    delta = batch["reference"][:, 1:] - token_logprobs[:, 1:prompt_length]
    loss = loss + 0.01 * ((delta.exp() - delta - 1) * query_mask).sum() / query_mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), ((entropy * response_mask).sum() / response_mask.sum()).item()


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def worker(args) -> dict:
    """Build the model, one warm-up step, then `--steps` measured steps of `args.path`."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=args.hidden, max_position_embeddings=4096,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device, dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = {key: value.to(device) for key, value in synthetic_batch(args).items()}
    first = step(model, optimizer, batch, args.path, args)
    peaks, times = [], []
    for _ in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
            before = _status_kib("VmRSS") * 1024
        start = time.perf_counter()
        step(model, optimizer, batch, args.path, args)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _status_kib("VmHWM") * 1024
        peaks.append(peak - before)
    return {"step_s": times, "peak_mib": [peak / 2**20 for peak in peaks], "first_loss_entropy": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=QWEN25_VOCAB)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096, help="micro-batch tokens (rows × (prompt + response))")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        print(json.dumps(worker(args)))
        return

    workers = {f"{dtype}/{path}": ["--path", path, "--dtype", dtype] for dtype in args.dtypes for path in args.paths}
    runs = run_workers(__file__, workers, args.rounds)
    results = {}
    for dtype in args.dtypes:
        by_path = {path: runs[f"{dtype}/{path}"] for path in args.paths}
        summary = {
            path: {
                "step_s_median": statistics.median(t for run in path_runs for t in run["step_s"]),
                "peak_mib_median": statistics.median(p for run in path_runs for p in run["peak_mib"]),
                "peak_mib_max": max(p for run in path_runs for p in run["peak_mib"]),
                "first_step_loss_entropy": path_runs[0]["first_loss_entropy"],
            }
            for path, path_runs in by_path.items()
        }
        if "old" in summary:
            for path in summary:
                summary[path]["peak_over_old"] = summary[path]["peak_mib_median"] / summary["old"]["peak_mib_median"]
                summary[path]["time_over_old"] = summary[path]["step_s_median"] / summary["old"]["step_s_median"]
        results[dtype] = summary
    config = {key: value for key, value in vars(args).items() if key not in ("path", "dtype")}
    logits_gib = args.tokens // (args.prompt_len + args.response_len) * (args.prompt_len + args.response_len)
    logits_gib = logits_gib * args.vocab * 4 / 2**30
    print(json.dumps({"config": config, "float32_logits_gib": logits_gib, "results": results}, indent=2))


if __name__ == "__main__":
    main()
