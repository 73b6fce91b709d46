"""The loss menu against TRL 1.16 as an outside reference (issue 70): GSPO (`importance_sampling_level='sequence'`),
CISPO (`loss_type='cispo'`), the entropy bonus (`entropy_coef`) and the high-entropy mask (`top_entropy_quantile`).

TRL runs its own `GRPOTrainer._compute_loss` on its own rollout batch (fixed completions, `num_iterations: 2`, so it
computes and passes the old log-probs); the old log-probs are then moved by fixed noise, as a later iteration sees
them, so sequence ratios leave GSPO's clip band and CISPO's weights pass their cap. Our side scores the same rows with
`erpo_lightning.scoring.logprobs` / `objectives.token_entropy` and builds the loss with `objectives.rl_loss` under the
`Algorithm` that `trl_config.trl_loss_menu` makes of TRL's GRPOConfig. Everything is float32 on CPU; the loss and
every parameter's gradient must agree within 1e-6 absolute (the existing TRL parity test's tolerance).

`ERPOTrainer` takes the same GRPOConfig settings instead of refusing them, and with Query-KL and w(q) off its loss and
gradients are TRL's. TRL is a bench-only extra: without it these tests are skipped; importing it is slow (`slow`).
"""

from __future__ import annotations

import pytest
import torch
from helpers.trl_setup import COMPLETIONS, GROUP_SIZE, PROMPTS, REWARDS, grpo_settings, requires_trl
from helpers.trl_setup import make_trainer as make_helper_trainer

from erpo_lightning import objectives as obj
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.scoring.logprobs import causal_lm_logits, prompt_response_token_logprobs
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model

pytestmark = [pytest.mark.slow, requires_trl]

TEMPERATURE = 0.9
TOLERANCE = 1e-6
TRL_ADVANTAGE_EPS = 1e-4
# TRL's loss_type -> our aggregation (docs/trl.md); cispo is a token mean over the step like dapo.
AGGREGATION = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "cispo": "token_mean"}
CASES = {
    "gspo_seq_mean": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.03, epsilon_high=0.05),
    "gspo_token_mean": dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=0.03, epsilon_high=0.05),
    "cispo": dict(loss_type="cispo", epsilon_high=1.2),
    "cispo_sequence": dict(loss_type="cispo", importance_sampling_level="sequence", epsilon_high=1.05),
    "entropy_bonus": dict(loss_type="dapo", entropy_coef=0.05),
    "entropy_bonus_seq_mean": dict(loss_type="grpo", entropy_coef=0.05),
    "entropy_mask_and_bonus": dict(loss_type="dapo", top_entropy_quantile=0.5, entropy_coef=0.05),
    "gspo_with_entropy_bonus": dict(
        loss_type="grpo", importance_sampling_level="sequence", epsilon=0.03, epsilon_high=0.05, entropy_coef=0.02
    ),  # fmt: skip
}


def make_trainer(model_path, output_dir, erpo: bool = True, algorithm: dict | None = None, **config):
    """`helpers.trl_setup.make_trainer`'s trainer with every `config` setting in its GRPOConfig (that helper sends
    settings named like an Algorithm field, such as `entropy_coef`, to ERPOTrainer instead), and the ERPOTrainer
    arguments in `algorithm`."""
    from trl import GRPOConfig

    settings = grpo_settings(output_dir)
    settings.update(config)
    inputs = {"args": GRPOConfig(**settings)}
    return make_helper_trainer(model_path, output_dir, erpo=erpo, inputs=inputs, **(algorithm or {}))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("loss_menu_trl") / "model", seed=0)


def moved_old_logprobs(inputs: dict) -> torch.Tensor:
    """TRL's old log-probs plus fixed noise (0.3 nats per token) on the completion tokens."""
    noise = 0.3 * torch.randn(inputs["completion_mask"].shape, generator=torch.Generator().manual_seed(2))
    return inputs["old_per_token_logps"] + noise * inputs["completion_mask"]


