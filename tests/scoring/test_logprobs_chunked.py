"""The chunked log-prob path: exact values and gradients against a plain full-tensor re-statement, any chunking,
temperature ≠ 1, padding, bf16; and no float32 [N, L, V] tensor kept for backward."""

import math

import pytest
import torch

from erpo_lightning.rollout.engine import left_pad
from erpo_lightning.scoring.logprobs import (
    causal_lm_logits,
    gather_token_logprobs,
    prompt_response_logprobs_and_entropy,
    prompt_response_token_logprobs,
    token_entropy,
)

VOCAB = 37


def plain_prompt_response(logits, input_ids, prompt_length, temperature):
    """Independent re-statement: log_softmax of the whole float32 tensor, prompt positions at T = 1."""
    length = logits.shape[1]
    scale = torch.tensor([1.0 if t < prompt_length - 1 else 1.0 / temperature for t in range(length)])
    log_probs = torch.log_softmax(logits.float() * scale[:, None], dim=-1)
    picked = log_probs[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1]
    zero = torch.zeros(len(input_ids), 1)
    return torch.cat([zero, picked], 1), torch.cat([zero, entropy], 1)


def padded_batch(seed=0):
    """3 rows, prompts left-padded to P = 5, responses right-padded to R = 6, random logits with gradient."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (3, 11), generator=generator)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, :2] = 0  # a shorter prompt
    mask[2, 8:] = 0  # a shorter response
    logits = torch.randn(3, 11, VOCAB, generator=generator) * 4
    # A loss over tokens that have a real token before them, as the trainer's: padding and first tokens are ignored.
    scored = mask * torch.nn.functional.pad(mask[:, :-1], (1, 0))
    weights = torch.randn(3, 11, generator=generator) * scored
    return logits, input_ids, mask, weights


# chunk sizes in elements: one position per chunk (rows cut), 4 positions (ragged), 2 whole rows, everything at once
CHUNKINGS = (VOCAB, 4 * VOCAB, 22 * VOCAB, 1 << 24)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("chunk_elements", CHUNKINGS)
def test_float32_values_gradients_and_entropy_equal_plain_path(temperature, chunk_elements):
    logits, input_ids, mask, weights = padded_batch()
    prompt_length = 5
    plain_logits = logits.clone().requires_grad_()
    expected, expected_entropy = plain_prompt_response(plain_logits, input_ids, prompt_length, temperature)
    (expected * weights).sum().backward()

    chunked_logits = logits.clone().requires_grad_()
    got, entropy = prompt_response_logprobs_and_entropy(
        chunked_logits, input_ids, prompt_length, temperature, chunk_elements=chunk_elements
    )
    (got * weights).sum().backward()

    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # |log p| reaches 20: ulp 2e-6
    torch.testing.assert_close(chunked_logits.grad, plain_logits.grad, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy, expected_entropy.detach(), atol=1e-5, rtol=0)
    assert not entropy.requires_grad
    # Padding gets no gradient; the last position predicts nothing and gets none either.
    assert chunked_logits.grad[1, :2].abs().max() == 0 and chunked_logits.grad[:, -1].abs().max() == 0
    alone = prompt_response_token_logprobs(logits, input_ids, prompt_length, temperature, chunk_elements=chunk_elements)
    torch.testing.assert_close(alone, got.detach(), atol=0, rtol=0)


def test_hand_computed_two_token_vocabulary():
    # logits (0, ln 3) at position 0: p = (1/4, 3/4); token 1 is sampled, so log p = ln 3/4, and the gradient of
    # log p_1 is 1[j = 1] − p_j = (−1/4, 1/4). Entropy: −(1/4 ln 1/4 + 3/4 ln 3/4).
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, -5.0]]], requires_grad=True)
    ids = torch.tensor([[0, 1]])
    logprobs, entropy = prompt_response_logprobs_and_entropy(logits, ids, prompt_length=2, temperature=1.0)
    logprobs[0, 1].backward()
    assert logprobs[0, 0].item() == 0.0
    assert logprobs[0, 1].item() == pytest.approx(math.log(0.75), abs=1e-7)
    assert entropy[0, 1].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-7)
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.25], [0.0, 0.0]]]))


def test_response_temperature_scales_the_gradient():
    # At T = 2 the response position's distribution is softmax(x / 2) and d log p_y / dx_j = (1[j = y] − p_j) / 2.
    logits = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]]], requires_grad=True)
    ids = torch.tensor([[0, 1, 0]])
    logprobs = prompt_response_token_logprobs(logits, ids, prompt_length=2, temperature=2.0)
    logprobs[0, 2].backward()  # token 2 is a response token, predicted at position 1 by softmax((2, 0) / 2)
    p0 = 1 / (1 + math.exp(-1.0))
    assert logprobs[0, 2].item() == pytest.approx(math.log(p0), abs=1e-7)
    torch.testing.assert_close(logits.grad[0, 1], torch.tensor([(1 - p0) / 2, -(1 - p0) / 2]))
    assert logits.grad[0, 0].abs().max() == 0


def test_float64_gradcheck():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5), generator=generator)
    assert torch.autograd.gradcheck(
        lambda x: prompt_response_token_logprobs(x, ids, 3, 0.6, chunk_elements=14), (logits,)
    )


@pytest.mark.parametrize("chunk_elements", CHUNKINGS)
def test_bfloat16_matches_plain_path_to_one_rounding(chunk_elements):
    logits, input_ids, mask, weights = padded_batch(seed=2)
    logits = logits.bfloat16()
    plain_logits = logits.clone().requires_grad_()
    expected, _ = plain_prompt_response(plain_logits, input_ids, 5, 0.7)
    (expected * weights).sum().backward()
    chunked_logits = logits.clone().requires_grad_()
    got = prompt_response_token_logprobs(chunked_logits, input_ids, 5, 0.7, chunk_elements=chunk_elements)
    (got * weights).sum().backward()
    assert got.dtype == torch.float32 and chunked_logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # both read the same bf16 values in float32
    # Both gradients are float32 sums rounded once to bf16: equal up to that rounding (2^-8 relative).
    torch.testing.assert_close(chunked_logits.grad.float(), plain_logits.grad.float(), atol=1e-6, rtol=2**-8)


def saved_bytes(fn) -> list[tuple[torch.dtype, tuple, int]]:
    """(dtype, shape, bytes) of every tensor autograd saves for backward while running `fn`."""
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tuple(tensor.shape), tensor.numel() * tensor.element_size()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return saved


def test_no_float32_copy_of_the_logits_is_kept_for_backward():
    logits, input_ids, _, _ = padded_batch()
    logits = logits.bfloat16().requires_grad_()
    kept = saved_bytes(lambda: prompt_response_token_logprobs(logits, input_ids, 5, 0.7, chunk_elements=VOCAB))
    full = [(dtype, shape) for dtype, shape, _ in kept if len(shape) == 3]
    assert full == [(torch.bfloat16, (3, 11, VOCAB))]  # the logits themselves, nothing else of their size
    assert sum(size for *_, size in kept) < logits.numel() * 2 + 3 * 11 * 8 * 3
    # The re-statement above, like the trainer's path before chunking, keeps float32 [N, L, V] tensors: the check
    # can tell the two apart.
    plain = saved_bytes(lambda: plain_prompt_response(logits, input_ids, 5, 0.7))
    assert any(dtype == torch.float32 and len(shape) == 3 for dtype, shape, _ in plain)


def test_model_parameter_gradients_equal_plain_path(tiny_model, tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    rows = [tokenizer(text)["input_ids"] for text in ("Compute 3 + 4.", "Hi", "What is 12 * 7 - 5?")]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    weights = torch.linspace(-1, 1, ids.numel()).view_as(ids) * mask
    grads = []
    for path in ("plain", "chunked"):
        tiny_model.zero_grad()
        logits = causal_lm_logits(tiny_model, ids, mask)
        if path == "plain":
            logprobs, _ = plain_prompt_response(logits, ids, ids.shape[1] - 3, 0.8)
        else:
            logprobs = prompt_response_token_logprobs(logits, ids, ids.shape[1] - 3, 0.8, chunk_elements=300)
        (logprobs * weights).sum().backward()
        grads.append({name: p.grad.clone() for name, p in tiny_model.named_parameters()})
    for name, plain_grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], plain_grad, atol=1e-6, rtol=1e-5, msg=name)


def test_token_entropy_reads_a_slice_in_place_and_matches_for_any_chunking():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 9, VOCAB, generator=generator) * 3
    window = logits[:, 3:-1]  # the trainer passes the response window, a non-contiguous view
    expected = torch.distributions.Categorical(logits=window / 0.8).entropy()
    for chunk_tokens in (None, 1, 2, 5, 6, 11, 100):
        torch.testing.assert_close(token_entropy(window, 0.8, chunk_tokens), expected, atol=1e-5, rtol=1e-5)


def test_gather_token_logprobs_uniform_temperature():
    logits, input_ids, _, _ = padded_batch(seed=4)
    expected = torch.log_softmax(logits / 1.3, -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    for chunk_elements in CHUNKINGS:
        got = gather_token_logprobs(logits, input_ids, 1.3, chunk_elements=chunk_elements)
        assert (got[:, 0] == 0).all()
        torch.testing.assert_close(got[:, 1:], expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gradient_written_into_the_logits_buffer_equals_a_fresh_one(dtype):
    """`gradient_into_logits`: the same gradient, bit for bit, in the logits' own buffer (one [N, L, V] buffer at the
    peak); a later autograd use of the overwritten logits fails loudly instead of reading the gradient."""
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(3, 9, VOCAB, generator=generator).to(dtype)
    input_ids = torch.randint(0, VOCAB, (3, 9), generator=generator)
    weights = torch.randn(3, 9, generator=generator)
    gradients = {}
    for into_logits in (False, True):
        leaf = source.clone().requires_grad_(True)
        logits = leaf * 1  # a non-leaf, as the LM head's output is
        logprobs, _ = prompt_response_logprobs_and_entropy(
            logits, input_ids, 4, 0.7, chunk_elements=2 * VOCAB, gradient_into_logits=into_logits
        )
        captured = []
        logits.register_hook(captured.append)
        (logprobs * weights).sum().backward()
        gradients[into_logits] = leaf.grad
        shares_buffer = captured[0].untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
        assert shares_buffer == into_logits
    assert torch.equal(gradients[True], gradients[False])
    leaf = source.clone().float().requires_grad_(True)
    logits = leaf * 1
    logprobs, _ = prompt_response_logprobs_and_entropy(logits, input_ids, 4, gradient_into_logits=True)
    also_read = (logits * logits).sum()  # another node keeps the logits for its backward, run after ours
    logprobs.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        also_read.backward()
