"""How far the training forward's query log-probs sit from the cached reference log-probs at θ0: the numerical noise
that `model.query_kl_tolerance` must cover; prints JSON.

At θ0 the two should agree exactly, but they come from forwards of different batch shapes: the cache scores prompts
alone, right-padded, in batches of its own (`data.reference_logprobs.batch_query_logprobs`, what `erpo cache` runs);
training scores `[prompt; response]` rows with left-padded prompts, G rows per prompt
(`logprobs.prompt_response_logprobs_and_entropy` on `causal_lm_logits`, what the trainer runs). Matmul reductions
of another shape round differently, so each query token's log-ratio δ_t = ref_t − cur_t is small but not zero, and
in bfloat16 far from zero. The JSON gives, per model and dtype, the root mean square, the 99th percentile and the
maximum of |δ_t| over every scored query token, and the token-k3 Query-KL those δ make.

    .venv/bin/python bench/bench_query_kl_noise.py                         # the shipped toy model, float32 and bf16
    .venv/bin/python bench/bench_query_kl_noise.py --model "$(.venv/bin/python -m erpo_lightning.real_model)" --chat
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.data.reference_logprobs import batch_query_logprobs
from erpo_lightning.objectives import per_query_kl, split_prompt_response
from erpo_lightning.scoring.logprobs import causal_lm_logits, prompt_response_logprobs_and_entropy

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "erpo_lightning" / "toy" / "shipped"


def prompts_of(tokenizer, count: int, chat: bool) -> list[list[int]]:
    """Token ids of the first `count` training problems of the shipped task (through the chat template if `chat`)."""
    rows = [json.loads(line) for line in (SHIPPED / "train.jsonl").read_text().splitlines()[:count]]
    if chat:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": row["problem"]}], tokenize=False, add_generation_prompt=True
            )
            for row in rows
        ]
        return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return [tokenizer(row["problem"] + "\n")["input_ids"] for row in rows]


def training_rows(prompts: list[list[int]], group: int, response_tokens: int, pad: int, vocab: int, seed: int):
    """(input_ids, attention_mask, prompt_length) of a training micro-batch: left-padded prompts, each repeated
    `group` times, with random right-padded responses of 1..response_tokens tokens."""
    rng = random.Random(seed)
    width = max(map(len, prompts))
    ids, mask = [], []
    for prompt in prompts:
        for _ in range(group):
            response = [rng.randrange(vocab) for _ in range(rng.randint(1, response_tokens))]
            left, right = width - len(prompt), response_tokens - len(response)
            ids.append([pad] * left + prompt + response + [pad] * right)
            mask.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
    return torch.tensor(ids), torch.tensor(mask), width


@torch.no_grad()
def measure(model_path: str, dtype: str, args: argparse.Namespace) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    prompts = prompts_of(tokenizer, args.queries, args.chat)
    reference = []
    for start in range(0, len(prompts), args.cache_batch):
        reference += batch_query_logprobs(model, prompts[start : start + args.cache_batch])
    deltas, kls = [], []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(prompts), args.batch):
        batch = prompts[start : start + args.batch]
        ids, mask, width = training_rows(batch, args.group, args.response_tokens, pad, len(tokenizer), start)
        logprobs, _ = prompt_response_logprobs_and_entropy(causal_lm_logits(model, ids, mask), ids, width)
        query_lp, query_mask, _, _ = split_prompt_response(logprobs, mask, width)
        leaders = torch.arange(0, len(ids), args.group)
        ref = torch.zeros(len(batch), width)
        for row, cached in enumerate(reference[start : start + len(batch)]):
            ref[row, width - len(cached) :] = cached
        current, real = query_lp[leaders], query_mask[leaders].bool()
        deltas.append((ref - current)[real].abs())
        kls.append(per_query_kl(current, ref, query_mask[leaders], "token_k3"))
    delta = torch.cat(deltas).double()
    return {
        "model": Path(model_path).name,
        "dtype": dtype,
        "query_tokens": int(delta.numel()),
        "delta_rms": float(delta.pow(2).mean().sqrt()),
        "delta_p99": float(delta.quantile(0.99)),
        "delta_max": float(delta.max()),
        "token_k3_query_kl": float(torch.cat(kls).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SHIPPED), help="model directory (default: the shipped toy model)")
    parser.add_argument("--chat", action="store_true", help="render prompts with the model's chat template")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--cache-batch", type=int, default=32, help="prompts per reference-cache forward")
    parser.add_argument("--batch", type=int, default=8, help="prompts per training micro-batch")
    parser.add_argument("--group", type=int, default=8, help="rows per prompt (G)")
    parser.add_argument("--response-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(json.dumps([measure(args.model, dtype, args) for dtype in args.dtypes], indent=1))


if __name__ == "__main__":
    main()
