"""``MathReward``: the default verifiable reward for math answers, and ``verify_answer``."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from erpo_lightning.rewards.compare import AnswerComparer, NeedsSymbolic
from erpo_lightning.rewards.extraction import BARE_MAX_CHARS, DEFAULT_FALLBACKS, extract_answer, extract_gold
from erpo_lightning.rewards.numbers import DEFAULT_REL_TOL
from erpo_lightning.rewards.pool import Outcome, VerifierPool

_COUNTER_NAMES = ("items", "correct", "extraction_failures", "parse_failures", "timeouts", "worker_errors", "symbolic")


@lru_cache(maxsize=4096)
def _cached_gold(gold: str) -> str:
    return extract_gold(gold)


class MathReward:
    """Reward 1 for a response whose final answer equals the gold answer, else 0.

    Answers are extracted (last ``\\boxed{}``, then ``fallbacks``), compared by cheap exact
    rules in this process, and only the undecided pairs go to a pool of ``num_workers`` verifier
    processes (sympy through Math-Verify), each pair within ``timeout_s`` seconds; a pair that
    runs over scores ``incorrect_reward`` and is counted in ``timeouts``. ``num_workers=0``
    verifies in-process, without any deadline: use it only where subprocesses are impossible.
    Numbers are equal when exactly equal or within relative tolerance ``rel_tol``.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        rel_tol: float = DEFAULT_REL_TOL,
        bare_max_chars: int = BARE_MAX_CHARS,
        start_method: str = "forkserver",
        worker_memory_mb: int = 2048,
    ) -> None:
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.fallbacks = list(fallbacks)
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.rel_tol = rel_tol
        self.bare_max_chars = bare_max_chars
        self.start_method = start_method
        self.worker_memory_mb = worker_memory_mb
        extract_answer("", self.fallbacks)  # validates the fallback names now, not mid-training
        self._pool: VerifierPool | None = None
        self._in_process: AnswerComparer | None = None
        self._counts: Counter[str] = Counter()

    def __call__(self, responses: list[str], golds: list[str]) -> list[float]:
        """One reward per ``(response, gold)`` pair."""
        return [self.correct_reward if ok else self.incorrect_reward for ok in self.verdicts(responses, golds)]

    def verdicts(self, responses: list[str], golds: list[str]) -> list[bool]:
        """Whether each response's final answer equals its gold answer."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        cheap = AnswerComparer(None, self.rel_tol)
        verdicts: list[bool] = [False] * len(responses)
        undecided: list[tuple[int, tuple[str, str]]] = []
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            answer = extract_answer(response, self.fallbacks, self.bare_max_chars)
            if answer is None:
                self._counts["extraction_failures"] += 1
                continue
            pair = (_cached_gold(gold), answer)
            try:
                verdicts[i] = cheap.equal(*pair)
            except NeedsSymbolic:
                undecided.append((i, pair))
        for (i, _), outcome in zip(undecided, self._verify_symbolic([p for _, p in undecided]), strict=True):
            verdicts[i] = outcome.equal
            self._counts["parse_failures"] += min(outcome.parse_failures, 1)
            self._counts["timeouts"] += outcome.timed_out
            self._counts["worker_errors"] += outcome.crashed
        self._counts["items"] += len(responses)
        self._counts["symbolic"] += len(undecided)
        self._counts["correct"] += sum(verdicts)
        return verdicts

    def _verify_symbolic(self, pairs: list[tuple[str, str]]) -> list[Outcome]:
        if not pairs:
            return []
        if self.num_workers <= 0:
            return [self._verify_in_process(pair) for pair in pairs]
        if self._pool is None:
            self._pool = VerifierPool(
                self.num_workers,
                self.timeout_s,
                self.rel_tol,
                self.start_method,
                self.worker_memory_mb,
            )
            weakref.finalize(self, self._pool.close)
        return self._pool.run(pairs)

    def _verify_in_process(self, pair: tuple[str, str]) -> Outcome:
        from erpo_lightning.rewards.symbolic import SympyBackend

        if self._in_process is None:
            self._in_process = AnswerComparer(SympyBackend(), self.rel_tol)
        backend = self._in_process.symbolic
        backend.parse_failures = 0
        try:
            return Outcome(self._in_process.equal(*pair), backend.parse_failures)
        except (Exception, RecursionError):  # noqa: BLE001 - a bad input scores 0
            return Outcome(False, backend.parse_failures, crashed=True)

    def counters(self) -> dict[str, float]:
        """Counters since the previous call (then reset): items, timeouts, parse failures..."""
        counts = {name: float(self._counts[name]) for name in _COUNTER_NAMES}
        self._counts.clear()
        return counts

    def close(self) -> None:
        """Stop the worker pool; a later call starts a new one."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # Processes and pipes cannot be copied: a copy (deepcopy, pickle) starts its own pool.
        state = self.__dict__.copy()
        state.update(_pool=None, _in_process=None, _counts=Counter())
        return state


_default: MathReward | None = None


def verify_answer(response: str, gold: str) -> bool:
    """Whether ``response``'s final answer equals ``gold`` (ad-hoc use; shared 1-worker pool)."""
    global _default
    if _default is None:
        _default = MathReward(num_workers=1)
    return _default.verdicts([response], [gold])[0]
