"""The fused output layer (`output_layer.py`, `model.fused_output_layer`): log-probs, entropies and gradients from
the last hidden states equal those of the logits (a plain re-statement and the unfused step), the logits are never
kept, the model's output layer is put back, and models it cannot fuse are refused before anything loads."""

import pytest
import torch
from helpers.module_steps import PROMPTS, ReferenceLogprobs, fit_one_batch, make_module, rollout_batch
from helpers.step_runs import LayoutScores, prepared, step
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from erpo_lightning.modules.lora import LoraSettings, add_lora_adapters
from erpo_lightning.modules.settings import check_module_settings
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.scoring.logprobs import causal_lm_window, prompt_response_logprobs_and_entropy, response_logprobs
from erpo_lightning.scoring.output_layer import fused_output_problem
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model
from erpo_lightning.update.forward import full_logits_forward, response_logits_forward, rollout_loss_rows

VOCAB, HIDDEN = 37, 16
# chunk sizes in elements: one position per chunk (rows cut), 4 positions (ragged), 2 whole rows, everything at once
CHUNKINGS = (VOCAB, 4 * VOCAB, 22 * VOCAB, 1 << 24)


def plain(hidden, weight, input_ids, prompt_length, temperature):
    """Independent re-statement: the whole float64 logits, log_softmax, prompt positions at T = 1."""
    logits = hidden.double() @ weight.double().T
    length = logits.shape[1]
    scale = torch.tensor([1.0 if t < prompt_length - 1 else 1.0 / temperature for t in range(length)])
    log_probs = torch.log_softmax(logits * scale[:, None].double(), dim=-1)
    picked = log_probs[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1]
    zero = torch.zeros(len(input_ids), 1, dtype=torch.float64)
    return torch.cat([zero, picked], 1), torch.cat([zero, entropy], 1)


def hidden_batch(dtype=torch.float32, seed=0):
    """3 rows of 11 positions (prompt width 5): hidden states, an output layer's weight, token ids, loss weights."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 11, HIDDEN, generator=generator).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=generator) / 2).to(dtype)
    input_ids = torch.randint(0, VOCAB, (3, 11), generator=generator)
    weights = torch.randn(3, 11, generator=generator)
    weights[:, 0] = 0
    return hidden, weight, input_ids, weights


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_elements", CHUNKINGS)
def test_fused_values_and_gradients_equal_the_whole_logits(temperature, chunk_elements):
    hidden, weight, input_ids, weights = hidden_batch()
    h_plain, w_plain = hidden.double().requires_grad_(), weight.double().requires_grad_()
    expected, expected_entropy = plain(h_plain, w_plain, input_ids, 5, temperature)
    (expected * weights.double()).sum().backward()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got, entropy = prompt_response_logprobs_and_entropy(
        h, input_ids, 5, temperature, chunk_elements=chunk_elements, output_weight=w
    )
    (got * weights).sum().backward()
    assert got.dtype == torch.float32 and w.grad.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), expected_entropy.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad.double(), h_plain.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w_plain.grad, rtol=1e-4, atol=1e-5)


def test_float64_gradcheck_through_hidden_states_and_weight():
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(7, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5), generator=generator)

    def fused(h, w):
        return prompt_response_logprobs_and_entropy(h, ids, 3, 0.6, chunk_elements=14, output_weight=w)[0]

    assert torch.autograd.gradcheck(fused, (hidden, weight))


def test_bfloat16_matches_the_unfused_logits_path():
    """In bfloat16 the fused path reads the same bf16 logits (each chunk's matmul) as the unfused one."""
    hidden, weight, input_ids, weights = hidden_batch(torch.bfloat16, seed=2)
    h0, w0 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    expected, _ = prompt_response_logprobs_and_entropy(torch.nn.functional.linear(h0, w0), input_ids, 5, 0.7)
    (expected * weights).sum().backward()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got, _ = prompt_response_logprobs_and_entropy(h, input_ids, 5, 0.7, chunk_elements=VOCAB, output_weight=w)
    (got * weights).sum().backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.02)
    torch.testing.assert_close(h.grad.float(), h0.grad.float(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(w.grad.float(), w0.grad.float(), atol=0.05, rtol=0.02)


def test_no_logits_sized_tensor_is_kept_for_backward():
    hidden, weight, input_ids, _ = hidden_batch()
    hidden.requires_grad_()
    kept = []

    def pack(tensor):
        kept.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        prompt_response_logprobs_and_entropy(hidden, input_ids, 5, 0.7, chunk_elements=VOCAB, output_weight=weight)
    assert (3, 11, HIDDEN) in kept and (VOCAB, HIDDEN) in kept
    assert not [shape for shape in kept if shape[-1] == VOCAB and len(shape) == 3]
    # The same check sees the logits when the output layer runs outside: it can fail.
    kept.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = torch.nn.functional.linear(hidden, weight)
        prompt_response_logprobs_and_entropy(logits, input_ids, 5, 0.7, chunk_elements=VOCAB)
    assert (3, 11, VOCAB) in kept


def untied_qwen2():
    config = Qwen2Config(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).float()


@pytest.mark.parametrize("forward", [response_logits_forward, full_logits_forward])
@pytest.mark.parametrize("tied", [True, False])
def test_the_fused_forward_equals_the_model_s_logits(tiny_model_path, forward, tied):
    """Response (and, under shared_forward, prompt) log-probs, entropies and every parameter's gradient equal the
    unfused forward's, for a tied and an untied output layer, which is put back afterwards."""
    model = load_tiny_model(tiny_model_path) if tied else untied_qwen2()
    head = model.get_output_embeddings()
    rows = rollout_loss_rows(prepared(model, LayoutScores(model, PROMPTS), resolve_algorithm("erpo")), 4)
    results = []
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = forward(model, rows, fused)
        scored = rows.attention_mask * torch.nn.functional.pad(rows.attention_mask[:, :-1], (1, 0))
        (logprobs * scored).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs * scored, entropy * scored, grads))
    assert model.get_output_embeddings() is head
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-6)
    assert grads1.keys() == grads0.keys() and ("lm_head.weight" in grads0) != tied  # a tied head is listed once
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("preset", ["erpo", "grpo"])
@pytest.mark.parametrize("share_prompt", [False, True])
def test_the_fused_step_equals_the_unfused_step(tiny_model_path, preset, share_prompt):
    """A whole step through `update.accumulate_gradients`, exact or shared prompt, one micro-batch per row: same
    loss, Query-KL, entropies and gradients; Query-KL's pass is not fused, so its drift is identical."""
    model = load_tiny_model(tiny_model_path)
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm(preset)
    batch = prepared(model, cache, algorithm)
    plain_grads, plain_stats = step(model, algorithm, batch, cache, 1, share_prompt)
    fused_grads, fused_stats = step(model, algorithm, batch, cache, 1, share_prompt, fused_output=True)
    torch.testing.assert_close(fused_stats.loss, plain_stats.loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused_stats.pg_loss, plain_stats.pg_loss, rtol=1e-5, atol=1e-7)
    assert torch.equal(fused_stats.query_drift.query_kl, plain_stats.query_drift.query_kl)
    for (rows, a), (_, b) in zip(fused_stats.micro, plain_stats.micro, strict=True):
        mask = rows.response_mask.bool()
        torch.testing.assert_close(a.entropy[mask], b.entropy[mask], rtol=1e-5, atol=1e-6)
    assert fused_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_output_layer_is_put_back_when_the_forward_fails(tiny_model):
    head = tiny_model.get_output_embeddings()
    ids = torch.full((1, 4), 10_000)  # past the vocabulary: the embedding lookup raises
    with pytest.raises(IndexError):
        causal_lm_window(tiny_model, ids, torch.ones_like(ids), fused_output=True)
    assert tiny_model.get_output_embeddings() is head


