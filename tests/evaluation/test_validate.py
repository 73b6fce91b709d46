"""`erpo validate` as a user runs it, and TemperatureSweepCallback inside a real `Trainer.fit` (tiny model)."""

import csv
import json

import lightning.pytorch as pl
import pytest
import torch
import yaml
from helpers.fit_configs import run_erpo
from helpers.policies import ParityReward, PolicyModule

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback
from erpo_lightning.data import QueryDataModule
from erpo_lightning.evaluation import Benchmark, Sweep, SweepConfig, run_validate
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine, VLLMEngine
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

TEMPERATURES = [0.4, 1.2]


class SizedHFEngine(HFEngine):
    """HF generate behind a VLLMEngine's context bookkeeping: `setup` records the `max_model_len` that VLLMEngine
    would be built with at that moment, so the fast tier checks the declarations without starting vLLM."""

    def __init__(self) -> None:
        super().__init__()
        self.sizing = VLLMEngine()
        self.built_with: int | None = None

    def require_context(self, tokens: int) -> None:
        self.sizing.require_context(tokens)

    def setup(self, policy, tokenizer) -> None:
        if self.built_with is None:
            self.built_with = self.sizing.llm_kwargs(policy)["max_model_len"]
        super().setup(policy, tokenizer)


@pytest.fixture()
def checkpoint(tmp_path, tiny_model_path):
    """A Lightning-style checkpoint whose policy weights differ from the base model's."""
    policy = load_tiny_model(tiny_model_path)
    torch.manual_seed(1)
    state = {f"policy.{key}": value + 0.05 * torch.randn_like(value) for key, value in policy.state_dict().items()}
    path = tmp_path / "step7.ckpt"
    torch.save({"state_dict": state}, path)
    return path


@pytest.mark.slow
def test_validate_writes_table_files_and_plot(tmp_path, tiny_model_path, benchmarks_dir, checkpoint):
    out = tmp_path / "sweep"
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "logger": False, "default_root_dir": str(tmp_path)},
        "model": {"model_path": str(tiny_model_path)},
        "data": {"template": "qwen25-math-cot"},  # no training data: a bare model directory is evaluated
        "rollout": {
            "engine": {"class_path": "erpo_lightning.rollout.HFEngine"},
            "reward": {"class_path": "erpo_lightning.rewards.MathReward", "init_args": {"num_workers": 0}},
            "max_new_tokens": 6,
        },
        "sweep": {
            "benchmarks": [
                {"source": {"path": str(benchmarks_dir / "gsm8k.jsonl")}, "k": 2},
                {"source": {"path": str(benchmarks_dir / "math500.jsonl")}, "k": 3, "pass_k": 2},
            ],
            "temperatures": TEMPERATURES,
            "max_problems": 3,
            "output_dir": str(out),
            "progress": False,
        },
    }
    path = tmp_path / "validate.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_erpo(
        "validate", "--config", str(path), "--ckpt_path", str(checkpoint), "--include_base", "true", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Avg@k (%) by temperature" in result.stdout and "problems/s" in result.stdout

    rows = list(csv.DictReader((out / "results.csv").open()))
    cells = {(r["run"], r["benchmark"], r["temperature"]): r for r in rows}
    assert {r["run"] for r in rows} == {"base", "step7"}
    assert {r["temperature"] for r in rows} == {"0.4", "1.2", "T<=1.0", "T>1.0", "all"}
    assert cells[("base", "gsm8k", "0.4")]["k"] == "2" and cells[("base", "math500", "1.2")]["pass_k"] == "2"
    assert cells[("step7", "mean", "all")]["problems"] == "6"
    document = json.loads((out / "results.json").read_text())
    for run in document["runs"]:
        assert run["timing"]["problems"] == 2 * 6  # 2 temperatures × (3 + 3) problems
        assert run["timing"]["samples"] == 2 * (3 * 2 + 3 * 3)  # k honoured per benchmark
        assert 0.0 <= run["values"]["val/avg@k/mean"] <= 1.0
    lengths = {run["label"]: run["values"]["val/length/gsm8k/T=0.4"] for run in document["runs"]}
    assert all(0 < value <= 6 for value in lengths.values())
    assert (out / "accuracy_vs_temperature.png").stat().st_size > 10_000


