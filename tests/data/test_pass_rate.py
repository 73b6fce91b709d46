"""The offline pass-rate filter (issue 55 item 4): the base model's pass rate of every training query, measured with
the training reward and the sweep's seeding, keeps exactly the queries inside the band; the rates are cached by
fingerprint and the setting is checked before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.policies import PolicyModule, fit_rollouts

import erpo_lightning.data.datamodule as datamodule_module
from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data import QueryDataModule, prepare_queries
from erpo_lightning.data.pass_rate import PassRateFilter, keep_band, load_or_compute_rates, pass_rates
from erpo_lightning.data.templates import resolve_template
from erpo_lightning.rollout import HFEngine, RolloutSampler, SamplingSettings
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model

GOLDS = ["always", "never", "parity", "parity", "parity", "parity", "parity", "parity"]
BAND = {"low": 0.2, "high": 0.6, "samples": 5, "temperature": 1.0, "max_new_tokens": 3, "batch_size": 3}


def band_reward(responses, golds):
    """Pays every response to an "always" query, none to a "never" one, and a "parity" one's when the response's
    character codes sum to an even number: pass rates of exactly 1, exactly 0, and in between."""
    paid = {
        "always": lambda text: True,
        "never": lambda text: False,
        "parity": lambda text: sum(map(ord, text)) % 2 == 0,
    }
    return [float(paid[gold](text)) for text, gold in zip(responses, golds, strict=True)]


def write_queries(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    rows = [{"id": i, "problem": f"Question {i}: say something.", "answer": gold} for i, gold in enumerate(GOLDS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def measured_rates(tiny_model_path, path: Path, settings: PassRateFilter):
    tokenizer = build_byte_tokenizer()
    data = prepare_queries([{"path": str(path)}], tokenizer, resolve_template("plain"), 64)
    sampler = RolloutSampler(HFEngine(), band_reward, SamplingSettings(max_new_tokens=3), tokenizer)
    sampler.setup(load_tiny_model(tiny_model_path))
    return data, pass_rates(data, sampler, settings)


def test_the_filter_keeps_exactly_the_queries_whose_measured_rate_is_in_the_band(tiny_model_path, tmp_path):
    settings = PassRateFilter(**BAND)
    data, rates = measured_rates(tiny_model_path, write_queries(tmp_path), settings)
    assert rates[0] == 1.0 and rates[1] == 0.0  # measured: every response paid, none paid
    parity = rates[2:].tolist()
    assert all(rate * 5 == round(rate * 5) for rate in parity)  # shares of 5 samples
    inside = [i for i, rate in enumerate(rates.tolist()) if 0.2 <= rate <= 0.6]
    assert inside and any(0 < rate < 1 and rate > 0.6 for rate in parity), parity  # the band cuts among them
    kept = keep_band(data, rates, settings)
    assert [q.query_id for q in kept.queries] == [data.queries[i].query_id for i in inside]
    assert kept.prompt_ids == [data.prompt_ids[i] for i in inside]
    _, again = measured_rates(tiny_model_path, write_queries(tmp_path), settings)
    assert again.tolist() == rates.tolist()  # seeded as the sweep seeds: reproducible


def test_the_rates_are_cached_by_fingerprint(tmp_path):
    import torch

    path, calls = tmp_path / "rates.json", []

    def compute():
        calls.append(1)
        return torch.tensor([0.5, 1.0], dtype=torch.float64)

    assert load_or_compute_rates(path, {"a": 1}, compute)[1] is False
    rates, loaded = load_or_compute_rates(path, {"a": 1}, compute)
    assert loaded and rates.tolist() == [0.5, 1.0] and len(calls) == 1
    assert load_or_compute_rates(path, {"a": 2}, compute)[1] is False and len(calls) == 2


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"low": 0.9, "high": 0.1}, r"the band needs 0 <= low <= high <= 1, got low=0.9, high=0.1"),
        ({"samples": 0}, r"data.pass_rate_filter.samples must be >= 1, got 0"),
        ({"temperature": -1.0}, r"data.pass_rate_filter.temperature must be"),
        ({"hgh": 0.5}, r"unknown keys \['hgh'\]; valid keys: low, high"),
    ],
)
def test_a_bad_setting_is_refused_when_the_module_is_built(tiny_model_path, setting, message):
    with pytest.raises(ValueError, match=message):
        QueryDataModule(str(tiny_model_path), [{"path": "q.jsonl"}], pass_rate_filter=setting)


@pytest.mark.slow  # a fit end to end: out of the `make test-fast` loop
def test_a_fit_trains_on_the_band_only_and_caches_the_rates(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr(datamodule_module, "PASS_RATE_ROOT", tmp_path / "rates")
    path = write_queries(tmp_path)
    data = QueryDataModule(
        str(tiny_model_path), [{"path": str(path)}], template="plain", max_prompt_length=64, batch_size=1,
        cache_dir=str(tmp_path / "cache"), pass_rate_filter=BAND,
    )  # fmt: skip
    callback = RolloutCallback(HFEngine(), band_reward, group_size=2, max_new_tokens=3, seed=0)
    module = PolicyModule(str(tiny_model_path))
    fit_rollouts(module, callback, 1, datamodule=data)
    _, rates = measured_rates(tiny_model_path, path, PassRateFilter(**BAND))
    assert data.pass_rates.tolist() == rates.tolist()
    expected = [f"q/{i}" for i, rate in enumerate(rates.tolist()) if 0.2 <= rate <= 0.6]
    assert [q.query_id for q in data.data.queries] == expected
    assert len(data.cache) == len(expected)  # the reference cache covers the kept queries only
    (written,) = (tmp_path / "rates").iterdir()
    assert json.loads(written.read_text())["rates"] == rates.tolist()


def test_the_saved_hyperparameters_hold_the_filter_as_plain_data(tiny_model_path):
    data = QueryDataModule(str(tiny_model_path), [{"path": "q.jsonl"}], pass_rate_filter=PassRateFilter(low=0.1))
    assert data.hparams["pass_rate_filter"] == {
        "low": 0.1, "high": 1.0, "samples": 8, "temperature": 1.0, "max_new_tokens": None, "batch_size": 64, "seed": 0
    }  # fmt: skip
    assert data.pass_rate_filter == PassRateFilter(low=0.1)
