"""The maths of ERPO and its baselines, as pure torch functions.

Nothing here imports Lightning: a TRL, verl or OpenRLHF user can call these directly.

Conventions: N sequences (responses), T tokens, Q unique queries. Masks are 1 on real tokens, 0 on padding; padding
never changes a result. Functions that normalise (means over tokens, sequences or queries) take an optional
`normalizer` so that a caller accumulating micro-batches, or running on several ranks, can divide by the count of
the *global* batch: then summing the per-micro-batch losses gives exactly the full-batch loss.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce"]
AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant"]
KLKind = Literal["k1", "k2", "k3"]
QueryKLEstimator = Literal["token_k3", "sequence_k3"]
KLClampMode = Literal["value", "log_ratio", "none"]
QueryKLAggregation = Literal["per_query", "like_pg"]

# The PPO log-ratio is clamped before exp (verl uses the same ±20): a token whose log-prob moved by 100 nats would
# otherwise give exp(100) = inf in float32, and inf * (advantage 0) = NaN.
RATIO_LOG_CLAMP = 20.0
# The released code's bound on the k3 value (ROLL `compute_approx_kl`), also verl's and slime's.
DEFAULT_KL_CLAMP = 10.0
# Estimators whose baseline comes from the other responses of the same query: a group of one has none.
GROUP_ESTIMATORS: tuple[Estimator, ...] = ("grpo", "dr_grpo", "rloo")


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
    if estimator in GROUP_ESTIMATORS and group_size < 2:
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


def _check_clamp(clamp_mode: KLClampMode, clamp: float) -> None:
    if clamp_mode not in ("value", "log_ratio", "none"):
        raise ValueError(f"unknown KL clamp mode {clamp_mode!r}; expected value, log_ratio or none")
    if clamp_mode != "none" and not clamp > 0:
        raise ValueError(f"the KL clamp bound must be > 0 with clamp mode {clamp_mode!r}, got {clamp}")


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: KLKind = "k3",
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman's k1/k2/k3), same shape as the inputs.

    With δ = log π_ref - log π: k1 = -δ, k2 = ½ δ², k3 = exp(δ) - δ - 1 (non-negative, low variance).
    The clamp applies to k3 only (k1 and k2 have no exp; ROLL and verl do not clamp them either). `clamp_mode`:
        - `value`: the estimate is clamped to [-clamp, clamp]; beyond, its gradient is 0. This is the released
          code's k3 (ROLL `compute_approx_kl`) and, for k3, equal in value and gradient to verl's `low_var_kl`.
        - `log_ratio`: δ is clamped to [-clamp, clamp] first (k3 then reaches exp(clamp) - clamp - 1); beyond, the
          gradient is 0.
        - `none`: no clamp (k3 overflows to inf past δ ≈ 88 in float32).
    Mask the result yourself (e.g. with `aggregate`).
    """
    _check_clamp(clamp_mode, clamp)
    delta = ref_logprobs - logprobs
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    if kind != "k3":
        raise ValueError(f"unknown KL kind {kind!r}; expected k1, k2 or k3")
    if clamp_mode == "log_ratio":
        delta = delta.clamp(-clamp, clamp)
    elif clamp_mode == "value":
        # k3(log(2 (c + 1))) >= c, so capping δ there changes no value, and keeps exp (and its gradient) finite.
        delta = delta.clamp(max=math.log(2.0 * (clamp + 1.0)))
    value = torch.expm1(delta) - delta
    return value.clamp(-clamp, clamp) if clamp_mode == "value" else value


@functools.lru_cache(maxsize=32)
def k3_level_log_ratios(level: float) -> tuple[float, float]:
    """(δ_low < 0 < δ_high): the two log-ratios where k3(δ) = exp(δ) - δ - 1 equals `level` (> 0).

    Newton's method from a point on the outer side of each root, where the convex k3 makes it converge monotonically.
    """

    def newton(start: float) -> float:
        x = start
        for _ in range(200):
            step = (math.expm1(x) - x - level) / math.expm1(x)
            x -= step
            if abs(step) <= 1e-15 * max(1.0, abs(x)):
                break
        return x

    return newton(-level - 1.0), newton(math.log(2.0 * (level + 1.0)))


def sequence_k3(
    delta: torch.Tensor, clamp_mode: KLClampMode = "value", clamp: float = DEFAULT_KL_CLAMP
) -> torch.Tensor:
    """k3 of summed log-ratios δ = ℓθ0(q) - ℓθ(q), one per query, that never stops pulling back.

    Inside the clamp the value and gradient are k3's. Outside, the value is held at the clamp and the gradient is the
    slope at the clamp point (a straight-through clamp), so a query that drifted far is still pulled towards θ0 at a
    bounded rate instead of not at all. `value` clamps where k3 reaches `clamp` (δ in [δ_low, δ_high] of
    `k3_level_log_ratios`), `log_ratio` clamps δ to ±clamp, `none` is plain k3.
    """
    _check_clamp(clamp_mode, clamp)
    if clamp_mode == "none":
        return torch.expm1(delta) - delta
    low, high = k3_level_log_ratios(float(clamp)) if clamp_mode == "value" else (-clamp, clamp)
    held = delta.detach().clamp(low, high)
    slope = torch.expm1(held)
    return (torch.expm1(held) - held) + slope * (delta - delta.detach())


