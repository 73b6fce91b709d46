"""The maths of ERPO and its baselines, as pure torch functions.

Nothing here imports Lightning: a TRL, verl or OpenRLHF user can call these directly
(`import erpo_lightning.objectives as obj`; every public name below is re-exported here).

    advantages     group advantage estimators (grpo, dr_grpo, rloo, reinforce)
    policy         the surrogates (PPO-clipped at the token or sequence level, CISPO) and the aggregation
    entropy        the entropy bonus, its adaptive coefficient and the high-entropy token mask
    kl             k1/k2/k3, sequence k3 and Query-KL
    query_weights  ERPO's per-query weight w(q)
    rollout_correction  truncated / masked importance weights for the rollout engine–trainer mismatch
    loss           prompt/response masks, `LossSettings`, `loss_normalizers` and the whole `rl_loss`

Conventions: N sequences (responses), T tokens, Q unique queries. Masks are 1 on real tokens, 0 on padding; padding
never changes a result. Functions that normalise (means over tokens, sequences or queries) take an optional
`normalizer` so that a caller accumulating micro-batches, or running on several ranks, can divide by the count of
the *global* batch: then summing the per-micro-batch losses gives exactly the full-batch loss.
"""

from erpo_lightning.objectives.advantages import (
    DEFAULT_ADVANTAGE_EPS,
    GROUP_ESTIMATORS,
    Estimator,
    check_group_size,
    group_advantages,
)
from erpo_lightning.objectives.entropy import (
    EntropyControl,
    entropy_bonus_term,
    high_entropy_mask,
    token_entropy,
)
from erpo_lightning.objectives.kl import (
    DEFAULT_KL_CLAMP,
    MAX_QUERY_KL_TOLERANCE,
    QUERY_KL_TOLERANCE,
    KLClampMode,
    KLKind,
    QueryKLAggregation,
    QueryKLEstimator,
    k3_level_log_ratios,
    kl_penalty,
    per_query_kl,
    query_kl,
    query_kl_tokens,
    query_kl_tolerance_for,
    sequence_k3,
    within_tolerance_as_zero,
)
from erpo_lightning.objectives.loss import (
    LossSettings,
    LossStats,
    QueryDrift,
    loss_normalizers,
    query_kl_loss,
    query_kl_parts,
    query_token_mask,
    rl_loss,
    split_prompt_response,
)
from erpo_lightning.objectives.policy import (
    RATIO_LOG_CLAMP,
    AggregationMode,
    PolicyLoss,
    RatioLevel,
    aggregate,
    cispo_loss,
    importance_log_ratio,
    policy_gradient_loss,
)
from erpo_lightning.objectives.query_weights import (
    DEFAULT_QUERY_WEIGHT_CLIP,
    QueryWeightNorm,
    QueryWeightSource,
    query_weights,
)
from erpo_lightning.objectives.rollout_correction import (
    DEFAULT_ROLLOUT_CORRECTION_CAP,
    RolloutCorrection,
    RolloutCorrectionLevel,
    rollout_correction_weights,
    rollout_log_ratios,
)

__all__ = [
    "DEFAULT_ADVANTAGE_EPS",
    "DEFAULT_KL_CLAMP",
    "DEFAULT_QUERY_WEIGHT_CLIP",
    "DEFAULT_ROLLOUT_CORRECTION_CAP",
    "GROUP_ESTIMATORS",
    "MAX_QUERY_KL_TOLERANCE",
    "QUERY_KL_TOLERANCE",
    "RATIO_LOG_CLAMP",
    "AggregationMode",
    "EntropyControl",
    "Estimator",
    "KLClampMode",
    "KLKind",
    "LossSettings",
    "LossStats",
    "PolicyLoss",
    "QueryKLAggregation",
    "QueryDrift",
    "QueryKLEstimator",
    "QueryWeightNorm",
    "QueryWeightSource",
    "RatioLevel",
    "RolloutCorrection",
    "RolloutCorrectionLevel",
    "aggregate",
    "check_group_size",
    "cispo_loss",
    "entropy_bonus_term",
    "group_advantages",
    "high_entropy_mask",
    "importance_log_ratio",
    "k3_level_log_ratios",
    "kl_penalty",
    "loss_normalizers",
    "per_query_kl",
    "policy_gradient_loss",
    "query_kl",
    "query_kl_loss",
    "query_kl_parts",
    "query_kl_tokens",
    "query_kl_tolerance_for",
    "within_tolerance_as_zero",
    "query_token_mask",
    "query_weights",
    "rl_loss",
    "rollout_correction_weights",
    "rollout_log_ratios",
    "sequence_k3",
    "split_prompt_response",
    "token_entropy",
]
