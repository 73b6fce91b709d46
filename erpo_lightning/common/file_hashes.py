"""The package's cache folder on this machine, and sha256 of files remembered there.

A leaf module (standard library only): the reference cache's fingerprint (`data/fingerprint.py`), the `.gguf`
conversion (`gguf.py`), the real model's download (`real_model.py`) and the toy build all keep their files under
`cache_home()`, and the first two name what they hold by file hashes that a large file should not pay for twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

READ_BYTES = 16 * 2**20
SAMPLE_BYTES = 64 * 2**10


def cache_home() -> Path:
    """`$ERPO_CACHE_HOME` (default `~/.cache/erpo_lightning`): reference caches, file hashes and the toy build."""
    return Path(os.environ.get("ERPO_CACHE_HOME") or Path.home() / ".cache" / "erpo_lightning")


HASH_MEMO = cache_home() / "file_hashes.json"


def file_version(path: Path) -> tuple[str, str]:
    """(resolved path, what identifies this version of the file) for the hash memo.

    Size and modification time alone can lie: `touch -d`, `cp -p` and rsync set mtime back, and a file rewritten in
    place keeps its size. The change time (ctime, which no user call can set back) and the inode catch such a
    rewrite, and a digest of three 64 KiB samples (start, middle, end) catches one on filesystems whose times are
    coarse. Reading the samples costs three seeks, not a read of the whole file.
    """
    stat = path.stat()
    samples = hashlib.sha256()
    with open(path, "rb") as handle:
        for offset in sorted({0, max(0, stat.st_size // 2 - SAMPLE_BYTES // 2), max(0, stat.st_size - SAMPLE_BYTES)}):
            handle.seek(offset)
            samples.update(handle.read(SAMPLE_BYTES))
    times = f"{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    return str(path.resolve()), f"{stat.st_size}|{times}|{samples.hexdigest()[:16]}"


def cached_file_sha256(path: Path) -> str:
    """sha256 of one file (hex), remembered in `HASH_MEMO` by path and `file_version`: a 15 GB file is read once."""
    resolved, version = file_version(path)
    key = f"{resolved}|{version}"
    try:
        memo = json.loads(HASH_MEMO.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    if key not in memo:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(READ_BYTES):
                digest.update(block)
        # Older versions of the same file can never match again: keep the memo to one entry per path.
        memo = {known: value for known, value in memo.items() if not known.startswith(f"{resolved}|")}
        memo[key] = digest.hexdigest()
        try:  # the memo is only a speed-up: an unwritable cache home just means hashing again next time
            HASH_MEMO.parent.mkdir(parents=True, exist_ok=True)
            tmp = HASH_MEMO.with_name(f".{HASH_MEMO.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, HASH_MEMO)
        except OSError:
            pass
    return memo[key]
