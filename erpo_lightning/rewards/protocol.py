"""The reward protocol shared by the rollout callback and user-supplied rewards."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
