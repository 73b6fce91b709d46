"""Per-token log-probabilities of a causal LM over padded sequences.

One function computes what the trainer, the reference-score cache and the engine-mismatch metric all need, so the
three agree by construction. Pure torch + a Hugging Face `PreTrainedModel`-like callable; no Lightning.

Log-probs (and entropies) are computed a chunk of positions at a time by a custom autograd function, so memory does
not grow with float32 N·L·V: for 4k tokens of a 152k vocabulary each float32 copy of the logits is 2.5 GB.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch

from erpo_lightning.scoring.output_layer import output_layer_bypassed


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [N, L] that start at 0 on each row's first real token (left padding aware).

    Hugging Face causal LMs number positions 0..L-1 in a plain forward whatever the mask says, so a left-padded row
    would be scored at shifted positions and disagree with an unpadded forward (or with vLLM).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# Elements of one chunk's float32 temporaries (64 MiB): about 110 positions of a 152k-token vocabulary. Smaller
# chunks were slower on 2 CPU cores (per-op overhead), larger ones only cost memory.
CHUNK_ELEMENTS = 1 << 24


def _blocks(rows: int, length: int, positions: int) -> Iterator[tuple[slice, slice]]:
    """(rows, positions) slices tiling an [rows, length] grid, each about `positions` positions (at least one).

    Whole rows are grouped while they fit, otherwise a row is cut: the slices of a [N, L, V] tensor they select are
    views even when the tensor is itself a slice (as `logits[:, P - 1 : -1]` is).
    """
    if positions >= length:
        step = positions // length
        for start in range(0, rows, step):
            yield slice(start, start + step), slice(None)
        return
    for row in range(rows):
        for start in range(0, length, positions):
            yield slice(row, row + 1), slice(start, start + positions)


def _positions_per_chunk(vocab: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // vocab)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """log softmax(scale_t · x_t)[target_t] at each position t of the logits x [N, L, V], chunk by chunk, and
    optionally the entropy of the same distribution from the same logsumexp.

    Autograd keeps only x itself (in its own dtype) and the [N, L] logsumexps; backward rebuilds each chunk's softmax
    and writes the chunk's gradient straight into a gradient of x's dtype. No float32 copy of the whole of x is
    formed: beyond x, memory is its gradient (needed by the layer below) and one chunk's temporaries. With
    `gradient_into_logits`, for a caller whose logits nothing else reads (the training step's forward), backward
    writes the gradient into x's own buffer, chunk by chunk after reading it: one [N, L, V] buffer at the peak, not
    two. A later use of x in autograd then fails loudly (its version counter moved), never silently.

    With the output layer's `weight` [V, H] given, x is instead the last hidden states [N, L, H] and each chunk's
    logits are `x_chunk @ weight.T`, made in forward and again in backward (`fused_output_layer`): the [N, L, V]
    logits never exist, at the price of one more output-layer matmul. Backward returns the gradients of x and of
    `weight` (accumulated over chunks in float32).
    """

    @staticmethod
    def forward(ctx, x, weight, targets, scale, positions, with_entropy, gradient_into_logits=False):
        # x [N, L, V] (or [N, L, H] with weight [V, H]); targets [N, L] long; scale [L] float32 (inverse temperature).
        compute = torch.promote_types(x.dtype, torch.float32)
        rows, length, _ = x.shape
        logprobs = torch.empty(rows, length, dtype=compute, device=x.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.empty((rows, length) if with_entropy else (0,), dtype=compute, device=x.device)
        for row, pos in _blocks(rows, length, positions):
            scaled = _chunk_logits(x, weight, row, pos).to(compute) * scale[pos, None]
            chunk_lse = torch.logsumexp(scaled, dim=-1)
            lse[row, pos] = chunk_lse
            logprobs[row, pos] = scaled.gather(-1, targets[row, pos, None]).squeeze(-1) - chunk_lse
            if with_entropy:
                log_p = scaled.sub_(chunk_lse[..., None])
                entropy[row, pos] = -(log_p.exp() * log_p).sum(-1)
        ctx.save_for_backward(x, weight, targets, scale, lse)
        ctx.positions, ctx.gradient_into_logits = positions, gradient_into_logits and weight is None
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, _grad_entropy):
        x, weight, targets, scale, lse = ctx.saved_tensors
        # Each chunk is read (into `chunk`) before its gradient is written back, so the buffer can be reused.
        grad = x.detach() if ctx.gradient_into_logits else torch.empty_like(x)
        grad_weight = None if weight is None else torch.zeros_like(weight, dtype=lse.dtype)
        for row, pos in _blocks(*x.shape[:2], ctx.positions):
            # d/dz_j of (s·z_y − lse(s·z)) is s·(1[j = y] − p_j), z the logits.
            g = (grad_logprobs[row, pos] * scale[pos])[..., None]
            chunk = _chunk_logits(x, weight, row, pos).to(lse.dtype) * scale[pos, None]
            chunk.sub_(lse[row, pos, None]).exp_().mul_(-g)
            chunk.scatter_add_(-1, targets[row, pos, None], g)
            if weight is None:
                grad[row, pos] = chunk
            else:  # through z = x @ weight.T, with the logits' gradient in their dtype, as an unfused layer has it
                chunk = chunk.to(weight.dtype)
                grad[row, pos] = chunk @ weight
                grad_weight += (chunk.flatten(0, 1).T @ x[row, pos].flatten(0, 1)).to(grad_weight.dtype)
        return grad, None if weight is None else grad_weight.to(weight.dtype), None, None, None, None, None


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor | None, row: slice, pos: slice) -> torch.Tensor:
    """One chunk's logits: x's own (x [N, L, V]) or the output layer's on the hidden states (x [N, L, H])."""
    return x[row, pos] if weight is None else torch.nn.functional.linear(x[row, pos], weight)


def _next_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    inverse_temperature: torch.Tensor,
    with_entropy: bool,
    chunk_elements: int,
    gradient_into_logits: bool = False,
    output_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Column-aligned next-token log-probs and entropies under softmax(logits[:, t] · inverse_temperature[t]).

    Args:
        logits: [N, L, V]; logits[:, t] predicts token t + 1. With `output_weight` [V, H]: the last hidden states
            [N, L, H] whose logits are `logits @ output_weight.T` (`_ChunkedTokenLogprobs`).
        input_ids: [N, L].
        inverse_temperature: [L] float32.
    Returns:
        ([N, L] log-probs, [N, L] entropies or an empty tensor), float32 (float64 for float64 logits); column t
        belongs to token t (the distribution at position t − 1); column 0 is 0.
    """
    # The last position predicts no token: it gets a dummy target and its result is dropped.
    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))
    vocab = logits.shape[-1] if output_weight is None else output_weight.shape[0]
    positions = _positions_per_chunk(vocab, chunk_elements)
    scale = inverse_temperature.to(logits.device, torch.float32)
    logprobs, entropy = _ChunkedTokenLogprobs.apply(
        logits, output_weight, targets, scale, positions, with_entropy, gradient_into_logits
    )

    def align(per_position: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(per_position[:, :-1], (1, 0), value=0.0)

    return align(logprobs), align(entropy) if with_entropy else entropy


def _position_scale(length: int, prompt_length: int, temperature: float, device: torch.device) -> torch.Tensor:
    """[L] inverse temperatures: 1 at positions predicting prompt tokens, 1 / temperature from position P − 1 on."""
    scale = torch.ones(length, dtype=torch.float32, device=device)
    scale[prompt_length - 1 :] = 1.0 / temperature
    return scale


def gather_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
    gradient_into_logits: bool = False,
    output_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-prob of each next token under `softmax(logits / temperature)`, differentiable, in chunks of positions.
    With `output_weight` [V, H], `logits` are the last hidden states [N, L, H] (`_ChunkedTokenLogprobs`).

    Memory beyond `logits` itself: about `chunk_elements` float32 values at a time, plus (in backward) a gradient
    in the dtype of `logits`, written into the logits' own buffer with `gradient_into_logits` (for a caller whose
    logits nothing else reads); never a float32 copy of the whole [N, L, V] tensor.

    Args:
        logits: [N, L, V] in any float dtype, logits[:, t] predicts token t + 1.
        input_ids: [N, L].
        chunk_elements: size of one chunk's float32 temporaries (whole positions, at least one).
    Returns:
        [N, L] float32 where column t holds log p(input_ids[:, t] | input_ids[:, :t]); column 0 (no context) is 0.
    """
    scale = torch.full((logits.shape[1],), 1.0 / temperature, device=logits.device)
    return _next_token_logprobs(logits, input_ids, scale, False, chunk_elements, gradient_into_logits, output_weight)[0]


def prompt_response_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Per-token log-probs of `[prompt; response]` sequences from one forward's logits.

    Under `query_kl_scoring: shared_forward` this is how Query-KL costs no forward of its own: the prompt tokens are
    scored by the same logits that score the response. Under the default `exact` scoring the step's unique queries
    are scored by one more forward, alone in the reference cache's layout (`update/query_pass.py`), and the response
    forward projects only the response positions (`response_window`); `shared_prompt` folds the response forward
    into that query forward (`update/shared_prompt.py`). Query tokens are scored at temperature 1 (the model's own
    likelihood of the query, what ρθ(q) is defined on); response tokens at the sampling temperature (the processed
    distribution the engine sampled from). Split the result with `objectives.split_prompt_response`. Chunked like
    `gather_token_logprobs`.

    Args:
        logits: [N, P + R, V] over prompts left-padded to width P and responses right-padded to width R.
        input_ids: [N, P + R].
        prompt_length: P.
    Returns:
        [N, P + R]; column t = log p(input_ids[:, t] | input_ids[:, :t]); column 0 is 0.
    """
    return prompt_response_logprobs_and_entropy(
        logits, input_ids, prompt_length, temperature, with_entropy=False, chunk_elements=chunk_elements
    )[0]


def prompt_response_logprobs_and_entropy(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
    *,
    with_entropy: bool = True,
    chunk_elements: int = CHUNK_ELEMENTS,
    gradient_into_logits: bool = False,
    output_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`prompt_response_token_logprobs` and, from the same logsumexps, the entropy of every scored distribution.

    One pass over the logits instead of two: the trainer's response entropy (nats, at the sampling temperature) is
    `entropy[:, P:]`, equal to `token_entropy(logits[:, P - 1 : -1], temperature)`. `gradient_into_logits`: backward
    writes the logits' gradient into their own buffer (one [N, L, V] buffer at the peak, not two), for a caller whose
    logits nothing else reads afterwards. `output_weight` [V, H]: `logits` are the last hidden states [N, P + R, H]
    and the output layer runs fused, chunk by chunk (`output_layer.py`): the logits never exist.

    Returns:
        ([N, P + R] log-probs as `prompt_response_token_logprobs`, [N, P + R] entropies without gradient, column t
        the entropy of the distribution token t was drawn from, column 0 is 0; an empty tensor when `with_entropy`
        is false).
    """
    scale = _position_scale(logits.shape[1], prompt_length, temperature, logits.device)
    return _next_token_logprobs(
        logits, input_ids, scale, with_entropy, chunk_elements, gradient_into_logits, output_weight
    )


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


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
    *,
    fused_output: bool = False,
) -> torch.Tensor:
    """Forward `model` over `[prompt; response]` rows and return the response tokens' log-probs only.

    The output layer runs on the R + 1 positions that predict response tokens (`logits_to_keep`), not on the prompt:
    with a large vocabulary it is a sizeable share of a small model's forward. What the reference model, the
    old-policy recompute and the engine-mismatch check need; the trainer's own forward also scores the prompt.

    Args:
        model: a causal LM; one whose `forward` has no `logits_to_keep` is scored over every position.
        input_ids, attention_mask: [N, P + R], prompts left-padded to width P, responses right-padded.
        prompt_length: P.
        fused_output: the output layer runs inside the log-prob code (`response_window`).
    Returns:
        [N, R] float32 log p(response token | everything before it) at `temperature`; padding columns are junk.
    """
    window, weight = response_window(model, input_ids, attention_mask, prompt_length, fused_output=fused_output)
    return gather_token_logprobs(window, input_ids[:, prompt_length - 1 :], temperature, output_weight=weight)[:, 1:]