def test_sweep_callback_logs_per_temperature_and_the_gap(tmp_path, tiny_model_path, benchmarks_dir):
    sweep = SweepConfig(
        benchmarks=[Benchmark({"path": str(benchmarks_dir / "amc23.jsonl")}, k=2)],
        temperatures=TEMPERATURES,
        max_new_tokens=4,
        max_problems=2,
        progress=False,
    )
    datamodule = QueryDataModule(
        str(tiny_model_path), [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 4}], batch_size=2,
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    sweeper = TemperatureSweepCallback(sweep, every_n_steps=2, train_sample_size=3, train_k=2)
    rollout = RolloutCallback(HFEngine(), ParityReward(), group_size=2, max_new_tokens=4, seed=0)
    sweeper.bind(rollout.sampler, datamodule.prompt_format(), datamodule.prepare_queries)
    logger = pl.loggers.CSVLogger(tmp_path)
    trainer = pl.Trainer(
        max_steps=2, accelerator="cpu", callbacks=[rollout, sweeper], logger=logger, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(PolicyModule(str(tiny_model_path)), datamodule=datamodule)

    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    logged = [r for r in rows if r.get("val/avg@k/amc23/T=0.4")]
    assert len(logged) == 1 and logged[0]["step"] == "1"  # every 2 batches of 2
    row = logged[0]
    for name in ("val/avg@k/amc23/T=1.2", "val/pass@k/mean/T>1.0", "val/avg@k/train/T<=1.0", "train_eval_gap/T=0.4"):
        assert row[name] != "", name
    gap = float(row["train_eval_gap"])
    assert gap == pytest.approx(float(row["val/avg@k/train"]) - float(row["val/avg@k/mean"]))
    assert "val/avg@k/mean" in row and float(row["val/problems_per_s"]) > 0


@pytest.mark.parametrize("sweep_cap", [5, None])  # None: the rollout's max_new_tokens
def test_validate_sizes_the_engine_to_prompt_limit_plus_response_cap(
    tmp_path, tiny_model_path, benchmarks_dir, sweep_cap
):
    engine = SizedHFEngine()
    rollout = RolloutCallback(engine, ParityReward(), group_size=2, max_new_tokens=3)
    trainer = pl.Trainer(accelerator="cpu", devices=1, callbacks=[rollout], logger=False, default_root_dir=tmp_path)
    datamodule = QueryDataModule(str(tiny_model_path), template="plain", max_prompt_length=400)
    sweep = SweepConfig(
        [Benchmark({"path": str(benchmarks_dir / "gsm8k.jsonl")}, k=1)], temperatures=[1.0], max_new_tokens=sweep_cap,
        max_problems=1, output_dir=str(tmp_path / "sweep"), progress=False,
    )  # fmt: skip
    run_validate(
        trainer, ERPOModule(str(tiny_model_path)), Sweep(sweep, rollout.sampler, datamodule.prompt_format()), []
    )
    assert engine.built_with == 400 + (sweep_cap or 3)


def test_sweep_callback_declares_its_context_before_the_engine_is_built(tmp_path, tiny_model_path, benchmarks_dir):
    sweep = SweepConfig(
        [Benchmark({"path": str(benchmarks_dir / "amc23.jsonl")}, k=1)], temperatures=[1.0], max_new_tokens=9,
        max_problems=1, progress=False,
    )  # fmt: skip
    datamodule = QueryDataModule(
        str(tiny_model_path), [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 2}], batch_size=2,
        max_prompt_length=300, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    engine = SizedHFEngine()
    # The sweep callback comes after the rollout's, whose `on_fit_start` builds the engine.
    callbacks = [
        RolloutCallback(engine, ParityReward(), group_size=2, max_new_tokens=4),
        TemperatureSweepCallback(sweep),
    ]
    callbacks[1].bind(callbacks[0].sampler, datamodule.prompt_format(), datamodule.prepare_queries)
    trainer = pl.Trainer(
        max_steps=1, accelerator="cpu", callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(PolicyModule(str(tiny_model_path)), datamodule=datamodule)
    assert engine.built_with == 300 + 9  # the sweep's cap is the longer one
