"""The verifier worker: ``python -m erpo_lightning.rewards.worker SETTINGS_JSON MEMORY_MB``.

Started as a module of its own, never by ``multiprocessing``: it imports nothing of the caller, so a plain script
without an ``if __name__ == "__main__":`` guard, ``python -c`` and notebooks can grade. It reads tasks from stdin
and writes outcomes to its original stdout (its ``print``s go to stderr), one JSON message each, framed by
:class:`multiprocessing.connection.Connection`:

- ``"ready"`` once sympy and the LaTeX grammar are loaded;
- task ``[kind, gold, pred, problem_numbers]`` -> ``[equal, parse_failures, conventions, crashed]``; ``null`` stops
  the worker.

``kind`` is ``"erpo"`` (this package's comparison of two extracted answers, the symbolic step) or ``"math_verify"``
(Math-Verify's own ``parse`` + ``verify`` of a gold and a whole response).
"""

from __future__ import annotations

import json
import os
import re
import sys
from fractions import Fraction
from multiprocessing.connection import Connection

from erpo_lightning.rewards.conventions import GraderSettings

_LATEX_ENVIRONMENT = re.compile(r"\$|\\\(|\\\[|\\boxed")


class Verifier:
    """Everything a task needs, built once per process."""

    def __init__(self, settings: GraderSettings) -> None:
        from erpo_lightning.rewards.compare import AnswerComparer
        from erpo_lightning.rewards.symbolic import SympyBackend

        self.backend = SympyBackend(settings)
        self.comparer = AnswerComparer(self.backend, settings)

    def warm_up(self) -> None:
        """Load the LaTeX grammar, Math-Verify's parsers and sympy's simplification (about 1 s on first use)."""
        self.run("erpo", "x+1", "\\frac{x^2-1}{x-1}")
        self.run("math_verify", "1", "\\boxed{1}")

    def run(
        self, kind: str, gold: str, pred: str, problem_numbers: list[str] | None = None
    ) -> tuple[bool, int, list[str], bool]:
        """``(equal, parse_failures, conventions used, crashed)``; any failure scores 0 and never propagates.

        ``problem_numbers``: the numbers the problem writes, as exact fractions in text (``"19"``, ``"5/2"``), or None
        when the problem is unknown (see ``AnswerComparer.equal``)."""
        self.backend.parse_failures = 0
        try:
            if kind == "math_verify":
                return math_verify_equal(gold, pred), 0, [], False
            numbers = None if problem_numbers is None else frozenset(map(Fraction, problem_numbers))
            equal = self.comparer.equal(gold, pred, numbers)
            return equal, self.backend.parse_failures, sorted(self.comparer.used) if equal else [], False
        except (Exception, RecursionError):  # noqa: BLE001 - a bad input scores 0, it never kills the worker
            return False, self.backend.parse_failures, [], True


def math_verify_equal(gold: str, response: str) -> bool:
    """Math-Verify's verdict with its default settings (a gold without LaTeX delimiters is put in a box)."""
    from math_verify import parse, verify

    if not _LATEX_ENVIRONMENT.search(gold):
        gold = f"\\boxed{{{gold}}}"
    gold_parsed = parse(gold, parsing_timeout=None)
    pred_parsed = parse(response, parsing_timeout=None)
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _limit_memory(extra_mb: int) -> None:
    """Cap the address space at its current size plus ``extra_mb``."""
    import resource

    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = current + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str]) -> None:
    """Serve tasks until ``null`` or until the parent closes the pipe."""
    settings = GraderSettings(**json.loads(argv[1]))
    memory_mb = int(argv[2])
    inbox = Connection(os.dup(0), writable=False)
    outbox = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # stray prints must not corrupt the message stream
    verifier = Verifier(settings)
    verifier.warm_up()
    if memory_mb > 0 and os.path.exists("/proc/self/statm"):
        _limit_memory(memory_mb)
    outbox.send_bytes(b'"ready"')
    while True:
        try:
            task = json.loads(inbox.recv_bytes())
        except (EOFError, OSError):
            return
        if task is None:
            return
        outbox.send_bytes(json.dumps(verifier.run(*task)).encode())


if __name__ == "__main__":
    main(sys.argv)
