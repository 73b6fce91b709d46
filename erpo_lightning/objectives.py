"""The maths of ERPO and its baselines, as pure torch functions.

Nothing here imports Lightning: a TRL, verl or OpenRLHF user can call these directly.

Conventions: N sequences (responses), T tokens, Q unique queries. Masks are 1 on real tokens, 0 on padding; padding
never changes a result. Functions that normalise (means over tokens, sequences or queries) take an optional
`normalizer` so that a caller accumulating micro-batches, or running on several ranks, can divide by the count of
the *global* batch: then summing the per-micro-batch losses gives exactly the full-batch loss.
"""

from __future__ import annotations

from typing import Literal

import torch

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce"]
AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant"]
KLKind = Literal["k1", "k2", "k3"]
QueryKLEstimator = Literal["token_k3", "sequence_k3"]

# exp(δ) is clamped through δ: beyond ±10 nats the k3 estimate is dominated by one token and overflows in bf16.
K3_LOG_RATIO_CLAMP = 10.0


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: Estimator = "grpo",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of every response from its scalar reward.

    Args:
        rewards: [N] float, N = number_of_groups * group_size; groups are consecutive blocks of `group_size`
            (the G responses to one query).
        estimator:
            - `grpo`: (r - group mean) / (unbiased group std + eps).
            - `dr_grpo`: r - group mean (Dr. GRPO: no std normalisation).
            - `rloo`: r - mean of the other G - 1 rewards of the group (leave-one-out).
            - `reinforce`: r - mean over the whole batch (a group-free baseline).
    Returns:
        [N] float advantages (no gradient). For the three group estimators a group whose rewards are all equal gets
        exactly 0 (and never NaN). `reinforce` ignores groups by definition.
    """
    rewards = rewards.detach().float()
    if rewards.ndim != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be [N] with N a multiple of group_size={group_size}, got {tuple(rewards.shape)}"
        )
    if estimator == "reinforce":
        return rewards - rewards.mean()
    if group_size < 2:
        raise ValueError(
            f"estimator {estimator!r} needs group_size >= 2 (got {group_size}): a group of one has no baseline"
        )
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if estimator == "grpo":
        advantages = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif estimator == "dr_grpo":
        advantages = centred
    elif estimator == "rloo":
        # r_i - (sum - r_i) / (G - 1) == G / (G - 1) * (r_i - mean)
        advantages = centred * (group_size / (group_size - 1))
    else:
        raise ValueError(f"unknown estimator {estimator!r}; expected grpo, dr_grpo, rloo or reinforce")
    return advantages.reshape(-1)


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

    loss_t = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = exp(logprobs_t - old_logprobs_t).
    With `dual_clip` = c > 1, tokens with A < 0 are further bounded: loss_t = min(loss_t, -c A) (Dual-clip PPO).
    On-policy (old_logprobs = logprobs.detach()) the gradient is exactly REINFORCE's -A ∇log π.

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
    mask = mask.to(logprobs.dtype)
    # Zero the log-ratio on padding first: junk log-probs there must not produce inf * 0 = NaN.
    log_ratio = (logprobs - old_logprobs.detach()) * mask
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    dual_active = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    loss = loss * mask

    with torch.no_grad():
        real = mask.bool()
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

    Modes (m = mask, w_i = seq_weights or 1):
        - `token_mean`: Σ_i w_i Σ_t l_it m_it / Σ_it m_it (DAPO, ERPO's token-level aggregation).
        - `seq_mean_token_mean`: (1/N) Σ_i w_i (Σ_t l_it m_it / Σ_t m_it) (original GRPO).
        - `seq_mean_token_sum`: (1/N) Σ_i w_i Σ_t l_it m_it.
        - `seq_sum_constant`: (1/N) Σ_i w_i Σ_t l_it m_it / constant (Dr. GRPO; constant = max response length).
    `seq_weights` [N] multiplies every term of a sequence: this is how the ERPO query weight w(q) enters.
    `normalizer` replaces the local denominator (Σ m for `token_mean`, N for the sequence modes) by a global count.
    """
    mask = mask.to(per_token.dtype)
    per_token = per_token * mask
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
    denominator = per_sequence.numel() if normalizer is None else normalizer
    return per_sequence.sum() / denominator


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman's k1/k2/k3), same shape as the inputs.

    k1 = log π - log π_ref; k2 = ½ (log π - log π_ref)²; k3 = exp(δ) - δ - 1 with δ = log π_ref - log π clamped
    to ±10 (non-negative, low variance). Mask the result yourself (e.g. with `aggregate`).
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind == "k3":
        delta = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown KL kind {kind!r}; expected k1, k2 or k3")


