"""The engine–trainer mismatch correction (`rollout_correction`: TIS / MIS importance weights on the sampled tokens):
the weights against a hand computation, off by default, a no-op without mismatch, and on a forced mismatch (an
engine at another temperature) an update pulled toward the on-policy one; in ERPOModule, its wiring and metrics. A
band that cannot hold ρ = 1 (a cap below 1, a floor above 1) is refused by the CLI and the constructors, and a
saturated band is warned about once."""

import math
from dataclasses import replace

import pytest
import torch
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.module_steps import PROMPTS, ReferenceLogprobs, fit_one_batch, rollout_batch

from erpo_lightning import objectives as obj
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.step_metrics import (
    SATURATED_STEPS,
    SaturatedCorrection,
    build_train_metrics,
    compute_and_reset,
    update_rollout_correction_metrics,
)
from erpo_lightning.objectives import rollout_correction_weights
from erpo_lightning.objectives.algorithms import ALGORITHMS, Algorithm
from erpo_lightning.scoring.logprobs import response_logprobs
from erpo_lightning.toy import SHIPPED_DIR

TRAINER = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]]
SAMPLER = [[-1.5, -1.0, -0.5], [-0.3, -3.0, 50.0]]  # the last token is padding: its junk must not count
MASK = [[1, 1, 1], [1, 1, 0]]


def hand_weights(mode, level, cap, floor):
    """The weights and the out-of-band flags of TRAINER / SAMPLER, token by token in plain Python."""
    low = 0.0 if floor is None else floor
    weights, outside = [], []
    for trainer, sampler, mask in zip(TRAINER, SAMPLER, MASK, strict=True):
        gaps = [t - s for t, s, m in zip(trainer, sampler, mask, strict=True) if m]
        ratios = [math.exp(sum(gaps))] * len(gaps) if level == "sequence" else [math.exp(g) for g in gaps]
        out = [not low <= r <= cap for r in ratios]
        if mode == "tis":
            row = [min(max(r, low), cap) for r in ratios]
        else:
            row = [0.0 if o else r for r, o in zip(ratios, out, strict=True)]
        padding = len(mask) - len(gaps)
        weights.append(row + [1.0] * padding)
        outside.append(out + [False] * padding)
    return torch.tensor(weights), torch.tensor(outside)


@pytest.mark.parametrize("floor", [None, 0.5])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_weights_match_the_hand_computation(mode, level, floor):
    weights, ratio, outside = obj.rollout_correction_weights(
        torch.tensor(TRAINER), torch.tensor(SAMPLER), torch.tensor(MASK), mode, level, cap=2.0, floor=floor
    )
    expected, expected_outside = hand_weights(mode, level, 2.0, floor)
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=0)
    assert torch.equal(outside, expected_outside)
    assert expected_outside.any() and not expected_outside.all()  # the case is not trivial
    assert ratio[1, 2] == 1.0  # padding


def test_off_by_default_in_every_preset_and_without_effect():
    assert all(algorithm.rollout_correction == "none" for algorithm in ALGORITHMS.values())
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 3, generator=generator)
    old, sampled = logprobs - 0.1, logprobs + torch.randn(4, 3, generator=generator)
    args = (logprobs, old, torch.tensor([1.0, -1.0, 0.5, 0.0]), torch.ones(4, 3), None, None, torch.zeros(4, 1))
    leaders = torch.tensor([True, False, True, False])
    plain, stats = obj.rl_loss(Algorithm(), *args, leaders)
    given, given_stats = obj.rl_loss(Algorithm(), *args, leaders, sampling_logprobs=sampled)
    assert torch.equal(plain, given) and given_stats.rollout_is_ratio is None and stats.rollout_is_ratio is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rollout_correction": "ti"}, "model.rollout_correction: 'ti' is not one of none, tis, mis"),
        ({"rollout_correction_level": "row"}, "model.rollout_correction_level"),
        ({"rollout_correction_cap": 0.0}, "model.rollout_correction_cap must be >= 1"),
        ({"rollout_correction_cap": math.nan}, "model.rollout_correction_cap must be >= 1"),
        ({"rollout_correction_floor": 2.0}, "model.rollout_correction_floor must be >= 0 and below"),
        ({"rollout_correction_floor": -0.1}, "model.rollout_correction_floor must be >= 0 and below"),
    ],
)
def test_bad_settings_are_refused_naming_them(settings, message):
    with pytest.raises(ValueError, match=message):
        Algorithm(**settings)


