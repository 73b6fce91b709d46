"""torchmetrics for RL training: every value is a global statistic (synchronised across ranks on `compute`)."""

from __future__ import annotations

import torch
from torchmetrics import Metric


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
