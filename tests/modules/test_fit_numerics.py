"""Numbers a run must not invent or keep (issue 30): logs of skipped steps and sweeps, diverged weights, checkpoints."""

import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers.logged_fits import logged_fit
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.callbacks import RolloutCallback, TemperatureSweepCallback
from erpo_lightning.cli.command import ERPOLightningTrainer
from erpo_lightning.data import QueryDataModule
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.evaluation.sweep import Benchmark
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.optim import NonFiniteLossError
from erpo_lightning.rollout import HFEngine


class ParityReward:
    """Half the untrained tiny model's responses score 1 (character-code parity); call `nan_call` scores NaN."""

    def __init__(self, nan_call: int | None = None) -> None:
        self.calls, self.nan_call = 0, nan_call

    def __call__(self, responses: list[str], golds: list[str]) -> list[float]:
        self.calls += 1
        if self.calls == self.nan_call:
            return [float("nan")] * len(responses)
        return [float(sum(map(ord, text)) % 2 == 0) for text in responses]


def fit(model_path, data_file, root, max_steps, module, reward, callbacks=()):
    """A tiny fit with the `erpo` command's trainer, logging every step to `root`/…/metrics.csv; its rows."""
    pl.seed_everything(0)
    data = QueryDataModule(
        str(model_path), [{"path": str(data_file), "limit": 8}], template="plain", max_prompt_length=1024,
        batch_size=2, cache_dir=str(root / "cache"),
    )  # fmt: skip
    rollout = RolloutCallback(HFEngine(), reward, group_size=2, max_new_tokens=6, seed=0)
    for callback in callbacks:  # wired as the erpo CLI wires them
        if isinstance(callback, TemperatureSweepCallback):
            callback.bind(rollout.sampler, data.prompt_format(), data.prepare_queries)
    checkpointing = any(isinstance(c, ModelCheckpoint) for c in callbacks)
    return logged_fit(root, module, data, [rollout, *callbacks], max_steps, checkpointing)


def test_a_skipped_step_logs_nan_not_the_previous_steps_values(tiny_model_path, benchmarks_dir, tmp_path):
    module = ERPOModule(str(tiny_model_path), learning_rate=1e-3, nan_policy="skip")
    rows = fit(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, 3, module, ParityReward(nan_call=2))
    skipped = [row for row in rows if row["train/skipped_steps"] == "1.0"]
    first = rows[0]
    assert first["train/skipped_steps"] == "0.0" and float(first["train/loss"]) == float(first["train/loss"])
    assert skipped, rows
    for name in ("train/loss", "train/query_kl", "train/pg_loss", "train/entropy"):
        assert skipped[0][name] in ("", "nan"), (name, skipped[0][name], first[name])  # not step 1's value again
    assert float(skipped[1]["train/loss"]) == float(skipped[1]["train/loss"])  # the next step logs its own value


def test_a_diverging_step_stops_naming_it_and_writes_no_checkpoint(tiny_model_path, benchmarks_dir, tmp_path):
    """lr 1e30: the weights are finite but their norm overflows; the run stops at that step, under either policy."""
    module = ERPOModule(str(tiny_model_path), learning_rate=1e30, nan_policy="skip", gradient_clip_norm=None)
    folder = tmp_path / "ckpt"
    checkpoint = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_last=True)
    with pytest.raises(NonFiniteLossError, match=r"not finite after the optimizer step at global step 0 \(epoch 0\)"):
        fit(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, 2, module, ParityReward(), [checkpoint])
    assert not list(folder.glob("*.ckpt")) if folder.exists() else True


def test_no_checkpoint_holds_non_finite_weights(tiny_model_path):
    module = ERPOModule(str(tiny_model_path))
    module.on_save_checkpoint({"state_dict": {"policy.w": torch.ones(3), "policy.steps": torch.tensor([7])}})
    with pytest.raises(ValueError, match="refusing to write a checkpoint whose weight policy.w is not finite"):
        module.on_save_checkpoint({"state_dict": {"policy.w": torch.tensor([1.0, float("inf")])}})


def test_sweep_values_are_logged_only_on_the_steps_that_ran_a_sweep(tiny_model_path, benchmarks_dir, tmp_path):
    sweep = SweepConfig(
        benchmarks=[Benchmark({"path": str(benchmarks_dir / "amc23.jsonl")}, k=1)], temperatures=[1.0],
        max_new_tokens=4, max_problems=1, progress=False,
    )  # fmt: skip
    sweeper = TemperatureSweepCallback(sweep, every_n_steps=2, train_sample_size=0)
    module = ERPOModule(str(tiny_model_path), learning_rate=1e-3)
    rows = fit(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, 3, module, ParityReward(), [sweeper])
    swept = [row["step"] for row in rows if row.get("val/avg@k/amc23")]
    assert swept == ["1"], [(row["step"], row.get("val/avg@k/amc23")) for row in rows]


def test_a_tiny_dataset_and_all_truncated_responses_are_each_said_once(tiny_model_path, benchmarks_dir, tmp_path):
    """One query for batches of 2, and 6-token responses the untrained model never finishes: one warning each."""
    pl.seed_everything(0)
    data = QueryDataModule(
        str(tiny_model_path), [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 1}], template="plain",
        max_prompt_length=1024, batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    trainer = ERPOLightningTrainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,  # where the default SampledCompletions writes
        callbacks=[RolloutCallback(HFEngine(), ParityReward(), group_size=2, max_new_tokens=6, seed=0)],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(ERPOModule(str(tiny_model_path), learning_rate=1e-3), datamodule=data)
    messages = [str(w.message) for w in caught]
    small = [m for m in messages if "training queries cannot fill one batch of 2" in m]
    truncated = [m for m in messages if "every response of this run's first step reached rollout.max_new_tokens" in m]
    assert (len(small), len(truncated)) == (1, 1), messages
