"""The update unit (`erpo_lightning/update`): pure torch, the same step whatever the micro-batching, and the engine's
missing log-probs read as ρ = 1."""

from dataclasses import replace
from typing import get_args

import pytest
import torch
from helpers.batches import carrying_scores, make_rollout
from helpers.imports import PACKAGE, imported_modules
from helpers.module_steps import PAD, PROMPTS, ReferenceLogprobs, rollout_batch

from erpo_lightning import objectives as obj
from erpo_lightning.objectives.algorithms import AlgorithmName, resolve_algorithm
from erpo_lightning.scoring.logprobs import response_logprobs
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model
from erpo_lightning.update import (
    StepInputs,
    accumulate_gradients,
    full_logits_forward,
    micro_batch_loss,
    micro_batch_rows,
    micro_batches,
    rank_aligned_micro_batches,
    response_logits_forward,
    rollout_loss_rows,
    step_normalizers,
)


def test_the_update_imports_no_lightning_and_no_trainer():
    """Any trainer can call it: no file of the unit imports Lightning, torchmetrics or a trainer's package (the
    Lightning module's `modules/`, `callbacks/`, `integrations/`, the CLI)."""
    trainers = ("lightning", "pytorch_lightning", "torchmetrics", "trl") + tuple(
        f"erpo_lightning.{name}" for name in ("modules", "callbacks", "integrations", "cli")
    )
    files = sorted((PACKAGE / "update").glob("*.py"))
    assert len(files) >= 3
    found = {f"{path.name}: {name}" for path in files for name in imported_modules(path) if name.startswith(trainers)}
    assert not found, sorted(found)


def step_gradients(model, algorithm, batch, reference, max_tokens, reference_policy):
    """The parameters' gradients after `accumulate_gradients` over `batch` cut into micro-batches of `max_tokens`,
    and the step's loss."""
    model.zero_grad(set_to_none=True)
    rows = rollout_loss_rows(batch, batch.max_new_tokens or 4)
    normalizers = step_normalizers(
        batch.response_mask, batch.attention_mask, batch.prompt_length, batch.is_group_leader, lambda total: total
    )
    micros = (
        (rollout_loss_rows(micro, batch.max_new_tokens or 4), True) for _, micro in micro_batches(batch, max_tokens)
    )
    inputs = StepInputs(algorithm, normalizers, batch.group_size, reference)
    stats = accumulate_gradients(model, rows, micros, inputs, lambda share: share.backward(), reference_policy)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, stats.loss


@pytest.mark.parametrize("preset", get_args(AlgorithmName))
def test_micro_batching_leaves_the_step_unchanged(tiny_model_path, preset):
    """One micro-batch of all rows or one per row: the same loss and gradients (each share is divided by the whole
    step's counts), for every preset; after a perturbation, so Query-KL and Policy-KL are not 0."""
    model = load_tiny_model(tiny_model_path)
    reference = ReferenceLogprobs(model, PROMPTS)
    batch = rollout_batch(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    algorithm = resolve_algorithm(preset)
    batch = carrying_scores(batch, algorithm, reference.nll)
    if batch.query_weights is None:  # a per-step w(q): any fixed one serves here
        weights = obj.query_weights(reference.nll, reference.nll.mean()).repeat_interleave(batch.group_size)
        batch = replace(batch, query_weights=weights)
    batch = replace(batch, advantages=obj.group_advantages(batch.rewards, batch.group_size, "grpo"))
    theta0 = load_tiny_model(tiny_model_path).requires_grad_(False) if algorithm.policy_kl_coef > 0 else None
    whole, whole_loss = step_gradients(model, algorithm, batch, reference, 10_000, theta0)
    split, split_loss = step_gradients(model, algorithm, batch, reference, 1, theta0)
    assert whole.keys() == split.keys() and whole
    torch.testing.assert_close(split_loss, whole_loss, rtol=1e-5, atol=1e-7)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-7, msg=name)
    assert max(g.abs().max() for g in whole.values()) > 0


def test_a_token_the_engine_has_no_logprob_for_weighs_one_under_the_rollout_correction(tiny_model_path):
    """vLLM's NaN sampling log-prob: the correction reads ρ = 1 at that token (the sampling log-prob taken as the
    old one) and the rest as given, so the loss stays finite and equals the batch with that token's log-prob set to
    the policy's own."""
    model = load_tiny_model(tiny_model_path)
    batch = rollout_batch(model)
    batch = replace(batch, advantages=obj.group_advantages(batch.rewards, batch.group_size, "grpo"))
    algorithm = resolve_algorithm("grpo", rollout_correction="tis", rollout_correction_cap=2.0)
    shifted = batch.sampling_logprobs - 0.3 * batch.response_mask  # a mismatch the correction acts on
    normalizers = step_normalizers(
        batch.response_mask, batch.attention_mask, batch.prompt_length, batch.is_group_leader, lambda total: total
    )
    own = rollout_loss_rows(batch, 4)
    with torch.no_grad():
        policy_logprobs = shifted.clone()  # on policy, the old log-probs are the rows' own forward
        policy_logprobs[0, 0] = response_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.prompt_length, batch.temperature
        )[0, 0]
        missing = shifted.clone()
        missing[0, 0] = float("nan")
        inputs = StepInputs(algorithm, normalizers, batch.group_size)
        with_nan, _ = micro_batch_loss(model, replace(own, sampling_logprobs=missing), inputs)
        with_own, _ = micro_batch_loss(model, replace(own, sampling_logprobs=policy_logprobs), inputs)
        without_fix, _ = micro_batch_loss(model, replace(own, sampling_logprobs=shifted), inputs)
    assert torch.isfinite(with_nan)
    torch.testing.assert_close(with_nan, with_own)
    assert with_nan != without_fix  # the token's weight did change


