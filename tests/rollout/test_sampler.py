"""A reward's values are checked where they become a tensor (issue 67): a NaN (or infinity) for every response used
to stop a run with "non-finite loss at global step 0", blaming the loss, and None or text with a raw TypeError naming
neither the reward nor the row. Now each is refused naming the reward, the row (its index, its prompt and response)
and the value; under `model.nan_policy: skip` a NaN passes on with a warning naming them, and the step is skipped.
On the shipped toy model and problems, through the real sampler and rollout callback."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
from helpers.logged_fits import logged_fit
from transformers import AutoTokenizer

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data import QueryDataModule
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine, RolloutSampler, SamplingSettings
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

SHIPPED = Path(__file__).resolve().parents[2] / "erpo_lightning" / "toy" / "shipped"
OWN = f"{__name__}.constant.<locals>.returns_value"  # how messages name the reward `constant` makes
PROBLEMS = [json.loads(line) for line in (SHIPPED / "train.jsonl").read_text().splitlines()[:2]]


def constant(value):
    """A reward returning `value` for every response, named by its own function name in messages."""

    def returns_value(responses, golds):
        return [value] * len(responses)

    return returns_value


def nan_on_second_call():
    calls = []

    def nan_later(responses, golds):
        calls.append(1)
        return [float("nan") if len(calls) == 2 else 0.5 * (i % 2) for i in range(len(responses))]

    return nan_later


@pytest.fixture(scope="module")
def policy():
    return load_tiny_model(SHIPPED)


def graded(policy, reward, non_finite_rewards="stop"):
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    sampler = RolloutSampler(HFEngine(), reward, SamplingSettings(max_new_tokens=4), tokenizer, 1.0, non_finite_rewards)
    sampler.setup(policy)
    prompts = [tokenizer(row["problem"] + "\n")["input_ids"] for row in PROBLEMS]
    problems = [row["problem"] for row in PROBLEMS]
    return sampler.sample_and_grade(prompts, [row["answer"] for row in PROBLEMS], 2, 1.0, 0, problems=problems)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("nan"), "returned nan for 4 of 4 responses, first for row 0 (prompt 0: 'Compute 5 + 9 + 5.'; response"),
        (float("inf"), "returned inf for 4 of 4 responses, first for row 0 (prompt 0: 'Compute 5 + 9 + 5.'; response"),
        (1e39, "returned 1e+39 for 4 of 4 responses"),  # finite in Python, infinite as float32
    ],
)
def test_a_non_finite_reward_is_refused_naming_the_reward_row_and_value(policy, value, says):
    with pytest.raises(ValueError) as refused:
        graded(policy, constant(value))
    message = str(refused.value)
    assert message.startswith(f"the reward {OWN} {says}"), message
    assert "a reward must return a finite number for every response (under model.nan_policy: skip" in message


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "not a NoneType"),
        ("1.0", "not text (even one that reads as a number)"),
        ([1.0], "not a list"),
    ],
)
def test_a_value_that_is_not_a_number_is_refused_naming_the_reward_row_and_value(policy, value, kind):
    with pytest.raises(ValueError) as refused:
        graded(policy, constant(value), non_finite_rewards="skip")  # not a number: refused under either policy
    message = str(refused.value)
    assert message.startswith(
        f"the reward {OWN} returned {value!r} for row 0 (prompt 0: 'Compute 5 + 9 + 5.'; response "
    ), message
    assert message.endswith(f"a reward must return a number for every response, {kind}")


def test_numbers_of_every_kind_are_accepted(policy):
    import numpy as np
    import torch

    values = iter([True, 1, np.float64(0.5), torch.tensor(0.25)])
    result = graded(policy, lambda responses, golds: [next(values) for _ in responses])
    assert result.rewards.flatten().tolist() == [1.0, 1.0, 0.5, 0.25]


def test_a_nan_under_skip_is_named_in_a_warning_and_passes_on(policy):
    with pytest.warns(UserWarning, match=r"model.nan_policy is skip, so this step's loss is not finite") as warned:
        result = graded(policy, constant(float("nan")), non_finite_rewards="skip")
    assert f"the reward {OWN} returned nan for 4 of 4" in str(warned[0].message)
    assert result.rewards.isnan().all()


def fit(root: Path, reward, nan_policy: str, steps: int) -> list[dict]:
    """A fit of the shipped model on 4 shipped problems with the `erpo` command's trainer; its metrics rows."""
    pl.seed_everything(0)
    data = QueryDataModule(
        str(SHIPPED), [{"path": str(SHIPPED / "train.jsonl"), "limit": 4}], template="plain", suffix="\n",
        max_prompt_length=64, batch_size=2, cache_dir=str(root / "cache"),
    )  # fmt: skip
    module = ERPOModule(str(SHIPPED), learning_rate=1e-4, nan_policy=nan_policy)
    rollout = RolloutCallback(HFEngine(), reward, group_size=2, max_new_tokens=6, seed=0)
    return logged_fit(root, module, data, [rollout], steps)


@pytest.mark.slow  # two short fits: out of the `make test-fast` loop
def test_a_fit_names_the_reward_not_the_loss_and_skips_under_nan_policy_skip(tmp_path):
    with pytest.raises(ValueError) as refused:
        fit(tmp_path / "stop", constant(float("nan")), "stop", 2)
    assert f"the reward {OWN} returned nan for 4 of 4" in str(refused.value)
    assert "non-finite loss" not in str(refused.value)
    with pytest.warns(UserWarning, match=r"nan_later returned nan for 4 of 4 responses.*the step is skipped"):
        rows = fit(tmp_path / "skip", nan_on_second_call(), "skip", 3)
    assert [row["train/skipped_steps"] for row in rows if row.get("train/skipped_steps")][:2] == ["0.0", "1.0"]
