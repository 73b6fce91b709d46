"""Exclusive `flock`s on small files that name their holder (pid and host), shared by the run-folder lock
(`checkpoints.files.RunDirectoryLock`) and the reference cache's build lock (`data.cache.lock_cache_build`).

The kernel drops a lock when its process ends, however it ends; the file's text only names the last holder for the
refusal message.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def take(path: Path) -> tuple[int | None, list[str]]:
    """Try the exclusive lock of `path` (created if missing) without waiting.

    Returns:
        (descriptor, holder): the open descriptor when taken, else None; and the file's text split in words, the
        pid and host of its current holder (refused) or of its last one (taken; empty after a clean release).
    Raises:
        OSError when the file cannot be opened.
    """
    import fcntl

    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    holder = os.pread(descriptor, 4096, 0).decode(errors="replace").split()
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None, holder
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return descriptor, holder


def holder_name(holder: list[str]) -> str:
    """`pid P on HOST` from a lock file's words, or `another process` when it names none."""
    return f"pid {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"


def release(descriptor: int) -> None:
    """Empty the file, unlock and close it."""
    import fcntl

    os.ftruncate(descriptor, 0)
    fcntl.flock(descriptor, fcntl.LOCK_UN)
    os.close(descriptor)
