"""The reward interface: what the rollout sampler calls and what a user-supplied reward implements.

`Reward` is the type the sampler and the CLI accept (any `(responses, golds) -> rewards` callable); `RewardFn` spells
out the same call plus the optional `counters()` as a Protocol, for isinstance checks and documentation.
`score_responses` is how the sampler calls one: a reward that does not return one value per response is refused
with the counts named, instead of failing later in a reshape.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
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


def reward_name(reward: Reward) -> str:
    """``module.Class`` of a reward object, ``module.function`` of a plain function (for error messages)."""
    named = reward if hasattr(reward, "__qualname__") else type(reward)
    return f"{named.__module__}.{named.__qualname__}"


def score_responses(reward: Reward, responses: list[str], golds: list[str]) -> list[float]:
    """``reward(responses, golds)``, checked to hold exactly one value per response.

    Raises:
        ValueError naming the reward, the number of values it returned and the number of responses.
    """
    values = reward(responses, golds)
    if not isinstance(values, Sized) or isinstance(values, (str, bytes, dict)):
        raise ValueError(
            f"the reward {reward_name(reward)} returned a {type(values).__name__}, not a list of {len(responses)} "
            "numbers (one per response, in order)"
        )
    if len(values) != len(responses):
        raise ValueError(
            f"the reward {reward_name(reward)} returned {len(values)} values for {len(responses)} responses: it must "
            "return one per response, in order"
        )
    return values
