"""Micro-batches sized by what each row forwards: under the shared prompt a row runs its response alone on its
query's kept keys and values, so the token budget counts response tokens only (`update.microbatch.forwarded_lengths`),
and the step stays the same whatever the cut (each share is divided by the step's global counts)."""

import pytest
import torch
from helpers.batches import make_rollout
from helpers.module_steps import PAD, PROMPTS, RESPONSES, REWARDS
from helpers.step_runs import LayoutScores, prepared, step

from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model
from erpo_lightning.update import micro_batches
from erpo_lightning.update.microbatch import forwarded_lengths


def test_under_the_shared_prompt_the_budget_counts_the_responses_alone():
    batch = make_rollout(PROMPTS, RESPONSES, REWARDS, 0.8, pad_token_id=PAD)  # rows of 9, 7, 6 and 4 real tokens
    assert forwarded_lengths(batch).tolist() == [9, 7, 6, 4]
    assert forwarded_lengths(batch, prompt_cached=True).tolist() == [4, 2, 3, 1]
    whole = list(micro_batches(batch, 8))
    cached = list(micro_batches(batch, 8, prompt_cached=True))
    assert [rows.tolist() for rows, _ in whole] == [[0], [1], [2], [3]]  # no two [prompt; response] rows fit 8
    assert [rows.tolist() for rows, _ in cached] == [[0, 2], [1, 3]]  # responses of 4 + 3, then 2 + 1
    for rows, micro in cached:
        response_columns = micro.attention_mask.shape[1] - micro.prompt_length
        assert len(rows) * response_columns <= 8


@pytest.mark.parametrize("preset", ["erpo", "grpo", "grpo_kl"])
def test_the_shared_prompt_step_is_the_same_whatever_the_response_budget(tiny_model_path, preset):
    """One micro-batch of all rows, or micro-batches cut by response tokens (two of two rows at 8, one row each at
    1): the same loss, Query-KL drift and gradients within float32 rounding."""
    model = load_tiny_model(tiny_model_path)
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm(preset)
    batch = prepared(model, cache, algorithm)
    theta0 = load_tiny_model(tiny_model_path).requires_grad_(False) if algorithm.policy_kl_coef > 0 else None
    whole, whole_stats = step(model, algorithm, batch, cache, 10_000, True, theta0, prompt_cached=True)
    assert len(whole_stats.micro) == 1
    for budget, cuts in ((8, 2), (1, 4)):
        split, split_stats = step(model, algorithm, batch, cache, budget, True, theta0, prompt_cached=True)
        assert len(split_stats.micro) == cuts
        torch.testing.assert_close(split_stats.loss, whole_stats.loss, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(split_stats.query_drift.query_kl, whole_stats.query_drift.query_kl)
        assert split.keys() == whole.keys() and whole
        for name in whole:
            torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)
    assert max(g.abs().max() for g in whole.values()) > 0
