"""The pass-rate filter's cache key holds everything that decides a pass and how samples are drawn (issue 67): the
reward's full settings, the correctness threshold, the response cap and the dtype the model samples in. Before, the
three graders strict, lenient and math_verify mapped to one rates file, and a second run with another grader or
threshold filtered with the first run's rates. Built from the shipped toy model and its training data, real graders."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

import erpo_lightning.data.datamodule as datamodule_module
from erpo_lightning.data import QueryDataModule, prepare_queries
from erpo_lightning.data.pass_rate import (
    KEY_FORMAT,
    PassRateFilter,
    load_or_compute_rates,
    pass_rate_fingerprint,
    rates_file_name,
    reward_description,
)
from erpo_lightning.data.templates import resolve_template
from erpo_lightning.rewards import CombinedReward, MathReward, ThinkFormatReward
from erpo_lightning.rollout import HFEngine, RolloutSampler, SamplingSettings

SHIPPED = Path(__file__).resolve().parents[2] / "erpo_lightning" / "toy" / "shipped"


@pytest.fixture(scope="module")
def toy_data():
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    source = {"path": str(SHIPPED / "train.jsonl"), "limit": 4}
    return prepare_queries([source], tokenizer, resolve_template("plain", suffix="\n"), 64)


def file_of(data, reward=None, threshold=1.0, max_new_tokens=48, filter_cap=None, dtype="float32") -> str:
    """The rates file name the filter would use with these settings (the rollout's sampler, as a fit builds it)."""
    reward = MathReward(num_workers=0) if reward is None else reward
    sampler = RolloutSampler(HFEngine(), reward, SamplingSettings(max_new_tokens=max_new_tokens), None, threshold)
    settings = PassRateFilter(samples=2, max_new_tokens=filter_cap)
    return rates_file_name(pass_rate_fingerprint(str(SHIPPED), data, sampler, settings, dtype))


def test_the_same_settings_give_the_same_file_also_after_grading(toy_data):
    reward = MathReward(num_workers=0)
    before = file_of(toy_data, reward)
    reward(["\\boxed{19}", "7"], ["19", "8"])  # counters change; they are state, not settings
    assert file_of(toy_data, reward) == before == file_of(toy_data, MathReward(num_workers=0))


def test_the_grader_preset_changes_the_key(toy_data):
    assert file_of(toy_data, MathReward(num_workers=0, preset="strict")) != file_of(
        toy_data, MathReward(num_workers=0, preset="lenient")
    )
    one_convention = MathReward(num_workers=0, conventions={"units": False})
    assert file_of(toy_data, one_convention) != file_of(toy_data, MathReward(num_workers=0))
    assert file_of(toy_data, MathReward(num_workers=0, correct_reward=2.0)) != file_of(toy_data)  # not in describe()


def test_the_correctness_threshold_changes_the_key(toy_data):
    assert file_of(toy_data, threshold=1.0) != file_of(toy_data, threshold=0.5)


def test_the_response_cap_changes_the_key(toy_data):
    assert file_of(toy_data, max_new_tokens=48) != file_of(toy_data, max_new_tokens=32)  # the rollout's cap
    assert file_of(toy_data, filter_cap=16) != file_of(toy_data, filter_cap=24)  # the filter's own
    # The filter's own cap replaces the rollout's: the rollout's no longer matters then.
    assert file_of(toy_data, max_new_tokens=48, filter_cap=16) == file_of(toy_data, max_new_tokens=32, filter_cap=16)


def test_the_sampling_dtype_changes_the_key(toy_data):
    assert file_of(toy_data, dtype="float32") != file_of(toy_data, dtype="bfloat16")


def test_strict_lenient_and_math_verify_no_longer_share_a_cache_file(toy_data, tmp_path):
    graders = {
        "strict": MathReward(num_workers=0),
        "lenient": MathReward(num_workers=0, preset="lenient"),
        "math_verify": MathReward(num_workers=1, backend="math_verify"),  # built only: no worker starts
    }
    files = {name: file_of(toy_data, grader) for name, grader in graders.items()}
    assert len(set(files.values())) == 3, files
    measured = []
    for name in graders:  # each grader measures its own rates; none reads another's
        rates, loaded = load_or_compute_rates(
            tmp_path / files[name], {"grader": name}, lambda: measured.append(1) or torch.zeros(2, dtype=torch.float64)
        )
        assert not loaded
    assert len(measured) == 3 and len(list(tmp_path.iterdir())) == 3


def test_a_users_reward_arguments_change_the_key(toy_data):
    class Threshold:
        def __init__(self, cutoff: float) -> None:
            self.cutoff = cutoff
            self._calls = 0  # state, not a setting

        def __call__(self, responses, golds):
            self._calls += 1
            return [float(len(r) >= self.cutoff) for r in responses]

    def scaled(responses, golds, scale=1.0):
        return [scale * (r.strip() == g) for r, g in zip(responses, golds, strict=True)]

    assert file_of(toy_data, Threshold(3)) != file_of(toy_data, Threshold(4))
    assert file_of(toy_data, functools.partial(scaled, scale=2.0)) != file_of(toy_data, scaled)
    combined = [MathReward(num_workers=0), ThinkFormatReward()]
    assert file_of(toy_data, CombinedReward(combined, [1.0, 0.1])) != file_of(
        toy_data, CombinedReward(combined, [1.0, 0.2])
    )
    assert file_of(toy_data, CombinedReward([Threshold(3)])) != file_of(toy_data, CombinedReward([Threshold(4)]))


def test_a_reward_that_cannot_describe_itself_is_refused():
    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, responses, golds):
            return [0.0] * len(responses)

    with pytest.raises(ValueError) as refused:
        reward_description(Locked())
    message = str(refused.value)
    assert "data.pass_rate_filter keys its cached pass rates by the reward's settings" in message
    assert "Locked cannot describe them: its attribute 'lock' is a lock, not plain data" in message
    assert "Give it a `describe()` method" in message

    class Described(Locked):
        def describe(self) -> dict:
            return {"kind": "locked"}

    assert reward_description(Described())["describe"] == {"kind": "locked"}


