"""ERPO's per-query weight w(q), from the summed negative log-likelihood of each query."""

from __future__ import annotations

from typing import Literal

import torch

# Where s(q) comes from: the frozen reference's cached NLL (the paper) or the current policy's (the released code).
QueryWeightSource = Literal["reference", "current"]
# What s̄ averages over: the whole training set (the paper) or the optimizer step's queries on all ranks (released).
QueryWeightNorm = Literal["dataset", "batch"]
# The paper's clip of w(q) (Appendix I); None = unclipped (the released code).
DEFAULT_QUERY_WEIGHT_CLIP = (0.0, 2.0)


def query_weights(
    ref_query_nll: torch.Tensor,
    dataset_mean_nll: float | torch.Tensor,
    clip: tuple[float, float] | None = DEFAULT_QUERY_WEIGHT_CLIP,
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
