"""Per-token log-probabilities of a causal LM over padded sequences.

One function computes what the trainer, the reference-score cache and the engine-mismatch metric all need, so the
three agree by construction. Pure torch + a Hugging Face `PreTrainedModel`-like callable; no Lightning.
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [N, L] that start at 0 on each row's first real token (left padding aware).

    Hugging Face causal LMs number positions 0..L-1 in a plain forward whatever the mask says, so a left-padded row
    would be scored at shifted positions and disagree with an unpadded forward (or with vLLM).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def gather_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each next token under `softmax(logits / temperature)`.

    Args:
        logits: [N, L, V], logits[:, t] predicts token t + 1.
        input_ids: [N, L].
    Returns:
        [N, L] where column t holds log p(input_ids[:, t] | input_ids[:, :t]); column 0 (no context) is 0.
    """
    scaled = logits[:, :-1].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    # log_softmax(x)[y] = x[y] - logsumexp(x): avoids materialising a second [N, L, V] tensor.
    token_logprobs = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(token_logprobs, (1, 0), value=0.0)


def prompt_response_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probs of `[prompt; response]` sequences from one forward's logits.

    This is how Query-KL costs no extra forward pass: the prompt tokens are scored by the same logits that score
    the response. Query tokens are scored at temperature 1 (the model's own likelihood of the query, what ρθ(q) is
    defined on); response tokens at the sampling temperature (the processed distribution the engine sampled from).
    Split the result with `objectives.split_prompt_response`.

    Args:
        logits: [N, P + R, V] over prompts left-padded to width P and responses right-padded to width R.
        input_ids: [N, P + R].
        prompt_length: P.
    Returns:
        [N, P + R]; column t = log p(input_ids[:, t] | input_ids[:, :t]); column 0 is 0.
    """
    if temperature != 1.0:
        # Positions P-1 .. P+R-2 predict response tokens; only those are tempered.
        scale = torch.ones(logits.shape[1], 1, device=logits.device, dtype=torch.float32)
        scale[prompt_length - 1 :] = 1.0 / temperature
        logits = logits.float() * scale
    return gather_token_logprobs(logits, input_ids)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Forward `model` over padded sequences and return per-position next-token log-probs.

    Args:
        model: a causal LM returning an object with `.logits` [N, L, V].
        input_ids, attention_mask: [N, L]; padding may be on either side.
    Returns:
        [N, L] float32; column t = log p(input_ids[:, t] | real tokens before t); column 0 and padding are junk
        and must be masked by the caller.
    """
    return gather_token_logprobs(causal_lm_logits(model, input_ids, attention_mask), input_ids, temperature)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = 4096) -> torch.Tensor:
    """Entropy (nats) of `softmax(logits / temperature)` at every position, without gradients.

    Works through whole rows, about `chunk_tokens` positions at a time (at least one row), so a few [chunk, V]
    float32 tensors exist at once rather than float32 copies of the whole [N, L, V] tensor (7.5 GB each for 12k
    tokens of a 152k vocabulary).

    Args:
        logits: [N, L, V] in any float dtype.
    Returns:
        [N, L] float32.
    """
    rows, length, _ = logits.shape
    entropy = torch.empty(rows, length, dtype=torch.float32, device=logits.device)
    rows_per_chunk = max(1, chunk_tokens // max(1, length))
    for start in range(0, rows, rows_per_chunk):
        scaled = logits[start : start + rows_per_chunk].float() / temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        entropy[start : start + rows_per_chunk] = -(log_probs.exp() * log_probs).sum(-1)
    return entropy


def causal_lm_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[N, L, V] logits of a forward over padded rows, positions numbered from each row's first real token."""
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits
