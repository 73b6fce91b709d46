"""The policy-gradient surrogates (PPO-clipped at the token or the sequence level, CISPO) and the reductions of
per-token losses to a scalar."""

from __future__ import annotations

from typing import Literal

import torch

AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant"]
# Where the importance ratio π / π_old lives: each token's own, or one per response (GSPO).
RatioLevel = Literal["token", "sequence"]
# The surrogate: PPO's clipped ratio times A, or CISPO's clipped stop-gradient weight times A·log π.
PolicyLoss = Literal["ppo_clip", "cispo"]

# The PPO log-ratio is clamped before exp (verl uses the same ±20): a token whose log-prob moved by 100 nats would
# otherwise give exp(100) = inf in float32, and inf * (advantage 0) = NaN.
RATIO_LOG_CLAMP = 20.0


def importance_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: RatioLevel = "token"
) -> torch.Tensor:
    """[N, T] log of the importance ratio π / π_old that the surrogate reads, 0 on padding (nats).

    token:    log r_it = clamp(logprobs_it − old_it, ±RATIO_LOG_CLAMP).
    sequence: log s_i = mean over the row's real tokens of log r_it (GSPO's length-normalised sequence ratio
              s_i = (π(y_i) / π_old(y_i))^(1/|y_i|)), the same value on every real token of the row; its gradient
              reaches every token of the response, each with weight 1/|y_i|.
    Each token's log-ratio is clamped before the mean, so a sequence's lies within ±RATIO_LOG_CLAMP too.

    Args:
        logprobs: [N, T] current log-probs of the sampled tokens (with gradient).
        old_logprobs: [N, T] the sampling policy's (detached here).
        mask: [N, T] 1 on response tokens.
    """
    real = mask.bool()
    # Zero the log-ratio on padding first: junk log-probs there must not produce inf * 0 = NaN.
    log_ratio = torch.where(real, logprobs - old_logprobs.detach(), 0.0).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)
    if level == "token":
        return log_ratio
    if level != "sequence":
        raise ValueError(f"unknown ratio level {level!r}; expected token or sequence")
    per_sequence = log_ratio.sum(-1) / real.sum(-1).clamp(min=1).to(log_ratio.dtype)
    return torch.where(real, per_sequence.unsqueeze(-1), 0.0)


def _ratio_stats(ratio: torch.Tensor, log_ratio: torch.Tensor, real: torch.Tensor, level: RatioLevel) -> dict:
    """Token means (no gradient) of the ratio, −log-ratio and, at the sequence level, |s − 1| (the spread of the
    sequence ratios around 1, each response weighted by its length)."""
    mask, count = real.to(ratio.dtype), real.sum().clamp(min=1)
    stats = {"ratio_mean": (ratio * mask).sum() / count, "approx_kl": (-log_ratio * mask).sum() / count}
    if level == "sequence":
        stats["seq_ratio_dev"] = ((ratio - 1).abs() * mask).sum() / count
    return stats


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clipped policy-gradient surrogate, per token.

    loss_t = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = exp(clamp(logprobs_t - old_logprobs_t,
    ±RATIO_LOG_CLAMP)). With `dual_clip` = c > 1, tokens with A < 0 are further bounded: loss_t = min(loss_t, -c A)
    (Dual-clip PPO). On-policy (old_logprobs = logprobs.detach()) the gradient is exactly REINFORCE's -A ∇log π.
    With `ratio_level` `sequence` (GSPO) r_t is the response's s_i of `importance_log_ratio` on each of its tokens,
    and the clip bounds are the sequence ratio's (GSPO's are much tighter, 3e-4 / 4e-4); on-policy s_i = 1 and the
    gradient is again -A ∇log π per token.

    Args:
        logprobs: [N, T] current policy log-probs of the sampled tokens (with gradient).
        old_logprobs: [N, T] log-probs of the policy that sampled them (no gradient).
        advantages: [N] one advantage per sequence, broadcast over its tokens.
        mask: [N, T] 1 on response tokens.
        clip_high: upper clip; None means clip_low (symmetric). DAPO's clip-higher uses 0.28.
        ratio_level: `token` (PPO, GRPO) or `sequence` (GSPO).
    Returns:
        per-token loss [N, T] (0 on padding) and statistics (scalars, no gradient, means over masked tokens):
        `clip_frac_low` (r < 1 - clip_low with A < 0: gradient clipped), `clip_frac_high` (r > 1 + clip_high with
        A > 0), `dual_clip_frac`, `ratio_mean`, `approx_kl` (mean of old - new, k1 to the sampling policy), and at the
        sequence level `seq_ratio_dev` (mean |s - 1|).
    """
    clip_high = clip_low if clip_high is None else clip_high
    real = mask.bool()
    mask = mask.to(logprobs.dtype)
    log_ratio = importance_log_ratio(logprobs, old_logprobs, real, ratio_level)
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
            **_ratio_stats(ratio, log_ratio, real, ratio_level),
        }
    return loss, stats


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weight_cap: float = 5.0,
    ratio_level: RatioLevel = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO's surrogate (MiniMax-M1), per token: loss_t = -sg(min(r_t, weight_cap)) · A · log π_t.

    The importance weight is truncated from above and carries no gradient; the gradient is the REINFORCE term
    -w_t A ∇log π_t, so unlike PPO's clip no token's gradient is dropped, only down-weighted. On-policy r_t = 1
    (a cap >= 1 leaves it 1) and the gradient is exactly REINFORCE's -A ∇log π. There is no lower bound (MiniMax-M1
    leaves its ε_low unbounded in practice, TRL has none). `ratio_level` `sequence` weights every token of a
    response by its sequence ratio s_i (`importance_log_ratio`). The loss *value* is -w·A·log π, not PPO's -r·A.

    Args:
        logprobs, old_logprobs, advantages, mask: as `policy_gradient_loss`.
        weight_cap: ε_max, the upper bound on the weight (an absolute ratio, not 1 + ε).
    Returns:
        per-token loss [N, T] (0 on padding) and token-mean statistics: `cispo_truncated_frac` (tokens whose ratio
        exceeded the cap, either sign of A), `ratio_mean`, `approx_kl` and at the sequence level `seq_ratio_dev`.
    """
    real = mask.bool()
    log_ratio = importance_log_ratio(logprobs, old_logprobs, real, ratio_level)
    ratio = torch.exp(log_ratio.detach())
    weight = ratio.clamp(max=weight_cap)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(-1)
    loss = torch.where(real, -weight * adv * logprobs, 0.0)
    with torch.no_grad():
        count = real.sum().clamp(min=1)
        stats = {
            "cispo_truncated_frac": (((ratio > weight_cap) & real).sum() / count).float(),
            **_ratio_stats(ratio, log_ratio, real, ratio_level),
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
