"""The heap release the `erpo` command runs between phases (erpo_lightning/common/memory.py), observed through glibc."""

import json
import os
import subprocess
import sys

import pytest

# In a fresh process: free a 24 MiB block (glibc then serves blocks up to that size from its heap), write 100 blocks
# of 4 MiB, keep a 1 MiB block allocated after them (so the heap's top stays in use and glibc cannot trim it by
# itself), free the 100 blocks, and read the resident set before and after `release_free_heap`.
PROBE = """
import ctypes, json
from erpo_lightning.common.memory import release_free_heap
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(24 << 20))
blocks = [libc.malloc(4 << 20) for _ in range(100)]
for block in blocks:
    ctypes.memset(block, 1, 4 << 20)
guard = libc.malloc(1 << 20)  # above the blocks: the heap top stays in use
for block in blocks:
    libc.free(block)
held = rss()
released = release_free_heap(above=256 << 20)  # 400 MiB free: above it
print(json.dumps({"released": released, "returned_mib": (held - rss()) / 2**20}))
"""


def probe(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_go_back_to_the_system():
    result = probe({})
    assert result["released"] and result["returned_mib"] > 300, result
    # Without the release the 400 MiB freed in the heap's middle stay resident.
    kept = probe({"ERPO_MALLOC_TRIM": "0"})
    assert not kept["released"] and kept["returned_mib"] < 50, kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_the_heap_is_trimmed_only_when_its_free_bytes_reach_the_threshold(monkeypatch):
    from erpo_lightning.common import memory

    if memory.free_heap_bytes() is None:
        pytest.skip("glibc before 2.33: no mallinfo2, so every release trims")
    trims = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: lambda pad: trims.append(pad) or 1)
    monkeypatch.setattr(memory, "free_heap_bytes", lambda: 300 << 20)  # about what a quickstart toy step leaves
    assert memory.release_free_heap() is False and trims == []
    assert memory.release_free_heap(above=300 << 20) is True and trims == [0]
    monkeypatch.setattr(memory, "free_heap_bytes", lambda: memory.TRIM_ABOVE_BYTES)
    assert memory.release_free_heap() is True and trims == [0, 0]
