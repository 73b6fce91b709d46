"""Reference per-token log-probs of every query: batched, length-sorted, sharded across ranks, resumable.

Queries are sorted by length (longest first, so an out-of-memory shows at once) and cut into chunks of
`chunk_size` queries; rank r scores chunks r, r + world_size, ... Each finished chunk is written to `chunk_dir`
(safetensors), so a restarted run skips it. Within a chunk, a transformers model scores in the blocks of
`scoring.queries.QueryScoringLayout`, the shape the training step scores queries at, so the two agree bit for bit;
vLLM scores in batches of at most `max_tokens` padded tokens.

A build stopped by SIGTERM or SIGUSR1 (`StopOnSignals`) keeps its finished chunks, leaves no partial file, and raises
`CacheBuildStopped`, which `erpo` turns into exit status 128 + the signal's number, as for a preempted fit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from safetensors import SafetensorError
from safetensors.torch import load_file

from erpo_lightning.data.cache import ReferenceLogprobCache, atomic_save_file
from erpo_lightning.data.reference_logprobs_vllm import vllm_query_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout, score_block

CHUNK_NAME = "chunk_{:06d}.safetensors"  # one finished chunk in `chunk_dir`, by chunk number
Shard = dict[str, torch.Tensor]  # {"query_index" [n], "lengths" [n], "logprobs" [sum(lengths)]}
Gather = Callable[[object], list]  # one object per rank in, every rank's object out (all_gather_object)
# A scheduler's notice to stop (SLURM, Kubernetes; SIGUSR1 is Lightning's SLURM requeue signal), as for fit.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class CacheBuildStopped(Exception):
    """A reference-score build stopped by a signal; `erpo` prints the message and exits `exit_status` (128 + the
    signal's number: 143 for SIGTERM), as a preempted fit does."""

    def __init__(self, number: int, outcome: str) -> None:
        name = signal.Signals(number).name
        super().__init__(f"stopped by {name} while building the reference score cache: {outcome}")
        self.exit_status = 128 + number


class StopOnSignals:
    """For the time of a cache build: SIGTERM / SIGUSR1 raise `CacheBuildStopped` at once (a chunk or file being
    written leaves nothing: `cache.atomic_write` removes its temporary file), except inside `deferred()`, which
    completes first and raises after. The previous handlers are back on exit; outside the main thread, where no
    handler can be set, nothing changes.

    Args:
        chunk_dir: the build's folder of finished chunks, named in the error.
    """

    def __init__(self, chunk_dir: str | Path) -> None:
        self.chunk_dir = chunk_dir
        self._previous: dict[int, object] = {}
        self._deferring = False
        self._pending: int | None = None

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, number: int, frame) -> None:
        if not self._deferring:
            kept = f"finished chunks stay in {self.chunk_dir} and the next run resumes from them"
            raise CacheBuildStopped(number, f"no partial cache was written; {kept}")
        self._pending = self._pending or number

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A step that must not be cut (writing the scores and then the manifest): a signal raises after it."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending is not None:
            raise CacheBuildStopped(self._pending, "the cache was written whole first; the next run loads it")


@dataclass
class LogprobBatching:
    """Batching of the cache forward.

    Attributes:
        max_tokens: padded tokens per vLLM batch (rows × longest prompt); bounds activation memory.
        max_batch_size: rows per vLLM batch.
        chunk_size: queries per resumable chunk (also the unit of work shared between ranks).
        layout: the blocks a transformers model scores in (the training step's shape: see `scoring.queries`).
    """

    max_tokens: int = 16384
    max_batch_size: int = 64
    chunk_size: int = 512
    layout: QueryScoringLayout = QueryScoringLayout()


def finished_chunks(chunk_dir: str | Path) -> int:
    """How many chunk files an earlier, interrupted build left in `chunk_dir` (read back, if intact, not recomputed)."""
    return len(list(Path(chunk_dir).glob(CHUNK_NAME.replace("{:06d}", "*"))))


