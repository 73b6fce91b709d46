"""From sampled responses to the tensors the loss needs: pure functions, no engine and no Lightning.

Layout (N = B·G rows, groups of G consecutive rows in query order, P = longest prompt, R = longest response):
each row is `[prompt; response]`, the prompt left-padded to P and the response right-padded to R with the pad id.
"""

from __future__ import annotations

import torch

from erpo_lightning.rollout.engine import Sample


def assemble_batch(
    prompt_ids: list[list[int]],
    samples: list[list[Sample]],
    rewards: torch.Tensor,
    query_index: torch.Tensor,
    query_weight: torch.Tensor,
    pad_token_id: int,
) -> dict[str, torch.Tensor | int]:
    """Pack B prompts and their G samples each into padded training tensors.

    Args:
        prompt_ids: B unpadded prompts (token ids).
        samples: samples[b] = the G responses to prompt b (same G for every prompt).
        rewards: [B·G] float, row order b·G + g.
        query_index: [B] long, dataset rows of the prompts.
        query_weight: [B] float, per-query loss weights.
        pad_token_id: id written on padding (masked everywhere, any id works).
    Returns:
        input_ids [N, P+R], attention_mask [N, P+R], prompt_length P, query_mask [N, P] (real prompt tokens except
        each row's first, which has no log-prob), response_mask [N, R] (response tokens, final eos included),
        sampling_logprobs [N, R] (0 on padding), rewards [N], group_index [N] (0..B-1), query_index [N],
        query_weight [N], truncated [N] bool (finished by length), group_size G.
    """
    group_size = len(samples[0])
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
    prompt_mask = attention_mask[:, :width_p]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt_length": width_p,
        "query_mask": prompt_mask * (prompt_mask.cumsum(-1) > 1).long(),
        "response_mask": attention_mask[:, width_p:].clone(),
        "sampling_logprobs": sampling_logprobs,
        "rewards": torch.as_tensor(rewards, dtype=torch.float32),
        "group_index": torch.arange(len(prompt_ids)).repeat_interleave(group_size),
        "query_index": torch.as_tensor(query_index, dtype=torch.long).repeat_interleave(group_size),
        "query_weight": torch.as_tensor(query_weight, dtype=torch.float32).repeat_interleave(group_size),
        "truncated": torch.tensor([sample.finish_reason == "length" for _, sample in rows]),
        "group_size": group_size,
    }


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
