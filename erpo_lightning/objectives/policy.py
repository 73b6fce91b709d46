"""The PPO-clipped policy-gradient surrogate and the reductions of per-token losses to a scalar."""

from __future__ import annotations

from typing import Literal

import torch

AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant"]

# The PPO log-ratio is clamped before exp (verl uses the same ±20): a token whose log-prob moved by 100 nats would
# otherwise give exp(100) = inf in float32, and inf * (advantage 0) = NaN.
RATIO_LOG_CLAMP = 20.0


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clipped policy-gradient surrogate, per token.

    loss_t = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = exp(clamp(logprobs_t - old_logprobs_t,
    ±RATIO_LOG_CLAMP)). With `dual_clip` = c > 1, tokens with A < 0 are further bounded: loss_t = min(loss_t, -c A)
    (Dual-clip PPO). On-policy (old_logprobs = logprobs.detach()) the gradient is exactly REINFORCE's -A ∇log π.

    Args:
        logprobs: [N, T] current policy log-probs of the sampled tokens (with gradient).
        old_logprobs: [N, T] log-probs of the policy that sampled them (no gradient).
        advantages: [N] one advantage per sequence, broadcast over its tokens.
        mask: [N, T] 1 on response tokens.
        clip_high: upper clip; None means clip_low (symmetric). DAPO's clip-higher uses 0.28.
    Returns:
        per-token loss [N, T] (0 on padding) and statistics (scalars, no gradient, means over masked tokens):
        `clip_frac_low` (r < 1 - clip_low with A < 0: gradient clipped), `clip_frac_high` (r > 1 + clip_high with
        A > 0), `dual_clip_frac`, `ratio_mean`, `approx_kl` (mean of old - new, k1 to the sampling policy).
    """
    clip_high = clip_low if clip_high is None else clip_high
    real = mask.bool()
    mask = mask.to(logprobs.dtype)
    # Zero the log-ratio on padding first: junk log-probs there must not produce inf * 0 = NaN.
    log_ratio = torch.where(real, logprobs - old_logprobs.detach(), 0.0).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    dual_active = torch.zeros_like(real)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    loss = loss * mask

    with torch.no_grad():
        count = real.sum().clamp(min=1)
        stats = {
            "clip_frac_low": (((ratio < 1.0 - clip_low) & (adv < 0) & real).sum() / count).float(),
            "clip_frac_high": (((ratio > 1.0 + clip_high) & (adv > 0) & real).sum() / count).float(),
            "dual_clip_frac": ((dual_active & real).sum() / count).float(),
            "ratio_mean": (ratio * mask).sum() / count,
            "approx_kl": (-log_ratio * mask).sum() / count,
        }
    return loss, stats


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode = "token_mean",
    seq_weights: torch.Tensor | None = None,
    constant: float | None = None,
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [N, T] to a scalar.

    Modes (m = mask, w_i = seq_weights or 1, N = rows with at least one masked-in token):
        - `token_mean`: Σ_i w_i Σ_t l_it m_it / Σ_it m_it (DAPO, ERPO's token-level aggregation).
        - `seq_mean_token_mean`: (1/N) Σ_i w_i (Σ_t l_it m_it / Σ_t m_it) (original GRPO).
        - `seq_mean_token_sum`: (1/N) Σ_i w_i Σ_t l_it m_it.
        - `seq_sum_constant`: (1/N) Σ_i w_i Σ_t l_it m_it / constant (Dr. GRPO; constant = max response length).
    A row whose mask is all 0 (a response masked out by overlong filtering) adds nothing and is not counted in N.
    `seq_weights` [N] multiplies every term of a sequence: this is how the ERPO query weight w(q) enters.
    `normalizer` replaces the local denominator (Σ m for `token_mean`, N for the sequence modes) by a global count.
    """
    real = mask.bool()
    mask = mask.to(per_token.dtype)
    per_token = torch.where(real, per_token, 0.0)
    if seq_weights is not None:
        per_token = per_token * seq_weights.detach().to(per_token.dtype).unsqueeze(-1)
    if mode == "token_mean":
        denominator = mask.sum().clamp(min=1) if normalizer is None else normalizer
        return per_token.sum() / denominator
    if mode == "seq_mean_token_mean":
        per_sequence = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
    elif mode == "seq_mean_token_sum":
        per_sequence = per_token.sum(-1)
    elif mode == "seq_sum_constant":
        if constant is None or constant <= 0:
            raise ValueError("mode 'seq_sum_constant' needs a positive `constant` (e.g. the max response length)")
        per_sequence = per_token.sum(-1) / constant
    else:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; expected token_mean, seq_mean_token_mean, "
            "seq_mean_token_sum or seq_sum_constant"
        )
    denominator = real.any(-1).sum().clamp(min=1) if normalizer is None else normalizer
    return per_sequence.sum() / denominator
