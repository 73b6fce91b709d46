"""`erpo export`'s model card (README.md in the exported folder): the run's true global step, algorithm and resolved
loss settings, and the numbers of its last temperature sweep, each compared with the checkpoint and metrics.csv read
here on their own. A checkpoint records where its run logged (issue 67): another run's metrics.csv beside it is not
read, a checkpoint without the record takes the file beside it saying so, and HFExportCallback's card is the one
`erpo export` writes."""

import csv
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers.fit_configs import run_erpo
from lightning.pytorch.loggers import CSVLogger

from erpo_lightning.common.errors import SettingsError
from erpo_lightning.evaluation import SweepMetric
from erpo_lightning.export.hf_model import export_checkpoint
from erpo_lightning.export.model_card import model_card
from erpo_lightning.toy import SHIPPED_DIR

STATS = ("avg@k", "pass@1", "pass@k", "length", "truncated")


def card_of(folder: Path) -> str:
    return (folder / "README.md").read_text()


def table_row(card: str, first_cell: str, after: str) -> list[str]:
    """The cells of the first Markdown table row starting with `first_cell` after the line starting with `after`."""
    lines = card.split("\n## Final temperature sweep", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    row = next(line for line in lines[start:] if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in row.strip("|").split("|")][1:]


def last_sweep_row(metrics_file: Path, max_step: int) -> dict[str, str]:
    """The last metrics.csv row with sweep values logged at a step <= `max_step`, read with the csv module."""
    rows = [row for row in csv.DictReader(metrics_file.open()) if row.get("val/avg@k/mean")]
    return [row for row in rows if int(row["step"]) <= max_step][-1]


def written(value: str) -> str:
    return f"{float(value):.4f}" if math.isfinite(float(value)) else "nan"


def assert_card_holds_sweep(card: str, row: dict[str, str], benchmarks: list[str], temperatures: list[str]) -> None:
    """The card's two sweep tables hold `row`'s numbers (a metrics.csv row) for `benchmarks` at `temperatures`."""
    for benchmark in benchmarks:
        expected = [written(row[f"val/{stat}/{benchmark}"]) for stat in STATS]
        assert table_row(card, benchmark, "The last sweep up to the checkpoint") == expected, benchmark
        per_temperature = [written(row[f"val/avg@k/{benchmark}/T={t}"]) for t in temperatures]
        assert table_row(card, benchmark, "Avg@k per sampling temperature") == per_temperature, benchmark


@pytest.fixture()
def run_copy(healthy_toy_run, tmp_path) -> Path:
    """The healthy run's checkpoint in a version folder of its own (`<version>/checkpoints/last.ckpt`)."""
    checkpoints = tmp_path / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    return Path(shutil.copy(healthy_toy_run.checkpoint, checkpoints / "last.ckpt"))


def test_card_names_the_runs_step_algorithm_and_says_no_sweep_was_logged(healthy_toy_run, tmp_path):
    """The healthy run (12 steps of `erpo`, no sweep): its metrics.csv beside the checkpoint holds no sweep."""
    checkpoint = torch.load(healthy_toy_run.checkpoint, map_location="cpu", weights_only=True)
    card = card_of(export_checkpoint(healthy_toy_run.checkpoint, tmp_path / "hf"))
    assert card.startswith("---\nlibrary_name: transformers\ntags:\n- erpo-lightning\n")
    assert f"- global step: {checkpoint['global_step']}\n" in card and checkpoint["global_step"] == 12
    assert f"- base model: `{SHIPPED_DIR.resolve()}`" in card
    assert "- algorithm: `erpo`" in card and "| query_kl_coef | 0.01 |" in card
    assert "| use_query_weights | True |" in card
    assert "No sweep was logged" in card
    assert "erpo-lightning" in card.split("## Software", 1)[1]


def test_card_holds_the_resolved_settings_of_another_preset(run_copy, tmp_path):
    checkpoint = torch.load(run_copy, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"].update(algorithm="grpo", query_kl_coef=0.05)
    checkpoint["global_step"] = 7
    torch.save(checkpoint, run_copy)
    card = card_of(export_checkpoint(run_copy, tmp_path / "hf"))
    assert "- algorithm: `grpo`" in card and "- global step: 7\n" in card
    assert "| query_kl_coef | 0.05 |" in card  # the run's override
    assert "| use_query_weights | False |" in card  # grpo's preset, not erpo's
    assert "\n- grpo\n" in card  # a tag


def log_sweeps(folder: Path, steps: list[int]) -> Path:
    """Sweeps of two benchmarks at two temperatures (distinct random values) logged at `steps` by Lightning's own
    CSVLogger, between rows of training metrics; its metrics.csv."""
    logger = CSVLogger(folder.parent, name=folder.name, version="")
    generator = torch.Generator().manual_seed(0)
    for step in steps:
        logger.log_metrics({"train/loss": float(step)}, step=step)
        metric = SweepMetric(["gsm8k", "openai/aime"], [0.5, 1.0], [2, 2])
        for b in range(2):
            for t in range(2):
                correct = torch.rand(3, 4, generator=generator) < 0.5
                lengths = torch.randint(1, 40, (3, 4), generator=generator).double()
                metric.update(b, t, correct, lengths, torch.rand(3, 4, generator=generator) < 0.2)
        values = {name: float(value) for name, value in metric.compute().items()}
        logger.log_metrics({**values, "train_eval_gap": 0.125 * step}, step=step)
    logger.save()
    return Path(logger.log_dir) / "metrics.csv"


def test_card_holds_the_last_sweep_at_or_before_the_checkpoints_step(run_copy, tmp_path):
    """metrics.csv beside the checkpoint (the version folder above `checkpoints/`) holds sweeps at steps 4, 12 and 16;
    the checkpoint holds step 12, so the card shows step 12's numbers, as the file has them."""
    metrics = Path(shutil.copy(log_sweeps(tmp_path / "logged", [4, 12, 16]), run_copy.parents[1]))
    card = card_of(export_checkpoint(run_copy, tmp_path / "hf"))
    row = last_sweep_row(metrics, 12)
    assert row["step"] == "12" and f"read from {metrics}, its row logged at step 12." in card
    assert_card_holds_sweep(card, row, ["gsm8k", "openai/aime", "mean"], ["0.5", "1"])
    assert f"train_eval_gap (Avg@k on the training sample − mean Avg@k): {written(row['train_eval_gap'])}" in card


def test_metrics_option_wins_and_an_unreadable_file_does_not_stop_the_export(run_copy, tmp_path):
    elsewhere = log_sweeps(tmp_path / "elsewhere", [3])
    card = card_of(export_checkpoint(run_copy, tmp_path / "hf", metrics=elsewhere))
    assert f"read from {elsewhere}, its row logged at step 3." in card
    assert_card_holds_sweep(card, last_sweep_row(elsewhere, 3), ["gsm8k", "mean"], ["0.5", "1"])
    damaged = tmp_path / "damaged.csv"
    damaged.write_bytes(b"step,val/avg@k/mean\n\xff\xfe,\x00\n")
    result = run_erpo("export", "--ckpt_path", str(run_copy), "--out", str(tmp_path / "hf2"), "--metrics",
                      str(damaged), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    card = card_of(tmp_path / "hf2")
    assert f"Note: {damaged} could not be read (UnicodeDecodeError" in card
    assert "No sweep was logged" in card and "- global step: 12\n" in card
    assert (tmp_path / "hf2" / "model.safetensors").is_file()


def test_a_missing_metrics_file_is_named_before_anything_loads(run_copy, tmp_path):
    with pytest.raises(SettingsError, match="--metrics: no metrics file at .*none.csv"):
        export_checkpoint(run_copy, tmp_path / "hf", metrics=tmp_path / "none.csv")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow  # a 4-step fit with three sweeps, then two exports
def test_a_real_runs_card_holds_its_sweeps_numbers(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from erpo_lightning.callbacks import RolloutCallback, TemperatureSweepCallback
    from erpo_lightning.cli.command import ERPOLightningTrainer
    from erpo_lightning.data import QueryDataModule
    from erpo_lightning.evaluation import Benchmark, SweepConfig
    from erpo_lightning.modules.erpo_module import ERPOModule
    from erpo_lightning.rewards import MathReward
    from erpo_lightning.rollout import HFEngine

    pl.seed_everything(0)
    train = str(SHIPPED_DIR / "train.jsonl")
    sweep = SweepConfig([Benchmark({"path": train, "limit": 4, "label": "toy"}, k=2)], temperatures=[0.5, 1.0],
                        max_new_tokens=48, progress=False)  # fmt: skip
    sweeper = TemperatureSweepCallback(sweep, every_n_steps=2, train_sample_size=2, train_k=2, run_at_start=True,
                                       run_at_end=True)  # fmt: skip
    data = QueryDataModule(str(SHIPPED_DIR), [{"path": train, "limit": 4}], template="plain", suffix="\n",
                           batch_size=2, max_prompt_length=64, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    rollout = RolloutCallback(HFEngine(), MathReward(num_workers=0), group_size=2, max_new_tokens=48, seed=0)
    sweeper.bind(rollout.sampler, data.prompt_format(), data.prepare_queries)
    every_two = ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)
    trainer = ERPOLightningTrainer(max_steps=4, accelerator="cpu", logger=CSVLogger(tmp_path), log_every_n_steps=1,
                                   enable_progress_bar=False, enable_model_summary=False,
                                   callbacks=[rollout, sweeper, every_two])  # fmt: skip
    trainer.fit(ERPOModule(str(SHIPPED_DIR), learning_rate=1e-3), datamodule=data)
    (metrics,) = tmp_path.rglob("metrics.csv")
    sweep_rows = {row["step"]: row for row in csv.DictReader(metrics.open()) if row.get("val/avg@k/mean")}
    assert list(sweep_rows) == ["0", "1", "3"]  # the sweep after u steps is logged at step u - 1
    for step in (2, 4):
        (ckpt,) = metrics.parent.glob(f"checkpoints/*step={step}.ckpt")
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == step
        row = sweep_rows[str(step - 1)]  # the sweep after `step` steps, not the later one
        card = card_of(export_checkpoint(ckpt, tmp_path / f"hf_{step}"))  # from the checkpoint's sweep history
        assert f"run at global step {step}, read from the sweep history in {ckpt}." in card
        assert_card_holds_sweep(card, row, ["toy", "train", "mean"], ["0.5", "1"])
        assert f"- global step: {step}\n" in card and "- algorithm: `erpo`" in card
        card = card_of(export_checkpoint(ckpt, tmp_path / f"hf_{step}", metrics=metrics))
        assert f"its row logged at step {step - 1}." in card
        assert_card_holds_sweep(card, row, ["toy", "train", "mean"], ["0.5", "1"])


def test_a_checkpoint_that_says_little_still_gets_a_card(tmp_path):
    """No hyper-parameters, step, run config or sweep (a checkpoint not written by `erpo fit`), an initial model on
    the Hub: the card writes what it knows and says what it does not."""
    card = model_card({"callbacks": {"TemperatureSweepCallback": {"history": "not a list of sweeps"}}},
                      tmp_path / "x.ckpt", "Qwen/Qwen2.5-Math-1.5B")  # fmt: skip
    assert card.startswith("---\nbase_model: Qwen/Qwen2.5-Math-1.5B\nlibrary_name: transformers\n")
    assert "- global step: unknown" in card and "- algorithm: `erpo`" in card
    assert "Note: the sweep history in" in card and "No sweep was logged" in card


# ------------------------------------------------- the model card: another run's metrics.csv, HFExportCallback's card
@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, tiny_model_path, benchmarks_dir) -> Path:
    """A 1-step `erpo fit` of the tiny model with a CSV logger, `last.ckpt` in the logger's version folder (Lightning's
    default) and HFExportCallback writing `<root>/hf`; the run's root."""
    from helpers.cli_runs import tiny_config
    from helpers.fit_configs import csv_logger
    from helpers.resume_runs import run_main

    root = tmp_path_factory.mktemp("logged_run")
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
        {"class_path": "erpo_lightning.callbacks.HFExportCallback", "init_args": {"output_dir": str(root / "hf")}},
    ]
    config = tiny_config(root, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=callbacks, max_steps=1)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"].update(logger=csv_logger(root / "logs"), log_every_n_steps=1)
    config.write_text(yaml.safe_dump(settings))
    assert run_main("fit", "--config", str(config)) == 0
    return root


def last_checkpoint(root: Path) -> Path:
    (path,) = (root / "logs").rglob("last.ckpt")
    return path


def sweep_file(folder: Path, step: int = 1) -> Path:
    """A metrics.csv in `folder` holding one sweep row (Avg@k 0.625 on gsm8k) logged at `step`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.csv"
    path.write_text(f"step,train/loss,val/avg@k/gsm8k,val/avg@k/mean\n{step},0.5,0.625,0.625\n")
    return path


def placed(checkpoint: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(checkpoint, target))


def test_the_checkpoint_records_where_its_run_logged(logged_run):
    from erpo_lightning.checkpoints.files import read_checkpoint

    checkpoint = last_checkpoint(logged_run)
    record = read_checkpoint(checkpoint)["erpo"]["logged_run"]
    assert record == {"csv_log_dirs": [str(checkpoint.parents[1].resolve())], "checkpoint_dir": str(checkpoint.parent)}
    assert (checkpoint.parents[1] / "metrics.csv").is_file()


def test_another_runs_metrics_beside_the_checkpoint_is_not_read(logged_run, tmp_path):
    """The checkpoint copied beside another run's metrics.csv (with a sweep): the card names that file as not this
    run's and shows no sweep; the same file where the run's folder, moved whole, would hold it is read."""
    checkpoint = last_checkpoint(logged_run)
    log_dir = checkpoint.parents[1].resolve()
    for where in (tmp_path / "other" / "checkpoints" / "last.ckpt", tmp_path / "version_0" / "last.ckpt"):
        copy = placed(checkpoint, where)
        metrics = sweep_file(copy.parent if copy.parent.name == "version_0" else copy.parents[1])
        card = (export_checkpoint(copy, tmp_path / f"hf_{where.parent.name}") / "README.md").read_text()
        assert (
            f"Note: {metrics} was not read: it is not the log of the run that wrote the checkpoint, which logged to "
            f"{log_dir}; pass that run's file with --metrics."
        ) in card
        assert "No sweep was logged" in card and "| gsm8k |" not in card
        shutil.rmtree(copy.parent)
    moved = placed(checkpoint, tmp_path / "moved" / "version_0" / "checkpoints" / "last.ckpt")
    metrics = sweep_file(moved.parents[1])
    card = (export_checkpoint(moved, tmp_path / "hf_moved") / "README.md").read_text()
    assert f"read from {metrics}, its row logged at step 1." in card and "| gsm8k | 0.6250 |" in card
    assert "Note:" not in card


def test_a_checkpoint_without_the_record_takes_the_file_saying_so(logged_run, tmp_path):
    from erpo_lightning.export.model_card import model_card

    checkpoint = torch.load(last_checkpoint(logged_run), map_location="cpu", weights_only=True)
    path = tmp_path / "other" / "checkpoints" / "last.ckpt"
    metrics = sweep_file(tmp_path / "other")
    del checkpoint["erpo"]["logged_run"]
    card = model_card(checkpoint, path, "base")
    assert f"Note: {metrics} was taken as this run's log without a check: the checkpoint does not record" in card
    assert "| gsm8k | 0.6250 |" in card
    checkpoint["erpo"]["logged_run"] = {"csv_log_dirs": [], "checkpoint_dir": None}
    card = model_card(checkpoint, path, "base")
    assert f"Note: {metrics} was not read: the run that wrote the checkpoint logged no metrics.csv" in card
    assert "No sweep was logged" in card


def test_the_runs_own_hf_model_has_the_card_erpo_export_writes(logged_run, tmp_path):
    """HFExportCallback's folder holds README.md, the same card as `erpo export` of the run's last checkpoint (the
    same step, settings and data), but for the lines saying what wrote it."""
    callback_card = (logged_run / "hf" / "README.md").read_text()
    export_card = (export_checkpoint(last_checkpoint(logged_run), tmp_path / "hf") / "README.md").read_text()
    assert "- checkpoint: none (written from the policy in memory)\n" in callback_card
    assert "Exported by `HFExportCallback` (during training) of erpo-lightning" in callback_card
    assert "- global step: 1\n" in callback_card and "- algorithm: `erpo`" in callback_card
    assert "- training data: path " in callback_card and "No sweep was logged" in callback_card

    def kept(card: str) -> list[str]:
        return [line for line in card.splitlines() if not line.startswith(("- checkpoint:", "Exported by"))]

    assert kept(callback_card) == kept(export_card)
