"""Writing the reference score cache when the disk or the folder says no (issue 30, items 10 and 12): a full disk
leaves no hidden temporary file and names the path, a rerun cleans what a killed writer left and says it resumed, and
a read-only folder is refused before the model is loaded."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from erpo_lightning.data import QueryDataModule, cache_build
from erpo_lightning.data.sources import BENCHMARK_DIR

SOURCES = [{"path": str(BENCHMARK_DIR / "aime24.jsonl"), "limit": 6}]


def make_datamodule(model_path: Path, cache_dir: Path) -> QueryDataModule:
    """6 queries in 3 chunks of 2."""
    return QueryDataModule(
        str(model_path),
        train=SOURCES,
        template="plain",
        max_prompt_length=2000,
        cache_dir=str(cache_dir),
        cache_chunk_size=2,
    )


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.tmp"))


def dead_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_full_disk_leaves_no_temporary_file_and_the_rerun_cleans_up_and_says_it_resumed(
    tiny_model_path, tmp_path, monkeypatch, capsys
):
    directory = tmp_path / "cache"
    real_fsync, calls = os.fsync, []

    def fsync_until_the_disk_is_full(descriptor: int) -> None:
        calls.append(descriptor)
        if len(calls) == 2:  # the second chunk file: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_until_the_disk_is_full)
    with pytest.raises(OSError) as error:
        make_datamodule(tiny_model_path, directory).setup("fit")
    monkeypatch.setattr(os, "fsync", real_fsync)
    (chunk_dir,) = (directory / "partial").iterdir()
    assert str(chunk_dir / "chunk_000001.safetensors") in str(error.value)
    assert "No space left on device" in str(error.value) and "free space there" in str(error.value)
    assert temporaries(directory) == []  # nothing hidden keeps the space
    assert [p.name for p in chunk_dir.iterdir()] == ["chunk_000000.safetensors"]

    # A writer killed mid-write (no chance to clean up) left its temporary file: the next start removes it.
    (chunk_dir / f".chunk_000002.safetensors.{dead_pid()}.tmp").write_bytes(b"\0" * 4096)
    capsys.readouterr()
    datamodule = make_datamodule(tiny_model_path, directory)
    datamodule.setup("fit")
    messages = capsys.readouterr().err
    assert f"removed 1 temporary file(s) left in {directory} by an interrupted write" in messages
    assert f"resuming an interrupted build: 1 of 3 chunk(s) found in {chunk_dir} are read back" in messages
    assert sorted(p.name for p in directory.iterdir()) == ["manifest.json", "scores.safetensors"]
    assert len(datamodule.cache) == 6


def test_a_fresh_build_does_not_say_it_resumed(tiny_model_path, tmp_path, capsys):
    make_datamodule(tiny_model_path, tmp_path / "cache").setup("fit")
    assert "resuming" not in capsys.readouterr().err


def test_a_running_writers_temporary_file_is_kept(tmp_path):
    from erpo_lightning.data.cache import remove_stale_temporaries

    chunk_dir = tmp_path / "partial" / "abc-c2"
    chunk_dir.mkdir(parents=True)
    live = chunk_dir / f".chunk_000003.safetensors.{os.getppid()}.tmp"
    stale = tmp_path / f".scores.safetensors.{dead_pid()}.tmp"
    other = tmp_path / "notes.tmp"  # not a writer's temporary file
    for path in (live, stale, other):
        path.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert live.exists() and other.exists() and not stale.exists()


def make_read_only(folder: Path) -> Callable[[], None] | None:
    """Make `folder` read-only for this process (mode 0555; as root, which ignores modes, the immutable attribute).
    Returns the undo, or None when this machine cannot do either."""

    def writable() -> bool:
        try:
            (folder / ".probe").touch()
        except OSError:
            return False
        (folder / ".probe").unlink()
        return True

    folder.chmod(0o555)
    if not writable():
        return lambda: folder.chmod(0o755)
    folder.chmod(0o755)
    chattr = shutil.which("chattr")
    if chattr and subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode == 0:
        if not writable():
            return lambda: subprocess.run([chattr, "-i", str(folder)], check=True)
        subprocess.run([chattr, "-i", str(folder)], check=True)
    return None


@pytest.fixture()
def read_only_folder(tmp_path):
    folder = tmp_path / "shared_cache"
    folder.mkdir()
    holder: dict[str, Callable[[], None] | None] = {"undo": None}

    def lock() -> Path:
        holder["undo"] = make_read_only(folder)
        if holder["undo"] is None:
            pytest.skip("cannot make a folder read-only here (chmod is ignored and chattr +i is not allowed)")
        return folder

    yield folder, lock
    if holder["undo"] is not None:
        holder["undo"]()


def test_a_read_only_cache_folder_is_refused_before_the_model_loads(tiny_model_path, read_only_folder, monkeypatch):
    folder, lock = read_only_folder
    lock()
    monkeypatch.setattr(cache_build, "load_reference_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(OSError) as error:
        make_datamodule(tiny_model_path, folder).setup("fit")
    assert str(error.value).startswith(f"{folder}: cannot write in this cache folder (")
    assert "make it writable and run again, or choose another cache folder (data.cache_dir)" in str(error.value)
    with pytest.raises(OSError, match=f"^{folder / 'sub'}: cannot write in this cache folder"):
        make_datamodule(tiny_model_path, folder / "sub").setup("fit")  # a folder that cannot be created


def test_a_complete_cache_in_a_read_only_folder_still_loads(tiny_model_path, read_only_folder, monkeypatch):
    folder, lock = read_only_folder
    built = make_datamodule(tiny_model_path, folder)
    built.setup("fit")
    lock()
    monkeypatch.setattr(cache_build, "load_reference_model", lambda *a, **k: pytest.fail("recomputed"))
    loaded = make_datamodule(tiny_model_path, folder)
    loaded.setup("fit")
    assert len(loaded.cache) == len(built.cache) == 6