def test_the_response_only_forward_scores_the_responses_as_the_full_forward(tiny_model_path):
    """`response_logits_forward` (the output layer on the R + 1 positions that predict response tokens) gives the
    full forward's response log-probs and entropies, and their gradients, within float32 rounding; 0 on the prompt."""
    model = load_tiny_model(tiny_model_path)
    rows = rollout_loss_rows(rollout_batch(model), 4)
    width = rows.prompt_length
    full, full_entropy = full_logits_forward(model, rows)
    full_grad = torch.autograd.grad(full[:, width:].sum(), list(model.parameters()), allow_unused=True)
    kept, kept_entropy = response_logits_forward(model, rows)
    kept_grad = torch.autograd.grad(kept[:, width:].sum(), list(model.parameters()), allow_unused=True)
    assert kept.shape == full.shape and kept_entropy.shape == full_entropy.shape
    torch.testing.assert_close(kept[:, width:], full[:, width:])
    torch.testing.assert_close(kept_entropy[:, width:], full_entropy[:, width:])
    assert not kept[:, :width].any() and not kept_entropy[:, :width].any()
    assert full[:, 1:width].any()  # the full forward did score the prompt
    for a, b in zip(kept_grad, full_grad, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_micro_batches_of_length_sorted_rows_pad_less_and_hold_every_row_once():
    """Rows sorted by length (longest first) then cut by the budget: every row once, each micro-batch within the
    budget (a row longer than it alone), and fewer padded tokens than cutting the rows in their order."""
    lengths = torch.tensor([3, 40, 5, 38, 4, 39, 6, 37])
    runs = micro_batch_rows(lengths, max_tokens=80)
    assert sorted(torch.cat(runs).tolist()) == list(range(8))
    assert all(len(run) == 1 or lengths[run].max() * len(run) <= 80 for run in runs)
    assert [lengths[run].max().item() for run in runs] == sorted(
        (lengths[run].max().item() for run in runs), reverse=True
    )
    padded = sum(lengths[run].max().item() * len(run) for run in runs)
    in_order = sum(max(lengths[i : i + 2]).item() * 2 for i in range(0, 8, 2))  # consecutive pairs: 4 x 2 x ~40
    assert padded < in_order
    assert [run.tolist() for run in micro_batch_rows(torch.tensor([5, 500, 5]), max_tokens=100)] == [[1], [0, 2]]


@pytest.mark.parametrize("micro_batch_tokens", [10_000, 12])
def test_old_logprobs_recomputed_over_sorted_micro_batches_land_on_their_rows(tiny_model_path, micro_batch_tokens):
    """With several updates per batch the module recomputes the old log-probs micro-batch by micro-batch; with
    length-sorted micro-batches each row's values must land on that row: equal to one forward over all rows."""
    from erpo_lightning.modules.erpo_module import ERPOModule

    module = ERPOModule(str(tiny_model_path), micro_batch_tokens=micro_batch_tokens)
    module.configure_model()
    # Real lengths 6, 9, 6, 5: sorted, the second row comes first (with a budget of 12: [1], [0, 2], [3]).
    responses = [[30], [31, 32, 33, 34], [40, 41, 42], [43, 44]]
    batch = make_rollout(
        PROMPTS, responses, [1.0, 0.0, 0.0, 1.0], 0.8, [[0.0] * len(r) for r in responses], pad_token_id=PAD
    )
    assert micro_batch_tokens > 12 or len(micro_batch_rows(batch.attention_mask.sum(-1), micro_batch_tokens)) == 3
    recomputed = module._recompute_old_logprobs(batch)
    with torch.no_grad():
        whole = response_logprobs(
            module.policy, batch.input_ids, batch.attention_mask, batch.prompt_length, batch.temperature
        )
    mask = batch.response_mask.bool()
    torch.testing.assert_close(recomputed[mask], whole[mask])


def test_every_rank_runs_as_many_micro_batches_with_fillers_of_weight_zero():
    """`rank_aligned_micro_batches`: this rank's micro-batches hold each row once; when another rank has more, the
    rest are one-row fillers marked by rows None, up to the largest count the collective returns."""
    responses = [[30], [31, 32, 33, 34], [40, 41, 42], [43, 44]]
    batch = make_rollout(PROMPTS, responses, [1.0, 0.0, 0.0, 1.0], 0.8, pad_token_id=PAD)
    own = len(micro_batch_rows(batch.attention_mask.sum(-1), 12))
    seen = []
    pairs = list(rank_aligned_micro_batches(batch, 12, lambda count: seen.append(count) or count + 2))
    assert seen == [own] and len(pairs) == own + 2
    real = [rows for _, rows in pairs if rows is not None]
    assert sorted(torch.cat(real).tolist()) == list(range(batch.num_rows))
    assert [rows for _, rows in pairs[own:]] == [None, None]
    assert all(micro.num_rows == 1 for micro, _ in pairs[own:])


def test_loss_rows_are_built_by_keyword_everywhere():
    """A field added to `LossRows` cannot shift another: no call in the package builds it with positional
    arguments (read with ast)."""
    import ast

    calls, positional = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "LossRows":
                calls += 1
                if node.args:
                    positional.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert calls >= 2  # the module's rows and the TRL trainer's
    assert not positional, positional
