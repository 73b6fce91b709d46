"""Where a training step's time goes: seconds per named phase (generation, grading, weight sync, the update's
forwards and backwards, the optimizer, ...), recorded only while a run holds the `PhaseTimes` callback
(`callbacks/phase_times.py`, which bench/profile_fit.py adds); otherwise `timed` does nothing but one check.

The phases are the places that call `timed` or `add`; they do not nest, so their seconds add up to the part of the
step they cover, and the step's wall time minus their sum is the rest (Lightning's loop, the loggers, checkpoints).
When recording on CUDA each phase's start and end synchronise the device, so a kernel is counted in the phase that
queued it; that costs a profiled GPU step a little, and an unprofiled one nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter

_seconds: dict[str, float] | None = None  # phase -> seconds since the last `take`; None: not recording
_synchronize: Callable[[], None] | None = None


def start_recording(synchronize: Callable[[], None] | None = None) -> None:
    """Record phases from now on; `synchronize` (e.g. `torch.cuda.synchronize`) runs at each phase's bounds."""
    global _seconds, _synchronize
    _seconds, _synchronize = {}, synchronize


def stop_recording() -> None:
    global _seconds, _synchronize
    _seconds, _synchronize = None, None


def recording() -> bool:
    return _seconds is not None


def add(name: str, seconds: float) -> None:
    """Count `seconds` to phase `name` (a phase timed elsewhere, e.g. the sampler's generation clock)."""
    if _seconds is not None:
        _seconds[name] = _seconds.get(name, 0.0) + seconds


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Count the wall time of the block to phase `name` while recording."""
    if _seconds is None:
        yield
        return
    if _synchronize is not None:
        _synchronize()
    start = perf_counter()
    try:
        yield
    finally:
        if _synchronize is not None:
            _synchronize()
        add(name, perf_counter() - start)


def take() -> dict[str, float]:
    """The seconds per phase recorded since the last `take` (empty when not recording), and start afresh."""
    global _seconds
    if _seconds is None:
        return {}
    taken, _seconds = _seconds, {}
    return taken