def test_a_correction_without_sampling_logprobs_is_refused():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), None, None, torch.zeros(1, 1))
    with pytest.raises(ValueError, match="needs the engine's sampling log-probs"):
        obj.rl_loss(Algorithm(rollout_correction="tis"), *args, torch.tensor([True]))


def loss_and_gradient(model, settings, weights_fn):
    """(loss, flat gradient over the model's parameters) of `rl_loss` with `settings` on what `weights_fn(model)`
    returns: (response_logprobs, sampling_logprobs, advantages, mask, seq_weights)."""
    model.zero_grad(set_to_none=True)
    logprobs, sampled, advantages, mask, seq_weights = weights_fn(model)
    rows = len(advantages)
    loss, stats = obj.rl_loss(
        settings, logprobs, logprobs.detach(), advantages, mask, None, None, torch.zeros(rows, 1),
        torch.arange(rows) == 0, seq_weights=seq_weights, sampling_logprobs=sampled,
    )  # fmt: skip
    loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach(), gradient, stats


def test_without_mismatch_loss_and_gradient_are_unchanged(tiny_model):
    """Sampling log-probs equal to the trainer's: ρ = 1 everywhere, weights 1, bit for bit the uncorrected step."""
    batch = rollout_batch(tiny_model)

    def rows(model):
        logprobs = response_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.prompt_length, batch.temperature
        )
        advantages = obj.group_advantages(batch.rewards, batch.group_size, "grpo")
        return logprobs, logprobs.detach().clone(), advantages, batch.response_mask, None

    plain = loss_and_gradient(tiny_model, Algorithm(), rows)
    assert plain[1].abs().max() > 1e-4
    for mode in ("tis", "mis"):
        for level in ("token", "sequence"):
            settings = Algorithm(rollout_correction=mode, rollout_correction_level=level, rollout_correction_floor=0.5)
            loss, gradient, stats = loss_and_gradient(tiny_model, settings, rows)
            assert torch.equal(loss, plain[0]) and torch.equal(gradient, plain[1]), (mode, level)
            assert not stats.rollout_is_outside.any()


ENGINE_TEMPERATURE = 0.5  # the engine samples colder than the trainer scores (T = 1)


def expected_update(sampler_temperature):
    """A one-token response after PROMPTS[0], every token y of the vocabulary as a row, each row's PG term weighted
    by its probability under the sampler (`seq_weights` = V·μ(y) with `seq_mean_token_sum`): the loss is then the
    exact expectation over the sampler's draws, E_{y~μ}[ℓ(y)], with no sampling noise. Advantages are fixed random
    numbers; the sampling log-probs are μ's, the trainer's π is the model's at T = 1."""

    def rows(model):
        logits = model(torch.tensor([PROMPTS[0]])).logits[0, -1]
        logprobs = torch.log_softmax(logits, -1)
        sampled = torch.log_softmax(logits.detach() / sampler_temperature, -1)
        vocabulary = len(logprobs)
        advantages = torch.randn(vocabulary, generator=torch.Generator().manual_seed(0))
        return logprobs[:, None], sampled[:, None], advantages, torch.ones(vocabulary, 1), vocabulary * sampled.exp()

    return rows


def test_a_forced_mismatch_is_pulled_toward_the_on_policy_update(tiny_model):
    settings = replace(Algorithm(), loss_aggregation="seq_mean_token_sum")
    _, on_policy, _ = loss_and_gradient(tiny_model, settings, expected_update(1.0))
    _, uncorrected, stats = loss_and_gradient(tiny_model, settings, expected_update(ENGINE_TEMPERATURE))
    error = (uncorrected - on_policy).norm()
    assert error > 0.1 * on_policy.norm()  # the mismatch matters: a measurably different update

    # Untruncated IS (no band) recovers the on-policy expectation exactly: Σ μ (π/μ) A ∇log π = Σ π A ∇log π.
    exact = replace(settings, rollout_correction="tis", rollout_correction_cap=math.inf)
    torch.testing.assert_close(loss_and_gradient(tiny_model, exact, expected_update(ENGINE_TEMPERATURE))[1], on_policy)
    # Capped at 1.5 (ρ spans 0.6 to 2.1 here): TIS keeps each token with a bounded weight (measured: 0.05 of the
    # uncorrected error), MIS drops the tokens above the cap, whose terms it then misses (0.66).
    for mode, bound in (("tis", 0.25), ("mis", 0.8)):
        capped = replace(settings, rollout_correction=mode, rollout_correction_cap=1.5)
        _, corrected, stats = loss_and_gradient(tiny_model, capped, expected_update(ENGINE_TEMPERATURE))
        assert 0 < stats.rollout_is_outside.float().mean() < 0.5, mode  # the cap binds on some tokens
        assert (corrected - on_policy).norm() < bound * error, mode


