"""KL estimators: Schulman's k1/k2/k3 per token, the sequence-level k3 and Query-KL over prompt tokens."""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]
QueryKLEstimator = Literal["token_k3", "sequence_k3"]
KLClampMode = Literal["value", "log_ratio", "none"]
QueryKLAggregation = Literal["per_query", "like_pg"]

# The released code's bound on the k3 value (ROLL `compute_approx_kl`), also verl's and slime's.
DEFAULT_KL_CLAMP = 10.0


# The per-token log-ratio (nats) that Query-KL takes as numerical noise by default, per compute dtype of the policy:
# the cached reference and the training forward score the same tokens in batches of different shapes, which round
# differently. Largest |δ_t| measured at θ0 by bench/bench_query_kl_noise.py (docs/erpo.md): float32 4.8e-6 (toy),
# 5.7e-5 (SmolLM2-135M); bfloat16 p99 0.016 / 0.10, max 0.07 / 0.62. Other dtypes take the bfloat16 value.
QUERY_KL_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3, torch.bfloat16: 0.1}
# The largest tolerance a setting may ask for (nats per query token). Rounding noise stays below 0.62 nats (the
# bfloat16 maximum above); a token whose log-probability moved by more than 1 nat (its probability by a factor of e)
# has drifted. A larger band would hide that drift, and a huge one (1e9) would switch the Query-KL loss off unnoticed.
MAX_QUERY_KL_TOLERANCE = 1.0


def query_kl_tolerance_for(compute_dtype: torch.dtype) -> float:
    """The default `query_kl_tolerance` (nats per query token) of a policy that computes in `compute_dtype`."""
    return QUERY_KL_TOLERANCE.get(compute_dtype, QUERY_KL_TOLERANCE[torch.bfloat16])


def within_tolerance_as_zero(delta: torch.Tensor, tolerance: float) -> torch.Tensor:
    """δ moved towards 0 by `tolerance` (a soft threshold, any shape): sign(δ) · max(|δ| - tolerance, 0).

    Log-ratios within the tolerance are taken as numerical noise: value and gradient 0. Beyond it the gradient is δ's
    own, so real drift is still pulled back, to the edge of the band. `tolerance` 0 returns δ unchanged.
    """
    if not tolerance > 0:
        return delta
    return torch.sign(delta) * (delta.abs() - tolerance).clamp(min=0.0)


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
    tolerance: float = 0.0,
) -> torch.Tensor:
    """Per-token k3 of the query tokens, [Q, L], exactly 0 (value and gradient) where `query_mask` is 0.

    `tolerance` (nats): each token's log-ratio is first shrunk by it (`within_tolerance_as_zero`).
    """
    real = query_mask.bool()
    ref = ref_query_logprobs.detach().to(query_logprobs.dtype)
    current = torch.where(real, query_logprobs, ref)  # δ = 0 on padding, whatever junk it holds
    if tolerance > 0:
        current = ref - within_tolerance_as_zero(ref - current, tolerance)
    return torch.where(real, kl_penalty(current, ref, "k3", clamp_mode, clamp), 0.0)


def per_query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
    tolerance: float = 0.0,
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
        tolerance: per-token log-ratio (nats) taken as numerical noise (`within_tolerance_as_zero`), applied to
            each token before the mean (token_k3) or the sum (sequence_k3); 0 = none.
    """
    if estimator == "token_k3":
        per_token = query_kl_tokens(query_logprobs, ref_query_logprobs, query_mask, clamp_mode, clamp, tolerance)
        return per_token.sum(-1) / query_mask.sum(-1).clamp(min=1).to(per_token.dtype)
    if estimator == "sequence_k3":
        real = query_mask.bool()
        delta = torch.where(real, ref_query_logprobs.detach().to(query_logprobs.dtype) - query_logprobs, 0.0)
        return sequence_k3(within_tolerance_as_zero(delta, tolerance).sum(-1), clamp_mode, clamp)
    raise ValueError(f"unknown Query-KL estimator {estimator!r}; expected token_k3 or sequence_k3")


def query_kl(
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    estimator: QueryKLEstimator = "token_k3",
    normalizer: float | torch.Tensor | None = None,
    clamp_mode: KLClampMode = "value",
    clamp: float = DEFAULT_KL_CLAMP,
    tolerance: float = 0.0,
) -> torch.Tensor:
    """Query-KL(ρθ ‖ ρθ0) estimated on a batch of unique queries: the mean of `per_query_kl` (scalar).

    Its gradient flows only through `query_logprobs`, never through response log-probs. Pass each query once
    (not once per response: the G responses of a group share one prompt). `normalizer` replaces Q by a global count.
    """
    per_query = per_query_kl(query_logprobs, ref_query_logprobs, query_mask, estimator, clamp_mode, clamp, tolerance)
    return per_query.sum() / (per_query.numel() if normalizer is None else normalizer)
