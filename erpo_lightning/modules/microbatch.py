"""Slicing a rollout batch into optimizer mini-batches and token-budgeted micro-batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Per-row tensors of a rollout batch: [N, ...] entries that follow the rows when a batch is sliced.
ROW_KEYS = (
    "input_ids",
    "attention_mask",
    "response_mask",
    "sampling_logprobs",
    "rewards",
    "group_index",
    "query_index",
    "query_weight",
    "truncated",
    "advantages",
    "old_logprobs",
    "is_group_leader",
)


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The sub-batch of `rows` (a LongTensor of row indices); non-row entries (prompt_length, ...) are shared."""
    return {key: (value[rows] if key in ROW_KEYS and torch.is_tensor(value) else value) for key, value in batch.items()}


def minibatch_rows(num_rows: int, group_size: int, groups_per_update: int | None) -> list[torch.Tensor]:
    """Row indices of each optimizer step: consecutive whole groups, `groups_per_update` at a time (None = all)."""
    num_groups = num_rows // group_size
    per_update = num_groups if not groups_per_update else min(groups_per_update, num_groups)
    return [
        torch.arange(start * group_size, min(start + per_update, num_groups) * group_size)
        for start in range(0, num_groups, per_update)
    ]


def trim_padding(batch: dict) -> dict:
    """Drop prompt columns that are padding in every row and response columns past the longest response.

    Shrinks the forward to what the micro-batch really needs; `prompt_length` follows.
    """
    prompt_length = batch["prompt_length"]
    attention = batch["attention_mask"]
    prompt_real = attention[:, :prompt_length].any(0).nonzero()
    first = int(prompt_real[0]) if len(prompt_real) else prompt_length - 1
    response_real = batch["response_mask"].any(0).nonzero()
    response_width = int(response_real[-1]) + 1 if len(response_real) else 1
    end = prompt_length + response_width
    trimmed = dict(batch)
    for key in ("input_ids", "attention_mask"):
        trimmed[key] = batch[key][:, first:end]
    for key in ("response_mask", "sampling_logprobs", "old_logprobs"):
        if key in batch:
            trimmed[key] = batch[key][:, :response_width]
    trimmed["prompt_length"] = prompt_length - first
    return trimmed


def micro_batches(batch: dict, max_tokens: int) -> Iterator[dict]:
    """Consecutive micro-batches whose padded size (rows × longest real length) stays within `max_tokens`.

    A single row longer than the budget still forms its own micro-batch. Each micro-batch is trimmed.
    """
    lengths = batch["attention_mask"].sum(-1).tolist()
    start, longest = 0, 0
    for row, length in enumerate(lengths):
        longest_with_row = max(longest, length)
        if row > start and longest_with_row * (row - start + 1) > max_tokens:
            yield trim_padding(select_rows(batch, torch.arange(start, row)))
            start, longest_with_row = row, length
        longest = longest_with_row
    yield trim_padding(select_rows(batch, torch.arange(start, len(lengths))))
