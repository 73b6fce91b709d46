"""The fused output layer (`model.fused_output_layer`): the step's forward stops at the last hidden states, and the
log-prob code applies the output layer to them a chunk of positions at a time (`logprobs._ChunkedTokenLogprobs`).

Why: the logits are the largest tensor of a step. With a 152k vocabulary, one 1,088-token row's float32 logits take
630 MiB, more than a small model's whole body; fused, a step holds one chunk's logits (`logprobs.CHUNK_ELEMENTS`)
instead. The price is one more output-layer matmul per scored position, in backward, where each chunk's logits are
made again. The log-probs are the unfused ones up to the rounding of a matmul cut into chunks.

The forward bypasses the output layer by swapping it for the identity while the model runs, so Hugging Face's own
forward (and FSDP2's hooks on the root module, which gather the output layer's weight) run as always. That is only
right for a model whose logits are its output layer's output and nothing more: `FUSABLE_MODEL_TYPES` lists the
families whose forward was read to be so (no logit soft-capping or scaling), and the output layer must be a plain
`Linear` without bias (not a LoRA-wrapped one). Anything else is refused by `fused_output_problem`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Model types whose causal-LM forward computes `logits = lm_head(last hidden states)` and nothing more.
FUSABLE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fused_output_problem(model: torch.nn.Module) -> str | None:
    """Why `model`'s output layer cannot be fused with the log-probs, or None when it can."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FUSABLE_MODEL_TYPES:
        return (
            f"model type {model_type!r} is not one whose logits are known to be its output layer's output alone "
            f"(supported: {', '.join(FUSABLE_MODEL_TYPES)})"
        )
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"its output layer is a {type(head).__name__}, not a plain Linear (LoRA on the LM head is not fused)"
    if head.bias is not None:
        return "its output layer has a bias"
    return None


@contextmanager
def output_layer_bypassed(model: torch.nn.Module, active: bool = True) -> Iterator[torch.nn.Linear | None]:
    """While inside, `model`'s forward returns its last hidden states [N, K, H] as `.logits` (K: the positions it
    would have made logits for); yields the output layer, whose weight [V, H] keeps its autograd identity (a tied
    weight stays tied). Only for a model `fused_output_problem` accepts. With `active` false, nothing is swapped and
    None is yielded, so one `with` serves the fused and the plain forward."""
    if not active:
        yield None
        return
    head = model.get_output_embeddings()
    model.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        model.set_output_embeddings(head)