def our_rows(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our forward over TRL's rows: [N, R] response log-probs and entropies (with gradient) at TEMPERATURE, mask."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["prompt_ids"].shape[1]
    logits = causal_lm_logits(model, input_ids, attention_mask)
    logprobs = prompt_response_token_logprobs(logits, input_ids, width, TEMPERATURE)[:, width:]
    entropy = obj.token_entropy(logits[:, width - 1 : -1], 1.0 / TEMPERATURE)
    return logprobs, entropy, inputs["completion_mask"]


def gradients(model, compute) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def trl_batch(trainer) -> dict:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop: one micro-batch per optimizer step
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)])
    assert inputs.get("old_per_token_logps") is not None, "num_iterations 2: TRL passes the old log-probs"
    inputs["old_per_token_logps"] = moved_old_logprobs(inputs)
    return inputs


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_equal_trl_with_moved_ratios(name, model_path, tmp_path):
    case = CASES[name]
    trainer = make_trainer(model_path, tmp_path, erpo=False, temperature=TEMPERATURE, num_iterations=2, **case)
    inputs = trl_batch(trainer)
    from erpo_lightning.integrations.trl_config import trl_loss_menu  # imports TRL

    # TRL's GRPOConfig as our loss settings: the mapping ERPOTrainer uses, on the grpo preset (no Query-KL, no w(q))
    grpo = resolve_algorithm("grpo", loss_aggregation=AGGREGATION[case["loss_type"]], advantage_eps=TRL_ADVANTAGE_EPS)
    settings = trl_loss_menu(trainer.args, grpo)
    advantages = obj.group_advantages(torch.tensor(REWARDS), GROUP_SIZE, "grpo", eps=TRL_ADVANTAGE_EPS)
    torch.testing.assert_close(advantages, inputs["advantages"], rtol=0, atol=1e-6)
    old, mask = inputs["old_per_token_logps"], inputs["completion_mask"]

    # the batch must exercise what the case is about
    with torch.no_grad():
        current, entropy, _ = our_rows(trainer.model, inputs)
        ratio = torch.exp(obj.importance_log_ratio(current, old, mask, settings.ratio_level))[mask.bool()]
    if settings.policy_loss == "cispo":
        assert (ratio > settings.cispo_weight_cap).any() and (ratio < settings.cispo_weight_cap).any()
    elif settings.ratio_level == "sequence":
        inside = (ratio > 1 - settings.sequence_clip_low) & (ratio < 1 + settings.sequence_clip_high)
        assert inside.any() and not inside.all(), "some sequence ratios inside GSPO's band, some outside"
    assert settings.entropy_coef == case.get("entropy_coef", 0.0), "TRL's entropy_coef reached both sides"
    if settings.entropy_top_fraction < 1:
        kept = obj.high_entropy_mask(entropy, mask, settings.entropy_top_fraction)
        assert 0 < kept.sum() < mask.sum()

    trl_loss, trl_grads = gradients(trainer.model, lambda: trainer.compute_loss(trainer.model, inputs))

    def ours():
        logprobs, entropy, mask = our_rows(trainer.model, inputs)
        loss, _ = obj.rl_loss(
            settings, logprobs, old, advantages, mask, None, None, torch.zeros_like(inputs["prompt_mask"]),
            torch.arange(len(COMPLETIONS)) % GROUP_SIZE == 0, constant=16, entropy=entropy,
        )  # fmt: skip
        return loss

    loss, grads = gradients(trainer.model, ours)
    assert trl_loss.abs() > 1e-3 and max(g.abs().max() for g in trl_grads.values()) > 1e-3
    torch.testing.assert_close(loss, trl_loss, rtol=0, atol=TOLERANCE, msg="loss")
    assert grads.keys() == trl_grads.keys()
    for parameter, trl_grad in trl_grads.items():
        torch.testing.assert_close(grads[parameter], trl_grad, rtol=0, atol=TOLERANCE, msg=parameter)


def test_the_entropy_bonus_matches_trl_by_its_difference_alone(model_path, tmp_path):
    """The bonus's own share of TRL's loss (with minus without `entropy_coef`) is -c · the mean response entropy of
    our chunked `token_entropy`: the two entropies agree, not just the totals."""
    losses = {}
    for coef in (0.0, 0.05):
        trainer = make_trainer(model_path, tmp_path / str(coef), erpo=False, temperature=TEMPERATURE,
                               num_iterations=2, loss_type="dapo", entropy_coef=coef)  # fmt: skip
        inputs = trl_batch(trainer)
        with torch.no_grad():
            losses[coef] = trainer.compute_loss(trainer.model, inputs)
            _, entropy, mask = our_rows(trainer.model, inputs)
    mean_entropy = (entropy * mask).sum() / mask.sum()
    torch.testing.assert_close(losses[0.05] - losses[0.0], -0.05 * mean_entropy, rtol=0, atol=TOLERANCE)


