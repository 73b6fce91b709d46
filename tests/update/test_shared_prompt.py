"""The shared prompt (`update/shared_prompt.py`): each query forwarded once, its responses on its keys and values.
The step's loss and gradients equal the plain exact step's within float32 rounding, and Query-KL at θ0 stays exactly
0 in float32 and bfloat16."""

import pytest
import torch
from helpers.module_steps import PROMPTS
from helpers.step_runs import LayoutScores, prepared, step, theta0_step

from erpo_lightning.modules.lora import LoraSettings, add_lora_adapters
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.scoring.queries import QueryScoringLayout
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model


@pytest.mark.parametrize("preset", ["erpo", "grpo", "grpo_kl", "dr_grpo", "erpo_released"])
@pytest.mark.parametrize("max_tokens", [10_000, 1])
def test_the_shared_prompt_step_equals_the_exact_step(tiny_model_path, preset, max_tokens):
    """Same loss, Query-KL drift, response log-probs, entropies and gradients as the plain exact step, in one
    micro-batch or one per row; the prompt forward's gradient does arrive (the embeddings of prompt-only tokens)."""
    model = load_tiny_model(tiny_model_path)
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm(preset)
    batch = prepared(model, cache, algorithm)
    theta0 = load_tiny_model(tiny_model_path).requires_grad_(False) if algorithm.policy_kl_coef > 0 else None
    plain, plain_stats = step(model, algorithm, batch, cache, max_tokens, False, theta0)
    shared, shared_stats = step(model, algorithm, batch, cache, max_tokens, True, theta0)
    torch.testing.assert_close(shared_stats.loss, plain_stats.loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(shared_stats.pg_loss, plain_stats.pg_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(shared_stats.query_drift.query_kl, plain_stats.query_drift.query_kl)
    for (rows, a), (_, b) in zip(shared_stats.micro, plain_stats.micro, strict=True):
        mask = rows.response_mask.bool()
        torch.testing.assert_close(a.entropy[mask], b.entropy[mask], rtol=1e-5, atol=1e-6)
    assert shared.keys() == plain.keys() and shared
    for name in plain:
        torch.testing.assert_close(shared[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)
    embeddings = shared["model.embed_tokens.weight"]
    assert embeddings[PROMPTS[0][0]].abs().max() > 0  # a prompt token's embedding: reached only through the prompt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("layout", [QueryScoringLayout(), QueryScoringLayout(rows=1, width_multiple=8)])
def test_query_kl_at_theta0_is_exactly_zero_in_either_layout(tiny_model_path, dtype, share_prompt, layout):
    """At θ0 the prompt forward is the cache build's, to the bit: every query token's log-ratio is exactly 0 and
    the Query-KL term adds nothing, in float32 and bfloat16, with the shared prompt and the exact pass, in the
    default layout and with each query alone at a width multiple of 8 (bench_step's `*_alone` arms)."""
    model = load_tiny_model(tiny_model_path).to(dtype)
    _, stats = theta0_step(model, 10_000, share_prompt, layout)
    drift = stats.query_drift.query_loglik_change
    assert drift.numel() == len(PROMPTS) and torch.equal(drift, torch.zeros_like(drift))
    assert torch.equal(stats.query_drift.query_kl, torch.zeros_like(drift))
    assert torch.equal(stats.loss, stats.pg_loss)  # no Query-KL in the loss


def test_lora_adapters_train_the_same_under_the_shared_prompt(tiny_model_path):
    """With LoRA adapters the shared prompt's gradients reach the adapters as the plain step's do."""
    model = load_tiny_model(tiny_model_path)
    add_lora_adapters(model, LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B = 0 would keep the adapters' input gradient out of the picture
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm("erpo")
    batch = prepared(model, cache, algorithm)
    plain, _ = step(model, algorithm, batch, cache, 10_000, False)
    shared, _ = step(model, algorithm, batch, cache, 10_000, True)
    assert shared.keys() == plain.keys() and all("lora_" in name for name in plain)
    for name in plain:
        torch.testing.assert_close(shared[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)
