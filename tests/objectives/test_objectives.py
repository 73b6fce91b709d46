"""The objectives against hand computation and invariants."""

import math
from dataclasses import replace

import pytest
import torch

from erpo_lightning import objectives as obj


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    grpo = obj.group_advantages(rewards, 4, "grpo")
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / torch.tensor([std + 1e-6] * 4 + [1.0] * 4)
    torch.testing.assert_close(grpo, expected)
    trl_eps = obj.group_advantages(rewards, 4, "grpo", eps=1e-4)  # TRL's (model.advantage_eps: 1e-4)
    assert trl_eps[0].item() == pytest.approx(0.5 / (std + 1e-4), rel=1e-6) and trl_eps[0] < grpo[0]
    torch.testing.assert_close(
        obj.group_advantages(rewards, 4, "dr_grpo"), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    )
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3 ; 0 - mean(1, 0, 1) = -2/3
    torch.testing.assert_close(
        obj.group_advantages(rewards, 4, "rloo"), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0])
    )
    torch.testing.assert_close(obj.group_advantages(rewards, 4, "reinforce"), rewards - 0.75)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "dr_grpo"])
def test_group_advantages_sum_to_zero_and_constant_groups_are_zero(estimator):
    torch.manual_seed(0)
    rewards = torch.rand(6 * 5)
    rewards[10:15] = 0.7  # one constant group
    advantages = obj.group_advantages(rewards, 5, estimator)
    torch.testing.assert_close(advantages.view(6, 5).sum(1), torch.zeros(6), atol=1e-5, rtol=0)
    assert torch.equal(advantages[10:15], torch.zeros(5))
    assert torch.isfinite(advantages).all()


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        obj.group_advantages(torch.zeros(7), 4)
    for estimator in ("grpo", "dr_grpo", "rloo"):  # a group of one has no baseline; the error names the estimator
        with pytest.raises(ValueError, match=f"group_size must be >= 2 with the '{estimator}' advantage estimator"):
            obj.group_advantages(torch.zeros(4), 1, estimator)
    reinforce = obj.group_advantages(torch.tensor([1.0, 3.0]), 1, "reinforce")  # groups play no part: r - batch mean
    torch.testing.assert_close(reinforce, torch.tensor([-1.0, 1.0]))
    with pytest.raises(ValueError, match="unknown estimator"):
        obj.group_advantages(torch.zeros(4), 2, "ppo")


def test_policy_gradient_loss_by_hand():
    # One token per sequence; ratios 1.5, 0.5, 5.0, 1.0 with advantages 1, -1, -1, 2.
    old = torch.zeros(4, 1)
    logprobs = torch.log(torch.tensor([[1.5], [0.5], [5.0], [1.0]]))
    advantages = torch.tensor([1.0, -1.0, -1.0, 2.0])
    mask = torch.ones(4, 1)
    loss, stats = obj.policy_gradient_loss(logprobs, old, advantages, mask, clip_low=0.2)
    # -min(1.5, 1.2) ; -min(-0.5, -0.8) ; -min(-5, -1.2) ; -min(2, 2)
    torch.testing.assert_close(loss[:, 0], torch.tensor([-1.2, 0.8, 5.0, -2.0]))
    assert stats["clip_frac_high"].item() == pytest.approx(0.25)
    assert stats["clip_frac_low"].item() == pytest.approx(0.25)  # ratio 0.5 < 0.8 with A < 0
    loss, stats = obj.policy_gradient_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(loss[:, 0], torch.tensor([-1.28, 0.8, 3.0, -2.0]))
    assert stats["dual_clip_frac"].item() == pytest.approx(0.25)


def test_policy_gradient_on_policy_gradient_is_reinforce():
    torch.manual_seed(0)
    logprobs = torch.randn(3, 5, requires_grad=True)
    advantages = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    loss, _ = obj.policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask)
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, -advantages[:, None] * mask)


