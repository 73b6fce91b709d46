"""Log-probs over padded [prompt; response] batches equal unpadded forwards, token by token."""

import torch
from transformers import AutoTokenizer

from erpo_lightning import objectives as obj
from erpo_lightning.rollout.engine import left_pad
from erpo_lightning.scoring.logprobs import (
    gather_token_logprobs,
    prompt_response_token_logprobs,
    response_logprobs,
    sequence_logprobs,
    token_entropy,
)


def test_left_padded_logprobs_equal_unpadded_forward(tiny_model, tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    texts = ["What is 2 + 3?", "Compute 12 * 7, then add 5.", "Hi"]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        padded = sequence_logprobs(tiny_model, ids, mask)
        for i, row in enumerate(rows):
            alone = gather_token_logprobs(tiny_model(torch.tensor([row])).logits, torch.tensor([row]))[0]
            torch.testing.assert_close(padded[i, -len(row) :][1:], alone[1:], atol=1e-5, rtol=0)


def test_prompt_response_temperature_applies_to_response_only(tiny_model):
    torch.manual_seed(0)
    prompt_length, temperature = 5, 0.7
    ids = torch.randint(0, 250, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        logits = tiny_model(ids, attention_mask=mask).logits
    token_logprobs = prompt_response_token_logprobs(logits, ids, prompt_length, temperature)
    query_lp, query_mask, response_lp, _ = obj.split_prompt_response(token_logprobs, mask, prompt_length)
    at_one = torch.log_softmax(logits.float(), -1)
    tempered = torch.log_softmax(logits.float() / temperature, -1)
    for t in range(1, prompt_length):
        torch.testing.assert_close(query_lp[:, t], at_one[torch.arange(2), t - 1, ids[:, t]])
    for j in range(ids.shape[1] - prompt_length):
        t = prompt_length + j
        torch.testing.assert_close(response_lp[:, j], tempered[torch.arange(2), t - 1, ids[:, t]])


def test_token_entropy_matches_categorical_for_every_chunking():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 33) * 3
    expected = torch.distributions.Categorical(logits=logits / 0.7).entropy()
    for chunk_tokens in (1, 7, 10, 35, 10_000):  # one row per chunk, exact rows, ragged last chunk, all at once
        torch.testing.assert_close(token_entropy(logits, 0.7, chunk_tokens), expected, rtol=1e-5, atol=1e-5)
    uniform = token_entropy(torch.zeros(2, 3, 33, dtype=torch.bfloat16))
    torch.testing.assert_close(uniform, torch.full((2, 3), torch.log(torch.tensor(33.0)).item()))
    assert token_entropy(torch.tensor([[[0.0, -1e4]]])).item() == 0.0  # a near-certain token: no NaN from 0·log 0


class _WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (older or custom models): always all positions."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


def test_response_logprobs_equal_the_full_forwards_response_columns(tiny_model):
    """Scoring only the response (the output layer on R + 1 positions) gives the full forward's response columns,
    with left-padded prompts and right-padded responses, for models with and without `logits_to_keep`."""
    torch.manual_seed(1)
    prompt_length, temperature = 6, 0.7
    ids = torch.randint(1, 250, (3, prompt_length + 5))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, -2:] = 0
    calls = []
    hook = tiny_model.lm_head.register_forward_hook(lambda _m, inputs, _o: calls.append(inputs[0].shape[1]))
    with torch.no_grad():
        full = sequence_logprobs(tiny_model, ids, mask, temperature)[:, prompt_length:]
        kept = response_logprobs(tiny_model, ids, mask, prompt_length, temperature)
        unkept = response_logprobs(_WithoutLogitsToKeep(tiny_model), ids, mask, prompt_length, temperature)
    hook.remove()
    assert calls == [ids.shape[1], 5 + 1, ids.shape[1]]  # the output layer ran on the response positions only
    real = mask[:, prompt_length:].bool()
    torch.testing.assert_close(kept[real], full[real], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(unkept[real], full[real], atol=1e-6, rtol=1e-6)
    assert kept.shape == (3, 5)
