"""Slicing a rollout batch into optimizer mini-batches and token-budgeted micro-batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from erpo_lightning.rollout.batch import RolloutBatch


def minibatch_rows(num_rows: int, group_size: int, groups_per_update: int | None) -> list[torch.Tensor]:
    """Row indices of each optimizer step: consecutive whole groups, `groups_per_update` at a time (None = all)."""
    num_groups = num_rows // group_size
    per_update = num_groups if not groups_per_update else min(groups_per_update, num_groups)
    return [
        torch.arange(start * group_size, min(start + per_update, num_groups) * group_size)
        for start in range(0, num_groups, per_update)
    ]


def trim_padding(batch: RolloutBatch) -> RolloutBatch:
    """Drop prompt columns that are padding in every row and response columns past the longest response.

    Shrinks the forward to what the micro-batch really needs; `prompt_length` follows.
    """
    prompt_length = batch.prompt_length
    prompt_real = batch.attention_mask[:, :prompt_length].any(0).nonzero()
    first = int(prompt_real[0]) if len(prompt_real) else prompt_length - 1
    response_real = batch.response_mask.any(0).nonzero()
    response_width = int(response_real[-1]) + 1 if len(response_real) else 1
    return batch.trim_columns(first, response_width)


def micro_batches(batch: RolloutBatch, max_tokens: int) -> Iterator[RolloutBatch]:
    """Consecutive micro-batches whose padded size (rows × longest real length) stays within `max_tokens`.

    A single row longer than the budget still forms its own micro-batch. Each micro-batch is trimmed.
    """
    lengths = batch.attention_mask.sum(-1).tolist()
    start, longest = 0, 0
    for row, length in enumerate(lengths):
        longest_with_row = max(longest, length)
        if row > start and longest_with_row * (row - start + 1) > max_tokens:
            yield trim_padding(batch.select_rows(torch.arange(start, row)))
            start, longest_with_row = row, length
        longest = longest_with_row
    yield trim_padding(batch.select_rows(torch.arange(start, len(lengths))))
