"""How `ERPOTrainer` (integrations/trl.py) turns its `algorithm` arguments and a `GRPOConfig` into one `Algorithm`:
TRL's loss type for each of our aggregations, its vLLM importance-sampling modes as our `rollout_correction`, its
`importance_sampling_level`, CISPO loss type and entropy settings as our loss-menu fields, and the first GRPOConfig
setting it cannot honour, as a one-line reason (docs/trl.md).

Importing this module imports TRL.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

from trl import GRPOConfig

from erpo_lightning.objectives.algorithms import Algorithm, resolve_algorithm

# TRL's loss_type for each of our aggregations (docs/trl.md, "Loss types"); seq_mean_token_sum has none.
TRL_LOSS_TYPE = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_sum_constant": "dr_grpo"}
ALGORITHM_FIELDS = frozenset(field.name for field in fields(Algorithm))
# TRL's vllm_importance_sampling_mode -> (rollout_correction, rollout_correction_level).
TRL_IS_MODES = {
    "token_truncate": ("tis", "token"),
    "token_mask": ("mis", "token"),
    "sequence_truncate": ("tis", "sequence"),
    "sequence_mask": ("mis", "sequence"),
}


def config_default(name: str):
    """TRL's default value of the GRPOConfig field `name`."""
    return GRPOConfig.__dataclass_fields__[name].default


def _expected_clip(algorithm: Algorithm) -> dict:
    """GRPOConfig's `epsilon` / `epsilon_high` as the algorithm's surrogate reads them: PPO's token clip, GSPO's
    sequence clip, or CISPO's weight cap (TRL's `epsilon_high` under `loss_type='cispo'`, which reads no epsilon)."""
    if algorithm.policy_loss == "cispo":
        return {"epsilon_high": algorithm.cispo_weight_cap}
    low, high = algorithm.clip_low, algorithm.clip_high
    if algorithm.ratio_level == "sequence":
        low, high = algorithm.sequence_clip_low, algorithm.sequence_clip_high
    return {"epsilon": low, "epsilon_high": low if high is None else high}


def config_problem(args: GRPOConfig, algorithm: Algorithm) -> str | None:
    """The first setting of `args` or `algorithm` that ERPOTrainer cannot honour, as a one-line reason, or None."""
    loss_type = "cispo" if algorithm.policy_loss == "cispo" else TRL_LOSS_TYPE.get(algorithm.loss_aggregation)
    expected = {  # GRPOConfig field -> the algorithm's value; a field left at TRL's default follows the algorithm
        "loss_type": loss_type,
        **_expected_clip(algorithm),
        "delta": algorithm.dual_clip,
        "scale_rewards": {"grpo": "group", "dr_grpo": "none"}.get(algorithm.advantage_estimator),
        "importance_sampling_level": algorithm.ratio_level,
        "entropy_coef": algorithm.entropy_coef,
        "use_adaptive_entropy": algorithm.entropy_target is not None,
        "top_entropy_quantile": algorithm.entropy_top_fraction,
    }
    for name, value in expected.items():
        if getattr(args, name) != config_default(name) and getattr(args, name) != value:
            return (
                f"GRPOConfig.{name}={getattr(args, name)!r} disagrees with the algorithm (which gives {value!r}); "
                "set the loss through `algorithm` and its fields (e.g. clip_high=0.28), not GRPOConfig"
            )
    refused = {
        "beta": "Policy-KL needs a reference model, which ERPOTrainer does not load: set beta=0",
        "off_policy_mask_threshold": "rl_loss has no off-policy mask: leave it unset",
        "multi_objective_aggregation": "advantages come from the summed rewards: leave it at 'sum_then_normalize'",
    }
    for name, reason in refused.items():
        if getattr(args, name) != config_default(name):
            return f"GRPOConfig.{name}={getattr(args, name)!r} is not supported ({reason})"
    if args.temperature != 1.0:
        return (
            f"GRPOConfig.temperature={args.temperature} is not supported: TRL's fused LM head scores the prompt "
            "and the completion at one temperature, and Query-KL needs the prompt at T = 1"
        )
    if args.use_vllm and args.vllm_mode == "server":
        return "GRPOConfig.vllm_mode='server' is not supported yet (colocate is)"
    if args.steps_per_generation != args.gradient_accumulation_steps:
        return "GRPOConfig.steps_per_generation must equal gradient_accumulation_steps (one optimizer step per batch)"
    if algorithm.policy_kl_coef:
        return f"algorithm policy_kl_coef={algorithm.policy_kl_coef} needs a reference model: use GRPOTrainer(beta=…)"
    if algorithm.loss_aggregation not in TRL_LOSS_TYPE:
        return f"algorithm loss_aggregation={algorithm.loss_aggregation!r} has no TRL loss_type"
    if algorithm.policy_loss == "cispo" and algorithm.loss_aggregation != "token_mean":
        return (
            f"loss_type 'cispo' is a token mean over the step (TRL's dapo normalisation); the algorithm's "
            f"loss_aggregation is {algorithm.loss_aggregation!r}: set loss_aggregation='token_mean'"
        )
    if algorithm.query_weight_source == "current" and args.num_iterations > 1:
        return "GRPOConfig.num_iterations > 1 with query_weight_source 'current' (w(q) is formed once per batch)"
    return None


