"""Our GRPO loss and gradients equal TRL's `GRPOTrainer` on one fixed batch, for every TRL `loss_type` we map.

TRL runs its own code path: `_generate_and_score_completions` (fixed completions from a `rollout_func`, rewards from
a reward function, TRL's group advantages with its 1e-4 epsilon, its reference model's log-probs) and then
`compute_loss`. Our side scores the same rows with `erpo_lightning.scoring.logprobs` and builds the loss from
`erpo_lightning.objectives`, both from its parts and through `rl_loss` (what the module runs). The policy is
perturbed away from the reference (so Policy-KL is not zero) and the old log-probs are given, off-policy (so both
clip sides are active). The mapping tested here is the one docs/trl.md documents, including where the two differ by
design.

TRL is a bench-only extra (`pip install -e .[trl]`); without it these tests are skipped. Importing TRL takes
about half a minute on a CPU, hence the slow tier.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import pytest
import torch
from helpers.trl_setup import (
    COMPLETIONS,
    GROUP_SIZE,
    gradients,
    noisy_old_logprobs,
    perturb,
    rollout_for,
    scored_rows,
)

from erpo_lightning import objectives as obj
from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, save_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("trl") is None,
        reason="TRL is not installed (bench-only extra: pip install -e '.[trl]'); nothing to compare against",
    ),
]

TEMPERATURE = 0.9
MAX_COMPLETION_LENGTH = 16  # TRL's `max_completion_length`: Dr. GRPO's constant normaliser
# Prompts of different lengths, so rows are left-padded: TRL numbers a row's positions from its first pad, we from
# its first real token. With rotary position embeddings (Qwen2) a constant shift per row cancels (docs/trl.md).
# GROUP_SIZE and the COMPLETIONS are tests/helpers/trl_setup.py's; these prompts and rewards are this file's own.
PROMPTS = ["Compute 7 + 8.", "What is 2 * 3? Be brief.", "9 - 4?"]
# The third group's rewards are all equal: its advantages must be exactly 0 on both sides.
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
TRL_ADVANTAGE_EPS = 1e-4


@dataclass(frozen=True)
class Case:
    """A TRL configuration and the pieces of ours that reproduce it."""

    loss_type: str
    beta: float
    aggregation: obj.AggregationMode
    estimator: obj.Estimator = "grpo"
    scale_rewards: str = "group"
    epsilon_high: float | None = None
    delta: float | None = None  # TRL's two-sided clipping: our `dual_clip` (it bounds only A < 0 tokens' loss)
    bias_corrected_kl: bool = False


CASES = {
    "grpo": Case("grpo", 0.0, "seq_mean_token_mean"),
    # TRL adds β·k3 to every token before its loss_type's aggregation, so with `grpo` the KL is a per-sequence mean.
    "grpo_kl": Case("grpo", 0.04, "seq_mean_token_mean"),
    "bnpo_kl": Case("bnpo", 0.04, "token_mean"),
    "dapo_clip_higher": Case("dapo", 0.0, "token_mean", epsilon_high=0.28),
    "dapo_kl": Case("dapo", 0.04, "token_mean"),
    "dapo_two_sided": Case("dapo", 0.0, "token_mean", delta=1.5),
    "dr_grpo": Case("dr_grpo", 0.04, "seq_sum_constant", estimator="dr_grpo", scale_rewards="none"),
    "dr_grpo_std": Case("dr_grpo", 0.0, "seq_sum_constant"),
    "dapo_kl_bias_corrected": Case("dapo", 0.04, "token_mean", bias_corrected_kl=True),
}


@pytest.fixture(scope="module")
def trl_classes():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` is experimental in TRL
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    return Dataset, GRPOConfig, GRPOTrainer


def make_trainer(trl_classes, model_path, output_dir, case: Case):
    """A TRL GRPOTrainer whose rollouts are COMPLETIONS and whose rewards are REWARDS (no sampling)."""
    Dataset, GRPOConfig, GRPOTrainer = trl_classes
    tokenizer = build_byte_tokenizer()

    def fixed_reward(prompts, completions, **_):
        assert completions == [c.replace("<|im_end|>", "") for c in COMPLETIONS]
        return list(REWARDS)

    config = GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, report_to="none", save_strategy="no", bf16=False,
        per_device_train_batch_size=len(COMPLETIONS), num_generations=GROUP_SIZE,
        max_completion_length=MAX_COMPLETION_LENGTH, temperature=TEMPERATURE, loss_type=case.loss_type,
        beta=case.beta, epsilon=0.2, epsilon_high=case.epsilon_high, delta=case.delta, scale_rewards=case.scale_rewards,
        use_bias_correction_kl=case.bias_corrected_kl,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(model_path), reward_funcs=fixed_reward, args=config,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
        rollout_func=rollout_for(PROMPTS),
    )  # fmt: skip
    # Move the policy away from the reference model TRL loaded from the same checkpoint: Policy-KL becomes non-zero.
    perturb(trainer.model)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop: one micro-batch per optimizer step
    return trainer


def trl_inputs(trainer) -> dict:
    """TRL's own rollout batch: padded rows, its advantages, its reference log-probs when beta > 0."""
    return trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)])


