"""`erpo_released` against an independent re-statement of the authors' released loss.

The re-statement below follows the released code's formulas (AlibabaResearch/ERPO `roll/pipeline/rlvr/actor_worker.py`:
`loss_func`, `prepare_backward_batch`; ROLL `roll/utils/functionals.py`: `compute_approx_kl`, `agg_loss`,
`masked_mean`), written here in a few lines on ROLL's own layout (one row = prompt then response, masks shifted by one
token), with its epsilons, and calls nothing of ours. docs/erpo.md cites the lines.
"""

import copy
from dataclasses import replace

import lightning as L
import pytest
import torch
from helpers.module_steps import (
    PROMPTS,
    RESPONSES,
    REWARDS,
    TEMPERATURE,
    ReferenceLogprobs,
    fit_one_batch,
    rollout_batch,
)

from erpo_lightning import objectives as obj
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.objectives.algorithms import ALGORITHMS

PG_CLIP, KL_COEF = 0.2, 0.01


def released_loss(log_probs, old_log_probs, ref_log_probs, advantages, prompt_mask, response_mask):
    """The released ERPO loss on [N, L] log-probs (column t: token t+1 given tokens <= t), ROLL's formulas.

    prompt_mask: scored prompt tokens; response_mask: `final_response_mask` (a row may be all 0).
    """
    # prepare_backward_batch: current actor's prompt NLL, mean over the valid rows of the global batch, no clip
    nll = -(log_probs.detach() * prompt_mask).sum(-1)
    valid_prompt = prompt_mask.sum(-1) > 0
    weights = torch.ones_like(nll)
    weights[valid_prompt] = nll[valid_prompt].mean() / nll[valid_prompt].clamp_min(1e-8)
    n = log_probs.shape[0]
    sample_weights = torch.ones(n, dtype=log_probs.dtype) * (n / (n + 1e-8)) * weights  # compute_sample_weights
    global_valid_samples = (response_mask.sum(-1) > 0).sum()

    def agg_seq_mean_token_mean(loss_mat, mask, weights=None):
        mask_sum = mask.sum(-1)
        seq = torch.where(mask_sum > 0, (loss_mat * mask).sum(-1) / (mask_sum + 1e-8), torch.zeros_like(mask_sum))
        valid = (mask > 0).any(-1).to(loss_mat.dtype)
        weights = torch.ones(n, dtype=loss_mat.dtype) if weights is None else weights
        return (seq * weights * valid).sum() / (global_valid_samples + 1e-8)

    kl = ref_log_probs - log_probs  # compute_approx_kl(kl_penalty="k3")
    ref_kl = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    kl_loss = agg_seq_mean_token_mean(ref_kl, prompt_mask)
    ratio = (log_probs - old_log_probs).exp()
    adv = advantages.unsqueeze(-1)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - PG_CLIP, 1 + PG_CLIP) * adv)
    loss = torch.where(adv < 0, -torch.max(-loss, (1 + PG_CLIP * 2) * adv), loss)
    return agg_seq_mean_token_mean(loss, response_mask, sample_weights) + kl_loss * KL_COEF


