"""Building or loading a `QueryDataModule`'s reference score cache: the frozen θ0 model (or vLLM engine) that scores
the queries, the dtype it runs in, and the checks that a cache found on disk is this run's and intact.

The datamodule states what it needs as a `CacheRequest` (`QueryDataModule.cache_request`: its queries, settings and
fingerprint), and `QueryDataModule.build_or_load_cache` and `erpo cache` both run `load_or_compute_cache` on it; the
cache's files, manifest and locks are `data/cache.py`'s, its fingerprint `data/fingerprint.py`'s.
"""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from transformers import AutoModelForCausalLM

from erpo_lightning.common.file_hashes import cache_home
from erpo_lightning.data.cache import (
    SCORES_FILE,
    CacheCorruptError,
    ReferenceLogprobCache,
    check_writable,
    lock_cache_build,
    read_manifest,
    remove_stale_temporaries,
    write_cache,
)
from erpo_lightning.data.fingerprint import check_manifest, fingerprint_digest
from erpo_lightning.data.reference_logprobs import (
    Gather,
    LogprobBatching,
    StopOnSignals,
    compute_reference_logprobs,
    finished_chunks,
)
from erpo_lightning.data.reference_logprobs_vllm import build_vllm_engine
from erpo_lightning.scoring.layers import compile_decoder_layers
from erpo_lightning.scoring.queries import QueryScoringLayout

DEFAULT_CACHE_ROOT = cache_home() / "reference"