def plan_chunks(lengths: Sequence[int], chunk_size: int) -> list[list[int]]:
    """Query indices sorted by length (longest first, ties by index) and cut into chunks."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[start : start + chunk_size] for start in range(0, len(order), chunk_size)]


def plan_batches(indices: Sequence[int], lengths: Sequence[int], settings: LogprobBatching) -> list[list[int]]:
    """Greedy batches of length-sorted `indices` with at most `max_tokens` padded tokens and `max_batch_size` rows."""
    batches: list[list[int]] = []
    for index in indices:
        batch = batches[-1] if batches else None
        width = max([lengths[i] for i in batch] + [lengths[index]]) if batch else lengths[index]
        if batch and len(batch) < settings.max_batch_size and width * (len(batch) + 1) <= settings.max_tokens:
            batch.append(index)
        else:
            batches.append([index])
    return batches


@torch.no_grad()
def batch_query_logprobs(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], layout: QueryScoringLayout | None = None
) -> list[torch.Tensor]:
    """Per-token log-probs of each prompt under `model`, scored in `layout`'s blocks (default: the default layout):
    one float32 [L_q] CPU tensor per prompt, entry 0 = 0."""
    layout = layout or QueryScoringLayout()
    rows: dict[int, torch.Tensor] = {}
    for block in layout.blocks([len(ids) for ids in prompts]):
        for position, row in zip(block, score_block(model, [prompts[p] for p in block], layout), strict=True):
            rows[position] = row.cpu().clone()
            rows[position][0] = 0.0
    return [rows[position] for position in range(len(prompts))]


def _load_chunk(path: Path, expected: list[int], lengths: list[int]) -> Shard | None:
    """A chunk written by an earlier run, if it is readable and holds exactly the expected queries (else recomputed)."""
    if not path.is_file():
        return None
    try:
        chunk = load_file(str(path))
        same = chunk["query_index"].tolist() == expected and chunk["lengths"].tolist() == [lengths[i] for i in expected]
        return chunk if same and chunk["logprobs"].numel() == sum(chunk["lengths"].tolist()) else None
    except (SafetensorError, OSError, KeyError):  # a damaged chunk is recomputed like a missing one
        return None


def compute_logprob_shard(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    rank: int = 0,
    world_size: int = 1,
    chunk_dir: str | Path | None = None,
    settings: LogprobBatching | None = None,
    progress: bool = True,
    resume: bool = True,
) -> Shard:
    """Score this rank's share of the queries (chunks rank, rank + world_size, ...).

    Args:
        model: a causal LM (torch module), or a `vllm.LLM` whose `prompt_logprobs` give the scores.
        prompts: token ids of every query (all ranks pass the same list).
        chunk_dir: where finished chunks are written and, on a rerun, read back instead of recomputed;
            None keeps everything in memory.
        resume: reuse chunks found in `chunk_dir` (False recomputes and overwrites them).
    Returns:
        {"query_index" [n] int64, "lengths" [n] int64, "logprobs" [Σ lengths] float32} for this rank's queries.
    """
    settings = settings or LogprobBatching()
    lengths = [len(ids) for ids in prompts]
    chunks = [(c, chunk) for c, chunk in enumerate(plan_chunks(lengths, settings.chunk_size)) if c % world_size == rank]
    done = [_shard([], [], torch.zeros(0))]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"))
    show = progress and rank == 0
    with Progress(*columns, TimeRemainingColumn(), console=Console(stderr=True), disable=not show) as bar:
        total = sum(lengths[i] for _, chunk in chunks for i in chunk)
        task = bar.add_task(f"reference log-probs (rank {rank}/{world_size})", total=total)
        for chunk_number, chunk in chunks:
            path = Path(chunk_dir) / CHUNK_NAME.format(chunk_number) if chunk_dir else None
            result = _load_chunk(path, chunk, lengths) if path and resume else None
            if result is None:
                result = _logprob_chunk(model, prompts, lengths, chunk, settings, lambda n: bar.advance(task, n))
                if path:
                    atomic_save_file(result, path)
            else:
                bar.advance(task, int(result["lengths"].sum()))
            done.append(result)
    return {key: torch.cat([shard[key] for shard in done]) for key in done[0]}


def _shard(indices: Sequence[int], lengths: Sequence[int], logprobs: torch.Tensor) -> Shard:
    return {
        "query_index": torch.tensor(indices, dtype=torch.long),
        "lengths": torch.tensor(lengths, dtype=torch.long),
        "logprobs": logprobs,
    }


def _logprob_chunk(model, prompts, lengths: list[int], chunk: list[int], settings: LogprobBatching, on_batch) -> Shard:
    """Score one chunk batch by batch (`on_batch(tokens)` after each) and return it in chunk order."""
    rows: dict[int, torch.Tensor] = {}
    if isinstance(model, torch.nn.Module):  # one scoring block at a time (its rows share a padded width)
        batches = [[chunk[p] for p in block] for block in settings.layout.blocks([lengths[i] for i in chunk])]
        score = lambda batch_prompts: batch_query_logprobs(model, batch_prompts, settings.layout)  # noqa: E731
    else:
        batches = plan_batches(chunk, lengths, settings)
        score = lambda batch_prompts: vllm_query_logprobs(model, batch_prompts)  # noqa: E731
    for batch in batches:
        rows.update(zip(batch, score([prompts[i] for i in batch]), strict=True))
        on_batch(sum(lengths[i] for i in batch))
    return _shard(chunk, [lengths[i] for i in chunk], torch.cat([rows[i] for i in chunk]))


def assemble(shards: Sequence[Shard], num_queries: int) -> ReferenceLogprobCache:
    """Merge the shards of all ranks into the cache, in query order; every query must appear exactly once."""
    index = torch.cat([shard["query_index"] for shard in shards])
    rows = [row for shard in shards for row in torch.split(shard["logprobs"], shard["lengths"].tolist())]
    if sorted(index.tolist()) != list(range(num_queries)):
        raise RuntimeError(f"the shards hold {index.numel()} query rows, not each of the {num_queries} queries once")
    return ReferenceLogprobCache.from_rows([rows[position] for position in index.argsort().tolist()])


def compute_reference_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    rank: int = 0,
    world_size: int = 1,
    gather: Gather | None = None,
    chunk_dir: str | Path | None = None,
    settings: LogprobBatching | None = None,
    progress: bool = True,
    resume: bool = True,
) -> ReferenceLogprobCache:
    """Reference log-probs of all `prompts`: each rank scores its shard, `gather` collects all shards on every rank.

    Args:
        gather: maps this rank's shard to the list of every rank's shard (e.g. `torch.distributed.all_gather_object`);
            None when world_size is 1.
    """
    if world_size > 1 and gather is None:
        raise ValueError("world_size > 1 needs a gather callable that collects the shards of all ranks")
    shard = compute_logprob_shard(model, prompts, rank, world_size, chunk_dir, settings, progress, resume)
    cache = assemble(gather(shard) if gather else [shard], len(prompts))
    # A transformers model scored in the layout, which the training step reproduces; vLLM's scores have none.
    cache.layout = (settings or LogprobBatching()).layout if isinstance(model, torch.nn.Module) else None
    return cache
