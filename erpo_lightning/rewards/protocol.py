"""The reward interface: what the rollout sampler calls and what a user-supplied reward implements.

A `Reward` is any callable `(responses, golds, **inputs) -> rewards` that returns one float per `(response, gold)`
pair, in order. Besides the two lists it may accept, by keyword, any of the inputs a rollout offers, each a list with
one entry per response:

- `prompts`: the prompt text of each response as the model saw it (its token ids decoded, template and special
  tokens included);
- `problems`: the problem text of each response as the data source gives it;
- every column that the data source names in its `columns:` (docs/data.md), e.g. `difficulty`.

Which inputs a reward gets is decided once, from its signature (`RewardSignature`): a parameter named like an input
gets it, `**kwargs` gets them all, and the two-argument form `(responses, golds)` gets none. A reward may also define
`counters() -> dict[str, float]`, returning the tallies accumulated since the previous call (e.g. `items`,
`timeouts`) and resetting them; the rollout callback logs them as `rollout/grader_<key>`. A reward with counters
and a `grade` may define `uncounted()`, a context in which grading leaves them as they were (the sampled-completions
log grades its rows a second time inside it). Any such class can be
configured from YAML by `class_path`, a plain function by its import path (`my_package.rewards.my_reward`).
`score_responses` is how the sampler calls one: a reward that does not return one value per response is refused
with the counts named, instead of failing later in a reshape.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass

Reward = Callable[[list[str], list[str]], list[float]]
# The names of the two positional lists; no data column may take them, nor the names of the rollout's own inputs.
POSITIONAL = ("responses", "golds")
ROLLOUT_INPUTS = ("prompts", "problems")
RESERVED_NAMES = POSITIONAL + ROLLOUT_INPUTS


def reward_name(reward: Reward) -> str:
    """``module.Class`` of a reward object, ``module.function`` of a plain function (for error messages)."""
    named = reward if hasattr(reward, "__qualname__") else type(reward)
    return f"{named.__module__}.{named.__qualname__}"


@dataclass(frozen=True)
class RewardSignature:
    """Which keyword inputs a reward accepts, read once from its signature (`RewardSignature.of`).

    Attributes:
        name: the reward's `module.Class` or `module.function`, for error messages.
        takes_all: it has a `**kwargs` parameter: every offered input is passed.
        names: the parameters after the two positional lists that can be given by keyword.
        required: those of `names` without a default: a call that cannot give one is refused.
        positional: the names of its first two parameters, which get the lists: never passed again by keyword.
    """

    name: str
    takes_all: bool = False
    names: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    positional: frozenset[str] = frozenset()

    @classmethod
    def of(cls, reward: Reward) -> RewardSignature:
        """The signature of `reward` (a function, or an object's `__call__`).

        A callable whose signature cannot be read (some builtins) is called with the two lists alone.

        Raises:
            TypeError when `reward` is not callable, or cannot take the two lists `(responses, golds)` positionally.
        """
        name = reward_name(reward)
        if not callable(reward):
            raise TypeError(f"the reward {name} is a {type(reward).__name__}, not a callable")
        try:
            parameters = list(inspect.signature(reward).parameters.values())
        except (TypeError, ValueError):
            return cls(name)
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in parameters):
            raise TypeError(
                f"the reward {name} must take the two lists (responses, golds) as its first two arguments; its "
                f"parameters are ({', '.join(p.name for p in parameters)})"
            )
        lists = positional[:2]  # the two lists are always given by position, never again by keyword
        keywords = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p not in lists]
        return cls(
            name,
            takes_all=any(p.kind == p.VAR_KEYWORD for p in parameters),
            names=frozenset(p.name for p in keywords),
            required=frozenset(p.name for p in keywords if p.default is p.empty),
            positional=frozenset(p.name for p in lists),
        )

    def wants(self, input_name: str) -> bool:
        """Whether the reward would be given `input_name` if it were offered."""
        return (self.takes_all or input_name in self.names) and input_name not in self.positional

    def select(self, offered: Mapping[str, list]) -> dict[str, list]:
        """The offered inputs this reward takes, by name.

        Raises:
            ValueError naming the reward, each input it requires that is not offered, and what is offered.
        """
        missing = sorted(self.required - offered.keys())
        if missing:
            raise ValueError(
                f"the reward {self.name} requires {', '.join(missing)}, which this rollout does not give (it gives "
                f"{', '.join(sorted(offered)) or 'no inputs'}): a data column must be named in the source's "
                "`columns:` (docs/data.md), or give the parameter a default"
            )
        return {key: value for key, value in offered.items() if self.wants(key)}


def score_responses(
    reward: Reward,
    responses: list[str],
    golds: list[str],
    inputs: Mapping[str, list] | None = None,
    signature: RewardSignature | None = None,
) -> list[float]:
    """``reward(responses, golds, **taken)``, checked to hold exactly one value per response.

    Args:
        inputs: keyword inputs offered to the reward (`prompts`, `problems`, data columns), each one entry per
            response; it gets those its signature accepts.
        signature: `RewardSignature.of(reward)`, when the caller has read it already.
    Raises:
        ValueError naming the reward, the number of values it returned and the number of responses; naming an
        input whose length is not the number of responses; or naming an input the reward requires that is not
        offered.
    """
    offered = dict(inputs or {})
    for key, values in offered.items():
        if len(values) != len(responses):
            raise ValueError(f"the reward input {key!r} has {len(values)} entries for {len(responses)} responses")
    signature = signature or RewardSignature.of(reward)
    values = reward(responses, golds, **signature.select(offered))
    if not isinstance(values, Sized) or isinstance(values, (str, bytes, dict)):
        raise ValueError(
            f"the reward {signature.name} returned a {type(values).__name__}, not a list of {len(responses)} "
            "numbers (one per response, in order)"
        )
    if len(values) != len(responses):
        raise ValueError(
            f"the reward {signature.name} returned {len(values)} values for {len(responses)} responses: it must "
            "return one per response, in order"
        )
    return values
