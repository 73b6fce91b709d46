"""A pool of verifier processes with a hard deadline per item.

Math-Verify's own timeouts use ``signal.alarm``, which only works in the main thread. Here each
item runs in a worker process instead; a worker that misses its deadline is killed and replaced,
and the item is reported as timed out. Workers are plain subprocesses running
``python -m erpo_lightning.rewards.worker`` over pipes (see that module): they never fork the
training process (torch threads, vLLM state) and never import the caller's ``__main__``.
A spare worker boots beside the pool so that a killed worker is replaced at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from erpo_lightning.rewards.conventions import GraderSettings

# What a worker compares: (kind, gold, pred, the numbers the problem writes as text or None when it is unknown).
Task = tuple[str, str, str, list[str] | None]
_BOOT_TIMEOUT_S = 120.0
_WORKER_MODULE = "erpo_lightning.rewards.worker"
# The folder holding the erpo_lightning package: workers find it even when the caller put it on the import path itself.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Outcome:
    """Result of one item: the verdict, how it was reached and the conventions it relied on."""

    equal: bool
    parse_failures: int = 0
    timed_out: bool = False
    crashed: bool = False
    conventions: tuple[str, ...] = ()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [_PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _exit_code(process: subprocess.Popen) -> int | None:
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


class _Worker:
    def __init__(self, settings: GraderSettings, memory_mb: int) -> None:
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        command = [sys.executable, "-m", _WORKER_MODULE, json.dumps(settings.as_dict()), str(memory_mb)]
        try:
            self.process = subprocess.Popen(
                command, stdin=to_child, stdout=to_parent, env=_worker_env(), close_fds=True, cwd=_PACKAGE_ROOT
            )
        finally:
            os.close(to_child)
            os.close(to_parent)
        self.inbox = Connection(from_child, writable=False)
        self.outbox = Connection(from_parent, readable=False)
        self.ready = False
        self.boot_deadline = time.monotonic() + _BOOT_TIMEOUT_S
        self.task: int | None = None
        self.deadline = float("inf")

    def send(self, message: object) -> None:
        self.outbox.send_bytes(json.dumps(message).encode())

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=5)
        self.inbox.close()
        self.outbox.close()


class VerifierPool:
    """``num_workers`` processes comparing ``(kind, gold, pred, problem numbers)`` tasks, each within ``timeout_s``."""

    def __init__(
        self, num_workers: int, timeout_s: float, settings: GraderSettings | None = None, memory_mb: int = 2048
    ) -> None:
        if num_workers < 1:
            raise ValueError("a VerifierPool needs at least one worker")
        self.timeout_s = timeout_s
        self.restarts = 0
        self._args = (settings or GraderSettings(), memory_mb)
        self._workers = [_Worker(*self._args) for _ in range(num_workers)]
        self._spare = _Worker(*self._args)
        self._started = False  # a worker that fails to boot before any did is a setup error: raised

    def _replace(self, worker: _Worker) -> None:
        """Kill ``worker``; the spare (or, for the spare itself, a new process) takes its place."""
        worker.kill()
        self.restarts += 1
        if worker is self._spare:
            self._spare = _Worker(*self._args)
            return
        self._workers[self._workers.index(worker)] = self._spare
        self._spare = _Worker(*self._args)

    def _boot_failed(self, worker: _Worker, why: str) -> None:
        if not self._started:
            raise RuntimeError(f"a verifier worker (python -m {_WORKER_MODULE}) {why}; its error is printed above")
        self._replace(worker)

    def run(self, tasks: list[Task]) -> list[Outcome]:
        """Run every ``(kind, gold, pred, problem numbers)`` task; an item past its deadline is a timeout."""
        results: list[Outcome | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        while pending or any(w.task is not None for w in self._workers):
            for worker in self._workers:
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.popleft()
                    worker.deadline = time.monotonic() + self.timeout_s
                    try:
                        worker.send(list(tasks[worker.task]))
                    except (OSError, ValueError):  # died since its last answer: the receive below reports it
                        pass
            self._collect(results)
        return [r if r is not None else Outcome(False, crashed=True) for r in results]

    def _collect(self, results: list[Outcome | None]) -> None:
        now = time.monotonic()
        waiting = [w for w in self._workers if w.task is not None or not w.ready]
        if not self._spare.ready:
            waiting.append(self._spare)
        next_deadline = min(w.deadline if w.ready else w.boot_deadline for w in waiting)
        ready = wait([w.inbox for w in waiting], timeout=max(0.0, next_deadline - now))
        for worker in waiting:
            if worker.inbox in ready:
                self._receive(worker, results)
            elif time.monotonic() >= (worker.deadline if worker.ready else worker.boot_deadline):
                if not worker.ready:
                    self._boot_failed(worker, f"did not start within {_BOOT_TIMEOUT_S:.0f} s")
                    continue
                results[worker.task] = Outcome(False, timed_out=True)
                self._replace(worker)

    def _receive(self, worker: _Worker, results: list[Outcome | None]) -> None:
        try:
            message = json.loads(worker.inbox.recv_bytes())
        except (EOFError, OSError):  # the worker died (e.g. killed by the OS for memory)
            if not worker.ready:
                self._boot_failed(worker, f"exited with code {_exit_code(worker.process)} while starting")
                return
            results[worker.task] = Outcome(False, crashed=True)
            self._replace(worker)
            return
        if message == "ready":
            worker.ready = self._started = True
            return
        equal, parse_failures, conventions, crashed = message
        results[worker.task] = Outcome(bool(equal), parse_failures, False, crashed, tuple(conventions))
        worker.task = None

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        workers = [*self._workers, self._spare]
        for worker in workers:
            try:
                worker.send(None)
            except (OSError, ValueError):
                pass
        for worker in workers:
            try:
                worker.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=5)
            worker.inbox.close()
            worker.outbox.close()
        self._workers = []
