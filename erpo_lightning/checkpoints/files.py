"""Checkpoints that are never half-written, and `--ckpt_path last` that never silently starts from scratch.

Lightning's default writer stages a checkpoint in `$TMPDIR` and moves it over the destination; when `$TMPDIR` is
on another filesystem the move is a copy, and a kill during it leaves a truncated `last.ckpt` that the next
`--ckpt_path last` picks. `AtomicCheckpointIO` writes a temporary file in the destination's own folder and renames
it, which is atomic: the destination holds either the previous complete checkpoint or the new one; a failed write
(a full disk) raises `CheckpointWriteError`, naming the file and the cause. `--ckpt_path last` resumes from the
newest complete `last*.ckpt`, or, when there is none (its first save failed, or it is incomplete), the newest whole
checkpoint beside it, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from erpo_lightning.common import holder_locks
from erpo_lightning.common.errors import SettingsError

PARTIAL_SUFFIX = ".partial"  # not `.ckpt`: Lightning's search for `last*.ckpt` never picks one


def partial_path(target: Path, pid: int | None = None) -> Path:
    """The temporary file a process writes before renaming it to `target`: `.<name>.<pid>.partial`, same folder."""
    return target.with_name(f".{target.name}.{os.getpid() if pid is None else pid}{PARTIAL_SUFFIX}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local saves go to a temporary file beside the destination, then `os.replace`.

    The file is flushed to disk before the rename, and the folder after it. Temporary files left by killed
    processes (their pid no longer runs) are removed after the next successful save of the same destination.
    Remote paths (s3://, ...) keep Lightning's writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        temporary = partial_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            cause = _os_error(error) if isinstance(error, Exception) else None  # not a Ctrl-C or a signal's stop
            if cause is None:
                raise
            raise CheckpointWriteError(target, cause) from error
        _fsync_directory(target.parent)
        _remove_orphans(target)


class CheckpointWriteError(OSError):
    """A checkpoint file could not be written (full disk, read-only folder, ...): the message names the file and the
    cause (errno name and text); the file it would have replaced is unchanged."""

    def __init__(self, target: Path, cause: OSError) -> None:
        code = errno.errorcode.get(cause.errno, str(cause.errno)) if cause.errno is not None else type(cause).__name__
        fix = "free space there" if cause.errno in (errno.ENOSPC, errno.EDQUOT) else "fix that"
        super().__init__(
            cause.errno,
            f"could not write checkpoint {target}: {code} ({cause.strerror or cause}); {target.name} was not "
            f"replaced (a previous one stays whole); {fix}, then resume with --ckpt_path last, which takes the "
            "newest complete checkpoint",
        )
        self.message = self.args[1]

    def __str__(self) -> str:
        return self.message


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`: itself, or one in its chain (torch.save reports a failed write of its archive as
    a RuntimeError raised while handling the file's OSError)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (a crash after it must not bring the old directory entry back)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_orphans(target: Path) -> None:
    """Delete `target`'s temporary files whose writer process is gone (killed during a save)."""
    prefix = f".{target.name}."
    for candidate in target.parent.glob(f"{prefix}*{PARTIAL_SUFFIX}"):
        pid = candidate.name[len(prefix) : -len(PARTIAL_SUFFIX)]
        if pid.isdigit() and not _process_alive(int(pid)):
            candidate.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def checkpoint_folders(trainer: pl.Trainer, callback: ModelCheckpoint) -> list[str]:
    """The folders where `callback`'s `last*.ckpt` of this run or of an earlier run with the same settings can be.

    Its `dirpath` when set. Without one Lightning writes into the first logger's version folder,
    `<save_dir>/<name>/version_<n>/checkpoints`, and a new run gets a new version: every version's folder is a
    candidate (a glob pattern). Without a logger: `<default_root_dir>/checkpoints`.
    """
    if callback.dirpath is not None:
        return [str(callback.dirpath)]
    if trainer.loggers:
        logger = trainer.loggers[0]  # its `version` is not read: that would fix this run's new version
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        return [os.path.join(save_dir, str(logger.name), "*", "checkpoints")]
    return [os.path.join(trainer.default_root_dir, "checkpoints")]