def response_logprobs(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, R] response log-probs at TEMPERATURE, [N, R] response mask) of `scored_rows`."""
    return scored_rows(model, inputs, TEMPERATURE)[2:]


def our_loss(trainer, inputs: dict, old: torch.Tensor, case: Case) -> torch.Tensor:
    """The loss TRL's `case` stands for, from our objectives on our own forwards of the same two models."""
    response_lp, mask = response_logprobs(trainer.model, inputs)
    advantages = obj.group_advantages(torch.tensor(REWARDS), GROUP_SIZE, case.estimator, eps=TRL_ADVANTAGE_EPS)
    per_token, _ = obj.policy_gradient_loss(
        response_lp, old, advantages, mask, clip_low=0.2, clip_high=case.epsilon_high, dual_clip=case.delta
    )
    loss = obj.aggregate(per_token, mask, case.aggregation, constant=MAX_COMPLETION_LENGTH)
    if case.beta > 0:
        with torch.no_grad():
            ref_lp, _ = response_logprobs(trainer.ref_model, inputs)
        kl = obj.kl_penalty(response_lp, ref_lp, "k3")
        if case.bias_corrected_kl:  # TRL's default: k3 times the (differentiable) ratio to the sampling policy
            kl = kl * torch.exp(response_lp - old)
        loss = loss + case.beta * obj.aggregate(kl, mask, case.aggregation, constant=MAX_COMPLETION_LENGTH)
    return loss


