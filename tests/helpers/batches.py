"""The one way tests build training batches by hand: through the package's own constructor, `assemble_batch`."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.utils.data import DataLoader

from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch, assemble_batch
from erpo_lightning.rollout.engine import Sample


def make_rollout(
    prompts: list[list[int]],
    responses: list[list[int]],
    rewards: list[float],
    temperature: float,
    logprobs: list[list[float]] | None = None,
    query_index: list[int] | None = None,
    truncated: tuple[int, ...] = (),
    pad_token_id: int = 0,
    max_new_tokens: int | None = None,
) -> RolloutBatch:
    """The `RolloutBatch` of B `prompts` and their N = B·G `responses` (response b·G + g answers prompt b).

    Args:
        rewards: [N] one per response.
        temperature: T the responses were sampled at (the batch carries it; the module scores at it).
        logprobs: [N] lists, the sampling log-prob of each response token (None = zeros).
        query_index: [B] dataset rows of the prompts (None = 0..B-1).
        truncated: rows whose response hit the length cap.
        max_new_tokens: the length cap the batch says it was sampled with (None = not known).
    """
    group_size = len(responses) // len(prompts)
    logprobs = logprobs or [[0.0] * len(ids) for ids in responses]
    samples = [
        [
            Sample(list(responses[row]), list(logprobs[row]), "length" if row in truncated else "stop")
            for row in range(b * group_size, (b + 1) * group_size)
        ]
        for b in range(len(prompts))
    ]
    index = torch.arange(len(prompts)) if query_index is None else torch.tensor(query_index)
    return assemble_batch(
        prompts, samples, torch.tensor(rewards), index, pad_token_id, temperature, max_new_tokens=max_new_tokens
    )


def carrying_scores(rollout: RolloutBatch, algorithm: Algorithm, reference_nll: torch.Tensor) -> RolloutBatch:
    """`rollout` with each row's query scores as QueryDataModule's stream carries them, from a reference cache's
    `reference_nll` [Q]: s(q), and w(q) from `algorithm.query_weight_table` when its rule makes w(q) static."""
    rows = rollout.query_index
    table = algorithm.query_weight_table(reference_nll)
    return replace(rollout, reference_nll=reference_nll[rows], query_weights=None if table is None else table[rows])


def with_rollout(rollout: RolloutBatch, prompts: list[list[int]] | None = None) -> QueryBatch:
    """The `QueryBatch` a training step receives once the RolloutCallback has attached `rollout`."""
    leaders = rollout.query_index[rollout.is_group_leader]
    prompts = prompts or [[] for _ in leaders]
    return QueryBatch(leaders.clone(), prompts, ["" for _ in leaders], rollout=rollout)


def rollout_loader(rollouts: list[RolloutBatch]) -> DataLoader:
    """A DataLoader yielding one `QueryBatch` with its rollout attached per step, as `trainer.fit` gets them."""
    return DataLoader([with_rollout(r) for r in rollouts], batch_size=None, collate_fn=lambda batch: batch)