def random_rows(seed, groups=3, group_size=4, prompt=7, response=9):
    """ROLL-layout rows and our split of the same numbers: left-padded prompts, right-padded responses of unequal
    lengths, one fully masked response, junk (huge finite values) wherever a mask is 0."""
    torch.manual_seed(seed)
    n = groups * group_size
    width = prompt + response
    prompt_lengths = torch.randint(2, prompt + 1, (groups,)).repeat_interleave(group_size)
    response_lengths = torch.randint(1, response + 1, (n,))
    columns = torch.arange(width)
    attention = ((columns >= prompt - prompt_lengths[:, None]) & (columns < prompt + response_lengths[:, None])).long()
    response_mask = attention[:, prompt:].clone()
    response_mask[5] = 0  # masked out (overlong filtering): the row keeps its prompt
    token_logprobs = -torch.rand(n, width, dtype=torch.float64) * 3
    # One forward scores each row, so the G rows of a group carry the same prompt log-probs.
    token_logprobs[:, :prompt] = token_logprobs[::group_size, :prompt].repeat_interleave(group_size, 0)
    token_logprobs[attention == 0] = 1e4
    reference = token_logprobs[:, :prompt].detach() + 0.4 * torch.randn(n, prompt, dtype=torch.float64)
    reference = reference[::group_size].repeat_interleave(group_size, 0)  # the G rows of a group share a prompt
    old = token_logprobs[:, prompt:].detach() + 0.5 * torch.randn(n, response, dtype=torch.float64)
    advantages = obj.group_advantages(torch.randint(0, 2, (n,)).double(), group_size, "grpo").double()
    return token_logprobs, attention, response_mask, reference, old, advantages, prompt, group_size


def our_loss(token_logprobs, attention, response_mask, reference, old, advantages, prompt, group_size, splits):
    """`erpo_released` through `objectives.rl_loss`, summed over micro-batches with the step's global counts."""
    query_lp, query_mask, response_lp, _ = obj.split_prompt_response(token_logprobs, attention, prompt)
    leaders = torch.arange(len(attention)) % group_size == 0
    nll = -(query_lp.detach() * query_mask)[leaders].sum(-1)  # the module's `_step_query_weights`
    weights = obj.query_weights(nll, nll.mean(), None).repeat_interleave(group_size)
    normalizers = obj.loss_normalizers(response_mask, query_mask, leaders)
    # The released code has no Query-KL tolerance (its reference is rescored in the training batch's own shapes).
    released = replace(ALGORITHMS["erpo_released"], query_kl_tolerance=0.0)
    total, dual = 0.0, 0.0
    for rows in torch.tensor_split(torch.arange(len(attention)), splits):
        loss, stats = obj.rl_loss(
            released, response_lp[rows], old[rows], advantages[rows], response_mask[rows],
            query_lp[rows], reference[rows], query_mask[rows], leaders[rows], seq_weights=weights[rows],
            normalizers=normalizers,
        )  # fmt: skip
        total, dual = total + loss, dual + stats.pg_stats["dual_clip_frac"]
    return total, dual


def roll_layout(token_logprobs, attention, response_mask, reference, old, prompt):
    """The same numbers in ROLL's layout: column t of [N, L-1] scores token t+1; masks shifted by one."""
    log_probs = token_logprobs[:, 1:]
    # A scored prompt token is a real one after a real one (ROLL's prompts start at column 0; ours are left-padded).
    scored = attention[:, 1:prompt] * attention[:, : prompt - 1]
    prompt_mask = torch.cat([scored, torch.zeros_like(response_mask)], 1).double()
    final_response_mask = torch.cat([torch.zeros_like(attention[:, 1:prompt]), response_mask], 1).double()
    ref = torch.cat([reference[:, 1:], torch.zeros_like(old)], 1)
    old_full = torch.cat([log_probs[:, : prompt - 1].detach(), old], 1)
    return log_probs, old_full, ref, prompt_mask, final_response_mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("splits", [1, 3])
def test_erpo_released_equals_the_released_formulas(seed, splits):
    token_logprobs, attention, response_mask, reference, old, advantages, prompt, group_size = random_rows(seed)
    ours_lp = token_logprobs.clone().requires_grad_()
    ours, dual = our_loss(ours_lp, attention, response_mask, reference, old, advantages, prompt, group_size, splits)
    ours.backward()
    theirs_lp = token_logprobs.clone().requires_grad_()
    log_probs, old_full, ref, prompt_mask, final_mask = roll_layout(
        theirs_lp, attention, response_mask, reference, old, prompt
    )
    real = (prompt_mask + final_mask) > 0
    log_probs = torch.where(real, log_probs, 0.0)  # ROLL's log-probs are of real tokens; ours carry junk there
    theirs = released_loss(log_probs, torch.where(real, old_full, 0.0), ref, advantages, prompt_mask, final_mask)
    theirs.backward()
    assert dual > 0  # the dual clip is exercised
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6, rel=1e-6)
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad, atol=1e-6, rtol=1e-6)
    assert ours_lp.grad[5, prompt:].abs().sum() == 0 and ours_lp.grad[5, 1:prompt].abs().sum() > 0


