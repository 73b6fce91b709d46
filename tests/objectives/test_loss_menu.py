"""The loss menu (issue 70): GSPO's sequence ratio, CISPO's truncated weight and the entropy controls, by hand and
in their on-policy reductions, composed with Query-KL and w(q), and through the update unit on a tiny model.

Tolerances: float64 hand cases 1e-12; float32 reductions and step gradients 1e-6 absolute (float rounding of
sums of a few dozen terms; the compared quantities are of order 0.1 to 1).
"""

from dataclasses import replace
from typing import get_args

import pytest
import torch
from helpers.module_steps import PROMPTS, TEMPERATURE
from helpers.step_runs import LayoutScores, prepared, step

from erpo_lightning import objectives as obj
from erpo_lightning.objectives.algorithms import ALGORITHMS, Algorithm, resolve_algorithm
from erpo_lightning.scoring.logprobs import causal_lm_logits
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

AGGREGATIONS = get_args(obj.AggregationMode)
NEW_PRESETS = ("gspo", "gspo_erpo", "cispo", "cispo_erpo")


def batch(seed: int = 0, dtype=torch.float32):
    """Random [4, 5] log-probs (a leaf with gradient), a mask of ragged lengths (5, 2, 3, 1 tokens) and advantages
    of both signs."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(4, 5, generator=generator, dtype=dtype) * 3).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=dtype)
    return logprobs, mask, advantages


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """d loss / d leaf, zeros where the loss does not read the leaf."""
    return torch.autograd.grad(loss, leaf, retain_graph=True, allow_unused=True, materialize_grads=True)[0]


# ---------------------------------------------------------------------------------------------------- GSPO by hand
def test_the_sequence_ratio_is_the_length_normalised_mean_log_ratio():
    logprobs = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -9.0, -9.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -2.1, 3.0], [-0.25, 4.0, 4.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_s = obj.importance_log_ratio(logprobs, old, mask, "sequence")
    expected = torch.tensor([[0.3, 0.3, 0.0], [-0.25, 0.0, 0.0]], dtype=torch.float64)  # (0.5 + 0.1) / 2; -0.25
    torch.testing.assert_close(log_s, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(obj.importance_log_ratio(logprobs, old, mask), torch.tensor(
        [[0.5, 0.1, 0.0], [-0.25, 0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)  # fmt: skip


def test_gspo_clips_the_sequence_ratio_with_its_own_range_by_hand():
    """One response of two tokens, A = 1, s = exp(0.3) = 1.35: clipped at 1 + 4e-4, so the loss is -(1 + 4e-4) per
    token and no gradient passes; with A = -1 the unclipped branch wins: loss s, gradient s / 2 per token."""
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.5, -2.1]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    s = torch.exp(torch.tensor(0.3, dtype=torch.float64))
    loss, stats = obj.policy_gradient_loss(logprobs, old, torch.tensor([1.0]), mask, 3e-4, 4e-4, None, "sequence")
    torch.testing.assert_close(loss, torch.full((1, 2), -(1 + 4e-4), dtype=torch.float64), rtol=0, atol=1e-12)
    assert stats["clip_frac_high"] == 1.0 and stats["seq_ratio_dev"].item() == pytest.approx(s.item() - 1, abs=1e-12)
    assert grad_of(loss.sum(), logprobs).abs().max() == 0
    loss, _ = obj.policy_gradient_loss(logprobs, old, torch.tensor([-1.0]), mask, 3e-4, 4e-4, None, "sequence")
    torch.testing.assert_close(loss, torch.stack([s, s]).unsqueeze(0), rtol=0, atol=1e-12)
    # d/dlogπ_t of Σ_t s = 2 · s · (1/2)
    torch.testing.assert_close(grad_of(loss.sum(), logprobs), torch.stack([s, s]).unsqueeze(0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_on_policy_ratio_is_one_and_its_gradient_is_the_token_level_one(aggregation):
    logprobs, mask, advantages = batch()
    old = logprobs.detach()
    assert (obj.importance_log_ratio(logprobs, old, mask, "sequence") == 0).all()
    grads = {}
    for level in ("token", "sequence"):
        per_token, stats = obj.policy_gradient_loss(logprobs, old, advantages, mask, ratio_level=level)
        assert stats["ratio_mean"] == 1.0
        grads[level] = grad_of(obj.aggregate(per_token, mask, aggregation, constant=5.0), logprobs)
    torch.testing.assert_close(grads["sequence"], grads["token"], rtol=0, atol=1e-7)
    # and that is REINFORCE's -A ∇log π, aggregated
    reinforce = obj.aggregate(-advantages[:, None] * logprobs, mask, aggregation, constant=5.0)
    torch.testing.assert_close(grads["token"], grad_of(reinforce, logprobs), rtol=0, atol=1e-7)


# --------------------------------------------------------------------------------------------------- CISPO by hand
def test_cispo_truncates_the_weight_and_stops_its_gradient_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - torch.log(torch.tensor([[0.5, 3.0, 1.0]], dtype=torch.float64))  # r = 0.5, 3, 1
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = obj.cispo_loss(logprobs, old, torch.tensor([2.0]), mask, weight_cap=2.0)
    # weights 0.5 and min(3, 2) = 2; loss_t = -w A log π_t; padding 0
    torch.testing.assert_close(loss, torch.tensor([[0.5 * 2 * 1.0, 2 * 2 * 2.0, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-12)  # fmt: skip
    torch.testing.assert_close(grad_of(loss.sum(), logprobs), torch.tensor([[-1.0, -4.0, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-12)  # fmt: skip
    assert stats["cispo_truncated_frac"].item() == 0.5  # one of the two real tokens


@pytest.mark.parametrize("level", get_args(obj.RatioLevel))
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_cispo_on_policy_weight_is_one_and_its_gradient_is_reinforce(aggregation, level):
    logprobs, mask, advantages = batch(1)
    per_token, stats = obj.cispo_loss(logprobs, logprobs.detach(), advantages, mask, 1.0, level)
    assert stats["ratio_mean"] == 1.0 and stats["cispo_truncated_frac"] == 0  # r = 1, not above a cap of 1
    cispo = grad_of(obj.aggregate(per_token, mask, aggregation, constant=5.0), logprobs)
    ppo, _ = obj.policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask)
    torch.testing.assert_close(cispo, grad_of(obj.aggregate(ppo, mask, aggregation, constant=5.0), logprobs),
                               rtol=0, atol=1e-7)  # fmt: skip


# ------------------------------------------------------------------------------------------------ entropy controls
@pytest.mark.parametrize("fused", [False, True])
def test_token_entropy_and_its_gradient_equal_the_plain_formula(fused):
    generator = torch.Generator().manual_seed(3)
    scale = torch.tensor([1.0, 1.0, 1 / 0.7, 1 / 0.7, 1 / 0.7])
    x = torch.randn(2, 5, 4 if fused else 11, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, generator=generator, dtype=torch.float64, requires_grad=True) if fused else None
    leaves = (x, weight) if fused else (x,)
    ours = obj.token_entropy(x, scale, weight, chunk_elements=22)  # 2 positions a chunk: chunks cut the rows
    logits = x @ weight.T if fused else x
    log_p = torch.log_softmax(logits * scale.double()[None, :, None], -1)
    plain = -(log_p.exp() * log_p).sum(-1)
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12)
    upstream = torch.randn(2, 5, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((ours * upstream).sum(), leaves),
                    torch.autograd.grad((plain * upstream).sum(), leaves), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_high_entropy_mask_keeps_the_top_share_by_hand():
    entropy = torch.tensor([[1.0, 4.0, 9.0], [2.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # real: 1, 4, 2, 3, 0; the 9 is padding
    # 0.5-quantile of [0, 1, 2, 3, 4] is 2: keep 4, 2, 3
    assert obj.high_entropy_mask(entropy, mask, 0.5).tolist() == [[False, True, False], [True, True, False]]
    assert obj.high_entropy_mask(entropy, mask, 0.0).tolist() == [[False, True, False], [False, False, False]]
    assert obj.high_entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()


def entropy_rows(seed=4):
    """[4, 5] per-token entropy with gradient, from logits [4, 5, 7] (a leaf)."""
    logits = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    return logits, obj.token_entropy(logits)


def settings(**changes) -> Algorithm:
    return replace(ALGORITHMS["grpo"], **changes)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_the_entropy_bonus_gradient_is_minus_coef_times_the_mean_entropy_gradient(aggregation):
    logprobs, mask, advantages = batch(2)
    logits, entropy = entropy_rows()
    leader = torch.tensor([True, False, True, False])
    no_query = (None, None, torch.zeros(4, 1), leader)
    common = dict(constant=5.0, entropy=entropy)
    base, _ = obj.rl_loss(settings(loss_aggregation=aggregation), logprobs, logprobs.detach(), advantages, mask,
                          *no_query, **common)  # fmt: skip
    bonus, stats = obj.rl_loss(settings(loss_aggregation=aggregation, entropy_coef=0.03), logprobs,
                               logprobs.detach(), advantages, mask, *no_query, **common)  # fmt: skip
    mean_entropy = (entropy * mask).sum() / mask.sum()
    torch.testing.assert_close(bonus, base - 0.03 * mean_entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad_of(bonus, logits) - grad_of(base, logits), -0.03 * grad_of(mean_entropy, logits),
                               rtol=0, atol=1e-7)  # fmt: skip
    torch.testing.assert_close(grad_of(bonus, logprobs), grad_of(base, logprobs), rtol=0, atol=0)
    assert stats.pg_stats["entropy_bonus"].item() == pytest.approx(0.03 * mean_entropy.item(), abs=1e-6)


def test_the_masked_policy_gradient_and_bonus_act_on_the_high_entropy_tokens():
    logprobs, mask, advantages = batch(3)
    _, entropy = entropy_rows(5)
    entropy = entropy.detach()
    leader = torch.tensor([True, False, True, False])
    loss, stats = obj.rl_loss(
        settings(entropy_top_fraction=0.4, entropy_coef=0.1), logprobs, logprobs.detach(), advantages, mask, None,
        None, torch.zeros(4, 1), leader, entropy=entropy.requires_grad_(),
    )  # fmt: skip
    kept = obj.high_entropy_mask(entropy, mask, 0.4)
    assert 0 < kept.sum() < mask.sum()
    # token_mean over all response tokens (the denominator keeps the dropped ones), PG on the kept ones only
    reinforce = (-advantages[:, None] * logprobs * kept).sum() / mask.sum()
    torch.testing.assert_close(grad_of(loss, logprobs), grad_of(reinforce, logprobs), rtol=0, atol=1e-7)
    kept_mean = entropy[kept].mean()
    assert stats.pg_stats["entropy_kept_frac"].item() == pytest.approx((kept.sum() / mask.sum()).item())
    assert stats.pg_stats["bonus_entropy"].item() == pytest.approx(kept_mean.item(), abs=1e-6)


def test_the_entropy_controls_need_an_entropy():
    logprobs, mask, advantages = batch()
    for changes in ({"entropy_coef": 0.1}, {"entropy_top_fraction": 0.2}, {"entropy_target": 1.0}):
        with pytest.raises(ValueError, match="entropy"):
            obj.rl_loss(settings(**changes), logprobs, logprobs.detach(), advantages, mask, None, None,
                        torch.zeros(4, 1), torch.ones(4, dtype=torch.bool))  # fmt: skip


def test_the_adaptive_coefficient_steps_toward_the_target_by_hand():
    control = obj.EntropyControl.of(settings(entropy_coef=0.01, entropy_target=0.5, entropy_coef_delta=0.01,
                                             entropy_coef_range=(0.0, 0.025)))  # fmt: skip
    assert control.applied == 0.0  # nothing measured yet: inf > target
    control.update(0.4)  # below the target: up, and applied
    assert control.coef == pytest.approx(0.02) and control.applied == pytest.approx(0.02)
    control.update(0.3)  # up again, to the cap
    assert control.coef == pytest.approx(0.025)
    control.update(0.9)  # above: down, and not applied
    assert control.coef == pytest.approx(0.015) and control.applied == 0.0
    restored = obj.EntropyControl.of(settings(entropy_target=0.5))
    restored.load_state_dict(control.state_dict())
    assert (restored.coef, restored.last_entropy) == (control.coef, control.last_entropy)
    static = obj.EntropyControl.of(settings(entropy_coef=0.02))
    static.update(0.0)
    assert static.applied == 0.02


# ------------------------------------------------------------------------------------------ settings and presets
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cispo_weight_cap": 0.5}, "cispo_weight_cap must be >= 1"),
        ({"cispo_weight_cap": float("nan")}, "cispo_weight_cap"),
        ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip"),
        ({"sequence_clip_low": -1e-4}, "sequence_clip_low"),
        ({"sequence_clip_high": float("nan")}, "sequence_clip_high"),
        ({"ratio_level": "group"}, "ratio_level"),
        ({"policy_loss": "sapo"}, "policy_loss"),
        ({"entropy_coef": -0.1}, "entropy_coef"),
        ({"entropy_coef": float("inf")}, "entropy_coef"),
        ({"entropy_target": -1.0}, "entropy_target"),
        ({"entropy_coef_range": (0.5, 0.1)}, "entropy_coef_range"),
        ({"entropy_top_fraction": 1.5}, "entropy_top_fraction"),
        ({"entropy_top_fraction": float("nan")}, "entropy_top_fraction"),
    ],
)
def test_out_of_range_loss_menu_settings_are_refused_naming_them(changes, message):
    with pytest.raises(ValueError, match=message):
        resolve_algorithm("erpo", **changes)


def test_the_new_presets_are_their_estimators_on_grpo_or_erpo():
    for name in NEW_PRESETS:
        algorithm, base = ALGORITHMS[name], ALGORITHMS["erpo" if name.endswith("_erpo") else "grpo"]
        if name.startswith("gspo"):
            assert replace(base, ratio_level="sequence", loss_aggregation="seq_mean_token_mean") == algorithm
        else:
            assert replace(base, policy_loss="cispo") == algorithm
    assert ALGORITHMS["gspo"].sequence_clip_low == 3e-4 and ALGORITHMS["gspo"].sequence_clip_high == 4e-4
    assert resolve_algorithm("gspo", entropy_coef=0.01).entropy_coef == 0.01  # the bonus composes with any preset


@pytest.mark.parametrize("preset", ["gspo_erpo", "cispo_erpo"])
def test_query_kl_and_query_weights_compose_with_the_new_surrogates(preset):
    """Off-policy: the ERPO preset's loss is its surrogate weighted by w(q) plus α · Query-KL, term by term."""
    logprobs, mask, advantages = batch(6)
    old = logprobs.detach() + 0.2 * torch.randn(4, 5, generator=torch.Generator().manual_seed(7))
    query = torch.randn(4, 3, generator=torch.Generator().manual_seed(8)) - 2
    query = query.requires_grad_()
    ref_query, query_mask = query.detach() + 0.3, torch.ones(4, 3)
    leader = torch.tensor([True, False, True, False])
    weights = torch.tensor([1.5, 1.5, 0.5, 0.5])
    algorithm = ALGORITHMS[preset]
    loss, _ = obj.rl_loss(algorithm, logprobs, old, advantages, mask, query, ref_query, query_mask, leader, weights)
    plain, _ = obj.rl_loss(replace(algorithm, query_kl_coef=0.0), logprobs, old, advantages, mask, query, ref_query,
                           query_mask, leader)  # fmt: skip
    if algorithm.policy_loss == "cispo":
        per_token, _ = obj.cispo_loss(logprobs, old, advantages, mask, algorithm.cispo_weight_cap)
    else:
        per_token, _ = obj.policy_gradient_loss(logprobs, old, advantages, mask, 3e-4, 4e-4, None, "sequence")
    torch.testing.assert_close(plain, obj.aggregate(per_token, mask, algorithm.loss_aggregation), rtol=0, atol=1e-6)
    normalizers = obj.loss_normalizers(mask, query_mask, leader)
    query_term = obj.query_kl_loss(algorithm, query[leader], ref_query[leader], query_mask[leader], normalizers)
    weighted = obj.aggregate(per_token, mask, algorithm.loss_aggregation, weights)
    torch.testing.assert_close(loss, weighted + algorithm.query_kl_coef * query_term, rtol=0, atol=1e-6)
    assert grad_of(loss, query).abs().max() > 0


