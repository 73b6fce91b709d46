"""One build per reference cache folder (issue 54 item 12): a second `erpo cache` or `erpo fit` that would build the
cache of a folder another process is building is refused before its model loads, naming the builder; the lock is
released once the cache is written. Another process's lock is stood in for by a second open file description, which
`flock` treats exactly as another process's."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
import torch

from erpo_lightning.data import QueryDataModule, cache_build
from erpo_lightning.data.cache import (
    CacheBuildInProgress,
    ReferenceLogprobCache,
    build_lock_path,
    lock_cache_build,
    release_cache_build,
    write_cache,
)
from erpo_lightning.data.sources import BENCHMARK_DIR


def try_lock(directory: Path, holder: str = "4242 builder-host") -> int | None:
    """Take the build lock of `directory` as another builder would: its descriptor, or None when it is held."""
    descriptor = os.open(build_lock_path(directory.resolve()), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    os.pwrite(descriptor, f"{holder}\n".encode(), 0)
    return descriptor


def unlock(descriptor: int) -> None:
    fcntl.flock(descriptor, fcntl.LOCK_UN)
    os.close(descriptor)


def test_a_second_build_is_refused_naming_the_builder_and_writing_the_cache_frees_the_folder(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir()
    other = try_lock(directory)
    with pytest.raises(CacheBuildInProgress, match=r"another erpo process \(pid 4242 on builder-host\) is building"):
        lock_cache_build(directory)
    unlock(other)

    lock_cache_build(directory)  # free: this process builds
    lock_cache_build(directory)  # it holds the lock already: asking again keeps it
    assert try_lock(directory) is None  # a second builder is kept out meanwhile
    assert build_lock_path(directory).read_text().split()[0] == str(os.getpid())
    cache = ReferenceLogprobCache.from_rows([torch.zeros(3), torch.zeros(2)])
    write_cache(directory, cache, {"dtype": "float32"}, "fingerprint")
    files = sorted(path.name for path in directory.iterdir() if path.is_file())
    assert files == ["manifest.json", "scores.safetensors"]
    assert build_lock_path(directory).read_text() == ""  # released, emptied, outside the cache folder
    after = try_lock(directory)
    assert after is not None
    unlock(after)
    release_cache_build(directory)  # not held: nothing happens


def test_a_datamodule_that_would_build_a_folder_being_built_fails_before_its_model_loads(
    tiny_model_path, tmp_path, monkeypatch
):
    directory = tmp_path / "cache"
    directory.mkdir()
    monkeypatch.setattr(cache_build, "reference_engine", lambda *args: pytest.fail("the model was loaded"))
    datamodule = QueryDataModule(
        str(tiny_model_path),
        train=[{"path": str(BENCHMARK_DIR / "aime24.jsonl"), "limit": 2}],
        template="plain",
        max_prompt_length=2000,
        cache_dir=str(directory),
    )
    other = try_lock(directory)
    try:
        with pytest.raises(CacheBuildInProgress) as refused:
            datamodule.setup("fit")
    finally:
        unlock(other)
    message = str(refused.value)
    assert message.startswith(f"{directory.resolve()}: another erpo process (pid 4242 on builder-host)")
    assert "wait for it to finish and run again" in message and "data.cache_dir" in message
