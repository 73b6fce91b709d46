"""Slicing a rollout batch into optimizer mini-batches and token-budgeted micro-batches, as many on every rank."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


def micro_batch_rows(lengths: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch: the rows sorted by real length, longest first (a stable sort, so equal
    lengths keep their order), cut into runs whose padded size (rows × the run's longest length) stays within
    `max_tokens`. Rows of similar length share a forward, so little of it is padding; the longest run comes first,
    so a budget too large for the machine fails at the first forward. A row longer than the budget forms its own
    micro-batch.

    Args:
        lengths: [N] real tokens of each row.
    Returns:
        index tensors (long) that together hold every row once.
    """
    order = torch.argsort(lengths, descending=True, stable=True)
    longest_first = lengths[order].tolist()  # one read, not a tensor index per row
    runs, start, count = [], 0, len(longest_first)
    for position in range(1, count + 1):
        if position == count or longest_first[start] * (position - start + 1) > max_tokens:
            runs.append(order[start:position])
            start = position
    return runs


def forwarded_lengths(batch: RolloutBatch, prompt_cached: bool = False) -> torch.Tensor:
    """[N] the real tokens each row's forward runs: its prompt and response; with `prompt_cached` (the shared
    prompt, whose rows run on their query's kept keys and values: `shared_prompt.PromptPass.forward`) its response
    alone."""
    mask = batch.attention_mask[:, batch.prompt_length :] if prompt_cached else batch.attention_mask
    return mask.sum(-1)


def micro_batches(
    batch: RolloutBatch, max_tokens: int, prompt_cached: bool = False
) -> Iterator[tuple[torch.Tensor, RolloutBatch]]:
    """(row indices into `batch`, micro-batch) pairs of `micro_batch_rows` over the tokens each row forwards
    (`forwarded_lengths`), each micro-batch trimmed of its padding columns (`trim_padding`).

    The loss of each is divided by its step's global counts (`update.step_normalizers`), so how the rows are cut
    changes the step's loss and gradient only by float rounding."""
    for rows in micro_batch_rows(forwarded_lengths(batch, prompt_cached), max_tokens):
        yield rows, trim_padding(batch.select_rows(rows))


def rank_aligned_micro_batches(
    batch: RolloutBatch, max_tokens: int, most: Callable[[int], int], prompt_cached: bool = False
) -> Iterator[tuple[RolloutBatch, torch.Tensor | None]]:
    """(micro-batch, its row indices into `batch`) pairs: `batch`'s `micro_batches` (`prompt_cached` as there), then
    one-row fillers (rows None) until this rank has yielded as many as the rank with the most. Under DDP and FSDP
    every forward/backward runs collectives, so the counts must agree.

    Args:
        most: this rank's count in, the largest over ranks out (the identity on one process).
    """
    micros = list(micro_batches(batch, max_tokens, prompt_cached))
    count = most(len(micros))
    yield from ((micro, rows) for rows, micro in micros)
    filler = micros[0][1].select_rows(torch.arange(1))
    yield from ((filler, None) for _ in range(count - len(micros)))