def query_kl_tokens(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
) -> torch.Tensor:
    """Per-token k3 of the query tokens, [Q, L], exactly 0 (value and gradient) where `query_mask` is 0."""
    real = query_mask.bool()
    ref = ref_query_logprobs.detach().to(query_logprobs.dtype)
    current = torch.where(real, query_logprobs, ref)  # δ = 0 on padding, whatever junk it holds
    return torch.where(real, kl_penalty(current, ref, "k3", clamp_mode, clamp), 0.0)


def per_query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
) -> torch.Tensor:
    """Query-KL contribution of each query, [Q].

    Args:
        query_logprobs: [Q, L] current policy log-probs of the query tokens (one row per unique query).
        ref_query_logprobs: [Q, L] cached log-probs of the same tokens under the initial policy θ0.
        query_mask: [Q, L] 1 on scored query tokens (real tokens except the first, which has no context).
        estimator:
            - `token_k3` (released code): mean over the query's tokens of k3(δ_t), δ_t = ref_t - cur_t, clamped as
              `kl_penalty` says.
            - `sequence_k3` (paper): `sequence_k3` of δ = ℓθ0(q) - ℓθ(q) on summed log-likelihoods.
        clamp_mode, clamp: see `kl_penalty` (token_k3) and `sequence_k3`.
    """
    if estimator == "token_k3":
        per_token = query_kl_tokens(query_logprobs, ref_query_logprobs, query_mask, clamp_mode, clamp)
        return per_token.sum(-1) / query_mask.sum(-1).clamp(min=1).to(per_token.dtype)
    if estimator == "sequence_k3":
        real = query_mask.bool()
        delta = torch.where(real, ref_query_logprobs.detach().to(query_logprobs.dtype) - query_logprobs, 0.0)
        return sequence_k3(delta.sum(-1), clamp_mode, clamp)
    raise ValueError(f"unknown Query-KL estimator {estimator!r}; expected token_k3 or sequence_k3")


def query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
    normalizer: float | torch.Tensor | None = None,
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
) -> torch.Tensor:
    """Query-KL(ρθ ‖ ρθ0) estimated on a batch of unique queries: the mean of `per_query_kl` (scalar).

    Its gradient flows only through `query_logprobs`, never through response log-probs. Pass each query once
    (not once per response: the G responses of a group share one prompt). `normalizer` replaces Q by a global count.
    """
    per_query = per_query_kl(query_logprobs, ref_query_logprobs, query_mask, estimator, clamp_mode, clamp)
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