def module_loss(trainer, inputs: dict, old: torch.Tensor, case: Case) -> torch.Tensor:
    """The same through `objectives.rl_loss`, the composition the module runs (Query-KL off: TRL has none), with
    the advantages as the module makes them from its `Algorithm` (`model.advantage_eps: 1e-4`, TRL's)."""
    settings = Algorithm(
        advantage_estimator=case.estimator, advantage_eps=TRL_ADVANTAGE_EPS, use_query_weights=False,
        loss_aggregation=case.aggregation, clip_low=0.2, clip_high=case.epsilon_high, dual_clip=case.delta,
        query_kl_coef=0.0, policy_kl_coef=case.beta, policy_kl_kind="k3",
    )  # fmt: skip
    query_lp, query_mask, response_lp, mask = scored_rows(trainer.model, inputs, TEMPERATURE)
    ref_lp = None
    if case.beta > 0:
        with torch.no_grad():
            ref_lp, _ = response_logprobs(trainer.ref_model, inputs)
    advantages = obj.group_advantages(
        torch.tensor(REWARDS), GROUP_SIZE, settings.advantage_estimator, eps=settings.advantage_eps
    )
    is_leader = torch.arange(len(REWARDS)) % GROUP_SIZE == 0
    loss, _ = obj.rl_loss(
        settings, response_lp, old, advantages, mask, query_lp, query_lp.detach(), query_mask, is_leader,
        constant=MAX_COMPLETION_LENGTH, ref_response_logprobs=ref_lp,
    )  # fmt: skip
    return loss


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("trl_parity") / "model", seed=0)


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_equal_trl(name, trl_classes, model_path, tmp_path):
    case = CASES[name]
    trainer = make_trainer(trl_classes, model_path, tmp_path, case)
    inputs = trl_inputs(trainer)
    assert (inputs["prompt_mask"] == 0).any(), "some prompts must be left-padded (see PROMPTS)"
    old = noisy_old_logprobs(trainer.model, inputs, TEMPERATURE)
    inputs["old_per_token_logps"] = old
    ratio = torch.exp(response_logprobs(trainer.model, inputs)[0].detach() - old)[inputs["completion_mask"].bool()]
    negative = (inputs["advantages"] < 0)[:, None].expand_as(old)[inputs["completion_mask"].bool()]
    assert (ratio < 0.8).any() and (ratio > 1.28).any(), "the batch must exercise both clip sides"
    assert (ratio[negative] > 1.5).any(), "and the two-sided (dual) clip"

    trl_loss, trl_grads = gradients(trainer.model, lambda: trainer.compute_loss(trainer.model, inputs))
    assert trl_loss.abs() > 1e-3
    assert max(g.abs().max() for g in trl_grads.values()) > 1e-3
    ours = {"objectives": our_loss}
    if not case.bias_corrected_kl:  # the module has no bias-corrected KL (docs/trl.md)
        ours["rl_loss"] = module_loss
    for path, compute in ours.items():
        loss, grads = gradients(trainer.model, lambda compute=compute: compute(trainer, inputs, old, case))
        torch.testing.assert_close(loss, trl_loss, rtol=0, atol=1e-6, msg=f"{path}: loss")
        for parameter, trl_grad in trl_grads.items():
            torch.testing.assert_close(grads[parameter], trl_grad, rtol=0, atol=1e-6, msg=f"{path}: {parameter}")


def test_advantages_equal_trl_with_its_epsilon(trl_classes, model_path, tmp_path):
    """TRL's advantages are ours with eps = 1e-4 (our default is 1e-6); checked by hand on the first group."""
    for case in (CASES["grpo"], CASES["dr_grpo"]):
        trainer = make_trainer(trl_classes, model_path, tmp_path, case)
        inputs = trl_inputs(trainer)
        ours = obj.group_advantages(torch.tensor(REWARDS), GROUP_SIZE, case.estimator, eps=TRL_ADVANTAGE_EPS)
        torch.testing.assert_close(ours, inputs["advantages"], rtol=0, atol=1e-7)
        assert (inputs["advantages"][8:] == 0).all()  # the zero-variance group
    # First group [1, 0, 1, 0] under `grpo`: mean 0.5, unbiased std sqrt(1/3).
    hand = 0.5 / ((1 / 3) ** 0.5 + TRL_ADVANTAGE_EPS)
    grpo = obj.group_advantages(torch.tensor(REWARDS), GROUP_SIZE, "grpo", eps=TRL_ADVANTAGE_EPS)
    assert grpo[0].item() == pytest.approx(hand, abs=1e-6)
    # With our default epsilon (1e-6) the same advantage is 1.7e-4 larger, relatively: a TRL config moves over
    # exactly only with eps = 1e-4.
    default = obj.group_advantages(torch.tensor(REWARDS), GROUP_SIZE, "grpo")
    expected = (TRL_ADVANTAGE_EPS - 1e-6) / ((1 / 3) ** 0.5 + 1e-6)
    assert default[0].item() / grpo[0].item() - 1 == pytest.approx(expected, rel=5e-3)


def test_bias_corrected_kl_differs_from_plain_k3(trl_classes, model_path, tmp_path):
    """TRL's default `use_bias_correction_kl=True` is not our Policy-KL: off-policy the two losses differ."""
    case = CASES["dapo_kl_bias_corrected"]
    trainer = make_trainer(trl_classes, model_path, tmp_path, case)
    inputs = trl_inputs(trainer)
    old = noisy_old_logprobs(trainer.model, inputs, TEMPERATURE)
    inputs["old_per_token_logps"] = old
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, inputs)
        plain = our_loss(trainer, inputs, old, CASES["dapo_kl"])
    assert (trl_loss - plain).abs() > 1e-5
