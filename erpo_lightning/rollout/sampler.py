"""One sampler for training and evaluation: prompts → engine → decoded responses → rewards.

`RolloutCallback` draws each step's groups through it, and the temperature sweep (`erpo validate`,
`TemperatureSweepCallback`) its benchmark samples, so generation, decoding and grading are written once.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Literal

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from erpo_lightning.rewards.protocol import RESERVED_NAMES, Reward, RewardSignature, score_responses
from erpo_lightning.rollout.engine import RolloutEngine, Sample, SamplingSettings

# What a rollout does with a reward's NaN or infinity: `stop` refuses it, naming the reward and the row; `skip` lets
# it through with a warning naming them, so that the step's non-finite loss is dropped by `model.nan_policy: skip`.
NonFiniteRewards = Literal["stop", "skip"]


@dataclass
class GradedGroups:
    """n samples for each of B prompts, decoded and graded (prompt-major: sample g of prompt b is `[b][g]`).

    Attributes:
        samples: [B][n] the engine's samples.
        texts: [B·n] decoded responses (special tokens skipped), as the reward saw them.
        rewards: [B, n] float32, the reward function's values.
        correct: [B, n] bool, reward ≥ the sampler's `correct_threshold`.
        generate_s, grade_s: seconds spent in the engine, and in decoding plus grading.
    """

    samples: list[list[Sample]]
    texts: list[str]
    rewards: torch.Tensor
    correct: torch.Tensor
    generate_s: float
    grade_s: float

    @property
    def lengths(self) -> torch.Tensor:
        """[B, n] int64 response lengths in tokens."""
        return torch.tensor([[len(s.token_ids) for s in group] for group in self.samples], dtype=torch.long)

    @property
    def truncated(self) -> torch.Tensor:
        """[B, n] bool: the response hit `max_new_tokens`."""
        return torch.tensor([[s.finish_reason == "length" for s in group] for group in self.samples])


class RolloutSampler:
    """An engine, a reward, a tokenizer and sampling settings: `sample_and_grade` turns prompts into graded groups.

    Args:
        engine: a RolloutEngine (HFEngine, VLLMEngine); `setup` binds it to a policy.
        reward: `(responses, golds, **inputs) -> rewards` (rewards/protocol.py): its signature, read once here,
            says which of `prompts`, `problems` and the data columns it is given; an optional `counters()` dict is
            the grader's tallies.
        settings: top_p, top_k, max_new_tokens, stop, stop_token_ids of every call (n, temperature and seed are
            given per call).
        tokenizer: a tokenizer, or its path; None = the policy's `name_or_path` (at `setup`).
        correct_threshold: a response is correct when its reward is at least this.
        non_finite_rewards: a reward's NaN or infinity is refused (`stop`), or passed on with a warning (`skip`: the
            rollout callback's sampler under `model.nan_policy: skip`, whose guard then drops the step); samplers
            made by `with_settings` (evaluation, the pass-rate filter) always refuse. None, text and other values
            that are not numbers are refused either way (`reward_tensor`).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        reward: Reward,
        settings: SamplingSettings | None = None,
        tokenizer: PreTrainedTokenizerBase | str | None = None,
        correct_threshold: float = 1.0,
        non_finite_rewards: NonFiniteRewards = "stop",
    ) -> None:
        if non_finite_rewards not in ("stop", "skip"):
            raise ValueError(f"non_finite_rewards must be 'stop' or 'skip', got {non_finite_rewards!r}")
        self.engine = engine
        self.reward = reward
        self.reward_signature = RewardSignature.of(reward)
        self.settings = settings or SamplingSettings()
        self.tokenizer_path = tokenizer if isinstance(tokenizer, str) else None
        self.tokenizer: PreTrainedTokenizerBase | None = None if isinstance(tokenizer, str) else tokenizer
        self.correct_threshold = correct_threshold
        self.non_finite_rewards = non_finite_rewards

    def setup(self, policy: torch.nn.Module) -> None:
        """Load the tokenizer (once) and set the engine up on `policy`."""
        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path or policy.name_or_path)
        self.engine.setup(policy, self.tokenizer)

    def with_settings(self, **changes: object) -> RolloutSampler:
        """A sampler with the same engine, reward and tokenizer and some settings changed (e.g. an eval top_p)."""
        tokenizer = self.tokenizer or self.tokenizer_path
        return RolloutSampler(
            self.engine, self.reward, replace(self.settings, **changes), tokenizer, self.correct_threshold
        )

    def sample_and_grade(
        self,
        prompts: list[list[int]],
        golds: list[str],
        n: int,
        temperature: float,
        seed: int | None,
        problems: list[str] | None = None,
        data_columns: Mapping[str, list] | None = None,
    ) -> GradedGroups:
        """Sample `n` responses to each of the B `prompts` (token ids) at `temperature` and grade them against
        `golds` (B gold answers); `seed` None = unseeded.

        The reward is offered, one entry per response: `prompts` (the prompt ids decoded, special tokens kept, as
        the model saw them), `problems` (B problem texts, when given) and each of `data_columns` (name -> B values);
        it takes those its signature accepts (`RewardSignature`).
        """
        if self.tokenizer is None:
            raise RuntimeError("RolloutSampler.setup(policy) has not run: no tokenizer to decode responses with")
        settings = replace(self.settings, n=n, temperature=temperature, seed=seed)
        start = perf_counter()
        samples = self.engine.generate(prompts, settings)
        generated = perf_counter()
        flat = [sample for group in samples for sample in group]
        texts = self.tokenizer.batch_decode([s.token_ids for s in flat], skip_special_tokens=True)
        inputs = self._reward_inputs(prompts, problems, data_columns, n)
        scores = score_responses(self.reward, texts, per_response(golds, n), inputs, self.reward_signature)
        rewards = self.reward_tensor(scores, texts, prompts, problems, n).view(len(prompts), n)
        return GradedGroups(
            samples, texts, rewards, rewards >= self.correct_threshold, generated - start, perf_counter() - generated
        )

    def reward_tensor(
        self,
        scores: Sequence[object],
        texts: list[str],
        prompts: list[list[int]],
        problems: list[str] | None,
        n: int,
    ) -> torch.Tensor:
        """[B·n] float32 of the reward's `scores` (one per response of `texts`, prompt-major, `n` per prompt).

        Raises:
            ValueError naming the reward, the row (index, its prompt's index and text, its response) and the value,
            for a value that is not a number (None, text even when it reads as one, a list...), and, unless
            `non_finite_rewards` is `skip`, for a NaN or an infinity (also a number too large for float32). Under
            `skip` the first such row is named in a warning instead, and the values pass on.
        """
        name = self.reward_signature.name
        numbers: list[float] = []
        for row, value in enumerate(scores):
            text = isinstance(value, (str, bytes, bytearray))
            try:
                number = None if text or value is None else float(value)
            except (TypeError, ValueError):
                number = None
            if number is None:
                kind = "text (even one that reads as a number)" if text else f"a {type(value).__name__}"
                raise ValueError(
                    f"the reward {name} returned {value!r:.40} for {self._row(row, texts, prompts, problems, n)}: a "
                    f"reward must return a number for every response, not {kind}"
                )
            numbers.append(number)
        rewards = torch.tensor(numbers, dtype=torch.float32)
        bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
        if bad:
            row = bad[0]
            message = (
                f"the reward {name} returned {scores[row]!r:.40} for {len(bad)} of {len(numbers)} responses, first "
                f"for {self._row(row, texts, prompts, problems, n)}"
            )
            if self.non_finite_rewards == "stop":
                raise ValueError(
                    f"{message}: a reward must return a finite number for every response (under model.nan_policy: "
                    "skip, a training step with such a reward is skipped instead)"
                )
            warnings.warn(
                f"{message}: model.nan_policy is skip, so this step's loss is not finite and the step is skipped",
                stacklevel=3,
            )
        return rewards

    def _row(self, row: int, texts: list[str], prompts: list[list[int]], problems: list[str] | None, n: int) -> str:
        """Response `row` of a call, as error messages name it: its index, its prompt's index and text (the problem
        when given, else the decoded prompt), and its response."""
        query = row // n
        prompt = problems[query] if problems is not None else self.tokenizer.decode(prompts[query])
        return f"row {row} (prompt {query}: {str(prompt)!r:.60}; response {texts[row]!r:.60})"

    def _reward_inputs(
        self, prompts: list[list[int]], problems: list[str] | None, data_columns: Mapping[str, list] | None, n: int
    ) -> dict[str, list]:
        """The keyword inputs offered to the reward, each repeated for the `n` responses of its prompt; the prompt
        texts are decoded only when the reward takes them."""
        per_query: dict[str, list] = {} if problems is None else {"problems": list(problems)}
        for name, values in (data_columns or {}).items():
            if name in RESERVED_NAMES:
                raise ValueError(f"a data column may not be named {name!r}: the reward's {name} are another input")
            per_query[name] = list(values)
        if self.reward_signature.wants("prompts"):
            per_query["prompts"] = self.tokenizer.batch_decode(prompts, skip_special_tokens=False)
        for name, values in per_query.items():
            if len(values) != len(prompts):
                raise ValueError(f"{len(values)} {name!r} for {len(prompts)} prompts: give one per prompt")
        return {name: per_response(values, n) for name, values in per_query.items()}


def per_response(per_query: list, n: int) -> list:
    """Each of B values `n` times in a row: the value of each of the B·n responses, prompt-major."""
    return [value for value in per_query for _ in range(n)]
