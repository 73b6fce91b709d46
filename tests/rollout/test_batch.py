"""Batch assembly, overlong shaping and group filtering, checked against tensors written out by hand."""

from dataclasses import fields, replace

import pytest
import torch
from helpers.batches import make_rollout

from erpo_lightning.rollout import Sample, SamplingSettings, assemble_batch, informative_groups, overlong_penalty
from erpo_lightning.rollout.batch import RolloutBatch

PAD = 0


def test_assemble_batch_matches_hand_built():
    prompts = [[11, 12, 13], [21]]
    samples = [
        [Sample([31, 32], [-0.1, -0.2], "stop"), Sample([33], [-0.3], "stop")],
        [Sample([41, 42, 43], [-0.4, -0.5, -0.6], "length"), Sample([44, 45], [-0.7, -0.8], "stop")],
    ]
    batch = assemble_batch(
        prompts,
        samples,
        torch.tensor([1.0, 0.0, 0.5, 0.25]),
        query_index=torch.tensor([7, 3]),
        pad_token_id=PAD,
        temperature=0.7,
    )
    # P = 3 (left-padded prompts), R = 3 (right-padded responses); rows b·G + g.
    expected_ids = torch.tensor(
        [
            [11, 12, 13, 31, 32, PAD],
            [11, 12, 13, 33, PAD, PAD],
            [PAD, PAD, 21, 41, 42, 43],
            [PAD, PAD, 21, 44, 45, PAD],
        ]
    )
    expected_attention = torch.tensor(
        [
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 1],
            [0, 0, 1, 1, 1, 0],
        ]
    )
    assert torch.equal(batch.input_ids, expected_ids)
    assert torch.equal(batch.attention_mask, expected_attention)
    assert batch.prompt_length == 3
    assert batch.group_size == 2
    assert batch.temperature == 0.7
    assert torch.equal(batch.response_mask, torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]))
    expected_logprobs = torch.tensor([[-0.1, -0.2, 0.0], [-0.3, 0.0, 0.0], [-0.4, -0.5, -0.6], [-0.7, -0.8, 0.0]])
    assert torch.equal(batch.sampling_logprobs, expected_logprobs)
    assert torch.equal(batch.rewards, torch.tensor([1.0, 0.0, 0.5, 0.25]))
    assert torch.equal(batch.query_index, torch.tensor([7, 7, 3, 3]))
    assert torch.equal(batch.truncated, torch.tensor([False, False, True, False]))
    assert torch.equal(batch.is_group_leader, torch.tensor([True, False, True, False]))
    assert batch.input_ids.dtype == batch.query_index.dtype == torch.long
    assert batch.advantages is None and batch.old_logprobs is None and batch.query_weights is None
    assert batch.reference_nll is None  # nothing carried: None, not zeros


def test_assemble_batch_gives_each_row_its_querys_carried_scores():
    """The query stream's per-query s(q) and w(q) ([B]) reach every row of the query's group ([N])."""
    samples = [[Sample([5], [-0.1], "stop")] * 3, [Sample([6], [-0.2], "stop")] * 3]
    batch = assemble_batch(
        [[1], [2, 3]], samples, torch.zeros(6), torch.tensor([4, 0]), PAD, 1.0,
        reference_nll=torch.tensor([12.5, 3.0]), query_weights=torch.tensor([0.5, 1.75]),
    )  # fmt: skip
    assert batch.reference_nll.tolist() == [12.5] * 3 + [3.0] * 3
    assert batch.query_weights.tolist() == [0.5] * 3 + [1.75] * 3
    assert batch.query_weights.dtype == batch.reference_nll.dtype == torch.float32


def test_select_rows_slices_every_row_field_and_keeps_the_rest():
    batch = make_rollout([[1, 2], [3]], [[4], [5, 6], [7], [8, 9, 10]], [1.0, 0.0, 0.0, 1.0], 0.6, query_index=[5, 9])
    batch = replace(
        batch, advantages=torch.tensor([1.0, -1.0, -1.0, 1.0]), old_logprobs=batch.sampling_logprobs + 1,
        reference_nll=torch.tensor([3.0, 3.0, 5.0, 5.0]), query_weights=torch.tensor([1.2, 1.2, 0.8, 0.8]),
    )  # fmt: skip
    rows = torch.tensor([1, 2])
    part = batch.select_rows(rows)
    for field in fields(RolloutBatch):
        value = getattr(batch, field.name)
        if torch.is_tensor(value):
            assert torch.equal(getattr(part, field.name), value[rows]), field.name
        else:
            assert getattr(part, field.name) == value, field.name
    assert part.is_group_leader.tolist() == [False, True] and part.query_index.tolist() == [5, 9]
    assert part.temperature == 0.6


def test_trim_columns_cuts_every_per_token_field_by_the_columns_it_declares():
    batch = make_rollout([[1, 2], [3]], [[4], [5, 6], [7], [8, 9, 10]], [1.0, 0.0, 0.0, 1.0], 0.6)
    batch = replace(batch, old_logprobs=torch.arange(12.0).view(4, 3))  # [N, R]: a response field
    trimmed = batch.trim_columns(1, 2)  # drop the first prompt column and the last response column
    assert trimmed.prompt_length == 1
    torch.testing.assert_close(trimmed.input_ids, batch.input_ids[:, 1:4])
    torch.testing.assert_close(trimmed.attention_mask, batch.attention_mask[:, 1:4])
    for name in ("response_mask", "sampling_logprobs", "old_logprobs"):
        torch.testing.assert_close(getattr(trimmed, name), getattr(batch, name)[:, :2])
    declared = {f.name for f in fields(RolloutBatch) if "columns" in f.metadata}
    assert declared == {"input_ids", "attention_mask", "response_mask", "sampling_logprobs", "old_logprobs"}


def test_a_per_token_field_of_the_wrong_width_is_refused():
    batch = make_rollout([[1, 2]], [[4], [5, 6]], [1.0, 0.0], 0.6)  # P = 2, R = 2
    with pytest.raises(ValueError, match="old_logprobs spans 3 columns, its response columns are 2"):
        replace(batch, old_logprobs=torch.zeros(2, 3))
    with pytest.raises(TypeError, match="advantages is per token .* declares no columns"):
        replace(batch, advantages=torch.zeros(2, 2))  # a per-row field given per-token values


@pytest.mark.parametrize("temperature", [0.0, -0.5, float("nan"), float("inf")])
def test_a_batch_sampled_at_a_temperature_without_log_probs_is_refused(temperature):
    """T = 0 (greedy) has no sampling distribution to score the responses under: refused, not treated as greedy."""
    with pytest.raises(ValueError, match=r"RolloutBatch.temperature must be > 0 and finite .*got"):
        make_rollout([[1]], [[2], [3]], [1.0, 0.0], temperature)
    with pytest.raises(ValueError, match=r"^temperature must be > 0 and finite .*got"):
        SamplingSettings(temperature=temperature)


def test_overlong_penalty_is_dapo_soft_punishment():
    lengths = torch.tensor([0, 6, 7, 8, 10])
    # max 10, buffer 4: free up to 6 tokens, then -1/4 per token down to -1 at the cap.
    assert torch.allclose(overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert torch.equal(overlong_penalty(lengths, 10, 0), torch.zeros(5))


def test_informative_groups_are_those_with_unequal_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    assert informative_groups(rewards, 3).tolist() == [False, True, True]
