"""Batches of query indices that are the same on any number of ranks and resume mid-epoch from a checkpoint."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class QueryBatchSampler(Sampler[list[int]]):
    """Yields this rank's share of each global batch of query indices.

    Epoch e visits the queries in the order of one permutation drawn from `seed + e` (or in file order without
    shuffling). Each global batch holds `batch_size * world_size` queries and rank r takes every W-th of them,
    starting at r, so a run on W ranks sees exactly the global batches of a run on one rank with a W-times larger
    batch. The position (`epoch`, `batches_done`) is saved in checkpoints: a resumed run continues with the next
    unseen batch.

    Args:
        num_queries: size of the dataset.
        batch_size: queries per rank per step.
        drop_last: drop the last incomplete global batch (kept when the dataset is smaller than one batch).
    """

    def __init__(
        self,
        num_queries: int,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_queries < 1:
            raise ValueError("no training queries to sample from")
        self.num_queries, self.batch_size, self.shuffle, self.seed = num_queries, batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.global_batch = batch_size * world_size
        if world_size > 1 and num_queries < self.global_batch:
            raise ValueError(
                f"{num_queries} training queries cannot fill one global batch of {batch_size} × {world_size} ranks: "
                "lower data.batch_size or add queries"
            )
        # Several ranks must all get a full share of every batch, so the ragged last batch goes.
        self.drop_last = (drop_last or world_size > 1) and num_queries >= self.global_batch
        self.epoch = 0
        self.batches_done = 0  # batches of `epoch` already trained on (restored from a checkpoint)

    def __len__(self) -> int:
        full, rest = divmod(self.num_queries, self.global_batch)
        return full if self.drop_last or rest == 0 else full + 1

    def order(self, epoch: int) -> torch.Tensor:
        """The visiting order of epoch `epoch`: [num_queries] indices."""
        if not self.shuffle:
            return torch.arange(self.num_queries)
        return torch.randperm(self.num_queries, generator=torch.Generator().manual_seed(self.seed + epoch))

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        start_batch, self.batches_done = self.batches_done, 0  # a resumed position is used once
        for batch in range(start_batch, len(self)):
            global_slice = order[batch * self.global_batch : (batch + 1) * self.global_batch]
            # Strided, not contiguous: the first k queries of each rank's batch are then the first k × W of the
            # global batch, so mini-batches of `update_batch_size` group the same queries as on one process.
            share = global_slice[self.rank :: self.world_size]
            yield share.tolist()

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # a restored position belongs to its own epoch only (end-of-epoch checkpoints)
            self.batches_done = 0
        self.epoch = epoch

    def state_dict(self, batches_done: int) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_done": batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches_done = state["epoch"], state["batches_done"]
