"""Checkpoints that are never half-written, and `--ckpt_path last` that never silently starts from scratch.

Lightning's default writer stages a checkpoint in `$TMPDIR` and moves it over the destination; when `$TMPDIR` is
on another filesystem the move is a copy, and a kill during it leaves a truncated `last.ckpt` that the next
`--ckpt_path last` picks. `AtomicCheckpointIO` writes a temporary file in the destination's own folder and renames
it, which is atomic: the destination holds either the previous complete checkpoint or the new one.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from erpo_lightning.errors import SettingsError

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
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = partial_path(target)
        try:
            with open(temporary, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fsync_directory(target.parent)
        _remove_orphans(target)


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


def _last_checkpoints(folder: str) -> list[Path]:
    """The `last.ckpt` / `last-v<n>.ckpt` files in `folder` (a glob pattern of local folders)."""
    parent, _, pattern = folder.rpartition("/*/")
    folders = Path(parent).glob(f"*/{pattern}") if parent else [Path(folder)]
    return [
        path for directory in folders for path in directory.glob("last*.ckpt")
        if path.name == "last.ckpt" or path.stem.removeprefix("last-v").isdigit()
    ]  # fmt: skip


def resolve_resume_path(trainer: pl.Trainer, ckpt_path: str | None) -> str | None:
    """`fit`'s checkpoint: `last` must find one (a SettingsError otherwise); `last_or_none` may find none (None).

    Every other value is returned unchanged. "Found" means a `last*.ckpt` in a folder of a ModelCheckpoint callback
    (`checkpoint_folders`: its `dirpath`, or the logger's version folders when it has none); the newest one is
    returned as a path. Remote folders (s3://, ...) are left to Lightning's own `last`.
    """
    if ckpt_path not in ("last", "last_or_none"):
        return ckpt_path
    callbacks = [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]
    folders = [folder for callback in callbacks for folder in checkpoint_folders(trainer, callback)]
    if any(not isinstance(get_filesystem(folder), LocalFileSystem) for folder in folders):
        found = set().union(*(callback._find_last_checkpoints(trainer) for callback in callbacks))
        return "last" if found or ckpt_path == "last" else None
    found = [path for folder in folders for path in _last_checkpoints(folder)]
    if found:
        return str(max(found, key=lambda path: path.stat().st_mtime_ns))
    if ckpt_path == "last_or_none":
        return None
    if not callbacks:
        where = "no ModelCheckpoint callback is configured (trainer.callbacks)"
    else:
        where = f"no last*.ckpt in {', '.join(sorted(set(folders)))}"
    raise SettingsError(
        f"ckpt_path: 'last' has nothing to resume: {where}; start without --ckpt_path, or pass --ckpt_path "
        "last_or_none to resume when a checkpoint exists and start from scratch otherwise"
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
        import fcntl

        for folder in self.folders:
            folder.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(lock_path(folder), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(descriptor, 4096, 0).decode(errors="replace").split()
                os.close(descriptor)
                self.release()
                who = f"pid {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
                raise RunDirectoryInUse(
                    f"{folder} is in use by another erpo run ({who}): two runs would interleave their checkpoints "
                    "and logs there; wait for it to end, or give this run its own folder (ModelCheckpoint dirpath, "
                    "trainer.default_root_dir or the logger's save_dir / version)"
                ) from None
            previous = os.pread(descriptor, 4096, 0).decode(errors="replace").split()
            if len(previous) >= 2:
                self.taken_over.append(f"{folder} (pid {previous[0]} on {previous[1]})")
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            self._held.append(descriptor)
        return self

    def release(self) -> None:
        """Empty and unlock every held file (idempotent)."""
        import fcntl

        for descriptor in self._held:
            os.ftruncate(descriptor, 0)
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)
        self._held = []


class RunDirectoryInUse(RuntimeError):
    """Another live process holds the lock of a run folder (`RunDirectoryLock`)."""


def run_folders(trainer: pl.Trainer) -> list[str]:
    """The local folders a fit writes into and no second run may share: each ModelCheckpoint's folder (its dirpath,
    or the logger's version folder Lightning resolves it to) and the first logger's `log_dir`.

    Reading the logger's version fixes it for this run, as Lightning would a moment later.
    """
    folders = []
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            folders.append(str(callback._ModelCheckpoint__resolve_ckpt_dir(trainer)))
    if trainer.loggers and getattr(trainer.loggers[0], "log_dir", None) is not None:
        folders.append(str(trainer.loggers[0].log_dir))
    return [folder for folder in folders if isinstance(get_filesystem(folder), LocalFileSystem)]


CONFIG_KEY = "erpo_config"  # the checkpoint entry holding the run's full `erpo fit` config
# What a resume may change: how long the run goes on, and where and what it records; and the start-up seed, which
# the checkpoint's RNG states replace (`seed_everything: true` draws a new one at every start). Anything else would
# train on with other settings than the checkpoint's optimizer state, data position and metrics were made with.
RESUMABLE_FIELDS = (
    "seed_everything",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time",
    "trainer.callbacks",
    "trainer.logger",
    "trainer.enable_checkpointing",
    "trainer.default_root_dir",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "data.num_workers",
)
_NOT_SETTINGS = ("config", "ckpt_path")  # the config files' names, and the checkpoint itself


class RunConfigRecorder(pl.Callback):
    """Writes the run's full config (plain YAML data) into every checkpoint, as `checkpoint["erpo_config"]`, for
    `check_resume_config` to compare a resume with."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        checkpoint[CONFIG_KEY] = self.config


SHARDED_METADATA = "meta.pt"  # what Lightning's ModelParallelStrategy writes beside a sharded checkpoint's tensors


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file's contents, memory-mapped on the CPU (tensors are not read until used); for a sharded
    (FSDP2) checkpoint folder, everything but its tensors (its `meta.pt`; {} without one)."""
    path = Path(path)
    if path.is_dir():
        path = path / SHARDED_METADATA
        if not path.is_file():
            return {}
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a.b": 1}`; lists (tuples as lists) and values with a `class_path` stay whole."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, dict) and "class_path" not in value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.removesuffix("."): value}


def check_resume_config(checkpoint: dict[str, Any], config: dict[str, Any], ckpt_path: str) -> None:
    """SettingsError naming every setting of `config` (this run's, as plain data) that differs from the run that
    wrote `checkpoint`, other than RESUMABLE_FIELDS, with both values.

    A checkpoint written without the CLI has no full config: its module hyperparameters are compared with the
    fields of `model:` that this run's config holds: a hyperparameter the module no longer has (`temperature`, before
    the rollout batch carried it) is not compared.
    """
    saved = checkpoint.get(CONFIG_KEY)
    if saved is None:
        model = config.get("model", {})
        hparams = checkpoint.get("hyper_parameters", {})
        saved = {"model": {key: value for key, value in hparams.items() if key in model}}
        config = {"model": {key: model[key] for key in saved["model"]}}
    before, now = _flatten(saved), _flatten(config)
    changed = [
        f"{key}: {before.get(key)!r} -> {now.get(key)!r}"
        for key in sorted(before.keys() | now.keys())
        if key.split(".")[0] not in _NOT_SETTINGS
        and not any(key == field or key.startswith(f"{field}.") for field in RESUMABLE_FIELDS)
        and before.get(key) != now.get(key)
    ]
    if changed:
        raise SettingsError(
            f"ckpt_path: this run differs from the run that wrote {ckpt_path} in {'; '.join(changed)}. A resume "
            f"continues the same run and may change only {', '.join(RESUMABLE_FIELDS)}; start a new run (without "
            "--ckpt_path) to change anything else"
        )


def check_checkpoint_model(checkpoint: dict[str, Any], model_path: str, ckpt_path: str) -> None:
    """SettingsError when `checkpoint` was trained from another initial model than `model_path` (`erpo validate`
    evaluates the checkpoint's weights in `model_path`'s architecture, with its tokenizer and template)."""
    trained_from = checkpoint.get("hyper_parameters", {}).get("model_path")
    if trained_from is None or _same_model_path(str(trained_from), model_path):
        return
    raise SettingsError(
        f"ckpt_path: {ckpt_path} was trained from model_path {trained_from}, but model.model_path is {model_path}; "
        f"set --model.model_path {trained_from} (the model the checkpoint's weights belong to)"
    )


def _same_model_path(a: str, b: str) -> bool:
    """Whether two model paths name the same model: equal strings, or the same local directory."""
    if a == b:
        return True
    first, second = Path(a).expanduser(), Path(b).expanduser()
    return first.exists() and second.exists() and first.resolve() == second.resolve()
