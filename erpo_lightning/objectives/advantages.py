"""Advantage estimators: one scalar per response from the rewards of its group."""

from __future__ import annotations

from typing import Literal

import torch

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce"]
# Estimators whose baseline comes from the other responses of the same query: a group of one has none.
GROUP_ESTIMATORS: tuple[Estimator, ...] = ("grpo", "dr_grpo", "rloo")
# The default eps of the grpo estimator's (r - mean) / (std + eps).
DEFAULT_ADVANTAGE_EPS = 1e-6


def check_group_size(estimator: Estimator, group_size: int, field: str = "rollout.group_size") -> None:
    """ValueError when `estimator` takes its baseline from the other responses of a query (`GROUP_ESTIMATORS`) and a
    group has fewer than 2; `field` is the setting the message names (e.g. `rollout.group_size`)."""
    if estimator in GROUP_ESTIMATORS and group_size < 2:
        raise ValueError(
            f"{field} must be >= 2 with the {estimator!r} advantage estimator (it compares the responses of one "
            f"query), got {group_size}"
        )


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: Estimator = "grpo",
    eps: float = DEFAULT_ADVANTAGE_EPS,
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
        eps: added to the group std of `grpo` (TRL uses 1e-4).
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
    check_group_size(estimator, group_size)
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
