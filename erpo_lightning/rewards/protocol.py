"""The reward interface: what the rollout sampler calls and what a user-supplied reward implements.

`Reward` is the type the sampler and the CLI accept (any `(responses, golds) -> rewards` callable); `RewardFn` spells
out the same call plus the optional `counters()` as a Protocol, for isinstance checks and documentation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

Reward = Callable[[list[str], list[str]], list[float]]


@runtime_checkable
class RewardFn(Protocol):
    """A batch reward: one float per ``(response, gold)`` pair.

    Implementations may also define ``counters() -> dict[str, float]``, which returns the
    counters accumulated since the previous call (e.g. ``timeouts``, ``parse_failures``,
    ``extraction_failures``, ``items``) and resets them; the rollout callback logs them.
    Any class satisfying this protocol can be configured from YAML by ``class_path``.
    """

    def __call__(self, responses: list[str], golds: list[str]) -> list[float]:
        """Score each response against the reference answer at the same index."""
        ...
