"""The frozen-reference query score cache: per-token log-probs of every training query under the initial policy θ0.

Stored as one safetensors file plus a JSON manifest (what it was computed from, see `fingerprint.py`). The scores
file carries the manifest's fingerprint, its row count and the sha256 of its tensors in its own metadata, so a scores
file copied from another cache, cut short or damaged (a single flipped byte included) is refused on load
(`CacheCorruptError`, naming the file and how to rebuild it) instead of training against the wrong numbers. One
process at a time builds the cache of a folder: a second `erpo cache` (or `erpo fit`) that would build it meanwhile
is refused before its model loads, naming the builder (`lock_cache_build`). The trainer reads the scores through
`ReferenceLogprobCache.padded`, which lines the cached values up with left-padded prompt tokens.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from erpo_lightning.common import holder_locks
from erpo_lightning.scoring.queries import QueryScoringLayout

SCORES_FILE = "scores.safetensors"
MANIFEST_FILE = "manifest.json"
TENSORS = ("logprobs", "offsets", "nll", "num_tokens")
REBUILD_HINT = "rebuild it with `erpo cache --config <your config> --force true`"
# A file being written: `.<name>.<pid of the writer>.tmp` (see `atomic_write`).
_TEMPORARY = re.compile(r"\..+\.(\d+)\.tmp")


class CacheCorruptError(RuntimeError):
    """A cache file that cannot be used as it is: unreadable, cut short, inconsistent, or not its manifest's."""

    def __init__(self, path: Path, reason: str, legacy: bool = False) -> None:
        super().__init__(f"{path}: {reason}; {REBUILD_HINT} (or delete {path.parent})")
        self.path, self.reason = path, reason
        self.legacy = legacy  # intact, but written before scores files carried their manifest's fingerprint


