"""The typed batches between data, rollout and module, and the pure functions that build them (no engine, no
Lightning).

`QueryBatch` is what the training DataLoader yields: B queries. `RolloutBatch` is what `ERPOModule.training_step`
trains on: their N = B·G rows, groups of G consecutive rows in query order, P = longest prompt, R = longest
response; each row is `[prompt; response]`, the prompt left-padded to P and the response right-padded to R with the
pad id. The RolloutCallback builds one per step (`assemble_batch`) and attaches it to the step's `QueryBatch`.
Each query's scores from the frozen reference travel with it: its summed NLL s(q) and, when the algorithm's w(q) is
a constant of the query (`Algorithm.static_query_weights`), w(q) itself, made once when the data is set up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Literal

import torch

from erpo_lightning.rollout.engine import TEMPERATURE_RANGE, Sample, is_sampling_temperature

Columns = Literal["sequence", "response"]  # what the second dimension of a per-token field spans: P+R or R columns


def per_token(columns: Columns, optional: bool = False):
    """A per-token field of RolloutBatch: [N, P+R] (`sequence`) or [N, R] (`response`), cut by `trim_columns`."""
    metadata = {"columns": columns}
    return field(default=None, metadata=metadata) if optional else field(metadata=metadata)


@dataclass
class RolloutBatch:
    """The rows one training step learns from. Every tensor field is per row, [N, ...]; `select_rows` slices them.
    A per-token field declares the columns it spans (`per_token`), so that `trim_columns` cuts every such field and
    construction refuses a 2-D field that declares none or one of the wrong width.

    Filled by the rollout (`assemble_batch`):
        input_ids: [N, P+R] long, `[prompt; response]` token ids.
        attention_mask: [N, P+R] long, 1 on real tokens.
        response_mask: [N, R] long, 1 on the response tokens the loss sees (the final eos included; a rollout may
            zero whole rows, e.g. overlong filtering).
        sampling_logprobs: [N, R] float32, log-probs (nats) of the sampled tokens under the engine's sampling
            distribution, 0 on padding.
        rewards: [N] float32, after any reward shaping.
        query_index: [N] long, the dataset row (and reference-cache row) of each row's query.
        truncated: [N] bool, the response hit the length cap.
        is_group_leader: [N] bool, the first row of each group (one row per query); derived from `group_size`
            when not given.
        group_size: G, rows per query.
        prompt_length: P, the prompt columns of `input_ids` / `attention_mask`.
        temperature: T the responses were sampled at (`TEMPERATURE_RANGE`); the trainer scores them under
            softmax(logits / T), the distribution `sampling_logprobs` are from.
        max_new_tokens: the response cap the rollout sampled with (rollout.max_new_tokens), Dr. GRPO's constant
            normaliser unless `model.loss_constant` is set; None when not known.
        reference_nll: [N] float32, s(q) of each row's query: the frozen reference's summed NLL (nats), as the
            query stream carries it (`QueryBatch.reference_nll`); None when not carried.
        reward_components: component name -> [N] float32, each reward component's raw value of each row, before
            weighting and shaping (a `CombinedReward`'s components; a single reward is one component, under its
            `component_name`), read from the one grading call (`response_components`); None when not carried. Only
            the sampled-completions log reads it; `select_rows` and `to` treat each value as a per-row field.
    Filled by the rollout when the query stream carries it, else by the training step:
        query_weights: [N] float32, w(q) of each row's query: the stream's precomputed w(q) under a dataset-static
            rule (`Algorithm.static_query_weights`), otherwise (None from the rollout) made by `ERPOModule` for the
            optimizer step the rows belong to.
    Filled by the training step (`ERPOModule`, None before), the values the loss reads besides the rollout's:
        advantages: [N] float32, one per row.
        old_logprobs: [N, R] float32, the policy's log-probs before this batch's first update (None = on-policy:
            the current forward, detached, is the old policy).
    """

    input_ids: torch.Tensor = per_token("sequence")
    attention_mask: torch.Tensor = per_token("sequence")
    response_mask: torch.Tensor = per_token("response")
    sampling_logprobs: torch.Tensor = per_token("response")
    rewards: torch.Tensor
    query_index: torch.Tensor
    truncated: torch.Tensor
    group_size: int
    prompt_length: int
    temperature: float
    max_new_tokens: int | None = None
    is_group_leader: torch.Tensor | None = None
    reference_nll: torch.Tensor | None = None
    query_weights: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = per_token("response", optional=True)
    reward_components: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not is_sampling_temperature(self.temperature):
            raise ValueError(f"RolloutBatch.temperature must be {TEMPERATURE_RANGE}, got {self.temperature!r}")
        if self.is_group_leader is None:
            rows = torch.arange(self.num_rows, device=self.input_ids.device)
            self.is_group_leader = rows % self.group_size == 0
        self._check_columns()

    def _check_columns(self) -> None:
        """Every 2-D tensor field declares its columns, and spans them: P+R for `sequence`, R for `response`."""
        widths = {"sequence": self.input_ids.shape[1], "response": self.response_mask.shape[1]}
        for item in fields(self):
            value = getattr(self, item.name)
            if not torch.is_tensor(value) or value.dim() < 2:
                continue
            columns = item.metadata.get("columns")
            if columns is None:
                raise TypeError(f"RolloutBatch.{item.name} is per token ({list(value.shape)}) but declares no columns: "
                                "declare it with per_token(...) so that trim_columns cuts it")  # fmt: skip
            if value.shape[1] != widths[columns]:
                raise ValueError(f"RolloutBatch.{item.name} spans {value.shape[1]} columns, its {columns} columns are "
                                 f"{widths[columns]}")  # fmt: skip

    @property
    def num_rows(self) -> int:
        """N."""
        return self.input_ids.shape[0]

    def select_rows(self, rows: torch.Tensor) -> RolloutBatch:
        """The rows `rows` (a LongTensor of row indices) of every per-row field; the other fields kept."""
        return replace(self, **{name: value[rows] for name, value in self._tensors().items()},
                       reward_components=self._map_components(lambda values: values[rows]))  # fmt: skip

    def trim_columns(self, first: int, response_width: int) -> RolloutBatch:
        """Every per-token field cut to sequence columns [first, prompt_length + response_width) and response columns
        [0, response_width); `prompt_length` follows."""
        end = self.prompt_length + response_width
        cuts = {"sequence": slice(first, end), "response": slice(0, response_width)}
        trimmed = {item.name: getattr(self, item.name)[:, cuts[item.metadata["columns"]]] for item in fields(self)
                   if "columns" in item.metadata and getattr(self, item.name) is not None}  # fmt: skip
        return replace(self, **trimmed, prompt_length=self.prompt_length - first)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """Every tensor field on `device`."""
        return replace(self, **{name: value.to(device) for name, value in self._tensors().items()},
                       reward_components=self._map_components(lambda values: values.to(device)))  # fmt: skip

    def _map_components(self, change: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """`reward_components` with `change` applied to each component's [N] values (None stays None)."""
        if self.reward_components is None:
            return None
        return {name: change(values) for name, values in self.reward_components.items()}

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if torch.is_tensor(getattr(self, f.name))}