def _checkpoints(folder: str) -> list[Path]:
    """The `*.ckpt` files and sharded checkpoint folders in `folder` (a glob pattern of local folders)."""
    parent, _, pattern = folder.rpartition("/*/")
    folders = Path(parent).glob(f"*/{pattern}") if parent else [Path(folder)]
    return [path for directory in folders for path in directory.glob("*.ckpt")]


def is_last(path: Path) -> bool:
    """Whether `path` is a `last.ckpt` / `last-v<n>.ckpt` (what Lightning's `--ckpt_path last` looks for)."""
    return path.stem == "last" or (path.stem.startswith("last-v") and path.stem.removeprefix("last-v").isdigit())


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint at `path` is not complete, or None when it is: a file must be a whole torch archive (its
    zip directory, written last, is there and lists the pickle), a sharded folder must hold its `meta.pt`."""
    if path.is_dir():
        return None if (path / SHARDED_METADATA).is_file() else f"a sharded checkpoint without its {SHARDED_METADATA}"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        return f"incomplete ({error})"
    return None if any(name.endswith("/data.pkl") or name == "data.pkl" for name in names) else "incomplete"


def newest_complete_checkpoint(paths: Iterable[Path]) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint of `paths` (by modification time; a `last*` one wins a tie), and a note on
    each newer one passed over as incomplete ("<name>: <why>")."""
    dated = []
    for path in paths:
        with contextlib.suppress(OSError):  # removed since it was listed
            dated.append((path.stat().st_mtime_ns, is_last(path), path))
    passed = []
    for _, _, path in sorted(dated, key=lambda entry: entry[:2], reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, passed
        passed.append(f"{path.name}: {problem}")
    return None, passed


def resolve_resume_path(trainer: pl.Trainer, ckpt_path: str | None) -> str | None:
    """`fit`'s checkpoint: `last` must find one (a SettingsError otherwise); `last_or_none` may find none (None).

    Every other value is returned unchanged. "Found" means a complete checkpoint in a folder of a ModelCheckpoint
    callback (`checkpoint_folders`: its `dirpath`, or the logger's version folders when it has none); the newest one
    is returned as a path: the newest complete `last*.ckpt`; when there is none (the first save of `last.ckpt`
    failed, or the callback saves no `last`), the newest complete other `*.ckpt`. A line says which was taken and why
    whenever a newer file was incomplete or there was no `last*.ckpt`.
    Remote folders (s3://, ...) are left to Lightning's own `last`.
    """
    if ckpt_path not in ("last", "last_or_none"):
        return ckpt_path
    callbacks = [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]
    folders = [folder for callback in callbacks for folder in checkpoint_folders(trainer, callback)]
    if any(not isinstance(get_filesystem(folder), LocalFileSystem) for folder in folders):
        found = set().union(*(callback._find_last_checkpoints(trainer) for callback in callbacks))
        return "last" if found or ckpt_path == "last" else None
    found = [path for folder in folders for path in _checkpoints(folder)]
    chosen, passed = newest_complete_checkpoint(path for path in found if is_last(path))
    if chosen is None:  # the first save of last.ckpt failed, or the callback saves none: the others, newest first
        chosen, more = newest_complete_checkpoint(path for path in found if not is_last(path))
        passed += more or ([] if any(is_last(path) for path in found) else ["there is no last*.ckpt"])
    if chosen is not None:
        if passed and rank_zero_only.rank == 0:
            print(f"[erpo] --ckpt_path last: resuming from {chosen}, the newest complete checkpoint", end="")
            print(f" ({'; '.join(passed)})", flush=True)
        return str(chosen)
    if ckpt_path == "last_or_none" and not found:
        return None
    if not callbacks:
        where = "no ModelCheckpoint callback is configured (trainer.callbacks)"
    elif found:
        where = f"no complete checkpoint in {', '.join(sorted(set(folders)))} ({'; '.join(passed)})"
    else:
        where = f"no last*.ckpt in {', '.join(sorted(set(folders)))}; no other checkpoint (*.ckpt) there either"
    raise SettingsError(
        f"ckpt_path: '{ckpt_path}' has nothing to resume: {where}; start without --ckpt_path, or pass --ckpt_path "
        "last_or_none to resume when a checkpoint exists and start from scratch otherwise"
    )


def check_fresh_run_folders(trainer: pl.Trainer) -> None:
    """SettingsError when a fresh run (no `--ckpt_path`) would write into a ModelCheckpoint folder that holds an
    earlier run's checkpoints: Lightning would add `last-v1.ckpt` beside its `last.ckpt`, and a later `--ckpt_path
    last` would take whichever is newest. A folder that is a new logger version is always empty."""
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        folder = str(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))
        if not isinstance(get_filesystem(folder), LocalFileSystem):
            continue
        existing = sorted(path.name for path in _checkpoints(folder))
        if existing:
            shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
            raise SettingsError(
                f"{folder} already holds checkpoints of an earlier run ({shown}): this new run would save beside "
                "them (last-v1.ckpt, ...) and --ckpt_path last could later resume either run; to continue that run, "
                "add --ckpt_path last; to start over, give this run another folder (ModelCheckpoint dirpath, "
                f"trainer.default_root_dir or the logger's save_dir / version) or delete {folder}"
            )