@dataclass
class ReferenceLogprobCache:
    """Reference log-probs of Q queries, flat.

    Attributes:
        logprobs: [T] float32, T = total prompt tokens. Query q owns `logprobs[offsets[q]:offsets[q+1]]`, one value
            per prompt token (template included): log p_θ0(token t | tokens < t), the first token's value is 0
            (it has no context and is never scored).
        offsets: [Q + 1] int64, offsets[0] = 0; offsets[q+1] - offsets[q] = prompt length of query q.
        nll: [Q] float32, summed negative log-likelihood -ℓθ0(q) over the scored tokens (nats).
        num_tokens: [Q] int64, number of scored tokens (prompt length - 1).
        layout: the blocks the scores were computed in, which the training step reproduces to score queries
            exactly (set by whoever built or loaded the cache against its manifest); None when unknown or not
            reproducible (vLLM's scores).
    """

    logprobs: torch.Tensor
    offsets: torch.Tensor
    nll: torch.Tensor
    num_tokens: torch.Tensor
    layout: QueryScoringLayout | None = None

    @classmethod
    def from_rows(cls, rows: list[torch.Tensor], layout: QueryScoringLayout | None = None) -> ReferenceLogprobCache:
        """Build from one [L_q] tensor per query (first entry ignored and stored as 0), scored in `layout`."""
        lengths = torch.tensor([row.numel() for row in rows], dtype=torch.long)
        logprobs = torch.cat([row.float() for row in rows]) if rows else torch.zeros(0)
        offsets = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
        logprobs[offsets[:-1][lengths > 0]] = 0.0
        # Sum in float64: a long query's ℓ is a sum of hundreds of terms and is compared across runs.
        nll = torch.stack([-row[1:].double().sum() for row in rows]).float() if rows else torch.zeros(0)
        return cls(logprobs, offsets, nll, (lengths - 1).clamp(min=0), layout)

    def __len__(self) -> int:
        return self.nll.numel()

    @property
    def lengths(self) -> torch.Tensor:
        """[Q] prompt lengths in tokens."""
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, query_index: int) -> torch.Tensor:
        """[L_q] per-token log-probs of one query (entry 0 is the unscored first token)."""
        return self.logprobs[self.offsets[query_index] : self.offsets[query_index + 1]]

    def padded(self, query_index: torch.Tensor, width: int) -> torch.Tensor:
        """Per-token reference log-probs of a batch, right-aligned to match left-padded prompts.

        Args:
            query_index: [B] rows of the cache.
            width: P, the padded prompt width.
        Returns:
            [B, P] float32 on the cache's device; column j lines up with column j of the prompts left-padded to P.
            Padding and each row's first real token are 0.
        """
        query_index = query_index.to(self.offsets.device).long()
        starts, lengths = self.offsets[query_index], self.lengths[query_index]
        if len(lengths) and int(lengths.max()) > width:
            raise ValueError(f"width {width} is narrower than the longest prompt in the batch ({int(lengths.max())})")
        columns = torch.arange(width, device=self.offsets.device)
        first_column = (width - lengths).unsqueeze(1)
        real = columns >= first_column
        flat_index = starts.unsqueeze(1) + (columns - first_column)
        out = torch.zeros(len(query_index), width, dtype=self.logprobs.dtype, device=self.logprobs.device)
        out[real] = self.logprobs[flat_index[real]]
        return out

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> None:
        """Write the scores with `metadata` (text key/values, e.g. the manifest's fingerprint) in the file header."""
        tensors = {name: getattr(self, name).contiguous().cpu() for name in TENSORS}
        meta = {"num_queries": str(len(self)), "num_prompt_tokens": str(self.logprobs.numel()), **(metadata or {})}
        meta["sha256"] = content_sha256(tensors)
        atomic_save_file(tensors, Path(path), meta)

    @classmethod
    def load(
        cls, path: str | Path, fingerprint: str | None = None, lengths: Sequence[int] | None = None
    ) -> ReferenceLogprobCache:
        """Read a scores file and check it against what the run expects.

        Args:
            fingerprint: the manifest's `fingerprint_digest`; the file must carry the same one (None: not checked).
            lengths: this run's prompt lengths in tokens, one per query; the file must hold exactly these rows.
        Raises:
            CacheCorruptError naming the file and what is wrong with it.
        """
        path = Path(path)
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except (SafetensorError, OSError) as error:
            raise CacheCorruptError(path, f"unreadable ({type(error).__name__}: {error})") from None
        missing = [name for name in TENSORS if name not in tensors]
        if missing:
            raise CacheCorruptError(path, f"no {', '.join(missing)} tensor(s) (not a reference score file)")
        cache = cls(*(tensors[name] for name in TENSORS))
        if fingerprint is not None and "fingerprint" not in metadata:
            raise CacheCorruptError(path, "it carries no fingerprint (written by an older version)", legacy=True)
        problem = cache._inconsistency(metadata)
        if problem is None and fingerprint is not None and metadata["fingerprint"] != fingerprint:
            problem = (
                f"its scores were computed for fingerprint {metadata['fingerprint']}, its manifest is {fingerprint} "
                "(a scores file from another cache?)"
            )
        if problem is None and lengths is not None:
            problem = cache._length_mismatch(lengths)
        if problem is not None:
            raise CacheCorruptError(path, problem)
        return cache

    def _inconsistency(self, metadata: dict[str, str]) -> str | None:
        """What makes the tensors disagree with each other or with the row count in `metadata`, or None."""
        offsets, rows = self.offsets, self.nll.numel()
        stored = metadata.get("sha256")  # absent from files written before it was recorded: nothing to compare
        if stored is not None and stored != content_sha256({name: getattr(self, name) for name in TENSORS}):
            return "its tensors' bytes differ from the sha256 written with them (a flipped or overwritten byte)"
        if offsets.dim() != 1 or offsets.numel() != rows + 1 or self.num_tokens.numel() != rows:
            return f"{rows} NLLs, {self.num_tokens.numel()} token counts and {offsets.numel()} offsets do not agree"
        if metadata.get("num_queries") != str(rows):
            return f"it holds {rows} rows, its header says {metadata.get('num_queries')} (cut short or rewritten)"
        if offsets[0] != 0 or (offsets[1:] < offsets[:-1]).any() or offsets[-1] != self.logprobs.numel():
            return f"its offsets do not cover its {self.logprobs.numel()} log-probs"
        if not (torch.isfinite(self.logprobs).all() and torch.isfinite(self.nll).all()):
            return "it holds NaN or infinite scores"
        return None

    def _length_mismatch(self, lengths: Sequence[int]) -> str | None:
        if len(self) != len(lengths):
            return f"it holds scores of {len(self)} queries, this run has {len(lengths)}"
        differ = (self.lengths != torch.as_tensor(list(lengths), dtype=self.lengths.dtype)).nonzero()
        if len(differ):
            q = int(differ[0])
            return f"query {q} has {int(self.lengths[q])} scored tokens in the file, {lengths[q]} in this run's prompt"
        return None


class CacheWriteError(OSError):
    """A cache file or folder that cannot be written (disk full, read-only folder, no permission); names the path."""

    def __init__(self, path: Path, error: OSError, what: str = "cannot write it") -> None:
        reason = error.strerror or str(error)
        hint = "free space there" if error.errno == errno.ENOSPC else "make it writable"
        super().__init__(
            f"{path}: {what} ({reason}); {hint} and run again, or choose another cache folder (data.cache_dir)"
        )
        self.errno, self.path = error.errno, path