# ------------------------------------------------------------------------------------- through the update unit
def plain_mean_entropy(model, batch_rows) -> torch.Tensor:
    """H̄ over the step's response tokens, from a plain forward of all its logits (no chunking, no fusing)."""
    logits = causal_lm_logits(model, batch_rows.input_ids, batch_rows.attention_mask).float()
    width = batch_rows.prompt_length
    window = logits[:, width - 1 : -1] / TEMPERATURE
    log_p = torch.log_softmax(window, -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    mask = batch_rows.response_mask
    return (entropy * mask).sum() / mask.sum()


@pytest.mark.parametrize(("share_prompt", "fused_output", "max_tokens"),
                         [(False, False, 1000), (False, True, 12), (True, False, 12)])  # fmt: skip
def test_the_steps_entropy_bonus_gradient_is_minus_coef_times_the_entropy_gradient(
    tiny_model_path, share_prompt, fused_output, max_tokens
):
    """Through `update.accumulate_gradients` (exact pass or shared prompt, output layer fused or not, one or several
    micro-batches): the bonus adds exactly -c ∇H̄ to the step's gradient, H̄ the step's mean response entropy."""
    model = load_tiny_model(tiny_model_path)
    cache = LayoutScores(model, PROMPTS)
    algorithm = ALGORITHMS["erpo"]
    rows = prepared(model, cache, algorithm)
    base, _ = step(model, algorithm, rows, cache, max_tokens, share_prompt, fused_output=fused_output)
    bonus, stats = step(model, replace(algorithm, entropy_coef=0.05), rows, cache, max_tokens, share_prompt,
                        fused_output=fused_output)  # fmt: skip
    model.zero_grad(set_to_none=True)
    mean_entropy = plain_mean_entropy(model, rows)
    mean_entropy.backward()
    for name, parameter in model.named_parameters():
        expected = base[name] - 0.05 * parameter.grad
        torch.testing.assert_close(bonus[name], expected, rtol=0, atol=1e-6, msg=name)
    tokens = [micro.response_mask.sum() for micro, _ in stats.micro]
    logged = sum(s.pg_stats["bonus_entropy"] * n for (_, s), n in zip(stats.micro, tokens, strict=True))
    assert (logged / sum(tokens)).item() == pytest.approx(mean_entropy.item(), abs=1e-5)