def test_erpo_released_preset_fields():
    released = ALGORITHMS["erpo_released"]
    assert released.loss_aggregation == "seq_mean_token_mean" and released.dual_clip == pytest.approx(1.4)
    assert (released.query_kl_estimator, released.query_kl_aggregation, released.query_kl_coef) == (
        "token_k3",
        "like_pg",
        0.01,
    )
    assert (released.kl_clamp_mode, released.kl_clamp) == ("value", 10.0)
    assert (released.query_weight_source, released.query_weight_norm, released.query_weight_clip) == (
        "current",
        "batch",
        None,
    )
    assert released.weight_decay == 0.01 and released.clip_low == 0.2 and released.clip_high is None


def test_module_erpo_released_loss_and_gradients_equal_the_restatement(tiny_model_path, tiny_model):
    """The module on the tiny model (2 micro-batches, a masked row, weights from the current policy before the step)
    against the re-statement on per-row unpadded forwards of an untouched copy of the same model."""
    reference = ReferenceLogprobs(tiny_model, PROMPTS)
    shifted = copy.deepcopy(reference)
    shifted.rows = [row + 0.05 for row in reference.rows]
    batch = rollout_batch(tiny_model)
    batch.response_mask[1] = 0
    module = ERPOModule(
        str(tiny_model_path), algorithm="erpo_released", learning_rate=1e-3,
        micro_batch_tokens=18, gradient_clip_norm=None, query_kl_tolerance=0.0,
    )  # fmt: skip
    module.reference_cache = shifted
    grads = {}

    class CaptureGradients(L.Callback):
        def on_train_start(self, trainer, pl_module):
            def capture(optimizer, args, kwargs):
                grads.update({n: p.grad.clone() for n, p in pl_module.policy.named_parameters() if p.grad is not None})

            trainer.optimizers[0].register_step_pre_hook(capture)

    trainer = fit_one_batch(module, batch, callbacks=[CaptureGradients()])
    assert trainer.optimizers[0].param_groups[0]["weight_decay"] == 0.01

    model = copy.deepcopy(tiny_model)
    rows = []
    for i, response in enumerate(RESPONSES):
        prompt = PROMPTS[i // 2]
        ids = torch.tensor([prompt + response])
        logits = model(ids).logits[0, :-1].float()
        scale = torch.cat([torch.ones(len(prompt) - 1), torch.full((len(response),), 1 / TEMPERATURE)])
        lp = torch.log_softmax(logits * scale[:, None], -1).gather(-1, ids[0, 1:, None])[:, 0]
        ref = torch.cat([shifted.rows[i // 2][1:], torch.zeros(len(response))])
        prompt_mask = torch.cat([torch.ones(len(prompt) - 1), torch.zeros(len(response))])
        rows.append((lp, ref, prompt_mask, (1 - prompt_mask) * float(i != 1)))
    width = max(len(r[0]) for r in rows)
    log_probs, ref, prompt_mask, response_mask = (
        torch.stack([torch.nn.functional.pad(r[k], (0, width - len(r[k]))) for r in rows]) for k in range(4)
    )
    advantages = obj.group_advantages(torch.tensor(REWARDS), 2, "grpo")
    expected = released_loss(log_probs, log_probs.detach(), ref, advantages, prompt_mask, response_mask)
    expected.backward()
    assert trainer.callback_metrics["train/loss"].item() == pytest.approx(expected.item(), abs=2e-6)
    assert set(grads) == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad, atol=2e-6, rtol=1e-4, msg=name)
