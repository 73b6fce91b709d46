"""Giving the heap memory that a phase freed back to the system, so that it does not stay resident.

A training step on CPU frees and reallocates tensors of a few MiB to tens of MiB (activations, gradients, vLLM's
buffers) thousands of times. glibc serves a block from its heap unless it is at least the mmap threshold, which it
raises (up to 32 MiB) after every large free, so these tensors live in the heap, and its freed pages stay resident:
on SmolLM2-135M the example held 6–7 GiB of freed heap between steps (docs/real_model.md, "Memory by phase").
`release_free_heap` (glibc's `malloc_trim(0)`) returns those pages at the end of each phase: after each training
step's optimizer steps and after each temperature sweep. A fixed 1 MiB mmap threshold, the other candidate, also
removed the retention but made each step 24% slower (every block mapped and faulted anew). ERPO_MALLOC_TRIM=0 turns
the release off (bench/bench_fit_memory.py compares both).

The release is not free: the trim walks the heap and hands pages back, and the next step faults them in again, which
was measured at 5-7% of a toy step (issue 71). So it runs only when the heap's free bytes (glibc's `mallinfo2`) reach
`TRIM_ABOVE_BYTES`: a quickstart toy step leaves about 0.3 GiB free, which stays; SmolLM2's 6-7 GiB go back.
"""

from __future__ import annotations

import ctypes
import functools
import os

TRIM_ABOVE_BYTES = 1 << 30  # free heap below this stays resident: not worth a trim and its page faults each step


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


@functools.cache
def _mallinfo2():
    """glibc's mallinfo2 (2.33 and later), or None."""
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def free_heap_bytes() -> int | None:
    """Bytes in the free chunks of glibc's heaps, all arenas (`mallinfo2().fordblks`; pages already handed back
    count too); None without mallinfo2."""
    info = _mallinfo2()
    return None if info is None else int(info().fordblks)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None on another C library (musl, macOS)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap(above: int = TRIM_ABOVE_BYTES) -> bool:
    """Return the heap's free pages to the system (glibc `malloc_trim(0)`) when its free bytes reach `above`
    (always, without a reading: `free_heap_bytes`); True when any memory was released."""
    trim = _malloc_trim()
    if trim is None or os.environ.get("ERPO_MALLOC_TRIM", "1") == "0":
        return False
    free = free_heap_bytes()
    if free is not None and free < above:
        return False
    return bool(trim(0))
