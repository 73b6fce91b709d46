"""The query stream: one resumable order of training queries from which each step's batch and its refills draw."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Sampler


class QueryBatchSampler(Sampler[list[int]]):
    """Hands out training queries in one stream: this rank's share of each step's batch, and of each refill.

    Epoch e visits the queries in the order of one permutation drawn from `seed + e` (or in file order without
    shuffling); epochs follow each other in one stream, with a position (`epoch`, `offset` = queries of that epoch
    already handed out). Iterating (the DataLoader) yields the step batches of one epoch: the next
    `batch_size * world_size` queries of the stream each time, until the epoch cannot fill one more. `refill()`
    (dynamic sampling) takes the next global batch of the same stream, so a refill never repeats a query of its step
    or takes one another step already had; only when it runs past the end of the epoch does it continue with the next
    epoch's order (warned: a query can then repeat within that step), and that epoch's batches then start after it.

    Rank r takes every W-th query of each global batch, starting at r, so a run on W ranks sees exactly the global
    batches of a run on one rank with a W-times larger batch; every rank draws the same global batches (refills are
    decided collectively), so the stream is the same on all ranks and rank 0's checkpoint resumes every rank.
    The checkpointed state also holds the batches drawn but not yet trained on (a DataLoader with workers draws
    ahead): a resumed run hands them out first, then continues the stream, as the uninterrupted run does.

    Args:
        num_queries: size of the dataset.
        batch_size: queries per rank per step.
        shuffle: a new permutation each epoch; else file order.
        seed: the permutations' seed (`seed + epoch`).
        drop_last: drop the last incomplete global batch of an epoch (kept when the dataset is smaller than one
            batch); its queries remain for refills.
        rank, world_size: this process's place among the ranks.
        sources, weights: mixing across training sources (`SourceSpec.weight`): `sources[i]` is the source of query i
            and `weights[s]` source s's weight. Each position of an epoch's order (still `num_queries` long) then
            draws its source with probability weights[s] / sum(weights) and takes that source's next query, each
            source cycling through its own permutations (`mixed_order`); all drawn from `seed + epoch`, so the
            stream, and its resume, are those of an unweighted one. None: every query once per epoch.
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
        sources: list[int] | None = None,
        weights: list[float] | None = None,
    ) -> None:
        if num_queries < 1:
            raise ValueError("no training queries to sample from")
        self.weights = None if weights is None else [float(weight) for weight in weights]
        self.members: list[torch.Tensor] = []  # the queries of each source, when mixing
        if self.weights is not None:
            origin = torch.as_tensor(sources, dtype=torch.long)
            if len(origin) != num_queries:
                raise ValueError(f"sources names {len(origin)} queries' sources, there are {num_queries} queries")
            self.members = [torch.nonzero(origin == s).flatten() for s in range(len(self.weights))]
            if any(len(members) == 0 for members in self.members) or min(self.weights) <= 0:
                raise ValueError("every mixed source needs a positive weight and at least one query")
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
        self.epoch = 0  # the stream's epoch: refills can move it past the DataLoader's
        self.offset = 0  # queries of `epoch`'s order handed out
        self._warned_crossing = False  # refills crossing into the next epoch are said once per run
        self._loader_epoch = 0  # the epoch the DataLoader iterates (`set_epoch`)
        self._pending: list[list[int]] = []  # drawn before a checkpoint, not trained on: handed out first on resume
        self._drawn: list[list[int]] = []  # global batches yielded in this epoch's iteration, pending ones included
        self._trained_before = 0  # batches of this epoch trained on before this iteration (a resumed position)
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, its order), the one in use

    def __len__(self) -> int:
        """Step batches of one epoch without refills (refills take queries and end the epoch earlier)."""
        full, rest = divmod(self.num_queries, self.global_batch)
        return full if self.drop_last or rest == 0 else full + 1

    def order(self, epoch: int) -> torch.Tensor:
        """The visiting order of epoch `epoch`: [num_queries] indices."""
        if self.weights is not None:
            return self.mixed_order(epoch)
        if not self.shuffle:
            return torch.arange(self.num_queries)
        return torch.randperm(self.num_queries, generator=torch.Generator().manual_seed(self.seed + epoch))

    def mixed_order(self, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s order when mixing sources: each of its `num_queries` positions draws a source by weight,
        then takes that source's next query (the source's queries in a fresh permutation each time it runs out)."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        picks = torch.multinomial(torch.tensor(self.weights), self.num_queries, True, generator=generator)
        order = torch.empty(self.num_queries, dtype=torch.long)
        for source, members in enumerate(self.members):
            slots = torch.nonzero(picks == source).flatten()
            rounds = -(-len(slots) // len(members))
            cycle = [members[torch.randperm(len(members), generator=generator)] for _ in range(rounds)]
            order[slots] = torch.cat(cycle)[: len(slots)] if cycle else members[:0]
        return order

    @property
    def sampler(self) -> QueryBatchSampler:
        """Itself: Lightning calls `set_epoch` on a batch sampler's `sampler` (torch's BatchSampler wraps one), never
        on the batch sampler; without it every epoch would replay one position of the stream."""
        return self

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's share of each step batch of the DataLoader's epoch: first those drawn before the checkpoint
        this run resumed from and not trained on, then the next ones of the stream while it is in this epoch."""
        pending, self._pending = self._pending, []
        self._drawn = []
        for batch in pending:
            self._drawn.append(batch)
            yield batch[self.rank :: self.world_size]
        while self.epoch == self._loader_epoch:
            left = self.num_queries - self.offset
            if left == 0 or (left < self.global_batch and self.drop_last):
                return
            batch = self._take(min(left, self.global_batch))
            self._drawn.append(batch)
            yield batch[self.rank :: self.world_size]

    def refill(self) -> list[int]:
        """This rank's share of the next global batch of unused queries (dynamic sampling), crossing into the next
        epoch when this one runs out (warned the first time)."""
        batch: list[int] = []
        while len(batch) < self.global_batch:
            if self.offset == self.num_queries:
                if not self._warned_crossing:
                    self._warned_crossing = True
                    rank_zero_warn(
                        f"dynamic-sampling refills used up the queries of epoch {self.epoch}: they continue with the "
                        "next epoch's order, so a query can repeat within a step (more queries, a smaller "
                        "data.batch_size or fewer rollout.max_refill_rounds avoid it); said once per run, the "
                        "`rollout/repeated_queries` metric counts every repeat"
                    )
                self.epoch, self.offset = self.epoch + 1, 0
            batch += self._take(min(self.num_queries - self.offset, self.global_batch - len(batch)))
        return batch[self.rank :: self.world_size]

    def _take(self, count: int) -> list[int]:
        """The next `count` queries of the stream's epoch (global indices), advancing the position."""
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, self.order(self.epoch))
        taken = self._order[1][self.offset : self.offset + count].tolist()
        self.offset += count
        return taken

    def set_epoch(self, epoch: int) -> None:
        """Start the DataLoader's epoch `epoch`: from the stream's position when refills already entered it (or a
        checkpoint was taken in it), else from the beginning of its order."""
        if epoch > self.epoch:
            self.epoch, self.offset, self._pending = epoch, 0, []
        if epoch != self._loader_epoch:
            self._trained_before, self._drawn = 0, []
        self._loader_epoch = epoch

    def state_dict(self, batches_done: int) -> dict[str, Any]:
        """The stream's position, for a checkpoint taken after `batches_done` step batches of this epoch."""
        # Resumed batches not handed out again yet are still pending.
        untrained = self._pending + self._drawn[max(batches_done - self._trained_before, 0) :]
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "loader_epoch": self._loader_epoch,
            "batches_done": batches_done,
            "pending": [list(batch) for batch in untrained],
            "num_queries": self.num_queries,
            "seed": self.seed,
            "weights": self.weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the stream; a state that carries only `epoch` and `batches_done` (no refills) is also accepted.

        Raises:
            ValueError when the state belongs to another dataset size or seed: its position would name other queries.
        """
        if state.get("num_queries", self.num_queries) != self.num_queries:
            raise ValueError(
                f"the checkpoint's query stream covers {state['num_queries']} training queries, this run has "
                f"{self.num_queries}: resume with the data configuration the run started with"
            )
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"the checkpoint's query stream was shuffled with data.seed {state['seed']}, this run's is {self.seed}:"
                " resume with the data configuration the run started with"
            )
        if state.get("weights", self.weights) != self.weights:
            raise ValueError(
                f"the checkpoint's query stream mixed its sources with weights {state['weights']}, this run's are "
                f"{self.weights}: resume with the data configuration the run started with"
            )
        self._trained_before = state["batches_done"]
        self.epoch = state["epoch"]
        self._loader_epoch = state.get("loader_epoch", self.epoch)
        self.offset = state.get("offset", self._trained_before * self.global_batch)
        self._pending = [list(batch) for batch in state.get("pending", [])]