@rank_zero_only
def report(message: str) -> None:
    """A one-line progress or summary message, printed once (rank 0), on stderr like the progress bar."""
    print(f"[erpo data] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class CacheRequest:
    """What a reference score cache is loaded or computed from, and where it lives (`QueryDataModule.cache_request`).

    Attributes:
        model_path: the frozen reference θ0 (the initial policy).
        prompt_ids: [Q] each query's prompt token ids.
        manifest: the fingerprint a cache on disk must match (`fingerprint.build_manifest`, with the engine).
        dtype: the reference forward's `ComputePath.name`.
        dtype_source: what chose `dtype`, as the report names it ("data.cache_dtype", "the policy's", "the default").
        cache_dir: the cache's folder; None: a folder named by the fingerprint under DEFAULT_CACHE_ROOT.
        engine: "transformers" or "vllm".
        device: the transformers forward's device; None: the strategy's root device, else CUDA if available.
        max_prompt_length: the longest prompt in tokens (vLLM's context is one more).
        batching: how the queries are batched and chunked (`LogprobBatching`).
        layout: the layout the scores are served in (`QueryDataModule.scoring_layout`; None with vLLM).
    """

    model_path: str
    prompt_ids: Sequence[Sequence[int]]
    manifest: dict
    dtype: str
    dtype_source: str
    cache_dir: str | None
    engine: Literal["transformers", "vllm"]
    device: str | None
    max_prompt_length: int
    batching: LogprobBatching
    layout: QueryScoringLayout | None

    @property
    def digest(self) -> str:
        """The fingerprint's digest, which names the cache's default folder and its chunks."""
        return fingerprint_digest(self.manifest)

    @property
    def directory(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else DEFAULT_CACHE_ROOT / self.digest


def distributed_context(strategy=None) -> tuple[int, int, Gather | None]:
    """(rank, world_size, gather) of a Lightning strategy; (0, 1, None) without one."""
    if strategy is None or strategy.world_size == 1:
        return 0, 1, None

    def gather(obj):
        gathered = [None] * strategy.world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    return strategy.global_rank, strategy.world_size, gather


def load_or_compute_cache(
    request: CacheRequest, force: bool, strategy=None, repair: bool = False
) -> ReferenceLogprobCache:
    """Load the reference score cache `request` names if it exists and matches it; otherwise compute it and write it
    (rank 0).

    Args:
        force: recompute even if a cache exists.
        strategy: a Lightning strategy to shard the computation over its ranks; None computes on one process.
        repair: recompute a cache whose files are damaged or do not belong together (what `erpo cache` does)
            instead of raising `CacheCorruptError`.
    Raises:
        CacheMismatchError when a cache exists in `cache_dir` but was computed from another model, tokenizer,
        template, data or dtype (the message names the fields and how to rebuild); CacheCorruptError when its
        files are unreadable, cut short, or its scores are not its manifest's (unless `repair`).
    """
    manifest, digest, directory = request.manifest, request.digest, request.directory
    chunk_dir = directory / "partial" / f"{digest}-c{request.batching.chunk_size}"
    rank, world_size, gather = distributed_context(strategy)
    # Before the ranks meet below: no rank of this run has written anything yet.
    if removed := remove_stale_temporaries(directory):
        report(f"removed {len(removed)} temporary file(s) left in {directory} by an interrupted write")
    cache = None if force else _load_checked(request, repair)
    reuse = cache is not None
    if gather is not None:  # every rank takes the same branch: computing needs all of them
        reuse = all(gather(reuse))
    if reuse:
        report(f"loaded reference scores of {len(cache)} queries ({request.dtype}) from {directory}")
        return replace(cache, layout=request.layout)

    check_writable(directory, chunk_dir)  # a read-only folder is refused before the model loads
    if rank == 0:  # and so is a second job building this folder's cache meanwhile (its ranks build together)
        lock_cache_build(directory)
    with StopOnSignals(chunk_dir) as stop:  # SIGTERM / SIGUSR1: finished chunks kept, nothing partial
        model = reference_engine(request, world_size, strategy)
        report(
            f"computing reference scores of {manifest['num_queries']} queries "
            f"({manifest['num_prompt_tokens']} tokens) with {request.model_path} "
            f"({request.engine}, {request.dtype}: {request.dtype_source}) on {world_size} rank(s)"
        )
        if not force and (finished := finished_chunks(chunk_dir)):
            total = -(-len(request.prompt_ids) // request.batching.chunk_size)
            report(f"resuming an interrupted build: {finished} of {total} chunk(s) found in {chunk_dir} are read back")
        cache = compute_reference_logprobs(
            model,
            request.prompt_ids,
            rank,
            world_size,
            gather,
            chunk_dir=chunk_dir,
            settings=request.batching,
            resume=not force,
        )
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        with stop.deferred():
            if rank == 0:
                write_cache(directory, cache, manifest, digest)
                shutil.rmtree(directory / "partial", ignore_errors=True)
    report(f"wrote reference scores to {directory}")
    return cache  # compute_reference_logprobs gave it its layout (None from vLLM)


def _load_checked(request: CacheRequest, repair: bool) -> ReferenceLogprobCache | None:
    """The cache `request` names if it is there, this run's, and intact; None when there is none, when it predates
    fingerprinted scores files, or (with `repair`) when it is damaged: the reason is reported, and it is recomputed.
    """
    directory = request.directory
    try:
        found = read_manifest(directory)
        if found is None:
            return None
        check_manifest(found, request.manifest, directory)
        lengths = [len(ids) for ids in request.prompt_ids]
        return ReferenceLogprobCache.load(directory / SCORES_FILE, request.digest, lengths)
    except CacheCorruptError as error:
        if not (repair or error.legacy):
            raise
        report(f"rebuilding the reference score cache in {directory}: {error.path.name}: {error.reason}")
        return None


def reference_engine(request: CacheRequest, world_size: int, strategy):
    """The frozen reference that scores the queries, in `request.dtype`: a transformers model, or a vLLM engine."""
    if request.engine == "transformers":
        device = request.device or (strategy.root_device if strategy is not None else None)
        return load_reference_model(request.model_path, request.dtype, device)
    if world_size > 1:
        raise ValueError(
            "cache_engine: vllm scores on one process; build the cache first with `erpo cache` on one device "
            "(the trainer then loads it), or use cache_engine: transformers"
        )
    # vLLM has no autocast: it runs in the dtype the matmuls would round to (only `shared_forward` reads its scores).
    compute = ComputePath.parse(request.dtype)
    return build_vllm_engine(request.model_path, request.max_prompt_length + 1, compute.autocast or compute.weights)


@dataclass(frozen=True)
class ComputePath:
    """How a forward of the policy computes, which the reference forward repeats so that Query-KL is exactly 0 at
    θ0: the weights' dtype, an autocast dtype the matmuls run in over those weights (None: none), TF32 for CUDA's
    float32 matmuls and cuDNN, and whether the decoder layers run compiled (`scoring.layers`, `model.compile`). Its
    `name` is the cache fingerprint's `dtype` field: the plain weights' dtype alone ("float32", "bfloat16", what
    caches have always recorded), with "+autocast_<dtype>", "+tf32" and "+compiled" appended when set, so a cache
    computed along another path is refused or rebuilt."""

    weights: str = "float32"
    autocast: str | None = None
    tf32: bool = False
    compiled: bool = False

    @property
    def name(self) -> str:
        extras = (f"+autocast_{self.autocast}" if self.autocast else "") + ("+tf32" if self.tf32 else "")
        return self.weights + extras + ("+compiled" if self.compiled else "")

    @classmethod
    def parse(cls, name: str) -> ComputePath:
        """The path a `name` (or a plain dtype name) stands for; ValueError for anything else."""
        weights, *extras = str(name).split("+")
        autocast = [extra.removeprefix("autocast_") for extra in extras if extra.startswith("autocast_")]
        path = cls(weights, autocast[0] if autocast else None, "tf32" in extras, "compiled" in extras)
        if path.name != name or not all(isinstance(getattr(torch, d, None), torch.dtype) for d in path.dtypes):
            raise ValueError(
                f"not a compute path: {name!r} (e.g. float32, bfloat16, float32+autocast_bfloat16+tf32+compiled)"
            )
        return path

    @property
    def dtypes(self) -> tuple[str, ...]:
        return (self.weights,) if self.autocast is None else (self.weights, self.autocast)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the matmuls round to: the autocast dtype, else the weights'."""
        return getattr(torch, self.autocast or self.weights)

    @contextmanager
    def active(self, device_type: str) -> Iterator[None]:
        """Autocast on `device_type` ("cpu", "cuda") and the TF32 flags, as this path sets them, restored after."""
        flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        if self.tf32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            with torch.autocast(device_type, getattr(torch, self.autocast or "float32"), enabled=bool(self.autocast)):
                yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` with every forward run under `active` (on the device of its first parameter), and its decoder
        layers compiled when `compiled` (`scoring.layers.compile_decoder_layers`), in place; as is when the path is
        the plain weights'. Everything that calls the model (the step, the rollout engine's generate, the sweeps,
        the cache build) then computes along this path."""
        if self.compiled:
            compile_decoder_layers(model)
        if self.autocast is None and not self.tf32:
            return model
        inner = getattr(model.forward, "erpo_unwrapped", model.forward)  # a second apply replaces the first

        @functools.wraps(inner)  # keeps the signature transformers and `logprobs` inspect
        def forward(*args, **kwargs):
            with self.active(next(model.parameters()).device.type):
                return inner(*args, **kwargs)

        forward.erpo_unwrapped = inner
        model.forward = forward
        return model


def policy_compute_dtype(module=None, strategy=None) -> str | None:
    """The `ComputePath.name` of the policy's forward: `fsdp_mixed_precision` under FSDP2
    (`ModelParallelStrategy`), else `dtype`, with `mixed_precision`'s autocast, `tf32` and `compile` when set, read
    from the module's hyperparameters (ERPOModule's names); None without a module that has them. Without the last
    three it is a plain dtype name."""
    hparams = getattr(module, "hparams", None) or {}
    mixed = hparams.get("fsdp_mixed_precision")
    dtype = mixed if mixed is not None and isinstance(strategy, ModelParallelStrategy) else hparams.get("dtype")
    if dtype is None:
        return None
    autocast = str(hparams.get("mixed_precision") or "none")
    compiled = bool(hparams.get("compile"))
    return ComputePath(str(dtype), None if autocast == "none" else autocast, bool(hparams.get("tf32")), compiled).name


def load_reference_model(model_path: str, dtype: str, device: str | torch.device | None = None) -> torch.nn.Module:
    """The initial policy in eval mode, as the frozen reference of the cache, computing along `dtype`: a dtype
    name, or a `ComputePath.name` (its weights' dtype, its autocast and TF32 applied to every forward)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = ComputePath.parse(dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, path.weights))
    return path.apply(model.to(device).eval())
