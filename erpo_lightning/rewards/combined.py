"""``CombinedReward``: a weighted sum of rewards, each component's mean also reported on its own.

Every component is held to the same rules: it is called with the keyword inputs its own signature accepts
(`protocol.RewardSignature`), it must return one finite number per response (text, even "1.0", a NaN, an infinity or
any other value that is not a number stops the step with one line naming the component and the row), and a
component with a worker pool keeps it (`MathReward`'s verifier processes, with their deadline and bounds): `close()`
and leaving a `with` block close every component's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from erpo_lightning.rewards.protocol import ROLLOUT_INPUTS, Reward, RewardSignature, reward_name, score_responses

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # what a metric name `rollout/reward/<name>` may hold


def component_name(reward: Reward) -> str:
    """The default name of a component: a function's own name, else its class name in snake case
    (`MathReward` -> `math_reward`)."""
    own = getattr(reward, "__name__", None)
    if isinstance(own, str):
        return own
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(reward).__name__).lower()


def _weight(index: int, value: Any) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = math.nan
    if isinstance(value, bool) or not math.isfinite(weight):
        raise ValueError(f"CombinedReward weights[{index}] is {value!r}: every weight must be a finite number")
    return weight


class CombinedReward:
    """The reward `sum_i weights[i] * rewards[i](responses, golds, ...)`, row by row.

    Args:
        rewards: the components, at least one: reward objects or plain functions (`class_path` or an import path
            from YAML), each called with the keyword inputs its signature accepts (`prompts`, `problems`, data
            columns).
        weights: one finite weight per component, in order (negative for a penalty, 0 to only report it); None =
            1.0 each.
        names: one name per component, unique, made of letters, digits, `_`, `.` and `-`; None = each component's
            `component_name` (a function's name, a class name in snake case).

    `components()` returns each component's mean raw value (before weighting) over the responses graded since the
    previous call; the rollout callback logs them as `rollout/reward/<name>`. `counters()` returns the components'
    own counters as `<name>_<key>` (logged as `rollout/grader_<name>_<key>`); `grade` is the first component's that
    has one (the verdicts `completions.jsonl` reports). `last_values()` holds each component's raw value of each
    response of the latest call (the per-row components `completions.jsonl` reports, without grading again).

    Raises:
        ValueError (at construction) naming the problem: no component, a count of weights or names that is not
        the number of components, a weight that is not a finite number, a name used twice or not usable in a metric
        name; TypeError for a component that is not a callable taking `(responses, golds)`.
    """

    def __init__(self, rewards: list[Reward], weights: list[float] | None = None, names: list[str] | None = None):
        rewards = list(rewards)
        if not rewards:
            raise ValueError("CombinedReward needs at least one reward in `rewards`")
        for what, given in (("weights", weights), ("names", names)):
            if given is not None and len(given) != len(rewards):
                raise ValueError(
                    f"CombinedReward has {len(rewards)} rewards but {len(given)} {what}: give one per reward, in order"
                )
        self.weights = [1.0] * len(rewards) if weights is None else [_weight(i, w) for i, w in enumerate(weights)]
        self.names = [component_name(r) for r in rewards] if names is None else list(names)
        for index, name in enumerate(self.names):
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(
                    f"CombinedReward component {index} is named {name!r}: a name is letters, digits, '_', '.' or '-' "
                    "(it names the metric rollout/reward/<name>); give `names:`"
                )
            if name in self.names[:index]:
                raise ValueError(
                    f"CombinedReward components {self.names.index(name)} and {index} are both named {name!r}: give "
                    "each a unique name with `names:`"
                )
        self.rewards = rewards
        self.signatures = []
        for name, reward in zip(self.names, rewards, strict=True):
            try:
                self.signatures.append(RewardSignature.of(reward))
            except TypeError as error:
                raise TypeError(f"CombinedReward component {name!r}: {error}") from None
        self._sums = dict.fromkeys(self.names, 0.0)
        self._counts = dict.fromkeys(self.names, 0)
        self._last_values: dict[str, list[float]] = {}

    def __call__(self, responses: list[str], golds: list[str], **inputs: list) -> list[float]:
        """One weighted sum per `(response, gold)` pair; `inputs` are offered to every component.

        Raises:
            ValueError naming the component (and the row and response) that returned a wrong number of values, a
            value that is not a finite number, or that requires an input not offered.
        """
        totals = [0.0] * len(responses)
        self._last_values = {}
        parts = zip(self.names, self.weights, self.rewards, self.signatures, strict=True)
        for name, weight, reward, signature in parts:
            try:
                raw = score_responses(reward, responses, golds, inputs, signature)
            except ValueError as error:
                raise ValueError(f"CombinedReward component {name!r}: {error}") from None
            values = [_finite(name, row, value, responses) for row, value in enumerate(raw)]
            self._sums[name] += sum(values)
            self._counts[name] += len(values)
            self._last_values[name] = values
            for row, value in enumerate(values):
                totals[row] += weight * value
        for row, total in enumerate(totals):
            if not math.isfinite(total):
                raise ValueError(
                    f"CombinedReward: the weighted sum of row {row} is {total} (the components' values are finite, "
                    "their weighted sum overflows): lower the weights"
                )
        return totals

    def components(self) -> dict[str, float]:
        """Each component's mean raw value over the responses graded since the previous call (then reset); a
        component with no response graded since is left out."""
        means = {name: self._sums[name] / self._counts[name] for name in self.names if self._counts[name]}
        self._sums = dict.fromkeys(self.names, 0.0)
        self._counts = dict.fromkeys(self.names, 0)
        return means

    def last_values(self) -> dict[str, list[float]]:
        """Each component's raw values (before weighting) from the latest call, one per response in order, by name;
        empty before the first call and after a call that stopped on a component's error. Not reset by reading."""
        return dict(self._last_values)

    def counters(self) -> dict[str, float]:
        """The components' `counters()` since the previous call, as `<name>_<key>`."""
        merged: dict[str, float] = {}
        for name, reward in zip(self.names, self.rewards, strict=True):
            counters = getattr(reward, "counters", None)
            if callable(counters):
                merged.update({f"{name}_{key}": float(value) for key, value in counters().items()})
        return merged

    @contextmanager
    def uncounted(self) -> Iterator[CombinedReward]:
        """Grade inside this block without changing any component's counters (each component's own `uncounted()`,
        where it has one); `components()` and `last_values()` are not touched by grading."""
        with ExitStack() as stack:
            for reward in self.rewards:
                uncounted = getattr(reward, "uncounted", None)
                if callable(uncounted):
                    stack.enter_context(uncounted())
            yield self

    @property
    def grade(self) -> Any:
        """The `grade` of the first component that has one (`MathReward.grade`: per-pair verdicts), which the
        sampled-completions log reports as each row's `correct`; no such attribute when no component has one."""
        for reward in self.rewards:
            grade = getattr(reward, "grade", None)
            if callable(grade):
                return grade
        raise AttributeError("no component of this CombinedReward has grade()")

    def describe(self) -> dict[str, Any]:
        """The settings of every component, as results files record a grader's."""
        components = []
        for name, weight, reward in zip(self.names, self.weights, self.rewards, strict=True):
            describe = getattr(reward, "describe", None)
            settings = describe() if callable(describe) else {"class": reward_name(reward)}
            components.append({"name": name, "weight": weight, **settings})
        return {"class": f"{type(self).__module__}.{type(self).__name__}", "components": components}

    def close(self) -> None:
        """Close every component that holds workers (`close()`); a later call starts them again."""
        for reward in self.rewards:
            close = getattr(reward, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> CombinedReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # A copy reports its own means (components copy themselves: MathReward starts its own pool).
        state = self.__dict__.copy()
        state.update(_sums=dict.fromkeys(self.names, 0.0), _counts=dict.fromkeys(self.names, 0), _last_values={})
        return state


def check_reward_inputs(reward: Reward, columns: Sequence[str]) -> None:
    """ValueError naming a keyword input that `reward`, or a component of a `CombinedReward`, requires without a
    default and that a training rollout does not offer (it offers `prompts`, `problems` and the data `columns`)."""
    offered = dict.fromkeys([*ROLLOUT_INPUTS, *columns], [])
    if not isinstance(reward, CombinedReward):
        RewardSignature.of(reward).select(offered)
        return
    for name, signature in zip(reward.names, reward.signatures, strict=True):
        try:
            signature.select(offered)
        except ValueError as error:
            raise ValueError(f"CombinedReward component {name!r}: {error}") from None


def response_components(reward: Reward, totals: Sequence[float]) -> dict[str, list[float]] | None:
    """Each reward component's raw value of each response of `reward`'s latest call, whose values were `totals`:
    a `CombinedReward`'s `last_values()`, a single reward's `totals` under its `component_name`; None when a
    CombinedReward's record is not of that call (it holds another count of responses, or none)."""
    if not isinstance(reward, CombinedReward):
        return {component_name(reward): [float(value) for value in totals]}
    values = reward.last_values()
    if len(values) != len(reward.names) or any(len(column) != len(totals) for column in values.values()):
        return None
    return values


def _finite(name: str, row: int, value: Any, responses: list[str]) -> float:
    """`value` as a float; ValueError naming the component, the row and its response when it is not a finite number
    (text is refused even when it reads as one: a component that returns "1.0" has a bug to fix)."""
    text = isinstance(value, (str, bytes, bytearray))
    try:
        number = math.nan if text else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(
            f"CombinedReward component {name!r} returned {value!r:.40} for row {row} (response "
            f"{str(responses[row])!r:.80}): every component must return a finite number for every response"
            + (", not text" if text else "")
        )
    return number