def trainer_algorithm(algorithm: str | Algorithm, overrides: dict) -> Algorithm:
    """The preset (or `Algorithm`) with `overrides`; a bad value is refused naming ERPOTrainer's own argument (the
    algorithm module's messages name the `erpo fit` config fields, `model.<field>`)."""
    try:
        if isinstance(algorithm, Algorithm):
            return replace(algorithm, **overrides)
        return resolve_algorithm(algorithm, **overrides)
    except ValueError as error:
        raise ValueError(f"ERPOTrainer: {str(error).replace('model.', '')}") from None


def trl_loss_menu(args: GRPOConfig, algorithm: Algorithm) -> Algorithm:
    """`algorithm` with the GRPOConfig loss settings TRL users carry over, set away from TRL's defaults, as our
    loss-menu fields (a field left at its default keeps the algorithm's):

    - `importance_sampling_level='sequence'` -> `ratio_level='sequence'`; then `epsilon` / `epsilon_high` are the
      sequence ratio's clip (`sequence_clip_low` / `sequence_clip_high`; GSPO uses 3e-4 / 4e-4);
    - `loss_type='cispo'` -> `policy_loss='cispo'`, its `epsilon_high` (TRL's ε_max) -> `cispo_weight_cap`;
    - `entropy_coef` -> `entropy_coef`; `use_adaptive_entropy=True` -> `entropy_target` (TRL's), with
      `entropy_coef_delta` and [`entropy_coef_min`, `entropy_coef_max`] as `entropy_coef_range`;
    - `top_entropy_quantile` -> `entropy_top_fraction`.
    ValueError (from the algorithm's checks) for a value out of our range, e.g. a CISPO cap below 1.
    """
    changes: dict = {}

    def changed(name: str) -> bool:
        return getattr(args, name) != config_default(name)

    if args.importance_sampling_level == "sequence":
        changes["ratio_level"] = "sequence"
        if changed("epsilon"):
            changes["sequence_clip_low"] = args.epsilon
        if args.epsilon_high is not None:
            changes["sequence_clip_high"] = args.epsilon_high
    if args.loss_type == "cispo":
        changes["policy_loss"] = "cispo"
        if args.epsilon_high is not None:
            changes["cispo_weight_cap"] = args.epsilon_high
    if changed("entropy_coef"):
        changes["entropy_coef"] = args.entropy_coef
    if args.use_adaptive_entropy:
        changes["entropy_target"] = args.entropy_target
        changes["entropy_coef_delta"] = args.entropy_coef_delta
        changes["entropy_coef_range"] = (args.entropy_coef_min, args.entropy_coef_max)
    if changed("top_entropy_quantile"):
        changes["entropy_top_fraction"] = args.top_entropy_quantile
    return replace(algorithm, **changes) if changes else algorithm


def trl_rollout_correction(args: GRPOConfig, algorithm: Algorithm) -> Algorithm:
    """`algorithm` with TRL's vLLM importance-sampling correction as its `rollout_correction` fields.

    TRL applies `vllm_importance_sampling_correction` only with `use_vllm`; then its mode gives the correction and
    its level (`TRL_IS_MODES`), `vllm_importance_sampling_clip_max` the cap (None: inf) and `..._clip_min` the
    floor: TRL's weights (ours clamp log ρ at ±RATIO_LOG_CLAMP first, which only an infinite cap can see).
    Otherwise `algorithm` is returned as is. ValueError when the algorithm sets a correction too (one place sets
    it), or for a mode TRL 1.16 does not have.
    """
    if not (args.use_vllm and args.vllm_importance_sampling_correction):
        return algorithm
    if algorithm.rollout_correction != "none":
        raise ValueError(
            f"rollout_correction={algorithm.rollout_correction!r} and GRPOConfig.vllm_importance_sampling_correction="
            "True both set the mismatch correction: set vllm_importance_sampling_correction=False, or leave "
            "rollout_correction unset"
        )
    mode = args.vllm_importance_sampling_mode
    if mode not in TRL_IS_MODES:
        raise ValueError(f"GRPOConfig.vllm_importance_sampling_mode={mode!r} is not one of {', '.join(TRL_IS_MODES)}")
    correction, level = TRL_IS_MODES[mode]
    cap = args.vllm_importance_sampling_clip_max
    return replace(
        algorithm, rollout_correction=correction, rollout_correction_level=level,
        rollout_correction_cap=math.inf if cap is None else cap,
        rollout_correction_floor=args.vllm_importance_sampling_clip_min,
    )  # fmt: skip
