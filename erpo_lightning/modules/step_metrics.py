"""The `train/` metrics of ERPOModule: built once, updated per micro-batch, computed and reset per training step.

Every value is a global statistic: torchmetrics synchronise their states across ranks on `compute`.
"""

from __future__ import annotations

import torch
from torchmetrics import MaxMetric, Metric, MinMetric

from erpo_lightning.objectives import LossSettings, LossStats, QueryDrift
from erpo_lightning.update import LossRows, StepStats

TRAIN_METRICS = (
    "loss", "pg_loss", "query_kl", "query_kl_token_k3", "policy_kl", "entropy", "clip_frac_low", "clip_frac_high",
    "dual_clip_frac", "ratio_mean", "approx_kl", "advantage_mean", "query_weight_mean", "query_weight_min",
    "query_weight_max", "logprob_abs_diff", "grad_norm", "query_loglik_change", "rollout_is_ratio_mean",
    "rollout_is_ratio_min", "rollout_is_ratio_max", "rollout_is_capped_frac",
    # the loss menu's statistics (`objectives.LossStats.pg_stats`), logged by the runs whose settings make them
    "seq_ratio_dev", "cispo_truncated_frac", "entropy_kept_frac", "entropy_coef", "bonus_entropy", "entropy_bonus",
    "entropy_target",
)  # fmt: skip
# Steps in a row with every response token outside the rollout correction's band before `SaturatedCorrection` warns.
SATURATED_STEPS = 3


class MaskedMean(Metric):
    """Mean of values over the positions where a mask is 1, accumulated over updates and ranks.

    `update(values, mask=None)`: any shape; `mask` broadcastable to `values` (None = all positions).
    """

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        values = values.detach().double()
        if mask is None:
            mask = torch.ones_like(values)
        mask = mask.detach().double().expand_as(values)
        self.total += (values * mask).sum()
        self.count += mask.sum()

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp(min=1)).float()


class QueryKL(MaskedMean):
    """Query-KL(ρθ ‖ ρθ0): the mean over unique queries of `objectives.per_query_kl`, update with a [Q] tensor.

    Logged for every algorithm, baselines included: it is the drift signal that Policy-KL does not show.
    """


class PolicyKL(MaskedMean):
    """Policy-KL(πθ ‖ π_ref) per response token: update with per-token KL [N, T] and the response mask."""


def build_train_metrics() -> torch.nn.ModuleDict:
    """One metric per name of TRAIN_METRICS: masked means, except the Query-KL / Policy-KL and the extremes of w(q)
    and of the rollout correction's ratio."""
    metrics = torch.nn.ModuleDict({name: MaskedMean() for name in TRAIN_METRICS})
    metrics.update({
        "query_kl": QueryKL(), "query_kl_token_k3": QueryKL(), "policy_kl": PolicyKL(),
        "query_weight_min": MinMetric(), "query_weight_max": MaxMetric(),
        "rollout_is_ratio_min": MinMetric(), "rollout_is_ratio_max": MaxMetric(),
    })  # fmt: skip
    return metrics


def update_step_metrics(
    metrics: torch.nn.ModuleDict,
    loss: torch.Tensor,
    pg_loss: torch.Tensor,
    grad_norm: torch.Tensor,
    step: StepStats,
) -> None:
    """Add one finite optimizer step: its loss, policy-gradient term and gradient norm (0-dim, the whole step's,
    equal on every rank), each micro-batch's `LossStats` and the exact pass's query drift."""
    metrics["loss"].update(loss)
    metrics["pg_loss"].update(pg_loss)
    metrics["grad_norm"].update(grad_norm)
    for rows, stats in step.micro:
        update_micro_metrics(metrics, rows, stats)
    if step.query_drift is not None:
        update_query_metrics(metrics, step.query_drift)


def update_query_metrics(metrics: torch.nn.ModuleDict, drift: QueryDrift) -> None:
    """Add the per-query values of a step's queries, each under its field's name."""
    for name in ("query_kl", "query_kl_token_k3", "query_loglik_change"):
        metrics[name].update(getattr(drift, name))


