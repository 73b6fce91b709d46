"""The rollout-engine protocol: what every engine takes and returns.

An engine samples G responses for each of B prompts given as token ids and reports, per sampled token, its
log-prob under the *processed* sampling distribution (after temperature, top-k and top-p), so that a trainer that
recomputes log-probs at the same temperature gets the same numbers. The temperature is always > 0: there is no greedy
mode, since a trainer cannot score greedy tokens (softmax(logits / T) has no limit it could train on at T = 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from erpo_lightning.common.setting_rules import Rule

FinishReason = Literal["stop", "length"]
# The one range rule of a sampling temperature, for every setting that holds one (rollout, sweep, SamplingSettings).
TEMPERATURE_RANGE = "> 0 and finite (greedy decoding, T = 0, has no log-probs to train on)"


def is_sampling_temperature(value: float) -> bool:
    """Whether `value` is a temperature an engine samples at and the trainer scores at: finite and > 0."""
    return math.isfinite(value) and value > 0


# The range rules of the sampling settings, one entry per field, for every owner of one (the rollout's, the sweep's).
SAMPLING_RULES: dict[str, Rule] = {
    rule[0]: rule
    for rule in (
        ("temperature", is_sampling_temperature, TEMPERATURE_RANGE),
        ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
        ("top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
        ("max_new_tokens", lambda v: v >= 1, ">= 1"),
    )
}


@dataclass
class SamplingSettings:
    """How to sample; plain data so that configs can build it.

    Attributes:
        n: responses per prompt (the group size G).
        temperature: T of softmax(logits / T), `TEMPERATURE_RANGE` (ValueError otherwise).
        top_p: nucleus mass, 1.0 = off.
        top_k: 0 = off.
        max_new_tokens: response length cap, in tokens.
        stop: strings that end a response; the tokens that complete one stay in the response.
        stop_token_ids: token ids that end a response, besides the tokenizer's eos; the stop token stays in it.
        seed: None = unseeded; the same seed gives the same samples from the same engine and weights.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if not is_sampling_temperature(self.temperature):
            raise ValueError(f"temperature must be {TEMPERATURE_RANGE}, got {self.temperature!r}")


@dataclass
class Sample:
    """One sampled response.

    Attributes:
        token_ids: [T] response token ids, including the final eos / stop token when one was sampled.
        logprobs: [T] log-prob (nats) of each token under the processed sampling distribution.
        finish_reason: "stop" (eos, stop token or stop string) or "length" (hit max_new_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@runtime_checkable
class RolloutEngine(Protocol):
    """What the RolloutCallback needs from an engine.

    An engine that fixes its context length when built (VLLMEngine's `max_model_len`) may also offer
    `require_context(tokens)`; callers reach it through `declare_context`, so engines without one stay valid.
    """

    def setup(self, policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        """Bind to (or build from) the training policy; called once before the first rollout."""

    def generate(self, prompt_ids: list[list[int]], settings: SamplingSettings) -> list[list[Sample]]:
        """Sample `settings.n` responses for each prompt: result[b][g] is response g to prompt b."""

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Load the policy's current weights into the engine (every rank must call it under sharding)."""

    def sleep(self) -> None:
        """Free accelerator memory between rollouts (a no-op where unsupported or disabled)."""

    def wake_up(self) -> None:
        """Undo `sleep` before the next rollout."""


def declare_context(engine: RolloutEngine, tokens: int) -> None:
    """Tell `engine`, before its `setup`, the longest sequence it will generate: longest prompt + response cap.

    VLLMEngine sizes `max_model_len` (and so its KV cache) from the longest declaration instead of the model's whole
    context; engines without a fixed context have no `require_context` and need nothing.
    """
    require = getattr(engine, "require_context", None)
    if require is not None:
        require(tokens)


def derive_seed(seed: int, *keys: int) -> int:
    """An independent 32-bit seed for (seed, *keys), e.g. one per prompt or per rollout step."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def rollout_seed(seed: int, call: int, rank: int) -> int:
    """The seed of rollout call `call` on data-parallel rank `rank`.

    Ranks sample different prompts but must not share a random stream: engines derive per-prompt seeds from the
    prompt's position in the call, so equal seeds would give rank r's prompt b the same sampling noise as every other
    rank's prompt b. Rank 0 keeps `derive_seed(seed, call)`, the stream of single-process runs, so their seeded
    samples (and checkpoints resumed from them) stay as they were.
    """
    return derive_seed(seed, call) if rank == 0 else derive_seed(seed, call, rank)


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Run `module` in eval mode (no dropout) and give it back in the mode it was in."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded `input_ids` [N, P] and `attention_mask` [N, P] (P = longest row), as `generate` needs."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    return input_ids, attention_mask


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, or its eos id when it has none (padding is masked, so either is safe)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