def lock_path(folder: Path) -> Path:
    """The lock file of a run folder: `.<name>.erpo.lock` beside it, not in it (a ModelCheckpoint would warn that
    its folder is not empty, and `--ckpt_path last` lists it)."""
    return folder.parent / f".{folder.name}.erpo.lock"


class RunDirectoryLock:
    """Exclusive use of a run's folders (checkpoints, logs) by one process: a lock file per folder (`lock_path`),
    held with `flock`.

    The file records the holder's pid and host, which a second run's error names. The kernel drops the `flock` when
    its process dies however it dies, so the file of a killed run is a stale lock: the next run takes it over (and
    says so). A clean exit empties the file before unlocking it.
    """

    def __init__(self, folders: list[str | Path]) -> None:
        self.folders = sorted({Path(folder).resolve() for folder in folders})
        self._held: list[int] = []  # open descriptors of the locked files
        self.taken_over: list[str] = []  # "<folder> (pid <n> on <host>)" of each stale lock taken over

    def acquire(self) -> RunDirectoryLock:
        """Lock every folder, or raise RunDirectoryInUse naming the holder; returns self."""
        for folder in self.folders:
            folder.parent.mkdir(parents=True, exist_ok=True)
            descriptor, holder = holder_locks.take(lock_path(folder))
            if descriptor is None:
                self.release()
                raise RunDirectoryInUse(
                    f"{folder} is in use by another erpo run ({holder_locks.holder_name(holder)}): two runs would "
                    "interleave their checkpoints and logs there; wait for it to end, or give this run its own folder "
                    "(ModelCheckpoint dirpath, trainer.default_root_dir or the logger's save_dir / version)"
                )
            if len(holder) >= 2:
                self.taken_over.append(f"{folder} ({holder_locks.holder_name(holder)})")
            self._held.append(descriptor)
        return self

    def release(self) -> None:
        """Empty and unlock every held file (idempotent)."""
        for descriptor in self._held:
            holder_locks.release(descriptor)
        self._held = []


class RunDirectoryInUse(RuntimeError):
    """Another live process holds the lock of a run folder (`RunDirectoryLock`)."""