def response_window(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    *,
    fused_output: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`causal_lm_window` at the R + 1 positions that predict response tokens, from the last prompt token on, of a
    forward over `[prompt; response]` rows ([N, P + R], prompts left-padded to P)."""
    keep = input_ids.shape[1] - prompt_length + 1
    return causal_lm_window(model, input_ids, attention_mask, logits_to_keep=keep, fused_output=fused_output)


def causal_lm_window(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    logits_to_keep: int = 0,
    fused_output: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the log-prob code scores of `causal_lm_logits`'s forward, at its last K = `logits_to_keep` positions
    (all L when 0): ([N, K, V] logits, None), or with `fused_output` ([N, K, H] the last hidden states there, [V, H]
    the output layer's weight), the output layer then applied chunk by chunk (`_ChunkedTokenLogprobs`,
    `output_layer.py`). The output layer runs on those positions only, or, for a model without `logits_to_keep`,
    on all and the window is sliced."""
    with output_layer_bypassed(model, fused_output) as head:
        window = causal_lm_output(model, input_ids, attention_mask, logits_to_keep=logits_to_keep).logits
    if logits_to_keep and window.shape[1] != logits_to_keep:
        window = window[:, -logits_to_keep:]
    return window, None if head is None else head.weight


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: int | None = None) -> torch.Tensor:
    """Entropy (nats) of `softmax(logits / temperature)` at every position, without gradients.

    Works through about `chunk_tokens` positions at a time (default: `CHUNK_ELEMENTS` float32 values' worth),
    cutting rows when needed, so a few [chunk, V] float32 tensors exist at once rather than float32 copies of the
    whole [N, L, V] tensor (2.5 GB each for 4k tokens of a 152k vocabulary). A slice such as
    `logits[:, P - 1 : -1]` is read in place.

    Args:
        logits: [N, L, V] in any float dtype.
    Returns:
        [N, L] float32.
    """
    rows, length, vocab = logits.shape
    entropy = torch.empty(rows, length, dtype=torch.float32, device=logits.device)
    positions = chunk_tokens or _positions_per_chunk(vocab, CHUNK_ELEMENTS)
    for row, pos in _blocks(rows, length, positions):
        log_probs = torch.log_softmax(logits[row, pos].float() / temperature, dim=-1)
        entropy[row, pos] = -(log_probs.exp() * log_probs).sum(-1)
    return entropy


def causal_lm_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, logits_to_keep: int = 0
) -> torch.Tensor:
    """[N, L, V] logits of a forward over padded rows, positions numbered from each row's first real token.

    `logits_to_keep` > 0 asks the model for the last that many positions' logits only (Hugging Face's argument);
    a model without the argument returns all of them, so callers slice `[:, -logits_to_keep:]` themselves.
    """
    return causal_lm_output(model, input_ids, attention_mask, logits_to_keep=logits_to_keep).logits


def causal_lm_output(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    logits_to_keep: int = 0,
    use_cache: bool = False,
):
    """The model's output (`.logits` [N, L, V], and `.past_key_values` with `use_cache`) of the forward
    `causal_lm_logits` runs. The cache does not change the computation: the keys and values are kept, not reused."""
    extra = {"logits_to_keep": logits_to_keep} if logits_to_keep and _accepts_logits_to_keep(model) else {}
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=use_cache,
        **extra,
    )


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters
