"""Is exact Query-KL exact on this device? Prints JSON.

Scores random queries as the reference cache does (`data.reference_logprobs.batch_query_logprobs`: blocks of the
query scoring layout, no grad) and as the training step does (`scoring.queries.score_block` with grad, the queries
shuffled into other blocks, so each sits at another row beside other queries), and compares them bit for bit, per
dtype. For contrast it also scores each query inside a left-padded [prompt; response] row, as the shared forward
does. Kernels can depend on shapes (more so on GPUs), which is why the layout fixes the block shape; this is the check
that a lent GPU runs (bench/gpu_check.sh).

    python bench/bench_query_exactness.py --device cpu --size tiny
    python bench/bench_query_exactness.py --model-path "$(python -m erpo_lightning.real_model)"   # SmolLM2
    python bench/bench_query_exactness.py --device cuda --size 1.5b
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
from bench_step import SIZES, build_model
from transformers import AutoConfig, AutoModelForCausalLM

from erpo_lightning.data.reference_logprobs import batch_query_logprobs
from erpo_lightning.scoring.logprobs import causal_lm_logits, prompt_response_token_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout, score_block


def shared_forward_rows(model, prompts: list[list[int]], response_len: int, vocab: int) -> list[torch.Tensor]:
    """Each prompt's token log-probs from [prompt; response] rows, prompts left-padded to one width."""
    width = max(map(len, prompts))
    generator = torch.Generator().manual_seed(1)
    rows = []
    for ids in prompts:
        response = torch.randint(1, vocab, (response_len,), generator=generator).tolist()
        input_ids = torch.tensor([[0] * (width - len(ids)) + ids + response])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * (len(ids) + response_len)])
        input_ids, mask = input_ids.to(model.device), mask.to(model.device)
        with torch.no_grad():
            logits = causal_lm_logits(model, input_ids, mask)
            logprobs = prompt_response_token_logprobs(logits, input_ids, width)
        rows.append(logprobs[0, width - len(ids) : width].float().cpu())
    return rows


def compare(cache: list[torch.Tensor], other: list[torch.Tensor]) -> dict:
    """Largest |difference| over the scored tokens (each query's first token has no context) and whether all are
    equal to the bit."""
    gaps = [(a[1:] - b[1:]).abs().max().item() if len(a) > 1 else 0.0 for a, b in zip(cache, other, strict=True)]
    return {"max_abs_diff": max(gaps), "bit_exact": all(gap == 0.0 for gap in gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=SIZES, default="tiny", help="the built model's shape (no --model-path)")
    parser.add_argument("--model-path", help="an existing Hugging Face model folder instead of a built --size model")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=150, help="query lengths are drawn from [8, max-len]")
    args = parser.parse_args()
    vocab = (
        AutoConfig.from_pretrained(args.model_path).vocab_size if args.model_path else SIZES[args.size]["vocab_size"]
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(8, args.max_len))] for _ in range(args.queries)]
    layout = QueryScoringLayout()
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        model_path = Path(args.model_path) if args.model_path else Path(workdir) / "model"
        if not args.model_path:
            build_model(args.size, model_path)
        for dtype in args.dtypes:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
            model = model.to(args.device)
            cache = batch_query_logprobs(model, prompts, layout)
            order = list(range(len(prompts)))
            rng.shuffle(order)
            step = [None] * len(prompts)
            for part in (order[:5], order[5:]):  # other block compositions than the cache's
                for block in layout.blocks([len(prompts[i]) for i in part]):
                    queries = [part[p] for p in block]
                    scores = score_block(model, [prompts[i] for i in queries], layout)  # with grad, as the step
                    for i, row in zip(queries, scores, strict=True):
                        step[i] = row.detach().float().cpu()
            results[dtype] = {
                "step_vs_cache": compare(cache, step),
                "shared_forward_vs_cache": compare(cache, shared_forward_rows(model, prompts, 32, vocab)),
            }
    config = {**vars(args), "layout": layout.to_dict()}
    print(json.dumps({"config": config, "results": results}))


if __name__ == "__main__":
    main()
