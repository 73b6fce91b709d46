"""Rollouts with Hugging Face `generate` on the training policy itself (no second copy of the weights).

The default where vLLM is not installed, and the fast path for tiny models. Log-probs come from the processed
distribution: the temperature / top-k / top-p warpers run as our own logits processors and a recorder placed last
keeps the log-softmax of the scores the token was actually sampled from.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from erpo_lightning.rollout.engine import Sample, SamplingSettings, eval_mode, left_pad, pad_token_id


class _Recorder(StoppingCriteria):
    """Records each row's sampled-token log-probs and the step at which it stopped.

    `_KeepLogprobs`, the last logits processor, leaves here the processed log-probs of the current step; this
    stopping criterion, called right after sampling, reads off the sampled token's log-prob and decides whether the
    row ended (stop token id, or a stop string now present in the decoded tail of the response).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_width: int,
        stop_ids: set[int],
        stop_strings: list[str],
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        # A byte-level token carries at least one byte and a character at most 4: this tail covers any stop string.
        self.tail_tokens = 4 * max((len(s) for s in stop_strings), default=0)
        self.current_logprobs: torch.Tensor | None = None
        self.step_logprobs: list[torch.Tensor] = []
        self.lengths: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        last = input_ids[:, -1]
        self.step_logprobs.append(self.current_logprobs.gather(-1, last[:, None]).squeeze(-1))
        generated = input_ids.shape[1] - self.prompt_width
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, token in enumerate(last.tolist()):
            if row not in self.lengths and (token in self.stop_ids or self._ends_with_stop_string(input_ids[row])):
                self.lengths[row] = generated
            done[row] = row in self.lengths
        return done

    def _ends_with_stop_string(self, row_ids: torch.Tensor) -> bool:
        if not self.stop_strings:
            return False
        start = max(self.prompt_width, row_ids.shape[0] - self.tail_tokens)
        tail = self.tokenizer.decode(row_ids[start:].tolist(), skip_special_tokens=True)
        return any(s in tail for s in self.stop_strings)


class _KeepLogprobs(LogitsProcessor):
    """Last logits processor: hands the processed distribution of this step to the recorder, scores unchanged."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.recorder.current_logprobs = torch.log_softmax(scores.float(), dim=-1)
        return scores


@contextmanager
def _sampling_mode(policy: torch.nn.Module, seed: int | None) -> Iterator[None]:
    """Eval mode and, with a seed, a private RNG state; the training mode and global RNG are restored after."""
    device = next(policy.parameters()).device
    devices = [device] if device.type == "cuda" else []
    with eval_mode(policy), torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        yield


class HFEngine:
    """Samples with `policy.generate`, batched; weight sync is free since it samples from the policy itself.

    Args:
        micro_batch_size: rows (prompt × sample) per `generate` call; None = all at once.
        synced_gpus: pass True under FSDP / ZeRO-3 so ranks that finish early keep joining the forward passes.
    """

    def __init__(self, micro_batch_size: int | None = None, synced_gpus: bool = False) -> None:
        self.micro_batch_size = micro_batch_size
        self.synced_gpus = synced_gpus
        self.policy: torch.nn.Module | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None

    def setup(self, policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        self.policy = policy
        self.tokenizer = tokenizer

    def generate(self, prompt_ids: list[list[int]], settings: SamplingSettings) -> list[list[Sample]]:
        """Sample `settings.n` responses per prompt; result[b][g] is response g to prompt b."""
        rows = [ids for ids in prompt_ids for _ in range(settings.n)]
        size = self.micro_batch_size or len(rows)
        samples: list[Sample] = []
        with _sampling_mode(self.policy, settings.seed):
            for start in range(0, len(rows), size):
                samples += self._generate_rows(rows[start : start + size], settings)
        return [samples[b * settings.n : (b + 1) * settings.n] for b in range(len(prompt_ids))]

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Nothing to do: the engine samples from the training policy itself."""

    def sleep(self) -> None:
        """Nothing to free: the engine holds no memory of its own."""

    def wake_up(self) -> None:
        """Nothing to restore."""

    def _stop_ids(self, settings: SamplingSettings) -> set[int]:
        """Configured stop ids plus the tokenizer's eos and the model's (a list in some generation configs)."""
        model_eos = self.policy.generation_config.eos_token_id
        ids = set(settings.stop_token_ids) | set(model_eos if isinstance(model_eos, list) else [model_eos])
        ids.add(self.tokenizer.eos_token_id)
        return ids - {None}

    def _generate_rows(self, rows: list[list[int]], settings: SamplingSettings) -> list[Sample]:
        pad_id = pad_token_id(self.tokenizer)
        input_ids, attention_mask = left_pad(rows, pad_id)
        width = input_ids.shape[1]
        device = next(self.policy.parameters()).device
        stop_ids = self._stop_ids(settings)
        recorder = _Recorder(self.tokenizer, width, stop_ids, list(settings.stop))
        warpers = []
        if settings.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k > 0:
            warpers.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            warpers.append(TopPLogitsWarper(settings.top_p))
        sequences = self.policy.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            do_sample=True,
            # Neutral built-in warpers (they would otherwise come from generation_config), ours run instead.
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=settings.max_new_tokens,
            eos_token_id=sorted(stop_ids),
            pad_token_id=pad_id,
            logits_processor=LogitsProcessorList([*warpers, _KeepLogprobs(recorder)]),
            stopping_criteria=StoppingCriteriaList([recorder]),
            synced_gpus=self.synced_gpus,
        )
        tokens = sequences[:, width:].tolist()
        logprobs = torch.stack(recorder.step_logprobs, dim=1).tolist()
        samples = []
        for row in range(len(rows)):
            length = recorder.lengths.get(row, len(tokens[row]))
            reason = "stop" if row in recorder.lengths else "length"
            samples.append(Sample(tokens[row][:length], logprobs[row][:length], reason))
        return samples
