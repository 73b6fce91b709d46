"""Algorithm presets: ERPO and the baselines it is measured against, as plain data.

An algorithm here is only the loss side (advantage estimator, surrogate, aggregation, regularisers). Rollout-side
choices of DAPO (dynamic sampling, overlong shaping) are settings of the rollout callback: see `configs/`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from erpo_lightning.objectives import AggregationMode, Estimator, KLKind, QueryKLEstimator


@dataclass(frozen=True)
class Algorithm:
    """Every loss-side knob, with ERPO's defaults (paper: arXiv 2608.23311, §3 and Appendix I).

    Attributes:
        advantage_estimator: `grpo` | `dr_grpo` | `rloo` | `reinforce` (see `objectives.group_advantages`).
        loss_aggregation: `token_mean` | `seq_mean_token_mean` | `seq_mean_token_sum` | `seq_sum_constant`.
        clip_low, clip_high: PPO ratio clip range [1 - clip_low, 1 + clip_high]; clip_high None = clip_low.
        dual_clip: optional dual-clip bound (> 1) for negative advantages.
        query_kl_coef: α, weight of Query-KL in the loss (0 = monitor only; it is always logged).
        query_kl_estimator: `token_k3` (released code) | `sequence_k3` (the paper's summed log-likelihood).
        use_query_weights: multiply each query's policy-gradient terms by w(q).
        policy_kl_coef: β, weight of Policy-KL to a frozen reference model (loads that model when > 0).
        policy_kl_kind: `k1` | `k2` | `k3` estimator of Policy-KL.
    """

    advantage_estimator: Estimator = "grpo"
    loss_aggregation: AggregationMode = "token_mean"
    clip_low: float = 0.2
    clip_high: float | None = None
    dual_clip: float | None = None
    query_kl_coef: float = 0.01
    query_kl_estimator: QueryKLEstimator = "token_k3"
    use_query_weights: bool = True
    policy_kl_coef: float = 0.0
    policy_kl_kind: KLKind = "k3"


_ERPO = Algorithm()
_NO_REGULARISER = replace(_ERPO, query_kl_coef=0.0, use_query_weights=False)

ALGORITHMS: dict[str, Algorithm] = {
    "erpo": _ERPO,
    "grpo": _NO_REGULARISER,
    # β = 0.001 with the low-variance k3 estimator, the common GRPO-with-KL setting (verl's default kl_loss_coef).
    "grpo_kl": replace(_NO_REGULARISER, policy_kl_coef=0.001),
    "dapo": replace(_NO_REGULARISER, clip_high=0.28),
    "dapo_erpo": replace(_ERPO, clip_high=0.28),
    "rloo": replace(_NO_REGULARISER, advantage_estimator="rloo"),
    "rloo_erpo": replace(_ERPO, advantage_estimator="rloo"),
    "dr_grpo": replace(_NO_REGULARISER, advantage_estimator="dr_grpo", loss_aggregation="seq_sum_constant"),
    "reinforce": replace(_NO_REGULARISER, advantage_estimator="reinforce"),
}


def resolve_algorithm(name: str, **overrides: Any) -> Algorithm:
    """The preset `name` with every non-None override applied (e.g. `query_kl_coef=0.05` for an ablation)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}")
    known = {f.name for f in fields(Algorithm)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown algorithm fields {sorted(unknown)}; known: {sorted(known)}")
    return replace(ALGORITHMS[name], **{key: value for key, value in overrides.items() if value is not None})