@dataclass
class QueryBatch:
    """B training queries, as the training DataLoader yields them (`QueryDataModule.collate`).

    Attributes:
        query_index: [B] long, the dataset row (and reference-cache row) of each query.
        prompt_ids: B unpadded prompts (token ids, template applied).
        answers: B gold answers, as the source gives them.
        reference_nll: [B] float32, s(q): the frozen reference's summed NLL of each query (nats, the cache's
            `nll`); None when not carried.
        query_weights: [B] float32, w(q) of each query when it is a constant of the query
            (`Algorithm.static_query_weights`), read from the table made once at set-up
            (`Algorithm.query_weight_table`); None otherwise (the module makes it per optimizer step).
        rollout: the step's `RolloutBatch`, attached by the RolloutCallback before `training_step`; None before.
        problems: B problem texts, as the source gives them (offered to the reward as `problems`); None when not
            carried.
        data_columns: the extra data columns the sources name (`SourceSpec.columns`): name -> B values, offered to
            the reward by name; None when not carried.
    """

    query_index: torch.Tensor
    prompt_ids: list[list[int]]
    answers: list[str]
    reference_nll: torch.Tensor | None = None
    query_weights: torch.Tensor | None = None
    rollout: RolloutBatch | None = None
    problems: list[str] | None = None
    data_columns: dict[str, list] | None = None