@pytest.fixture()
def module_setup(tiny_model_path, tiny_model):
    return tiny_model_path, ReferenceLogprobs(tiny_model, PROMPTS), rollout_batch(tiny_model), tiny_model


def sgd_module(path, reference, **settings):
    """ERPOModule stepping with plain SGD: the step is the gradient itself (Adam would turn 1e-7 rounding gaps into
    full learning-rate steps)."""
    module = ERPOModule(str(path), optimizer=lambda params: torch.optim.SGD(params, lr=1.0), **settings)
    module.reference_cache = reference
    return module


def trained_weights(module):
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()])


def test_the_module_corrects_a_forced_mismatch_and_logs_it(module_setup):
    path, reference, batch, _ = module_setup
    # The engine gave the first token of each response 1 nat less (ρ = e > cap 2) and the others 0.2 nats more.
    first = torch.zeros_like(batch.response_mask, dtype=torch.bool)
    first[:, 0] = True
    skewed = replace(batch, sampling_logprobs=batch.sampling_logprobs + torch.where(first, -1.0, 0.2))
    results = {}
    for correction in ("none", "mis"):
        module = sgd_module(path, reference, rollout_correction=correction)
        results[correction] = (fit_one_batch(module, skewed).callback_metrics, trained_weights(module))
    metrics = results["mis"][0]
    tokens = batch.response_mask.sum().item()
    assert metrics["train/rollout_is_capped_frac"].item() == pytest.approx(len(batch.response_mask) / tokens)
    assert metrics["train/rollout_is_ratio_max"].item() == pytest.approx(math.e, rel=1e-4)
    assert metrics["train/rollout_is_ratio_min"].item() == pytest.approx(math.exp(-0.2), rel=1e-4)
    expected_mean = (len(batch.response_mask) * math.e + (tokens - len(batch.response_mask)) * math.exp(-0.2)) / tokens
    assert metrics["train/rollout_is_ratio_mean"].item() == pytest.approx(expected_mean, rel=1e-4)
    assert "train/rollout_is_ratio_mean" not in results["none"][0]  # logged only with the correction on
    # The rows' first tokens no longer push: the step moved measurably elsewhere.
    assert (results["mis"][1] - results["none"][1]).abs().max() > 1e-3


def test_the_module_without_mismatch_steps_as_without_correction(module_setup):
    """The batch's sampling log-probs came from the same weights (unpadded forwards, ~1e-7 from the trainer's)."""
    path, reference, batch, model = module_setup
    initial = torch.cat([p.detach().flatten() for p in model.parameters()])
    plain = sgd_module(path, reference)
    fit_one_batch(plain, batch)
    corrected = sgd_module(path, reference, rollout_correction="mis", rollout_correction_level="sequence")
    metrics = fit_one_batch(corrected, batch).callback_metrics
    assert metrics["train/rollout_is_capped_frac"].item() == 0.0
    assert metrics["train/rollout_is_ratio_max"].item() == pytest.approx(1.0, abs=1e-5)
    assert (trained_weights(plain) - initial).abs().max() > 1e-3  # a real step
    torch.testing.assert_close(trained_weights(corrected), trained_weights(plain), rtol=0, atol=1e-6)


CAP_MEANING = "it is the upper bound on the engine/trainer probability ratio"


@pytest.fixture()
def config(tmp_path):
    return str(tiny_config(tmp_path, SHIPPED_DIR, SHIPPED_DIR / "train.jsonl"))