def _temporary(path: Path) -> Path:
    """The hidden name a file is written under before its rename: `.<name>.<pid>.tmp` beside it."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file and a rename, so an interrupted write never leaves a cut file.

    Written with `open`, so the file gets the usual permissions (umask). When the write fails (a full disk, a
    read-only folder) the temporary file is removed at once and the error names `path`.

    Raises:
        CacheWriteError naming `path` and why.
    """
    tmp = _temporary(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise CacheWriteError(path, error) from error
    except BaseException:  # Ctrl-C mid-write: no hidden file either
        tmp.unlink(missing_ok=True)
        raise


def content_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 (hex) of the tensors' names, dtypes, shapes and bytes, in `TENSORS` order."""
    digest = hashlib.sha256()
    for name in TENSORS:
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def atomic_save_file(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file with :func:`atomic_write`: never cut, the usual permissions (not the 0600 of
    `safetensors.save_file`), nothing left behind by a failed write."""
    atomic_write(path, save(tensors, metadata))


def _writer_running(pid: int) -> bool:
    """Whether process `pid` (the writer named in a temporary file) still runs on this machine; not this process."""
    if pid == os.getpid():
        return False  # a leftover of an earlier write of this very process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporary files (`.<name>.<pid>.tmp`) that writers which no longer run left in a cache `directory`
    and its partial-chunk folders, e.g. after a full disk or a kill. A live writer's file is kept. Returns the
    removed paths.

    Called at the start of a cache build, before any rank writes, so no file of the current run is touched.
    """
    directory = Path(directory)
    removed = []
    for path in [*directory.glob(".*.tmp"), *directory.glob("partial/*/.*.tmp")]:
        match = _TEMPORARY.fullmatch(path.name)
        if match is None or _writer_running(int(match.group(1))):
            continue
        try:
            path.unlink()
        except OSError:  # gone meanwhile, or a read-only folder (refused later, if anything must be written)
            continue
        removed.append(path)
    return removed


class CacheBuildInProgress(RuntimeError):
    """Another live process is building the reference score cache in the same folder (`lock_cache_build`)."""


# Cache folder (resolved) -> the open descriptor of its build lock, for the builds this process holds.
_BUILD_LOCKS: dict[Path, int] = {}


def build_lock_path(directory: Path) -> Path:
    """The build lock file of a cache folder: `.<name>.erpo-cache.lock` beside it (the folder holds only the cache)."""
    return directory.parent / f".{directory.name}.erpo-cache.lock"


def _first_process() -> bool:
    """Whether this is the first process of its job (rank 0 of node 0, by the launchers' variables)."""
    names = ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")
    return all(int(os.environ.get(name, "0") or 0) == 0 for name in names)


def lock_cache_build(directory: str | Path) -> None:
    """Take this process's exclusive right to build the cache in `directory` (an `flock` on `build_lock_path`),
    held until `release_cache_build` (`write_cache` calls it once the cache is complete) or until the process ends,
    however it ends. The file names the holder's pid and host for the refusal of a second build.

    Only the first process of a job takes it: the other ranks of a multi-process build compute beside it. A process
    that holds it already keeps it.

    Raises:
        CacheBuildInProgress naming the folder, the holder and what to do.
    """
    directory = Path(directory).resolve()
    if not _first_process() or directory in _BUILD_LOCKS:
        return
    try:
        descriptor, holder = holder_locks.take(build_lock_path(directory))
    except OSError:
        return  # a read-only parent of a writable cache folder: build unguarded, as before the lock existed
    if descriptor is None:
        raise CacheBuildInProgress(
            f"{directory}: another erpo process ({holder_locks.holder_name(holder)}) is building the reference score "
            "cache in this folder; wait for it to finish and run again (the finished cache is then loaded, not "
            "rebuilt), or give this run another data.cache_dir"
        )
    _BUILD_LOCKS[directory] = descriptor


def release_cache_build(directory: str | Path) -> None:
    """Empty and unlock the build lock of `directory` if this process holds it (otherwise nothing happens)."""
    descriptor = _BUILD_LOCKS.pop(Path(directory).resolve(), None)
    if descriptor is not None:
        holder_locks.release(descriptor)


def check_writable(*folders: Path) -> None:
    """Create each folder (parents too) and a file in it, then remove the file: a read-only folder or file system is
    refused before any score is computed.

    Raises:
        CacheWriteError naming the first folder that cannot be written.
    """
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".write-check.", suffix=f".{os.getpid()}.tmp", dir=folder)
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            raise CacheWriteError(folder, error, "cannot write in this cache folder") from error


def write_cache(directory: str | Path, cache: ReferenceLogprobCache, manifest: dict, fingerprint: str) -> Path:
    """Write scores (carrying `fingerprint`, the manifest's digest) then the manifest, whose presence marks a complete
    cache. Returns the directory."""
    directory = Path(directory)
    cache.save(directory / SCORES_FILE, {"fingerprint": fingerprint, "dtype": str(manifest.get("dtype"))})
    atomic_write(directory / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True).encode())
    release_cache_build(directory)  # complete: a run that starts now loads it
    return directory


def read_manifest(directory: str | Path) -> dict | None:
    """The manifest of a complete cache in `directory`, or None when there is none.

    Raises:
        CacheCorruptError when the manifest is not a JSON object.
    """
    path = Path(directory) / MANIFEST_FILE
    if not (path.is_file() and (Path(directory) / SCORES_FILE).is_file()):
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CacheCorruptError(path, f"unreadable ({type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict):
        raise CacheCorruptError(path, f"a JSON {type(manifest).__name__}, not a manifest object")
    return manifest
