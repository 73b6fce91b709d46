"""The `train/` metrics of ERPOModule: built once, updated per micro-batch, computed and reset per training step."""

from __future__ import annotations

import torch
from torchmetrics import MaxMetric, MinMetric

from erpo_lightning.objectives import LossStats, QueryDrift
from erpo_lightning.training_metrics import MaskedMean, PolicyKL, QueryKL
from erpo_lightning.update import LossRows, StepStats

TRAIN_METRICS = (
    "loss", "pg_loss", "query_kl", "query_kl_token_k3", "policy_kl", "entropy", "clip_frac_low", "clip_frac_high",
    "dual_clip_frac", "ratio_mean", "approx_kl", "advantage_mean", "query_weight_mean", "query_weight_min",
    "query_weight_max", "logprob_abs_diff", "grad_norm", "query_loglik_change", "rollout_is_ratio_mean",
    "rollout_is_ratio_min", "rollout_is_ratio_max", "rollout_is_capped_frac",
)  # fmt: skip


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