def per_query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
) -> torch.Tensor:
    """Query-KL contribution of each query, [Q].

    Args:
        query_logprobs: [Q, L] current policy log-probs of the query tokens (one row per unique query).
        ref_query_logprobs: [Q, L] cached log-probs of the same tokens under the initial policy θ0.
        query_mask: [Q, L] 1 on scored query tokens (real tokens except the first, which has no context).
        estimator:
            - `token_k3` (released code): mean over the query's tokens of k3(δ_t), δ_t = ref_t - cur_t.
            - `sequence_k3` (paper): k3(δ), δ = ℓθ0(q) - ℓθ(q) on summed log-likelihoods.
    """
    mask = query_mask.to(query_logprobs.dtype)
    ref = ref_query_logprobs.detach().to(query_logprobs.dtype)
    if estimator == "token_k3":
        per_token = kl_penalty(query_logprobs, ref, "k3") * mask
        return per_token.sum(-1) / mask.sum(-1).clamp(min=1)
    if estimator == "sequence_k3":
        delta = ((ref - query_logprobs) * mask).sum(-1)
        return kl_penalty(torch.zeros_like(delta), delta, "k3")
    raise ValueError(f"unknown Query-KL estimator {estimator!r}; expected token_k3 or sequence_k3")


def query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Query-KL(ρθ ‖ ρθ0) estimated on a batch of unique queries: the mean of `per_query_kl` (scalar).

    Its gradient flows only through `query_logprobs`, never through response log-probs. Pass each query once
    (not once per response: the G responses of a group share one prompt). `normalizer` replaces Q by a global count.
    """
    per_query = per_query_kl(query_logprobs, ref_query_logprobs, query_mask, estimator)
    return per_query.sum() / (per_query.numel() if normalizer is None else normalizer)


def query_weights(
    ref_query_nll: torch.Tensor,
    dataset_mean_nll: float | torch.Tensor,
    clip: tuple[float, float] | None = (0.0, 2.0),
) -> torch.Tensor:
    """ERPO's per-query weight w(q) = clip(s̄ / s(q), lo, hi), s(q) = summed NLL of the query (paper, Appendix I).

    Args:
        ref_query_nll: [Q] summed negative log-likelihood -ℓθ0(q) of each query (nats, > 0).
        dataset_mean_nll: s̄, the mean of s over the whole training set (the paper) or over the batch (released code).
        clip: (lo, hi) or None for no clipping (released code).
    Returns:
        [Q] weights, no gradient. Queries the model finds easy (low NLL) weigh more; a query with the mean NLL
        weighs 1. A non-positive NLL (a query with no scored token) is treated as tiny, i.e. gets the upper clip.
    """
    nll = ref_query_nll.detach().float().clamp(min=1e-8)
    weights = torch.as_tensor(dataset_mean_nll, dtype=nll.dtype, device=nll.device) / nll
    if clip is not None:
        weights = weights.clamp(clip[0], clip[1])
    return weights


def batch_query_weights(query_nll: torch.Tensor, clip: tuple[float, float] | None = None) -> torch.Tensor:
    """The released code's variant: weights normalised by the mean NLL of this batch, unclipped by default."""
    return query_weights(query_nll, query_nll.detach().float().mean(), clip)


def split_prompt_response(
    token_logprobs: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split per-token log-probs of `[prompt; response]` rows into query and response parts.

    Args:
        token_logprobs: [N, P + R], column t = log p(token t | tokens < t) (as `scoring` returns them).
        attention_mask: [N, P + R], prompts left-padded to width P, responses right-padded.
        prompt_length: P.
    Returns:
        query_logprobs [N, P], query_mask [N, P] (real prompt tokens except each row's first, which is unscored),
        response_logprobs [N, R], response_mask [N, R].
    """
    prompt_mask = attention_mask[:, :prompt_length]
    query_mask = prompt_mask * (prompt_mask.cumsum(-1) > 1).to(prompt_mask.dtype)
    return (
        token_logprobs[:, :prompt_length],
        query_mask,
        token_logprobs[:, prompt_length:],
        attention_mask[:, prompt_length:],
    )


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
