"""Scoring queries alone, in one fixed layout, so the training step reproduces the θ0 cache bit for bit.

A forward's rounding depends on the shape it runs at: the same query scored inside a wider row (its prompt followed
by a response) or in a batch of another size gets log-probs a few ulps apart in float32 and up to 0.6 nats apart in
bfloat16 (docs/erpo.md, "Query-KL at θ0"). Query-KL compares the step's scores with the cached ones, so that gap
would be drift the regulariser pulls against. The cache build and the step therefore score queries the same way:
blocks of exactly `rows` queries (short blocks filled with padding rows), each query right-padded to its length
rounded up to `width_multiple` tokens. Equal shapes run the same kernels, and under causal attention a real token
never sees the padding after it nor another row, so a query's scores do not depend on which rows share its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from erpo_lightning.scoring.logprobs import causal_lm_output, gather_token_logprobs


@dataclass(frozen=True)
class QueryScoringLayout:
    """The shape every query-scoring forward runs at (the cache build's and the training step's).

    Attributes:
        rows: queries per forward; a block with fewer is filled with padding rows to this many.
        width_multiple: a query of L tokens is right-padded to L rounded up to a multiple of this (tokens).
    """

    rows: int = 8
    width_multiple: int = 64

    def __post_init__(self) -> None:
        for name in ("rows", "width_multiple"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"the query scoring layout's {name} must be an integer >= 1, got {value!r}")

    def width(self, length: int) -> int:
        """The padded width (tokens) of a query of `length` tokens."""
        return -(-length // self.width_multiple) * self.width_multiple

    def blocks(self, lengths: Sequence[int]) -> list[list[int]]:
        """Positions into `lengths` grouped by padded width (first seen first, order kept within a width), cut into
        blocks of at most `rows`."""
        by_width: dict[int, list[int]] = {}
        for position, length in enumerate(lengths):
            by_width.setdefault(self.width(length), []).append(position)
        rows = self.rows
        return [group[start : start + rows] for group in by_width.values() for start in range(0, len(group), rows)]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _block_input_ids(
    prompts: Sequence[Sequence[int]], layout: QueryScoringLayout, device: torch.device | str
) -> torch.Tensor:
    """[layout.rows, W] token ids of one scoring block: each query right-padded with token 0 to the block's padded
    width W, and padding rows of token 0 after the queries. Refuses (ValueError) queries of different padded widths
    or more queries than `layout.rows`."""
    widths = {layout.width(len(ids)) for ids in prompts}
    if len(widths) != 1 or not 1 <= len(prompts) <= layout.rows:
        raise ValueError(f"a scoring block holds 1 to {layout.rows} queries of one padded width, got widths {widths}")
    input_ids = torch.zeros(layout.rows, widths.pop(), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return input_ids.to(device)


def forward_block(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], layout: QueryScoringLayout, *, keep_cache: bool = False
) -> tuple[Any, list[torch.Tensor]]:
    """The forward of one scoring block in the layout's shape, and each query's per-token log-probs from it.

    The one forward both the cache build and the training step score queries with (`score_block`), and the shared
    prompt too (`keep_cache`: the output also holds the block's keys and values; keeping them does not change the
    computation). Differentiable when called with grad enabled; without `keep_cache`, whose caller reads the logits
    again, backward writes the logits' gradient into their own buffer (one logits-sized buffer at the peak).

    Args:
        prompts: token ids of up to `layout.rows` queries; all must share one `layout.width`.
    Returns:
        the model's output (`.logits` [rows, W, V], `.past_key_values` with `keep_cache`), and one [L_q] float32
        tensor per query on the model's device (column t = log p(token t | tokens < t); column 0 has no context and
        is whatever the forward gives: callers ignore it).
    """
    input_ids = _block_input_ids(prompts, layout, next(model.parameters()).device)
    # An all-ones mask: padding sits after every real token, so causal attention keeps it out of every real score.
    output = causal_lm_output(model, input_ids, torch.ones_like(input_ids), use_cache=keep_cache)
    token_logprobs = gather_token_logprobs(output.logits, input_ids, gradient_into_logits=not keep_cache).float()
    return output, [token_logprobs[row, : len(ids)] for row, ids in enumerate(prompts)]


def score_block(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], layout: QueryScoringLayout
) -> list[torch.Tensor]:
    """Per-token log-probs of up to `layout.rows` queries of one padded width, in the layout's shape
    (`forward_block`'s). Differentiable when called with grad enabled (the training step); the cache build calls it
    under no_grad."""
    return forward_block(model, prompts, layout)[1]