def run_folders(trainer: pl.Trainer) -> list[str]:
    """The local folders a fit writes into and no second run may share: each ModelCheckpoint's folder (its dirpath,
    or the logger's version folder Lightning resolves it to) and the first logger's `log_dir`.

    Reading the logger's version fixes it for this run, as Lightning would a moment later. A folder inside another
    of them (the checkpoints Lightning puts in the logger's version folder) is covered by that folder's lock: its
    own lock file would sit in the logger's folder, which the CSV logger would then warn is not empty.
    """
    folders = []
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            folders.append(str(callback._ModelCheckpoint__resolve_ckpt_dir(trainer)))
    if trainer.loggers and getattr(trainer.loggers[0], "log_dir", None) is not None:
        folders.append(str(trainer.loggers[0].log_dir))
    local = [Path(folder).resolve() for folder in folders if isinstance(get_filesystem(folder), LocalFileSystem)]
    return [str(folder) for folder in local if not any(other in folder.parents for other in local)]


SHARDED_METADATA = "meta.pt"  # what Lightning's ModelParallelStrategy writes beside a sharded checkpoint's tensors


ZIP_MAGIC = b"PK\x03\x04"  # the first bytes of every archive torch.save writes (its default, zip format)
# What to do about a checkpoint file that cannot be read, whichever command met it.
RESUME_ADVICE = (
    "use another checkpoint of the run, an earlier step's (`erpo fit --ckpt_path last` skips incomplete files and "
    "resumes from the newest complete one)"
)


class CheckpointReadError(ValueError):
    """A checkpoint file that cannot be read: the message names the file, what is wrong with it, and what to do."""


