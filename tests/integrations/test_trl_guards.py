"""`ERPOTrainer` on hostile inputs (real TRL 1.16, a real tiny Qwen2 and the shipped toy model's tokenizer): a
non-finite reward, a diverging update, empty prompts, chat prompts without a chat template and bad algorithm
arguments are each refused with one line naming the culprit, before any weight turns NaN.

The rollouts are fixed (tests/helpers/trl_setup.py's `fixed_rollout`), so no assertion depends on sampling.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from helpers.trl_setup import PROMPTS, REWARDS, make_trainer, requires_trl

from erpo_lightning.modules.optim import NonFiniteLossError
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

pytestmark = [pytest.mark.slow, requires_trl]
BAD_ROW = 2  # COMPLETIONS[2] is "it is 15<|im_end|>"


def with_value(value):
    """A reward function named `odd_reward` giving REWARDS with `value` at BAD_ROW."""

    def odd_reward(prompts, completions, **_):
        rewards = list(REWARDS)
        rewards[BAD_ROW] = value
        return rewards

    return odd_reward


def plain_reward(prompts, completions, **_):
    return list(REWARDS)


def assert_unchanged(model, model_path) -> None:
    initial = load_tiny_model(model_path).state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, initial[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("funcs", "message"),
    [
        ([with_value(math.inf)], "reward function 'odd_reward' returned inf for row 2"),
        ([with_value(-math.inf)], "reward function 'odd_reward' returned -inf for row 2"),
        ([with_value(math.nan)], "reward function 'odd_reward' returned nan for row 2"),
        ([plain_reward, with_value(math.nan)], "reward function 'odd_reward' returned nan for row 2"),  # not a None
        ([with_value(None)], "every reward function returned None for row 2"),
    ],
    ids=["+inf", "-inf", "nan", "nan_beside_a_finite_reward", "none"],
)
def test_a_non_finite_reward_is_refused_naming_function_value_and_row(funcs, message, tiny_model_path, tmp_path):
    trainer = make_trainer(tiny_model_path, tmp_path, max_steps=1, optim="sgd", inputs={"reward_funcs": funcs})
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        trainer.train()
    assert str(error.value).startswith("ERPOTrainer: ") and "\n" not in str(error.value)
    assert "it is 15" in str(error.value)  # the completion of that row
    assert_unchanged(trainer.model, tiny_model_path)


def test_finite_and_none_rewards_still_train(tiny_model_path, tmp_path):
    """None from one function beside a finite reward is TRL's "not scored here": the step is taken."""
    funcs = [plain_reward, with_value(None)]
    trainer = make_trainer(tiny_model_path, tmp_path, max_steps=1, optim="sgd", inputs={"reward_funcs": funcs})
    trainer.train()
    assert trainer.state.global_step == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_weights_are_checked_after_every_optimizer_step(tiny_model_path, tmp_path):
    """lr 1e30 without clipping: the weights' norm overflows at the first step, which stops the run (as `erpo fit`)."""
    trainer = make_trainer(
        tiny_model_path, tmp_path, max_steps=2, optim="sgd", learning_rate=1e30, max_grad_norm=0.0
    )  # fmt: skip
    with pytest.raises(NonFiniteLossError, match="not finite after the optimizer step at global step 1") as error:
        trainer.train()
    assert "GRPOConfig.learning_rate" in str(error.value) and "model." not in str(error.value)
    assert trainer.state.global_step == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"algorithm": "erpo_typo"}, "ERPOTrainer: unknown algorithm 'erpo_typo'"),
        ({"clip_low": -0.2}, "ERPOTrainer: clip_low / clip_high must be >= 0"),
        ({"query_weight_source": "current", "query_weight_norm": "dataset"}, "ERPOTrainer: query_weight_source"),
    ],
)
def test_algorithm_errors_name_the_trainer_arguments(settings, message, tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        make_trainer(tiny_model_path, tmp_path, **settings)
    assert "model." not in str(error.value)


@pytest.mark.parametrize(
    ("prompts", "eval_prompts", "message"),
    [
        ([PROMPTS[0], "", PROMPTS[2]], None, "train_dataset row 1 has an empty prompt ('')"),
        (PROMPTS, ["Compute 1 + 1.", " \n"], "eval_dataset row 1 has an empty prompt"),
        ([[{"role": "user", "content": p}] for p in ("2 + 2?", " ")], None, "train_dataset row 1 has an empty prompt"),
    ],
    ids=["empty", "blank_eval", "empty_chat"],
)
def test_empty_prompts_are_refused_before_theta0_scoring(prompts, eval_prompts, message, tiny_model_path, tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": prompts})
    with pytest.raises(ValueError, match=re.escape(f"ERPOTrainer: {message}")) as error:
        make_trainer(tiny_model_path, tmp_path, eval_prompts=eval_prompts, inputs={"train_dataset": dataset})
    assert "\n" not in str(error.value)  # the blank prompt is quoted as its repr
    assert not (tmp_path / "erpo_reference").exists()


@pytest.mark.parametrize(
    ("train_prompts", "eval_prompts", "name"),
    [([], None, "train_dataset"), (PROMPTS, {"held_out": []}, "eval_dataset['held_out']")],
    ids=["train", "eval"],
)
def test_an_empty_dataset_is_refused_naming_it_before_trl_builds_anything(
    train_prompts, eval_prompts, name, tiny_model_path, tmp_path
):
    """TRL meets an empty dataset with a bare IndexError (issue 54 item 11)."""
    from datasets import Dataset

    inputs = {"train_dataset": Dataset.from_dict({"prompt": train_prompts})}
    if eval_prompts is not None:
        inputs["eval_dataset"] = {key: Dataset.from_dict({"prompt": rows}) for key, rows in eval_prompts.items()}
    with pytest.raises(ValueError, match=re.escape(f"ERPOTrainer: {name} is empty (0 rows): give it at least one")):
        make_trainer(tiny_model_path, tmp_path, inputs=inputs)
    assert not (tmp_path / "erpo_reference").exists()


def test_chat_prompts_without_a_chat_template_are_refused_before_theta0_scoring(tmp_path):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from erpo_lightning.toy import SHIPPED_DIR

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    tokenizer.chat_template = None
    chats = Dataset.from_dict({"prompt": [[{"role": "user", "content": prompt}] for prompt in PROMPTS]})
    inputs = {"train_dataset": chats, "processing_class": tokenizer}
    with pytest.raises(ValueError, match="ERPOTrainer: train_dataset holds conversational prompts but the tokenizer "):
        make_trainer(SHIPPED_DIR, tmp_path, inputs=inputs)
    assert not (tmp_path / "erpo_reference").exists()
