"""``MathReward``: the default verifiable reward for math answers, and ``verify_answer``."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from typing import Literal

from erpo_lightning.rewards.compare import AnswerComparer, NeedsSymbolic
from erpo_lightning.rewards.conventions import Preset, make_settings
from erpo_lightning.rewards.extraction import (
    BARE_MAX_CHARS,
    DEFAULT_FALLBACKS,
    extract_answer,
    extract_final,
    extract_gold_parts,
    has_doubled_commands,
)
from erpo_lightning.rewards.normalize import has_invisible
from erpo_lightning.rewards.pool import Outcome, Task, VerifierPool
from erpo_lightning.rewards.restatement import problem_numbers

Backend = Literal["erpo", "math_verify"]
Status = Literal["graded", "no_answer", "too_long", "too_deep", "timeout", "error"]

MAX_RESPONSE_CHARS = 200_000
MAX_ANSWER_CHARS = 1_000
MAX_DEPTH = 32

_COUNTER_NAMES = (
    "items",
    "correct",
    "extraction_failures",
    "parse_failures",
    "timeouts",
    "worker_errors",
    "symbolic",
    "too_long",
    "too_deep",
    "errors",
)
_OPENING = frozenset("({[")
_CLOSING = frozenset(")}]")


@dataclass(frozen=True)
class Verdict:
    """One graded pair: whether it is correct, how the verdict was reached and the conventions it relied on."""

    correct: bool
    status: Status = "graded"
    conventions: tuple[str, ...] = ()


@lru_cache(maxsize=4096)
def _cached_gold(gold: str, join_boxes: bool, undouble: bool, invisible: bool) -> tuple[str, bool]:
    return extract_gold_parts(gold, join_boxes, undouble, invisible)


def _numbers_of_problems(problems: Sequence[object] | None, count: int) -> list[frozenset[Fraction] | None]:
    """The numbers each of ``count`` pairs' problem writes (``restatement.problem_numbers``), read once per distinct
    problem (a rollout repeats each one for its group); None for a pair whose problem is unknown (no problems, or
    one that is not text)."""
    if problems is None:
        return [None] * count
    read: dict[str, frozenset[Fraction]] = {}
    for problem in problems:
        if isinstance(problem, str) and problem not in read:
            read[problem] = problem_numbers(problem)
    return [read.get(problem) if isinstance(problem, str) else None for problem in problems]


def bracket_depth(text: str, stop_at: int) -> int:
    """Deepest bracket nesting of ``text`` (``({[`` against ``)}]``); the scan stops once it exceeds ``stop_at``."""
    depth = deepest = 0
    for char in text:
        if char in _OPENING:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_at:
                    break
        elif char in _CLOSING and depth:
            depth -= 1
    return deepest


class MathReward:
    """Reward 1 for a response whose final answer equals the gold answer, else 0.

    Answers are extracted (last ``\\boxed{}``, then ``fallbacks``), compared by cheap exact rules in this process,
    and only the undecided pairs go to a pool of ``num_workers`` verifier processes (sympy through Math-Verify),
    each pair within ``timeout_s`` seconds; a pair that runs over scores ``incorrect_reward`` and is counted in
    ``timeouts``. ``num_workers=0`` verifies in-process, without any deadline: use it only where subprocesses are
    impossible (or for answers known to be plain numbers); answers sympy could spend unbounded time on (power
    towers, huge exponents and factorials) are refused before parsing there. ``backend="math_verify"`` with
    ``num_workers=0`` is refused (ValueError): Math-Verify parses whole responses, which no such check bounds.

    Bounds, checked before anything is parsed: a response longer than ``max_response_chars`` characters, or an
    extracted answer longer than ``max_answer_chars`` or nested deeper than ``max_depth`` brackets, scores 0 and is
    counted (``too_long`` / ``too_deep``). What runs in this process is linear scans of at most
    ``max_response_chars`` characters and comparisons of bounded answers; nothing raises into the caller.

    Conventions (docs/rewards.md): ``preset`` ("strict", the default for training and evaluation, or "lenient"),
    then ``accept_approximations`` (``1.414`` for ``\\sqrt{2}``; off in "strict"), ``rel_tol`` (relative tolerance
    on numbers; 0 in "strict"), ``float_rounding`` (decimal places a written decimal is compared at, 6) and
    ``conventions`` (name -> on/off for any other convention) override it.

    ``backend="math_verify"`` grades with Math-Verify itself (its ``parse`` and ``verify`` on the gold and the whole
    response, default settings) in the same worker pool under the same deadline, to reproduce work that used it;
    conventions do not apply there.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        rel_tol: float | None = None,
        bare_max_chars: int = BARE_MAX_CHARS,
        worker_memory_mb: int = 2048,
        preset: Preset = "strict",
        accept_approximations: bool | None = None,
        float_rounding: int | None = None,
        conventions: dict[str, bool] | None = None,
        backend: Backend = "erpo",
        max_response_chars: int = MAX_RESPONSE_CHARS,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        max_depth: int = MAX_DEPTH,
    ) -> None:
        if backend not in ("erpo", "math_verify"):
            raise ValueError(f"backend={backend!r}: choose 'erpo' or 'math_verify'")
        if backend == "math_verify" and num_workers <= 0:
            # Math-Verify parses the whole response with sympy, which can spend unbounded time inside one C call
            # (9^9^9^9 is a number of hundreds of millions of digits) that no signal interrupts: only a worker
            # process, killed at its deadline, bounds it.
            raise ValueError(
                f"MathReward(backend='math_verify', num_workers={num_workers}): Math-Verify would grade in this "
                "process without any deadline, and a response such as 'The answer is 9^9^9^9' can hang it for ever. "
                "Set num_workers >= 1 (verifier processes, each pair within timeout_s), or backend: erpo, whose "
                "in-process path refuses such answers before parsing them"
            )
        for name, value in (("timeout_s", timeout_s), ("max_response_chars", max_response_chars),
                            ("max_answer_chars", max_answer_chars), ("max_depth", max_depth)):  # fmt: skip
            if value <= 0:
                raise ValueError(f"{name}={value}: must be positive")
        overrides = dict(conventions or {})
        if accept_approximations is not None:
            overrides["approximations"] = accept_approximations
        self.settings = make_settings(preset, overrides, rel_tol=rel_tol, float_rounding=float_rounding)
        self.preset = preset
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.fallbacks = list(fallbacks)
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.bare_max_chars = bare_max_chars
        self.worker_memory_mb = worker_memory_mb
        self.backend = backend
        self.max_response_chars = max_response_chars
        self.max_answer_chars = max_answer_chars
        self.max_depth = max_depth
        extract_answer("", self.fallbacks)  # validates the fallback names now, not mid-training
        self._pool: VerifierPool | None = None
        self._in_process = None
        self._counts: Counter[str] = Counter()

    def __call__(self, responses: list[str], golds: list[str], problems: list[str] | None = None) -> list[float]:
        """One reward per ``(response, gold)`` pair; ``problems`` (one per pair, optional): see :meth:`grade`."""
        verdicts = self.verdicts(responses, golds, problems)
        return [self.correct_reward if ok else self.incorrect_reward for ok in verdicts]

    def verdicts(self, responses: list[str], golds: list[str], problems: list[str] | None = None) -> list[bool]:
        """Whether each response's final answer equals its gold answer."""
        return [verdict.correct for verdict in self.grade(responses, golds, problems)]

    def grade(self, responses: list[str], golds: list[str], problems: list[str] | None = None) -> list[Verdict]:
        """One :class:`Verdict` per pair: correctness, status and the conventions a correct verdict relied on.

        ``problems``: the problem text of each pair (the rollout gives them). An answer written as arithmetic that
        restates its problem (``\\frac{38}{2}`` for "Compute 38/2.") scores 0; other arithmetic is paid by its value
        (``unsimplified_values``, docs/rewards.md). Without the problems no answer is known to restate one.
        """
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        if problems is not None and len(problems) != len(responses):
            raise ValueError(f"{len(problems)} problems for {len(responses)} responses: give one per response")
        numbers = _numbers_of_problems(problems, len(responses))
        verdicts: list[Verdict] = [Verdict(False)] * len(responses)
        extraction: dict[int, set[str]] = {}  # pair -> conventions its extraction relied on
        tasks: list[tuple[int, Task]] = []
        cheap = AnswerComparer(None, self.settings)
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            try:
                verdict = self._quick(response, gold, numbers[i], cheap, i, tasks, extraction)
            except (Exception, RecursionError):  # noqa: BLE001 - one bad pair scores 0, it never stops the batch
                verdict = Verdict(False, "error")
            if verdict is not None:
                verdicts[i] = verdict
        for (i, _), outcome in zip(tasks, self._verify([task for _, task in tasks]), strict=True):
            verdicts[i] = self._from_outcome(outcome)
        for i, names in extraction.items():
            if verdicts[i].correct:
                verdicts[i] = replace(verdicts[i], conventions=tuple(sorted({*verdicts[i].conventions, *names})))
        self._counts["items"] += len(responses)
        self._counts["symbolic"] += len(tasks)
        self._counts["correct"] += sum(v.correct for v in verdicts)
        for status, counter in (("no_answer", "extraction_failures"), ("too_long", "too_long"),
                                ("too_deep", "too_deep"), ("error", "errors")):  # fmt: skip
            self._counts[counter] += sum(v.status == status for v in verdicts)
        return verdicts

    def _quick(
        self,
        response: str | bytes,
        gold: str,
        numbers: frozenset[Fraction] | None,
        cheap: AnswerComparer,
        i: int,
        tasks: list[tuple[int, Task]],
        extraction: dict[int, set[str]],
    ) -> Verdict | None:
        """The bounded in-process part of pair ``i`` (``numbers``: those its problem writes, None when unknown);
        None when it was queued for a worker (``tasks``)."""
        response = response.decode("utf-8", "replace") if isinstance(response, bytes) else str(response)
        gold = str(gold)
        if len(response) > self.max_response_chars:
            return Verdict(False, "too_long")
        if self.backend == "math_verify":
            tasks.append((i, ("math_verify", gold, response, None)))
            return None
        settings = self.settings
        answer, source = extract_final(
            response,
            self.fallbacks,
            self.bare_max_chars,
            settings.multiple_boxes,
            settings.doubled_backslashes,
            settings.invisible_characters,
        )
        if answer is None:
            return Verdict(False, "no_answer")
        if not settings.doubled_backslashes and has_doubled_commands(answer):
            return Verdict(False)  # read literally, "\\frac" is a line break and a word (Math-Verify would undouble it)
        if len(gold) > self.max_response_chars:
            return Verdict(False, "too_long")
        gold_answer, gold_joined = _cached_gold(
            gold, settings.multiple_boxes, settings.doubled_backslashes, settings.invisible_characters
        )
        for text in (answer, gold_answer):
            if bracket_depth(text, self.max_depth) > self.max_depth:
                return Verdict(False, "too_deep")
            if len(text) > self.max_answer_chars:
                return Verdict(False, "too_long")
        names = {"multiple_boxes"} if source == "boxes" or gold_joined else set()
        names |= {"marker": {"answer_markers"}, "bare": {"bare_answers"}}.get(source, set())
        if settings.doubled_backslashes and (has_doubled_commands(response) or has_doubled_commands(gold)):
            names.add("doubled_backslashes")
        if settings.invisible_characters and (has_invisible(response) or has_invisible(gold)):
            names.add("invisible_characters")
        extraction[i] = names
        try:
            equal = cheap.equal(gold_answer, answer, numbers)
        except NeedsSymbolic:
            sent = None if numbers is None else [str(number) for number in sorted(numbers)]
            tasks.append((i, ("erpo", gold_answer, answer, sent)))
            return None
        return Verdict(equal, conventions=tuple(sorted(cheap.used)) if equal else ())

    def _from_outcome(self, outcome: Outcome) -> Verdict:
        self._counts["parse_failures"] += min(outcome.parse_failures, 1)
        self._counts["timeouts"] += outcome.timed_out
        self._counts["worker_errors"] += outcome.crashed
        status: Status = "timeout" if outcome.timed_out else "error" if outcome.crashed else "graded"
        return Verdict(outcome.equal, status, outcome.conventions)

    def _verify(self, tasks: list[Task]) -> list[Outcome]:
        if not tasks:
            return []
        if self.num_workers <= 0:
            return [self._verify_in_process(task) for task in tasks]
        if self._pool is None:
            self._pool = VerifierPool(self.num_workers, self.timeout_s, self.settings, self.worker_memory_mb)
            weakref.finalize(self, self._pool.close)
        return self._pool.run(tasks)

    def _verify_in_process(self, task: Task) -> Outcome:
        from erpo_lightning.rewards.worker import Verifier

        if self._in_process is None:
            self._in_process = Verifier(self.settings)
        equal, parse_failures, conventions, crashed = self._in_process.run(*task)
        return Outcome(equal, parse_failures, crashed=crashed, conventions=tuple(conventions))

    def enabled_conventions(self) -> list[str]:
        """Names of the conventions in force (docs/rewards.md), extraction conventions included."""
        if self.backend == "math_verify":
            return []
        names = self.settings.enabled()
        names += ["answer_markers"] if self.fallbacks else []
        return names + (["bare_answers"] if self.bare_max_chars > 0 else [])

    def describe(self) -> dict[str, object]:
        """The grader's settings by name, as results files record them."""
        own = {  # Math-Verify's defaults replace all of these under backend "math_verify"
            "preset": self.preset,
            "conventions_on": self.enabled_conventions(),
            **self.settings.as_dict(),
            "fallbacks": self.fallbacks,
            "bare_max_chars": self.bare_max_chars,
        }
        return {
            "class": f"{type(self).__module__}.{type(self).__name__}",
            "backend": self.backend,
            **(own if self.backend == "erpo" else {}),
            "timeout_s": self.timeout_s,
            "num_workers": self.num_workers,
            "max_response_chars": self.max_response_chars,
            "max_answer_chars": self.max_answer_chars,
            "max_depth": self.max_depth,
        }

    @contextmanager
    def uncounted(self) -> Iterator[MathReward]:
        """Grade inside this block without changing `counters()`: for a second look at pairs already graded and
        counted once (the sampled-completions log), so the rollout's `rollout/grader_*` counts each response once."""
        saved = Counter(self._counts)
        try:
            yield self
        finally:
            self._counts = saved

    def counters(self) -> dict[str, float]:
        """Counters since the previous call (then reset): items, timeouts, parse failures, too long/deep..."""
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


def verify_answer(response: str, gold: str, problem: str | None = None) -> bool:
    """Whether ``response``'s final answer equals ``gold`` (ad-hoc use; shared 1-worker pool, default settings);
    ``problem``: its problem text, against which a restatement is refused (:meth:`MathReward.grade`)."""
    global _default
    if _default is None:
        _default = MathReward(num_workers=1)
    return _default.verdicts([response], [gold], None if problem is None else [problem])[0]
