"""Giving the heap memory that a phase freed back to the system, so that it does not stay resident.

A training step on CPU frees and reallocates tensors of a few MiB to tens of MiB (activations, gradients, vLLM's
buffers) thousands of times. glibc serves a block from its heap unless it is at least the mmap threshold, which it
raises (up to 32 MiB) after every large free, so these tensors live in the heap, and its freed pages stay resident:
on SmolLM2-135M the example held 6–7 GiB of freed heap between steps (docs/real_model.md, "Memory by phase").
`release_free_heap` (glibc's `malloc_trim(0)`) returns those pages at the end of each phase: after each training
step's optimizer steps and after each temperature sweep. Within a step the heap is reused as before, so the step
costs what it did; a fixed 1 MiB mmap threshold, the other candidate, also removed the retention but made each step
24% slower (every block mapped and faulted anew). ERPO_MALLOC_TRIM=0 turns the release off (bench/bench_fit_memory.py
compares both).
"""

from __future__ import annotations

import ctypes
import functools
import os


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None on another C library (musl, macOS)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return the heap's free pages to the system (glibc `malloc_trim(0)`); True when any memory was released."""
    trim = _malloc_trim()
    if trim is None or os.environ.get("ERPO_MALLOC_TRIM", "1") == "0":
        return False
    return bool(trim(0))