# ------------------------------------------------------------------------------------------ ERPOTrainer takes them
GRPO_CONFIG_CASES = {
    "sequence": (
        dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
        dict(ratio_level="sequence", sequence_clip_low=3e-4, sequence_clip_high=4e-4),
    ),
    "cispo": (dict(loss_type="cispo", epsilon_high=5.0), dict(policy_loss="cispo", cispo_weight_cap=5.0)),
    "entropy_coef": (dict(entropy_coef=0.01), dict(entropy_coef=0.01)),
    "adaptive_entropy": (
        dict(
            entropy_coef=0.01,
            use_adaptive_entropy=True,
            entropy_target=1.5,
            entropy_coef_delta=0.002,
            entropy_coef_min=0.001,
            entropy_coef_max=0.1,
        ),  # fmt: skip
        dict(entropy_coef=0.01, entropy_target=1.5, entropy_coef_delta=0.002, entropy_coef_range=(0.001, 0.1)),
    ),
    "top_entropy_quantile": (dict(top_entropy_quantile=0.2), dict(entropy_top_fraction=0.2)),
}


@pytest.mark.parametrize("name", list(GRPO_CONFIG_CASES))
def test_erpo_trainer_maps_trls_settings_onto_the_algorithm(name, model_path, tmp_path):
    config, fields = GRPO_CONFIG_CASES[name]
    trainer = make_trainer(model_path, tmp_path, **config)
    assert trainer.algorithm == resolve_algorithm("erpo", query_kl_tolerance=0.0, **fields)


def test_erpo_trainer_refuses_a_cispo_cap_below_one_and_cispo_with_a_sequence_mean(model_path, tmp_path):
    with pytest.raises(ValueError, match="cispo_weight_cap must be >= 1"):
        make_trainer(model_path, tmp_path / "cap", loss_type="cispo", epsilon_high=0.2)
    with pytest.raises(ValueError, match="loss_type 'cispo' is a token mean"):
        make_trainer(model_path, tmp_path / "mean", algorithm=dict(loss_aggregation="seq_mean_token_mean"),
                     loss_type="cispo", epsilon_high=5.0)  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        dict(loss_type="cispo", epsilon_high=1.2, importance_sampling_level="sequence", entropy_coef=0.05),
        dict(
            loss_type="grpo",
            importance_sampling_level="sequence",
            epsilon=0.03,
            epsilon_high=0.05,
            top_entropy_quantile=0.5,
            entropy_coef=0.05,
        ),  # fmt: skip
    ],
    ids=["cispo_sequence_bonus", "gspo_mask_bonus"],
)
def test_without_query_kl_and_weights_erpo_trainer_is_trl(config, model_path, tmp_path):
    """α = 0 and no w(q): ERPOTrainer's loss and gradients (TRL's fused LM head, its entropy with gradient, our
    rl_loss) are GRPOTrainer's on the same moved batch, at T = 1."""
    plain = dict(algorithm="grpo", query_kl_coef=0.0, use_query_weights=False, advantage_eps=TRL_ADVANTAGE_EPS)
    if config["loss_type"] == "grpo":
        plain["loss_aggregation"] = "seq_mean_token_mean"
    results = []
    for erpo in (True, False):
        trainer = make_trainer(model_path, tmp_path / str(erpo), erpo=erpo, algorithm=plain if erpo else None,
                               num_iterations=2, **config)  # fmt: skip
        inputs = trl_batch(trainer)
        results.append(gradients(trainer.model, lambda t=trainer, i=inputs: t.compute_loss(t.model, i)))
    (loss, grads), (trl_loss, trl_grads) = results
    torch.testing.assert_close(loss, trl_loss, rtol=0, atol=TOLERANCE)
    for parameter, trl_grad in trl_grads.items():
        torch.testing.assert_close(grads[parameter], trl_grad, rtol=0, atol=TOLERANCE, msg=parameter)


def test_erpo_trainer_trains_with_gspo_cispo_and_adaptive_entropy_and_logs_them(model_path, tmp_path):
    for name, config in {
        "gspo": dict(use_adaptive_entropy=True, entropy_coef=0.01, entropy_target=10.0),
        "cispo": dict(entropy_coef=0.01, top_entropy_quantile=0.5),
    }.items():
        trainer = make_trainer(model_path, tmp_path / name, algorithm={"algorithm": f"{name}_erpo"}, max_steps=2,
                               optim="sgd", learning_rate=0.05, num_iterations=2, **config)  # fmt: skip
        trainer.train()
        logged = {key for entry in trainer.state.log_history for key in entry}
        expected = {"entropy_coef", "entropy/bonus"}
        expected |= {"gspo/seq_ratio_dev", "entropy/target"} if name == "gspo" else {"cispo/truncated_frac"}
        expected |= {"entropy/kept_frac"} if name == "cispo" else set()
        assert expected <= logged, expected - logged
        if name == "gspo":  # entropy (a few nats) below the 10-nat target: the coefficient grew by δ per step
            assert trainer.entropy_coef == pytest.approx(0.01 + 2 * 0.005)
            assert trainer._last_world_entropy < 10.0