def test_an_old_cache_file_is_measured_again_with_the_reason(toy_data, tmp_path, capsys):
    sampler = RolloutSampler(HFEngine(), MathReward(num_workers=0), SamplingSettings(max_new_tokens=48))
    fingerprint = pass_rate_fingerprint(str(SHIPPED), toy_data, sampler, PassRateFilter(samples=2), "float32")
    assert fingerprint["key_format"] == KEY_FORMAT
    old = {key: fingerprint[key] for key in ("weights_hash", "tokenizer_hash", "dataset_fingerprint", "sampling")}
    old["reward"] = "erpo_lightning.rewards.math_reward.MathReward"  # the old key: a class name only
    path = tmp_path / rates_file_name(fingerprint)
    path.write_text(json.dumps({"fingerprint": old, "rates": [1.0, 1.0, 1.0, 1.0]}))
    rates, loaded = load_or_compute_rates(path, fingerprint, lambda: torch.full((4,), 0.25, dtype=torch.float64))
    assert not loaded and rates.tolist() == [0.25] * 4
    assert f"measuring again instead of reading {path}: it was written with key format 1, not {KEY_FORMAT}" in (
        capsys.readouterr().err
    )
    assert json.loads(path.read_text())["fingerprint"] == fingerprint  # rewritten with the new key
    assert load_or_compute_rates(path, fingerprint, lambda: pytest.fail("measured again"))[1] is True


def test_a_fit_with_another_grader_measures_again(tmp_path, monkeypatch, capsys):
    """The data module's own path: the first grader writes its rates, the same grader reads them, another grader
    measures its own (2 queries x 2 samples of 4 tokens from the shipped model)."""
    monkeypatch.setattr(datamodule_module, "PASS_RATE_ROOT", tmp_path / "rates")
    data_file = tmp_path / "q.jsonl"
    data_file.write_text("".join((SHIPPED / "train.jsonl").read_text().splitlines(keepends=True)[:2]))

    def filtered(reward) -> str:
        data = QueryDataModule(
            str(SHIPPED), [{"path": str(data_file)}], template="plain", suffix="\n", max_prompt_length=64,
            pass_rate_filter={"samples": 2, "max_new_tokens": 4, "batch_size": 2},
        )  # fmt: skip
        data.prepare_queries()
        sampler = RolloutSampler(HFEngine(), reward, SamplingSettings(max_new_tokens=48), data.tokenizer)
        trainer = SimpleNamespace(callbacks=[SimpleNamespace(sampler=sampler)])
        data.filter_by_pass_rate(trainer, "float32")
        return capsys.readouterr().err

    assert "written to" in filtered(MathReward(num_workers=0))
    assert "loaded from" in filtered(MathReward(num_workers=0))
    assert "written to" in filtered(MathReward(num_workers=0, preset="lenient"))
    assert len(list((tmp_path / "rates").iterdir())) == 2
