"""The reward interface: what the rollout sampler calls and what a user-supplied reward implements.

A `Reward` is any callable `(responses, golds) -> rewards` that returns one float per `(response, gold)` pair, in
order. It may also define `counters() -> dict[str, float]`, returning the tallies accumulated since the previous call
(e.g. `items`, `timeouts`, `parse_failures`, `extraction_failures`) and resetting them; the rollout callback logs
them as `rollout/grader_<key>`. Any such class can be configured from YAML by `class_path` (`MathReward` is one).
`score_responses` is how the sampler calls one: a reward that does not return one value per response is refused
with the counts named, instead of failing later in a reshape.
"""

from __future__ import annotations

from collections.abc import Callable, Sized

Reward = Callable[[list[str], list[str]], list[float]]


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