def checkpoint_file_problem(path: Path) -> str | None:
    """Why the file at `path` cannot be a checkpoint torch.save wrote whole, and what to do, in words; None when it
    may be one. Empty, not a zip archive (another kind of file, or random bytes), or an archive cut short (its
    directory, which torch.save writes last, missing). Reads the first bytes and the archive's directory only."""
    size = path.stat().st_size
    if size == 0:
        return (
            "it is empty (0 bytes): nothing was ever written to it (a save killed before its first write, or a "
            "copy that failed), so it holds no weights to recover; delete it and " + RESUME_ADVICE
        )
    with path.open("rb") as handle:
        start = handle.read(len(ZIP_MAGIC))
    if start != ZIP_MAGIC:
        return (
            f"it is not a torch checkpoint ({size} bytes that do not start as torch.save's zip archive does); "
            + RESUME_ADVICE
        )
    try:
        with zipfile.ZipFile(path):
            pass
    except (OSError, zipfile.BadZipFile):
        return (
            f"it is cut short ({size} bytes, without the archive directory torch.save writes last: a save or copy "
            "that did not finish); " + RESUME_ADVICE
        )
    return None


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file's contents, memory-mapped on the CPU (tensors are not read until used); for a sharded
    (FSDP2) checkpoint folder, everything but its tensors (its `meta.pt`; {} without one).

    What is and is not detected here (issue 54 item 7): an empty file, a file that is not torch's zip archive (random
    bytes, another format), an archive cut short (its directory, written last, missing) and a damaged pickle or
    record table (torch fails to load it) are each a CheckpointReadError naming the file. A changed byte inside a
    tensor's data is not detected by torch (the archive's per-record CRC-32 is not checked when it loads, memory-mapped
    or not); the tensor digest an ERPOModule checkpoint carries is (`check_tensor_digest`, which the readers of the
    weights run: resume, `erpo validate`, `erpo export`).

    Raises:
        CheckpointReadError: naming the file, when it is empty, not a torch archive, cut short, or does not load
            (`checkpoint_file_problem`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / SHARDED_METADATA
        if not path.is_file():
            return {}
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise CheckpointReadError(f"checkpoint {path} cannot be read: {problem}")
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as error:  # torch's messages (a pickle error, a bad record) do not name the file
        cause = " ".join(str(error).split()) or type(error).__name__
        raise CheckpointReadError(f"checkpoint {path} cannot be read ({type(error).__name__}: {cause})") from error


# The checkpoint entry holding the sha256 of each tensor of its state dict, written by `ERPOModule.on_save_checkpoint`:
# {"algorithm": "sha256", "tensors": {state-dict name: hex digest}}.
DIGEST_KEY = "erpo_tensor_digest"
DIGEST_ADVICE = (
    "if its weights were changed on purpose (a script that edits a checkpoint), record their new digest with "
    "erpo_lightning.checkpoints.files.add_tensor_digest(checkpoint) before torch.save"
)


class CheckpointDigestError(CheckpointReadError):
    """A checkpoint tensor whose bytes do not hash to the digest recorded when the checkpoint was saved."""


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 (hex) of a tensor's dtype, shape and bytes in row-major order (a view hashes as its own values, not its
    storage's). A tensor on an accelerator is copied to the CPU first."""
    local = tensor.detach()
    digest = hashlib.sha256(f"{local.dtype}|{tuple(local.shape)}|".encode())
    if local.numel() > 0:
        digest.update(local.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def tensor_digest(state: dict[str, Any]) -> dict[str, Any] | None:
    """The digest entry of a checkpoint's `state` (its state dict): the sha256 of each tensor by name (other values
    are not hashed); None when a tensor is a DTensor shard (FSDP2's sharded checkpoints, whose shards no process holds
    whole: not digested)."""
    tensors = {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    if any(hasattr(value, "to_local") for value in tensors.values()):
        return None
    return {"algorithm": "sha256", "tensors": {name: tensor_sha256(value) for name, value in tensors.items()}}


def add_tensor_digest(checkpoint: dict[str, Any]) -> None:
    """Record the digest of `checkpoint["state_dict"]` in `checkpoint` (DIGEST_KEY), as a save does; nothing for a
    sharded state dict (`tensor_digest`)."""
    digest = tensor_digest(checkpoint.get("state_dict") or {})
    if digest is not None:
        checkpoint[DIGEST_KEY] = digest


def check_tensor_digest(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint whose tensors do not hash to the digest recorded when it was saved (a byte changed on disk
    or in a copy), naming the file and the first tensor that differs (state-dict order). Every tensor is read once.

    A checkpoint with tensors and no digest (written before the digest was recorded, or not by an ERPOModule) loads
    unchecked, with a warning line naming the file; one without a state dict (a sharded checkpoint's metadata) has
    nothing to check.

    Raises:
        CheckpointDigestError: a tensor's sha256 differs, or a digested tensor is missing from the file.
    """
    state = checkpoint.get("state_dict") or {}
    record = checkpoint.get(DIGEST_KEY)
    if record is None:
        if any(isinstance(value, torch.Tensor) for value in state.values()):
            print(
                f"[erpo] warning: checkpoint {path} carries no digest of its tensors (written before erpo-lightning "
                "recorded one, or not by an ERPOModule): its weights are loaded unchecked",
                file=sys.stderr,
                flush=True,
            )
        return
    expected = record.get("tensors") if isinstance(record, dict) else None
    if not isinstance(expected, dict) or record.get("algorithm") != "sha256":
        raise CheckpointDigestError(f"checkpoint {path}: its tensor digest is not a sha256 record this version reads")
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        if name not in expected:
            raise CheckpointDigestError(
                f"checkpoint {path} holds the tensor {name}, which its digest (recorded when it was saved) does not "
                f"list: the file was changed after it was written; {DIGEST_ADVICE}"
            )
        if tensor_sha256(value) != expected[name]:
            raise CheckpointDigestError(
                f"checkpoint {path} is damaged: its tensor {name} ({str(value.dtype).removeprefix('torch.')}, "
                f"{list(value.shape)}) does not hash to the sha256 recorded when it was saved (the file changed after "
                f"it was written: a bad disk or copy); {RESUME_ADVICE}; {DIGEST_ADVICE}"
            )
    missing = [name for name in expected if name not in state]
    if missing:
        raise CheckpointDigestError(
            f"checkpoint {path} lacks the tensor {missing[0]}"
            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which its digest (recorded when it was "
            f"saved) lists: the file was changed after it was written; {DIGEST_ADVICE}"
        )