def test_models_it_cannot_fuse_are_named(tiny_model, tmp_path):
    assert fused_output_problem(tiny_model) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert "model type 'gpt2'" in fused_output_problem(gpt2)
    untied = untied_qwen2()
    add_lora_adapters(untied, LoraSettings(r=2, alpha=4, target_modules=["q_proj", "lm_head"]))
    assert "not a plain Linear (LoRA" in fused_output_problem(untied)
    # Before anything loads: the config's skeleton is checked, naming the setting.
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"model.fused_output_layer cannot be used with .*gpt2.*model type 'gpt2'"):
        check_module_settings({"fused_output_layer": True, "model_path": str(tmp_path / "gpt2")})
    check_module_settings({"fused_output_layer": False, "model_path": str(tmp_path / "gpt2")})


@pytest.mark.parametrize("tied", [True, False])
def test_the_forwards_without_gradient_are_fused_too(tiny_model_path, tied):
    """The old-policy recompute and the Policy-KL reference forward (`response_logprobs`): equal to the logits'
    response log-probs."""
    model = load_tiny_model(tiny_model_path) if tied else untied_qwen2()
    batch = rollout_batch(model)
    args = (model, batch.input_ids, batch.attention_mask, batch.prompt_length, 0.7)
    with torch.no_grad():
        expected = response_logprobs(*args)
        fused = response_logprobs(*args, fused_output=True)
    mask = batch.response_mask.bool()
    assert mask.any()
    torch.testing.assert_close(fused[mask], expected[mask], rtol=1e-5, atol=1e-6)


def test_a_fused_run_with_policy_kl_and_two_updates_per_batch_matches_the_unfused_one(tiny_model_path, tiny_model):
    """Through Lightning, with the reference model's forward (grpo_kl) and the old-policy recompute (two optimizer
    steps per batch, the second off-policy): the fused and unfused runs log the same loss, Policy-KL and ratio."""
    reference = ReferenceLogprobs(tiny_model, PROMPTS)
    batch = rollout_batch(tiny_model)
    metrics = []
    for fused in (False, True):
        module = make_module(
            tiny_model_path, reference, algorithm="grpo_kl", update_batch_size=1, fused_output_layer=fused
        )
        metrics.append(fit_one_batch(module, batch, steps=2).callback_metrics)
    for name in ("train/loss", "train/policy_kl", "train/ratio_mean", "train/entropy"):
        assert metrics[1][name].item() == pytest.approx(metrics[0][name].item(), rel=1e-4, abs=1e-6), name
    assert metrics[0]["train/policy_kl"].item() > 0  # the second update is off θ0: Policy-KL was computed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share_prompt", [False, True])
def test_query_kl_at_theta0_stays_exactly_zero_with_the_fused_output_layer(tiny_model_path, dtype, share_prompt):
    """The query pass keeps the cache's unfused forward: at θ0 every query token's log-ratio is exactly 0."""
    model = load_tiny_model(tiny_model_path).to(dtype)
    cache = LayoutScores(model, PROMPTS)
    algorithm = resolve_algorithm("erpo", query_kl_tolerance=0.0)
    batch = prepared(model, cache, algorithm, perturb=False)
    _, stats = step(model, algorithm, batch, cache, 10_000, share_prompt, fused_output=True)
    drift = stats.query_drift.query_loglik_change
    assert drift.numel() == len(PROMPTS) and torch.equal(drift, torch.zeros_like(drift))
    assert torch.equal(stats.loss, stats.pg_loss)