def update_micro_metrics(metrics: torch.nn.ModuleDict, micro: LossRows, stats: LossStats) -> None:
    """Add one micro-batch's `LossStats` (with its entropy); the queries' drift only when the micro-batch's forward
    scored the queries (`query_kl_scoring: shared_forward`)."""
    response_mask = micro.response_mask
    if stats.query_drift is not None:
        update_query_metrics(metrics, stats.query_drift)
    metrics["entropy"].update(stats.entropy, response_mask)
    for name, per_token in (("policy_kl", stats.policy_kl), ("logprob_abs_diff", stats.logprob_abs_diff)):
        if per_token is not None:
            metrics[name].update(per_token, response_mask)
    tokens = response_mask.sum()
    for name, value in stats.pg_stats.items():  # token means: weight by this micro-batch's token count
        metrics[name].update(value, tokens)
    metrics["advantage_mean"].update(micro.advantages)
    if stats.rollout_is_ratio is not None:
        update_rollout_correction_metrics(metrics, stats.rollout_is_ratio, stats.rollout_is_outside, response_mask)
    if micro.query_weights is None:
        return
    weights = micro.query_weights[micro.is_group_leader]
    metrics["query_weight_mean"].update(weights)
    if len(weights):
        metrics["query_weight_min"].update(weights)
        metrics["query_weight_max"].update(weights)


def update_rollout_correction_metrics(
    metrics: torch.nn.ModuleDict, ratio: torch.Tensor, outside: torch.Tensor, response_mask: torch.Tensor
) -> None:
    """Add the engine–trainer ratio ρ ([N, R], each token's or its response's) over the response tokens: its mean,
    min and max, and the share of tokens whose ρ left the band (`rollout_is_capped_frac`)."""
    metrics["rollout_is_ratio_mean"].update(ratio, response_mask)
    metrics["rollout_is_capped_frac"].update(outside.float(), response_mask)
    real = ratio[response_mask.bool()]
    if len(real):
        metrics["rollout_is_ratio_min"].update(real)
        metrics["rollout_is_ratio_max"].update(real)


def compute_and_reset(metrics: torch.nn.ModuleDict) -> dict[str, torch.Tensor]:
    """`train/<name>` of every metric updated since the last call; all of them reset."""
    logged = {}
    for name, metric in metrics.items():
        if metric.update_count:
            logged[f"train/{name}"] = metric.compute()
        metric.reset()
    return logged


class SaturatedCorrection:
    """Warns once when `train/rollout_is_capped_frac` is 1 for `steps` logged training steps in a row: every response
    token's engine–trainer ratio ρ left [rollout_correction_floor, rollout_correction_cap], so under `mis` no
    policy-gradient term is left (the run learns from Query-KL and Policy-KL alone) and under `tis` every token's
    weight is a bound, not its ratio.

    Args:
        settings: the run's loss settings (their correction, level, cap and floor are named in the warning).
        steps: consecutive saturated steps before the warning (SATURATED_STEPS).
    """

    def __init__(self, settings: LossSettings, steps: int = SATURATED_STEPS) -> None:
        self.settings, self.steps = settings, steps
        self.streak, self.warned = 0, False

    def update(self, capped_frac: torch.Tensor | float | None) -> str | None:
        """Add one step's `train/rollout_is_capped_frac` (a share of response tokens, or None when the correction
        logged nothing); the warning text on the step that completes the first saturated run, else None."""
        saturated = capped_frac is not None and float(capped_frac) >= 1.0
        self.streak = self.streak + 1 if saturated else 0
        if self.warned or self.streak < self.steps:
            return None
        self.warned = True
        s = self.settings
        floor = 0 if s.rollout_correction_floor is None else s.rollout_correction_floor
        lost = (
            "its policy-gradient terms are all zeroed (the run learns from Query-KL and Policy-KL alone)"
            if s.rollout_correction == "mis"
            else "every token's weight is the band's bound instead of its ratio"
        )
        return (
            f"train/rollout_is_capped_frac has been 1.0 for {self.streak} steps in a row: every response token's "
            f"engine/trainer ratio ρ left the band [{floor:g}, {s.rollout_correction_cap:g}] of "
            f"model.rollout_correction {s.rollout_correction!r} (rollout_correction_level "
            f"{s.rollout_correction_level!r}), so {lost}; train/rollout_is_ratio_mean shows where ρ lies: widen "
            "model.rollout_correction_cap / rollout_correction_floor (a sequence-level ratio spreads wider than a "
            "token's), or find why the rollout engine's log-probs differ from the trainer's (train/logprob_abs_diff)"
        )
