"""Batch assembly, overlong shaping and group filtering, checked against tensors written out by hand."""

import torch

from erpo_lightning.rollout import Sample, assemble_batch, informative_groups, overlong_penalty

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
        query_weight=torch.tensor([1.5, 0.5]),
        pad_token_id=PAD,
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
    assert torch.equal(batch["input_ids"], expected_ids)
    assert torch.equal(batch["attention_mask"], expected_attention)
    assert batch["prompt_length"] == 3
    assert batch["group_size"] == 2
    # The first real prompt token has no context, so no log-prob: it is left out of the query mask.
    assert torch.equal(batch["query_mask"], torch.tensor([[0, 1, 1], [0, 1, 1], [0, 0, 0], [0, 0, 0]]))
    assert torch.equal(batch["response_mask"], torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]))
    expected_logprobs = torch.tensor([[-0.1, -0.2, 0.0], [-0.3, 0.0, 0.0], [-0.4, -0.5, -0.6], [-0.7, -0.8, 0.0]])
    assert torch.equal(batch["sampling_logprobs"], expected_logprobs)
    assert torch.equal(batch["rewards"], torch.tensor([1.0, 0.0, 0.5, 0.25]))
    assert torch.equal(batch["group_index"], torch.tensor([0, 0, 1, 1]))
    assert torch.equal(batch["query_index"], torch.tensor([7, 7, 3, 3]))
    assert torch.equal(batch["query_weight"], torch.tensor([1.5, 1.5, 0.5, 0.5]))
    assert torch.equal(batch["truncated"], torch.tensor([False, False, True, False]))
    assert batch["input_ids"].dtype == batch["group_index"].dtype == batch["query_index"].dtype == torch.long


def test_overlong_penalty_is_dapo_soft_punishment():
    lengths = torch.tensor([0, 6, 7, 8, 10])
    # max 10, buffer 4: free up to 6 tokens, then -1/4 per token down to -1 at the cap.
    assert torch.allclose(overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert torch.equal(overlong_penalty(lengths, 10, 0), torch.zeros(5))


def test_informative_groups_are_those_with_unequal_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    assert informative_groups(rewards, 3).tolist() == [False, True, True]
