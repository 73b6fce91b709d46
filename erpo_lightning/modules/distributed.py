"""What makes a run on W ranks compute what one process computes on the same global batch.

Each function takes the Lightning `trainer` (None or one rank: no communication). The update (`update/`) receives
these collectives as functions and aligns its micro-batches over ranks itself (`update.rank_aligned_micro_batches`).
"""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics.utilities.distributed import gather_all_tensors

from erpo_lightning import objectives as obj


def _single_process(trainer: L.Trainer | None) -> bool:
    return trainer is None or trainer.world_size == 1


def all_reduce(
    trainer: L.Trainer | None, value: torch.Tensor | float, reduce_op: str, device: torch.device
) -> torch.Tensor:
    """`value` (any shape) reduced over all ranks with `reduce_op` ("sum", "max"), as float32 on `device`."""
    value = torch.as_tensor(value, dtype=torch.float32, device=device).clone()  # reduced in place
    if _single_process(trainer):
        return value
    return trainer.strategy.reduce(value, reduce_op=reduce_op)


def global_advantages(
    trainer: L.Trainer | None, rewards: torch.Tensor, group_size: int, estimator: obj.Estimator, eps: float
) -> torch.Tensor:
    """Advantages of this rank's rows, [N]. Groups never span ranks, so group baselines are local; the
    `reinforce` batch-mean baseline is the mean over every rank's rows.
    """
    if estimator != "reinforce" or _single_process(trainer):
        return obj.group_advantages(rewards, group_size, estimator, eps)
    gathered = gather_all_tensors(rewards.float())  # ranks may hold different numbers of rows
    offset = sum(len(part) for part in gathered[: trainer.global_rank])
    return obj.group_advantages(torch.cat(gathered), group_size, estimator, eps)[offset : offset + len(rewards)]