def query_token_mask(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """[N, P] 1 on the scored query tokens of left-padded prompts: real prompt tokens except each row's first."""
    prompt_mask = attention_mask[:, :prompt_length]
    return prompt_mask * (prompt_mask.cumsum(-1) > 1).to(prompt_mask.dtype)


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
    return (
        token_logprobs[:, :prompt_length],
        query_token_mask(attention_mask, prompt_length),
        token_logprobs[:, prompt_length:],
        attention_mask[:, prompt_length:],
    )


@dataclass(frozen=True)
class LossSettings:
    """The knobs of `rl_loss` (the loss side of an algorithm; `algorithms.Algorithm` extends it with presets).

    Attributes:
        loss_aggregation: how per-token PG terms become a scalar (`aggregate`).
        clip_low, clip_high, dual_clip: PPO ratio clip range and optional dual clip (`policy_gradient_loss`).
        query_kl_coef: α, weight of Query-KL in the loss.
        query_kl_estimator: `token_k3` | `sequence_k3` (`per_query_kl`).
        query_kl_aggregation: `per_query`: mean of `per_query_kl` over unique queries (the paper: each query once);
            `like_pg`: per-token k3 on every row's prompt tokens aggregated like the PG loss, with its normaliser
            (the released code; needs `token_k3`).
        kl_clamp_mode, kl_clamp: clamp of Query-KL and Policy-KL (`kl_penalty`, `sequence_k3`).
        policy_kl_coef, policy_kl_kind: β and estimator of Policy-KL, aggregated like the PG loss.
    """

    loss_aggregation: AggregationMode = "token_mean"
    clip_low: float = 0.2
    clip_high: float | None = None
    dual_clip: float | None = None
    query_kl_coef: float = 0.01
    query_kl_estimator: QueryKLEstimator = "sequence_k3"
    query_kl_aggregation: QueryKLAggregation = "per_query"
    kl_clamp_mode: KLClampMode = "value"
    kl_clamp: float = DEFAULT_KL_CLAMP
    policy_kl_coef: float = 0.0
    policy_kl_kind: KLKind = "k3"


def loss_normalizers(
    response_mask: torch.Tensor, query_mask: torch.Tensor, is_leader: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The local counts `rl_loss` divides by; sum them over micro-batches and ranks for the global ones.

    `tokens`: response tokens; `sequences`: rows with at least one response token; `queries`: group leaders (one
    row per query); `query_tokens`: scored prompt tokens over all rows.
    """
    return {
        "tokens": response_mask.sum().float(),
        "sequences": response_mask.bool().any(-1).sum().float(),
        "queries": is_leader.sum().float(),
        "query_tokens": query_mask.sum().float(),
    }


def rl_loss(
    settings: LossSettings,
    response_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    is_leader: torch.Tensor,
    seq_weights: torch.Tensor | None = None,
    constant: float | None = None,
    normalizers: dict[str, torch.Tensor] | None = None,
    ref_response_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """The whole loss of [prompt; response] rows: weighted PG + α · Query-KL (+ β · Policy-KL).

    Args:
        response_logprobs, old_logprobs, response_mask: [N, R] (see `policy_gradient_loss`); advantages: [N].
        query_logprobs, ref_query_logprobs, query_mask: [N, P] for every row (G rows share a prompt).
        is_leader: [N] bool, one True per query (its first row).
        seq_weights: [N] w(q) of each row's query, or None.
        constant: Dr. GRPO's normaliser for `seq_sum_constant`.
        normalizers: global counts as `loss_normalizers` names them; None = this batch's own.
        ref_response_logprobs: [N, R] reference-model log-probs of the responses for Policy-KL, or None.
    Returns:
        loss (scalar) and parts (no gradient): `pg_loss` (scalar), `query_kl` ([Q] per-query values of the run's
        estimator), `query_kl_token_k3` ([Q], token_k3 with the released ±10 value clamp: a common yardstick),
        `policy_kl` ([N, R] per-token values, when a reference is given), `stats` (`policy_gradient_loss`'s).
    """
    s = settings
    if normalizers is None:
        normalizers = loss_normalizers(response_mask, query_mask, is_leader)
    token_mode = s.loss_aggregation == "token_mean"
    per_token, stats = policy_gradient_loss(
        response_logprobs, old_logprobs, advantages, response_mask, s.clip_low, s.clip_high, s.dual_clip
    )
    sequences = normalizers["sequences"]
    pg_loss = aggregate(
        per_token,
        response_mask,
        s.loss_aggregation,
        seq_weights,
        constant,
        normalizers["tokens"] if token_mode else sequences,
    )
    leaders = (query_logprobs[is_leader], ref_query_logprobs[is_leader], query_mask[is_leader])
    per_query = per_query_kl(*leaders, s.query_kl_estimator, s.kl_clamp_mode, s.kl_clamp)
    if s.query_kl_aggregation == "per_query":
        query_kl_loss = per_query.sum() / normalizers["queries"]
    elif s.query_kl_estimator != "token_k3":
        raise ValueError("query_kl_aggregation 'like_pg' aggregates per-token values: it needs estimator token_k3")
    else:
        tokens = query_kl_tokens(query_logprobs, ref_query_logprobs, query_mask, s.kl_clamp_mode, s.kl_clamp)
        query_normalizer = normalizers["query_tokens"] if token_mode else sequences
        query_kl_loss = aggregate(tokens, query_mask, s.loss_aggregation, None, constant, query_normalizer)
    loss = pg_loss + s.query_kl_coef * query_kl_loss
    with torch.no_grad():
        parts = {
            "pg_loss": pg_loss.detach(),
            "query_kl": per_query.detach(),
            "query_kl_token_k3": per_query_kl(*leaders, "token_k3", "value", DEFAULT_KL_CLAMP),
            "stats": stats,
        }
    if ref_response_logprobs is not None:
        real = response_mask.bool()
        current = torch.where(real, response_logprobs, ref_response_logprobs)  # δ = 0 on padding: no inf there
        per_token_kl = kl_penalty(current, ref_response_logprobs, s.policy_kl_kind, s.kl_clamp_mode, s.kl_clamp)
        if s.policy_kl_coef:
            normalizer = normalizers["tokens"] if token_mode else sequences
            policy_kl = aggregate(per_token_kl, response_mask, s.loss_aggregation, None, constant, normalizer)
            loss = loss + s.policy_kl_coef * policy_kl
        parts["policy_kl"] = torch.where(real, per_token_kl.detach(), 0.0)
    return loss, parts
