"""A pool of verifier processes with a hard deadline per item.

Math-Verify's own timeouts use ``signal.alarm``, which only works in the main thread. Here each
item runs in a worker process instead; a worker that misses its deadline is killed and replaced,
and the item is reported as timed out. Workers are started with ``forkserver`` (or ``spawn``),
never ``fork``: the training process holds torch threads and possibly vLLM state.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

_BOOT_TIMEOUT_S = 120.0
_WORKER_MODULE = "erpo_lightning.rewards.pool"


@dataclass(frozen=True)
class Outcome:
    """Result of one item: the verdict, and how it was reached."""

    equal: bool
    parse_failures: int = 0
    timed_out: bool = False
    crashed: bool = False


def _limit_memory(extra_mb: int) -> None:
    """Cap the worker's address space at its current size plus ``extra_mb``."""
    import resource

    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = current + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _worker_main(conn: Connection, rel_tol: float, memory_mb: int) -> None:
    """Worker loop: receive ``(gold, pred)``, send an :class:`Outcome`; ``None`` stops it."""
    from erpo_lightning.rewards.compare import AnswerComparer
    from erpo_lightning.rewards.symbolic import SympyBackend

    backend = SympyBackend()
    comparer = AnswerComparer(backend, rel_tol)
    backend("1", "1")  # load the LaTeX grammar before declaring readiness
    if memory_mb > 0 and os.path.exists("/proc/self/statm"):
        _limit_memory(memory_mb)
    conn.send("ready")
    while (task := conn.recv()) is not None:
        backend.parse_failures = 0
        try:
            outcome = Outcome(comparer.equal(*task), backend.parse_failures)
        except (Exception, RecursionError):  # noqa: BLE001 - any failure scores 0, never kills us
            outcome = Outcome(False, backend.parse_failures, crashed=True)
        conn.send(outcome)


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext, rel_tol: float, memory_mb: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, rel_tol, memory_mb), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.boot_deadline = time.monotonic() + _BOOT_TIMEOUT_S
        self.task: int | None = None
        self.deadline = float("inf")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class VerifierPool:
    """``num_workers`` processes comparing ``(gold, pred)`` pairs, each within ``timeout_s``."""

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        rel_tol: float,
        start_method: str = "forkserver",
        memory_mb: int = 2048,
    ) -> None:
        if num_workers < 1:
            raise ValueError("a VerifierPool needs at least one worker")
        self.timeout_s = timeout_s
        self.restarts = 0
        self._args = (rel_tol, memory_mb)
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload([_WORKER_MODULE])
        self._workers = [self._spawn() for _ in range(num_workers)]

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, *self._args)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._spawn()
        self.restarts += 1

    def run(self, pairs: list[tuple[str, str]]) -> list[Outcome]:
        """Compare every ``(gold, pred)`` pair; an item past its deadline is a timeout."""
        results: list[Outcome | None] = [None] * len(pairs)
        pending = deque(range(len(pairs)))
        while pending or any(w.task is not None for w in self._workers):
            for worker in self._workers:
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.popleft()
                    worker.deadline = time.monotonic() + self.timeout_s
                    worker.conn.send(pairs[worker.task])
            self._collect(results, pending)
        return [r if r is not None else Outcome(False, crashed=True) for r in results]

    def _collect(self, results: list[Outcome | None], pending: deque[int]) -> None:
        now = time.monotonic()
        waiting = [w for w in self._workers if w.task is not None or not w.ready]
        next_deadline = min(w.deadline if w.ready else w.boot_deadline for w in waiting)
        ready = wait([w.conn for w in waiting], timeout=max(0.0, next_deadline - now))
        for worker in list(waiting):
            if worker.conn in ready:
                self._receive(worker, results)
            elif time.monotonic() >= (worker.deadline if worker.ready else worker.boot_deadline):
                if not worker.ready:
                    raise RuntimeError("a verifier worker did not start in time")
                results[worker.task] = Outcome(False, timed_out=True)
                self._replace(worker)

    def _receive(self, worker: _Worker, results: list[Outcome | None]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # the worker died (e.g. killed by the OS for memory)
            if not worker.ready:
                raise RuntimeError("a verifier worker died while starting") from None
            results[worker.task] = Outcome(False, crashed=True)
            self._replace(worker)
            return
        if message == "ready":
            worker.ready = True
        else:
            results[worker.task] = message
            worker.task = None

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=1)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        self._workers = []
