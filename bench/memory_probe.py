"""A Lightning callback that records, at each phase boundary of `erpo fit`, the process's resident set, its peak since
the previous boundary, and glibc's heap statistics; bench/bench_fit_memory.py adds it to a run.

Phases, in the order Lightning reaches them: `setup` (the data module's setup has built or loaded the reference
cache), `train_start` (the rollout engine is built and the start sweep, if any, ran), then per step `rollout` (from
on_train_batch_start to the step's first backward: weight sync, generation, grading, the first micro-batch's
forward) and `train` (from there to on_train_batch_end: the backward passes and optimizer steps), and `train_end`
(the end sweep, if any, ran). The peak of a
phase is VmHWM, reset at the previous boundary through /proc/self/clear_refs. Heap figures come from glibc's
`mallinfo2`: `heap_in_use` (uordblks: allocated from the arenas), `heap_free` (fordblks: free inside the arenas,
held by the process), `mmapped` (hblkhd: large blocks mapped one by one, returned on free).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path

import lightning as L


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]  # fmt: skip


def status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmRSS, VmHWM, ...) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def heap_stats() -> dict[str, int]:
    """glibc's heap figures in bytes (empty where mallinfo2 is missing: another libc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return {}
    info = libc.mallinfo2()
    return {"heap_in_use": info.uordblks, "heap_free": info.fordblks, "mmapped": info.hblkhd}


class PhaseProbe(L.Callback):
    """Appends one record per phase boundary to a JSON-lines file `path` (default: $ERPO_MEMORY_PROBE)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path or os.environ["ERPO_MEMORY_PROBE"])
        self.started = time.perf_counter()
        self.step = -1
        self.first_backward = False

    def record(self, phase: str) -> None:
        entry = {
            "phase": phase,
            "step": self.step,
            "seconds": round(time.perf_counter() - self.started, 2),
            "unix_time": time.time(),
            "rss": status_bytes("VmRSS"),
            "peak": status_bytes("VmHWM"),
            **heap_stats(),
        }
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")
        Path("/proc/self/clear_refs").write_text("5")  # the next phase's peak starts from the current resident set

    def setup(self, trainer, pl_module, stage):
        self.record("setup")

    def on_train_start(self, trainer, pl_module):
        self.record("train_start")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.step, self.first_backward = trainer.global_step, True
        self.record("step_start")

    def on_before_backward(self, trainer, pl_module, loss):
        if self.first_backward:
            self.first_backward = False
            self.record("rollout")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.record("train")

    def on_train_end(self, trainer, pl_module):
        self.record("train_end")