# -------------------------------------------------------------------------- issue 67 item 1: a cap below 1 refused
@pytest.mark.parametrize("mode", ["tis", "mis"])
@pytest.mark.parametrize("cap", ["0.5", "0.9"])
def test_a_cap_below_one_is_refused_by_the_cli(capsys, config, mode, cap):
    line = fails_in_one_line(
        capsys, "fit", "--config", config, "--model.rollout_correction", mode, "--model.rollout_correction_cap", cap
    )
    assert line.startswith(f"erpo: error: model.rollout_correction_cap must be >= 1 (.inf: no upper end), got {cap}")
    assert CAP_MEANING in line and "verl's rollout_is_threshold" in line and "rollout_correction_floor" in line


def test_a_cap_below_one_is_refused_by_the_constructors():
    with pytest.raises(ValueError, match="model.rollout_correction_cap must be >= 1") as refused:
        ERPOModule(model_path=str(SHIPPED_DIR), rollout_correction="mis", rollout_correction_cap=0.5)
    assert CAP_MEANING in str(refused.value)
    with pytest.raises(ValueError, match="model.rollout_correction_cap must be >= 1"):
        Algorithm(rollout_correction="tis", rollout_correction_cap=0.999)
    # The bounds themselves are allowed: 1 keeps every ratio of agreeing engine and trainer, inf has no upper end.
    assert Algorithm(rollout_correction="mis", rollout_correction_cap=1.0).rollout_correction_cap == 1.0
    assert Algorithm(rollout_correction="tis", rollout_correction_cap=math.inf, rollout_correction_floor=1.0)


def test_a_floor_above_one_is_refused(capsys, config):
    line = fails_in_one_line(
        capsys, "fit", "--config", config, "--model.rollout_correction", "mis",
        "--model.rollout_correction_cap", "4", "--model.rollout_correction_floor", "1.5",
    )  # fmt: skip
    assert line == (
        "erpo: error: model.rollout_correction_floor must be >= 0 and below rollout_correction_cap (4), at most 1 "
        "(ρ = 1, engine and trainer agreeing, must lie in the band), or null, got 1.5"
    )


# ---------------------------------------------------------------- issue 67 item 1: a saturated band warned, once
def _capped_frac(settings: Algorithm, gap: float) -> torch.Tensor:
    """`train/rollout_is_capped_frac` of one step whose engine log-probs sit `gap` nats below the trainer's on every
    token (ρ = e^gap), computed by the module's own metric code."""
    metrics = build_train_metrics()
    trainer = -torch.rand(4, 5, generator=torch.Generator().manual_seed(0)) - 0.1
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    _, ratio, outside = rollout_correction_weights(
        trainer, trainer - gap, mask, settings.rollout_correction, settings.rollout_correction_level,
        settings.rollout_correction_cap, settings.rollout_correction_floor,
    )  # fmt: skip
    update_rollout_correction_metrics(metrics, ratio, outside, mask)
    return compute_and_reset(metrics)["train/rollout_is_capped_frac"]


def test_every_token_outside_the_band_for_three_steps_warns_once():
    settings = Algorithm(rollout_correction="mis", rollout_correction_cap=2.0)
    watch = SaturatedCorrection(settings)
    inside, outside = _capped_frac(settings, 0.1), _capped_frac(settings, 1.0)  # ρ = 1.105, 2.718
    assert float(inside) == 0.0 and float(outside) == 1.0
    # Two saturated steps, one healthy one (the count restarts), then SATURATED_STEPS saturated ones: one warning.
    said = [watch.update(frac) for frac in (outside, outside, inside, *[outside] * (SATURATED_STEPS + 3))]
    warnings = [(step, text) for step, text in enumerate(said) if text is not None]
    assert [step for step, _ in warnings] == [2 + SATURATED_STEPS]
    text = warnings[0][1]
    assert text.startswith(f"train/rollout_is_capped_frac has been 1.0 for {SATURATED_STEPS} steps in a row")
    assert "the band [0, 2] of model.rollout_correction 'mis'" in text
    assert "policy-gradient terms are all zeroed" in text and "model.rollout_correction_cap" in text
    # No correction logged (None) or a step without the metric (NaN) is not saturation.
    quiet = SaturatedCorrection(settings)
    assert [quiet.update(value) for value in (None, float("nan"), None, outside, outside)] == [None] * 5