def assemble_batch(
    prompt_ids: list[list[int]],
    samples: list[list[Sample]],
    rewards: torch.Tensor,
    query_index: torch.Tensor,
    pad_token_id: int,
    temperature: float,
    max_new_tokens: int | None = None,
    reference_nll: torch.Tensor | None = None,
    query_weights: torch.Tensor | None = None,
    reward_components: dict[str, torch.Tensor] | None = None,
) -> RolloutBatch:
    """Pack B prompts and their G samples each into a `RolloutBatch` (on the CPU).

    Args:
        prompt_ids: B unpadded prompts (token ids).
        samples: samples[b] = the G responses to prompt b (same G for every prompt).
        rewards: [B·G] float, row order b·G + g.
        query_index: [B] long, dataset rows of the prompts.
        pad_token_id: id written on padding (masked everywhere, any id works).
        temperature: T the samples were drawn at (their `logprobs` are under softmax(logits / T)).
        max_new_tokens: the response cap they were sampled with (None: not known).
        reference_nll, query_weights: [B] the queries' scores as the query stream carries them (`QueryBatch`), or
            None; each row gets its query's.
        reward_components: component name -> [B·G] raw values in the order of `rewards`, or None.
    """
    group_size = len(samples[0])

    def per_row(per_query: torch.Tensor | None) -> torch.Tensor | None:
        if per_query is None:
            return None
        return torch.as_tensor(per_query, dtype=torch.float32).repeat_interleave(group_size)

    rows = [(prompt_ids[b], sample) for b in range(len(prompt_ids)) for sample in samples[b]]
    n = len(rows)
    width_p = max(len(prompt) for prompt, _ in rows)
    width_r = max(len(sample.token_ids) for _, sample in rows)
    input_ids = torch.full((n, width_p + width_r), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width_p + width_r), dtype=torch.long)
    sampling_logprobs = torch.zeros((n, width_r), dtype=torch.float32)
    for i, (prompt, sample) in enumerate(rows):
        end = width_p + len(sample.token_ids)
        input_ids[i, width_p - len(prompt) : width_p] = torch.tensor(prompt, dtype=torch.long)
        input_ids[i, width_p:end] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention_mask[i, width_p - len(prompt) : end] = 1
        sampling_logprobs[i, : len(sample.token_ids)] = torch.tensor(sample.logprobs, dtype=torch.float32)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=attention_mask[:, width_p:].clone(),
        sampling_logprobs=sampling_logprobs,
        rewards=torch.as_tensor(rewards, dtype=torch.float32),
        query_index=torch.as_tensor(query_index, dtype=torch.long).repeat_interleave(group_size),
        truncated=torch.tensor([sample.finish_reason == "length" for _, sample in rows]),
        group_size=group_size,
        prompt_length=width_p,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        reference_nll=per_row(reference_nll),
        reward_components=None if reward_components is None else dict(reward_components),
        query_weights=per_row(query_weights),
    )


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment, in [-1, 0]: 0 up to `max_new_tokens - buffer` tokens, then linear to -1.

    Args:
        lengths: [N] response lengths in tokens.
        max_new_tokens: the response cap.
        buffer: width of the linear zone in tokens (0 = no shaping).
    """
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    excess = lengths.float() - (max_new_tokens - buffer)
    return -(excess / buffer).clamp(min=0.0, max=1.0)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] bool: groups whose G rewards are not all equal (the only ones with a non-zero group advantage).

    Args:
        rewards: [B·G], groups of G consecutive entries.
    """
    grouped = rewards.view(-1, group_size)
    return (grouped != grouped[:, :1]).any(dim=1)