def test_aggregate_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    weights = torch.tensor([2.0, 0.5])
    assert obj.aggregate(per_token, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert obj.aggregate(per_token, mask, "token_mean", seq_weights=weights).item() == pytest.approx((12 + 2) / 4)
    assert obj.aggregate(per_token, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert obj.aggregate(per_token, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert obj.aggregate(per_token, mask, "seq_sum_constant", constant=5).item() == pytest.approx((6 + 4) / 2 / 5)
    assert obj.aggregate(per_token, mask, "token_mean", normalizer=8).item() == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="constant"):
        obj.aggregate(per_token, mask, "seq_sum_constant")


def test_token_mean_equals_flat_masked_mean():
    torch.manual_seed(1)
    per_token = torch.randn(5, 7)
    mask = (torch.rand(5, 7) > 0.3).float()
    flat = per_token[mask.bool()]
    torch.testing.assert_close(obj.aggregate(per_token, mask, "token_mean"), flat.mean())


def test_micro_batches_with_global_normalizer_sum_to_full_batch_loss():
    torch.manual_seed(2)
    per_token = torch.randn(8, 6)
    mask = (torch.rand(8, 6) > 0.4).float()
    full = obj.aggregate(per_token, mask, "token_mean")
    parts = sum(
        obj.aggregate(per_token[i : i + 3], mask[i : i + 3], "token_mean", normalizer=mask.sum()) for i in (0, 3, 6)
    )
    torch.testing.assert_close(parts, full)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_padding_never_changes_a_result(mode):
    torch.manual_seed(3)
    logprobs = -torch.rand(4, 5)
    old = logprobs + 0.1 * torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    advantages = torch.tensor([1.0, -1.0, 0.5, 2.0])
    loss, stats = obj.policy_gradient_loss(logprobs, old, advantages, mask)
    value = obj.aggregate(loss, mask, mode)
    # Three more padding columns, and junk (huge finite values) under every padded position.
    junk = 1e4 * torch.ones(4, 3)
    padded_mask = torch.cat([mask, torch.zeros(4, 3)], 1)
    padded_lp = torch.where(padded_mask.bool(), torch.cat([logprobs, junk], 1), 1e4)
    padded_old = torch.where(padded_mask.bool(), torch.cat([old, -junk], 1), -1e4)
    padded_loss, padded_stats = obj.policy_gradient_loss(padded_lp, padded_old, advantages, padded_mask)
    torch.testing.assert_close(obj.aggregate(padded_loss, padded_mask, mode), value)
    for key in stats:
        torch.testing.assert_close(padded_stats[key], stats[key])


def test_kl_penalty_by_hand():
    logprobs = torch.tensor([-1.0, -2.0, -30.0])
    ref = torch.tensor([-1.5, -1.0, -1.0])
    torch.testing.assert_close(obj.kl_penalty(logprobs, ref, "k1"), torch.tensor([0.5, -1.0, -29.0]))
    torch.testing.assert_close(obj.kl_penalty(logprobs, ref, "k2"), torch.tensor([0.125, 0.5, 420.5]))
    delta = torch.tensor([-0.5, 1.0, 10.0])  # ref - logp, the last clamped from 29 to 10
    torch.testing.assert_close(obj.kl_penalty(logprobs, ref, "k3", "log_ratio"), torch.exp(delta) - delta - 1)
    k3 = torch.exp(delta[:2]) - delta[:2] - 1
    # the default (released code): the value is clamped, k3(29) = e^29 - 30 becomes 10
    torch.testing.assert_close(obj.kl_penalty(logprobs, ref, "k3"), torch.cat([k3, torch.tensor([10.0])]))


def test_query_kl_by_hand():
    current = torch.tensor([[0.0, -1.0, -2.0], [0.0, 0.0, -3.0]])  # row 1 has one left-pad column
    reference = torch.tensor([[0.0, -1.5, -2.0], [0.0, 0.0, -2.0]])
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    token = ((k3(-0.5) + k3(0.0)) / 2 + k3(1.0)) / 2
    sequence = (k3(-0.5) + k3(1.0)) / 2
    assert obj.query_kl(current, reference, mask, "token_k3").item() == pytest.approx(token, rel=1e-6)
    assert obj.query_kl(current, reference, mask, "sequence_k3").item() == pytest.approx(sequence, rel=1e-6)
    assert obj.query_kl(current, reference, mask, "token_k3", normalizer=4).item() == pytest.approx(token / 2, rel=1e-6)


@pytest.mark.parametrize("estimator", ["token_k3", "sequence_k3"])
def test_query_kl_is_zero_at_reference_and_grows_with_drift(estimator):
    torch.manual_seed(4)
    reference = -torch.rand(6, 10) * 3
    mask = (torch.rand(6, 10) > 0.2).float()
    assert obj.query_kl(reference.clone(), reference, mask, estimator).item() == 0.0
    drift = torch.randn(6, 10)
    values = [obj.query_kl(reference + scale * drift, reference, mask, estimator).item() for scale in (0.01, 0.1, 0.5)]
    assert 0 < values[0] < values[1] < values[2]


@pytest.mark.parametrize("estimator", ["token_k3", "sequence_k3"])
def test_query_kl_gradient_flows_only_through_query_logprobs(estimator):
    """Query-KL computed from one [prompt; response] log-prob tensor: zero gradient on every response position."""
    torch.manual_seed(5)
    group_size, prompt_length = 3, 4
    token_logprobs = (-torch.rand(6, 9)).requires_grad_()
    attention_mask = torch.ones(6, 9, dtype=torch.long)
    attention_mask[3:, :1] = 0  # second query's prompt is left-padded by one
    attention_mask[1, 7:] = 0  # a short response
    query_lp, query_mask, response_lp, response_mask = obj.split_prompt_response(
        token_logprobs, attention_mask, prompt_length
    )
    unique = slice(0, None, group_size)  # one row per query
    reference = query_lp[unique].detach() - 0.3
    loss = obj.query_kl(query_lp[unique], reference, query_mask[unique], estimator)
    loss.backward()
    grad = token_logprobs.grad
    assert torch.equal(grad[:, prompt_length:], torch.zeros_like(grad[:, prompt_length:]))
    assert (grad[0, 1:prompt_length] != 0).all() and (grad[3, 2:prompt_length] != 0).all()
    assert torch.equal(grad[:, 0], torch.zeros(6)) and grad[3, 1] == 0  # unscored first tokens and padding
    assert torch.equal(grad[[1, 2, 4, 5]], torch.zeros(4, 9))  # the duplicate rows of each group do not count


def test_query_weights_by_hand_and_invariants():
    nll = torch.tensor([10.0, 20.0, 40.0, 2.0])
    weights = obj.query_weights(nll, 20.0)
    torch.testing.assert_close(weights, torch.tensor([2.0, 1.0, 0.5, 2.0]))  # 20/2 = 10 clipped to 2
    torch.testing.assert_close(obj.query_weights(torch.full((5,), 7.0), 7.0), torch.ones(5))
    torch.manual_seed(6)
    random_nll = torch.rand(100) * 50 + 0.1
    weights = obj.query_weights(random_nll, random_nll.mean(), clip=(0.25, 1.5))
    assert weights.min() >= 0.25 and weights.max() <= 1.5
    torch.testing.assert_close(obj.query_weights(nll, nll.mean(), None), 18.0 / nll)  # released: batch mean, no clip
    assert obj.query_weights(torch.tensor([0.0]), 5.0).item() == 2.0


def test_split_prompt_response_by_hand():
    token_logprobs = torch.arange(12, dtype=torch.float32).view(2, 6)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])
    query_lp, query_mask, response_lp, response_mask = obj.split_prompt_response(token_logprobs, attention_mask, 3)
    assert torch.equal(query_mask, torch.tensor([[0, 1, 1], [0, 0, 1]]))
    assert torch.equal(response_mask, torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert torch.equal(query_lp, token_logprobs[:, :3]) and torch.equal(response_lp, token_logprobs[:, 3:])


# ---------------------------------------------------------------------------------------------------- KL clamps
def _k3(d):
    return math.exp(d) - d - 1


def _root(f, lo, hi):
    """Bisection, independent of the code under test: f(lo) and f(hi) have opposite signs."""
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (f(mid) > 0) == (f(lo) > 0) else (lo, mid)
    return (lo + hi) / 2


K3_HIGH = _root(lambda x: _k3(x) - 10.0, 0.0, 5.0)  # where k3 reaches the value clamp 10: e^x - 1 = 10 + x
K3_LOW = _root(lambda x: _k3(x) - 10.0, -20.0, 0.0)

# (δ = ref - current per token, clamp mode) -> (k3 value, d value / d current) of ONE token, by hand.
TOKEN_K3 = {
    (0.0, "value"): (0.0, 0.0), (0.0, "log_ratio"): (0.0, 0.0), (0.0, "none"): (0.0, 0.0),
    (0.5, "value"): (_k3(0.5), 1 - math.exp(0.5)),
    (0.5, "log_ratio"): (_k3(0.5), 1 - math.exp(0.5)),
    (0.5, "none"): (_k3(0.5), 1 - math.exp(0.5)),
    (5.0, "value"): (10.0, 0.0),  # e^5 - 6 = 142.4 is clamped: no gradient beyond the clamp
    (5.0, "log_ratio"): (_k3(5.0), 1 - math.exp(5.0)),  # 142.41, -147.41: inside ±10 nats
    (5.0, "none"): (_k3(5.0), 1 - math.exp(5.0)),
    (30.0, "value"): (10.0, 0.0),
    (30.0, "log_ratio"): (_k3(10.0), 0.0),  # δ clamped to 10: e^10 - 11 = 22015.5, no gradient
    (30.0, "none"): (_k3(30.0), 1 - math.exp(30.0)),
}  # fmt: skip


def _sequence_expected(total, mode):
    """sequence_k3 of a summed δ by hand: k3 inside the clamp; outside, held value and the slope at the clamp point."""
    low, high = {"value": (K3_LOW, K3_HIGH), "log_ratio": (-10.0, 10.0), "none": (-math.inf, math.inf)}[mode]
    held = min(max(total, low), high)
    return _k3(held), 1 - math.exp(held)  # d/d current = -(e^held - 1)


@pytest.mark.parametrize("delta", [0.0, 0.5, 5.0, 30.0])
@pytest.mark.parametrize("mode", ["value", "log_ratio", "none"])
def test_k3_clamps_single_token_and_token_mean_over_20_tokens(delta, mode):
    value, grad = TOKEN_K3[(delta, mode)]
    current = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    out = obj.kl_penalty(current, torch.tensor([delta], dtype=torch.float64), "k3", mode, 10.0)
    out.sum().backward()
    assert out.item() == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert current.grad.item() == pytest.approx(grad, rel=1e-9, abs=1e-12)
    # token_k3 over 20 tokens each δ off: the mean of 20 equal values; each token's gradient is 1/20 of one token's
    current = torch.zeros(1, 21, dtype=torch.float64, requires_grad=True)
    reference = torch.full((1, 21), delta, dtype=torch.float64)
    mask = torch.ones(1, 21)
    mask[0, 0] = 0  # the unscored first token
    per_query = obj.per_query_kl(current, reference, mask, "token_k3", mode, 10.0)
    per_query.sum().backward()
    assert per_query.item() == pytest.approx(value, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(
        current.grad[0, 1:], torch.full((20,), grad / 20, dtype=torch.float64), rtol=1e-9, atol=0
    )
    assert current.grad[0, 0] == 0


@pytest.mark.parametrize("delta", [0.0, 0.5, 5.0, 30.0])
@pytest.mark.parametrize("mode", ["value", "log_ratio", "none"])
@pytest.mark.parametrize("tokens", [1, 20])
def test_sequence_k3_clamps_single_token_and_summed_over_20_tokens(delta, mode, tokens):
    value, grad = _sequence_expected(delta * tokens, mode)
    current = torch.zeros(1, tokens + 1, dtype=torch.float64, requires_grad=True)
    reference = torch.full((1, tokens + 1), delta, dtype=torch.float64)
    mask = torch.ones(1, tokens + 1)
    mask[0, 0] = 0
    per_query = obj.per_query_kl(current, reference, mask, "sequence_k3", mode, 10.0)
    per_query.sum().backward()
    assert per_query.item() == pytest.approx(value, rel=1e-9, abs=1e-12)
    expected_grad = torch.full((tokens,), grad, dtype=torch.float64)  # dΣδ/d current_t = -1 for every token
    torch.testing.assert_close(current.grad[0, 1:], expected_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", ["value", "log_ratio"])
def test_sequence_k3_keeps_pulling_back_at_20_tokens_of_0_6_nats(mode):
    """The summed drift is 12 nats: the value stays bounded and every token is still pulled towards θ0."""
    current = torch.zeros(1, 21, requires_grad=True)
    reference = torch.full((1, 21), 0.6)
    mask = torch.ones(1, 21)
    mask[0, 0] = 0
    value = obj.per_query_kl(current, reference, mask, "sequence_k3", mode)
    value.sum().backward()
    bound = 10.0 if mode == "value" else _k3(10.0)
    assert value.item() == pytest.approx(bound, rel=1e-5)
    slope = 10.0 + K3_HIGH if mode == "value" else math.exp(10.0) - 1  # e^x - 1 at the clamp point x
    assert (current.grad[0, 1:] < 0).all()  # raising the current log-likelihood lowers the loss: pulled back
    torch.testing.assert_close(current.grad[0, 1:], torch.full((20,), -slope), rtol=1e-5, atol=0)


def test_sequence_k3_is_plain_k3_below_the_clamp_and_zero_at_the_reference():
    delta = torch.tensor([-3.0, -0.2, 0.0, 0.7, 2.5], dtype=torch.float64, requires_grad=True)
    value = obj.sequence_k3(delta)
    value.sum().backward()
    torch.testing.assert_close(value.detach(), torch.expm1(delta.detach()) - delta.detach())
    torch.testing.assert_close(delta.grad, torch.expm1(delta.detach()))
    low, high = obj.k3_level_log_ratios(10.0)
    assert low == pytest.approx(K3_LOW, abs=1e-12) and high == pytest.approx(K3_HIGH, abs=1e-12)


def test_k3_value_clamp_has_no_nan_gradient_where_exp_overflows():
    """ROLL's own k3 gives 0 * inf = NaN past δ ≈ 88 nats in float32; ours keeps the value and a zero gradient."""
    current = torch.tensor([0.0, -200.0], requires_grad=True)
    out = obj.kl_penalty(current, torch.zeros(2), "k3", "value")
    out.sum().backward()
    assert out.tolist() == [0.0, 10.0] and torch.isfinite(current.grad).all()


def test_kl_clamp_options_are_checked():
    with pytest.raises(ValueError, match="clamp mode"):
        obj.kl_penalty(torch.zeros(1), torch.zeros(1), "k3", "values")
    with pytest.raises(ValueError, match="must be > 0"):
        obj.sequence_k3(torch.zeros(1), "value", 0.0)


# ------------------------------------------------------------------------------------------ smaller items of 5
@pytest.mark.parametrize("gap", [100.0, -100.0])
def test_ratio_log_clamp_gives_no_nan(gap):
    """A zero-advantage token 100 nats away from its sampling log-prob: loss 0 and finite gradients, not inf * 0."""
    logprobs = torch.tensor([[gap, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.0]])
    loss, stats = obj.policy_gradient_loss(logprobs, old, torch.tensor([0.0]), torch.ones(1, 2))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and loss.abs().sum() == 0
    assert torch.isfinite(logprobs.grad).all() and all(torch.isfinite(v) for v in stats.values())
    # With A = -1 the unclipped branch is active past 1 + clip: ratio exp(clamp(gap, ±20)), gradient 0 beyond the clamp
    logprobs = torch.tensor([[gap]], requires_grad=True)
    loss, _ = obj.policy_gradient_loss(logprobs, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.sum().backward()
    expected = math.exp(20.0) if gap > 0 else 0.8  # -min(-r, -clip(r)) = max(r, clip(r)) for A = -1
    assert loss.item() == pytest.approx(expected, rel=1e-6) and logprobs.grad.item() == 0.0


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_fully_masked_rows_do_not_count_in_n(mode):
    per_token = torch.tensor([[1.0, 2.0], [4.0, 0.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])  # the last row was masked out by overlong filtering
    expected = {"seq_mean_token_mean": (1.5 + 4.0) / 2, "seq_mean_token_sum": (3.0 + 4.0) / 2}[mode]
    assert obj.aggregate(per_token, mask, mode).item() == pytest.approx(expected)
    assert obj.aggregate(per_token, mask, "seq_sum_constant", constant=4.0).item() == pytest.approx(7.0 / 2 / 4)
    assert obj.loss_normalizers(mask, torch.ones(3, 2), torch.tensor([True, False, True]))["sequences"] == 2


def _rows(n=6, response=5, prompt=4, seed=7):
    torch.manual_seed(seed)
    response_mask = (torch.arange(response) < torch.randint(1, response + 1, (n, 1))).float()
    response_mask[2] = 0  # a fully masked row
    query_mask = torch.ones(n, prompt)
    query_mask[:, 0] = 0
    return {
        "response_logprobs": (-torch.rand(n, response, dtype=torch.float64)).requires_grad_(),
        "old_logprobs": -torch.rand(n, response, dtype=torch.float64),
        "advantages": torch.randn(n, dtype=torch.float64),
        "response_mask": response_mask,
        "query_logprobs": (-torch.rand(n, prompt, dtype=torch.float64)).requires_grad_(),
        "ref_query_logprobs": -torch.rand(n, prompt, dtype=torch.float64),
        "query_mask": query_mask,
        "is_leader": torch.arange(n) % 2 == 0,
    }


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_policy_kl_is_aggregated_like_the_pg_loss(mode):
    rows = _rows()
    reference = rows["response_logprobs"].detach() + 0.3 * torch.randn(6, 5, dtype=torch.float64)
    settings = obj.LossSettings(loss_aggregation=mode, query_kl_coef=0.0, policy_kl_coef=1.0)
    with_kl, stats = obj.rl_loss(settings, **rows, ref_response_logprobs=reference)
    without, _ = obj.rl_loss(replace(settings, policy_kl_coef=0.0), **rows)
    delta = (reference - rows["response_logprobs"].detach()).clamp(max=math.log(22.0))
    k3 = (torch.exp(delta) - delta - 1) * rows["response_mask"]
    mask = rows["response_mask"]
    if mode == "token_mean":
        expected = k3.sum() / mask.sum()
    else:  # mean over the 5 rows that have response tokens of each row's token mean
        expected = (k3.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / 5
    assert (with_kl - without).item() == pytest.approx(expected.item(), rel=1e-10)
    torch.testing.assert_close(stats.policy_kl, k3)


def test_rl_loss_reports_typed_stats_with_the_leaders_query_drift():
    rows = _rows()
    settings = obj.LossSettings(query_kl_estimator="token_k3")
    loss, stats = obj.rl_loss(settings, **rows)
    assert isinstance(stats, obj.LossStats) and isinstance(stats.query_drift, obj.QueryDrift)
    leaders = rows["is_leader"]
    change = (rows["query_logprobs"] - rows["ref_query_logprobs"]) * rows["query_mask"]  # by hand, per row
    torch.testing.assert_close(stats.query_drift.query_loglik_change, change.sum(-1)[leaders].detach())
    assert stats.query_drift.query_kl.shape == (int(leaders.sum()),) and not stats.pg_loss.requires_grad
    assert {"clip_frac_low", "clip_frac_high"} <= set(stats.pg_stats) and stats.policy_kl is None
    assert stats.entropy is None and stats.logprob_abs_diff is None  # the trainer that ran the forward adds them
    _, alone = obj.rl_loss(settings, **{**rows, "query_logprobs": None})  # the queries scored in a pass of their own
    assert alone.query_drift is None
    two = obj.QueryDrift.cat([stats.query_drift, stats.query_drift], "cpu")
    assert two.query_kl_token_k3.shape == (2 * int(leaders.sum()),)
    assert obj.QueryDrift.cat([], "cpu").query_kl.shape == (0,)
