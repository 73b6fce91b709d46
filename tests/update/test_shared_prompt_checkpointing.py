"""The shared prompt under gradient checkpointing (`update/shared_prompt.py`): both forwards stay checkpointed, the
responses read their prompt's keys and values through a cache that a recomputation cannot change, Query-KL at θ0
is exactly 0 in float32 and bfloat16, and the step's loss and gradients equal the exact step's within float32
rounding (the same tolerances as tests/update/test_shared_prompt.py: loss rtol 1e-5, gradients rtol 1e-4 / atol 1e-6;
measured here: 1.5e-6 of the largest entry, with checkpointing and without)."""

import csv

import pytest
import torch
from helpers.fit_configs import run_erpo
from helpers.module_steps import PROMPTS
from helpers.quickstart import copy_quickstart_inputs
from helpers.step_runs import LayoutScores, prepared, step, theta0_step
from safetensors.torch import load_file

from erpo_lightning.modules.settings import check_module_settings
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model
from erpo_lightning.update.shared_prompt import PrefixCache


def policy(path, checkpointing, dtype=torch.float32, reentrant=False):
    """The tiny model in training mode (Hugging Face checkpoints layers only then), checkpointed if asked."""
    model = load_tiny_model(path).to(dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_kl_at_theta0_is_exactly_zero_under_checkpointing(tiny_model_path, dtype):
    """The checkpointed prompt forward is the cache build's forward to the bit: every query token's log-ratio is 0
    and the Query-KL term adds nothing, one micro-batch per row."""
    model = policy(tiny_model_path, True, dtype)
    grads, stats = theta0_step(model, 1, True)
    drift = stats.query_drift.query_loglik_change
    assert drift.numel() == len(PROMPTS) and torch.equal(drift, torch.zeros_like(drift))
    assert torch.equal(stats.query_drift.query_kl, torch.zeros_like(drift))
    assert torch.equal(stats.loss, stats.pg_loss)  # no Query-KL in the loss
    assert grads and all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("preset", ["erpo", "grpo_kl"])
def test_the_checkpointed_shared_prompt_step_equals_the_exact_step(tiny_model_path, preset):
    """Off θ0, one micro-batch per row: the shared-prompt step with and without checkpointing has the exact step's
    loss, Query-KL, entropies and every parameter's gradient (the exact step itself checkpointed or not), and the
    prompt forward's own gradient arrives (a prompt-only token's embedding)."""
    algorithm = resolve_algorithm(preset)
    runs = {}
    for checkpointing in (False, True):
        for shared in (False, True):
            model = policy(tiny_model_path, checkpointing)
            cache = LayoutScores(model, PROMPTS)
            batch = prepared(model, cache, algorithm)
            theta0 = load_tiny_model(tiny_model_path).requires_grad_(False) if algorithm.policy_kl_coef > 0 else None
            runs[checkpointing, shared] = step(model, algorithm, batch, cache, 1, shared, theta0)
    exact, exact_stats = runs[False, False]
    for (checkpointing, shared), (grads, stats) in runs.items():
        where = f"checkpointing={checkpointing}, shared_prompt={shared}"
        torch.testing.assert_close(stats.loss, exact_stats.loss, rtol=1e-5, atol=1e-7, msg=where)
        torch.testing.assert_close(stats.query_drift.query_kl, exact_stats.query_drift.query_kl, msg=where)
        for (rows, a), (_, b) in zip(stats.micro, exact_stats.micro, strict=True):
            mask = rows.response_mask.bool()
            torch.testing.assert_close(a.entropy[mask], b.entropy[mask], rtol=1e-5, atol=1e-6, msg=where)
        assert grads.keys() == exact.keys() and grads, where
        for name in exact:
            torch.testing.assert_close(grads[name], exact[name], rtol=1e-4, atol=1e-6, msg=f"{name}, {where}")
        assert grads["model.embed_tokens.weight"][PROMPTS[0][0]].abs().max() > 0, where


def test_both_forwards_stay_checkpointed(tiny_model_path):
    """Each decoder layer runs twice per forward (the forward, its recomputation in backward) for the prompt
    forward and for each micro-batch's response forward: 2 · (1 scoring block + 4 micro-batches) calls. Without
    checkpointing it runs once each."""
    algorithm = resolve_algorithm("erpo")
    for checkpointing, expected in ((False, 5), (True, 10)):
        model = policy(tiny_model_path, checkpointing)
        cache = LayoutScores(model, PROMPTS)
        batch = prepared(model, cache, algorithm)
        calls = [0]

        def count(module, args, calls=calls):
            calls[0] += 1

        hook = model.model.layers[0].register_forward_pre_hook(count)
        step(model, algorithm, batch, cache, 1, True)
        hook.remove()
        assert calls[0] == expected, checkpointing


def test_the_prefix_cache_never_changes():
    """`update` returns prefix ⊕ new states and keeps nothing: a second call (a checkpointed layer's
    recomputation) returns the same, the cache's length stays the prefix's, `seen` holds the first call's."""
    generator = torch.Generator().manual_seed(0)
    prefix = [(torch.randn(2, 1, 3, 4, generator=generator), torch.randn(2, 1, 3, 4, generator=generator))]
    cache = PrefixCache(prefix)
    new = torch.randn(2, 1, 5, 4, generator=generator), torch.randn(2, 1, 5, 4, generator=generator)
    first = cache.update(*new, 0)
    again = cache.update(*new, 0)
    assert torch.equal(first[0], torch.cat([prefix[0][0], new[0]], dim=2)) and first[0].shape == (2, 1, 8, 4)
    assert torch.equal(first[1], torch.cat([prefix[0][1], new[1]], dim=2))
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert cache.get_seq_length() == 3 and torch.equal(cache.layers[0].keys, prefix[0][0])
    assert cache.seen[0][0] is first[0]
    cache.check_read(1)
    with pytest.raises(RuntimeError, match="read its key/value cache in 1 of 2 layers"):
        cache.check_read(2)


def test_reentrant_checkpointing_is_refused(tiny_model_path):
    """Reentrant checkpointing runs the prompt forward without a graph: the responses' gradient could not reach
    the prompt, so the step refuses rather than train without it."""
    model = policy(tiny_model_path, True, reentrant=True)
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm("erpo")
    batch = prepared(model, cache, algorithm)
    with pytest.raises(RuntimeError, match="needs non-reentrant gradient checkpointing"):
        step(model, algorithm, batch, cache, 10_000, True)


def test_the_settings_accept_the_shared_prompt_with_checkpointing():
    check_module_settings({"query_kl_scoring": "shared_prompt", "gradient_checkpointing": True})


@pytest.mark.slow
def test_erpo_fit_trains_with_the_shared_prompt_and_checkpointing(tmp_path):
    """The quickstart, shortened, with both settings: `erpo fit` runs its steps, logs a finite loss and Query-KL at
    each, and the exported model's weights differ from the shipped model's."""
    copy_quickstart_inputs(tmp_path, test_problems=8)
    result = run_erpo(
        "fit", "--config", "configs/quickstart.yaml", "--model.query_kl_scoring", "shared_prompt",
        "--model.gradient_checkpointing", "true", "--trainer.max_steps", "3", "--data.batch_size", "4",
        "--rollout.group_size", "4", cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    run = tmp_path / "runs" / "quickstart"
    with next(run.rglob("metrics.csv")).open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/loss")]
    assert len(rows) == 3, rows
    for row in rows:
        assert torch.isfinite(torch.tensor(float(row["train/loss"]))), row
        assert float(row["train/query_kl"]) >= 0.0, row
    shipped = load_file(tmp_path / "erpo_lightning" / "toy" / "shipped" / "model.safetensors")
    trained = load_file(next(run.rglob("hf_model/model.safetensors")))
    assert shipped.keys() == trained.keys()
    assert any(not torch.equal(trained[name], shipped[name]) for name in shipped)
