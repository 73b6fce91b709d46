"""Trackers out of the box: TensorBoard writes every metric (Query-KL included) and the sampled completions; the
W&B and MLflow overlays select their loggers over the quickstart."""

import json
from pathlib import Path

import pandas
import pytest
import yaml
from helpers.cli_runs import run_main
from helpers.healthy_run import STEPS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
OVERLAYS = {
    "logger_tensorboard.yaml": "lightning.pytorch.loggers.TensorBoardLogger",
    "logger_wandb.yaml": "lightning.pytorch.loggers.WandbLogger",
    "logger_mlflow.yaml": "lightning.pytorch.loggers.MLFlowLogger",
}


def test_tensorboard_run_logs_query_kl_and_completions(healthy_toy_run):
    """The healthy toy run logs to TensorBoard beside its CSV logger: every metric at every step (Query-KL included,
    the steps the CSV has) and the sampled completions as a text summary at the steps completions.jsonl holds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(healthy_toy_run.tensorboard_dir), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    for name in ("train/query_kl", "train/loss", "rollout/reward_mean", "rollout/accuracy"):
        assert name in scalars, sorted(scalars)
    assert [event.step for event in accumulator.Scalars("train/query_kl")] == list(range(STEPS))
    csv = pandas.read_csv(healthy_toy_run.log_dir / "metrics.csv")
    logged = csv.dropna(subset=["train/query_kl"])
    assert [event.value for event in accumulator.Scalars("train/query_kl")] == pytest.approx(
        logged["train/query_kl"].tolist(), rel=1e-6
    )
    texts = accumulator.Tensors("completions/text_summary")
    rows = [json.loads(line) for line in (healthy_toy_run.log_dir / "completions.jsonl").read_text().splitlines()]
    assert [event.step for event in texts] == sorted({row["step"] for row in rows}) == [1, 5, 10]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| step | group_index | prompt | response | gold | reward | advantage |")


def test_tracker_overlays_select_their_logger_and_keep_the_csv(capsys):
    for name, logger in OVERLAYS.items():
        args = ("fit", "--print_config", "--config", str(CONFIGS / "quickstart.yaml"), "--config", str(CONFIGS / name))
        assert run_main(*args) == 0
        loggers = yaml.safe_load(capsys.readouterr().out)["trainer"]["logger"]
        assert [entry["class_path"] for entry in loggers] == ["lightning.pytorch.loggers.CSVLogger", logger]
