"""Trackers out of the box: TensorBoard writes every metric (Query-KL included) and the sampled completions; the
W&B and MLflow overlays select their loggers over the quickstart."""

import json
from pathlib import Path

import yaml
from helpers.fit_configs import fit_config, run_erpo, write_config

from erpo_lightning.toy import SHIPPED_DIR

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
OVERLAYS = {
    "logger_tensorboard.yaml": "lightning.pytorch.loggers.TensorBoardLogger",
    "logger_wandb.yaml": "lightning.pytorch.loggers.WandbLogger",
    "logger_mlflow.yaml": "lightning.pytorch.loggers.MLFlowLogger",
}


def test_tensorboard_run_logs_query_kl_and_completions(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": str(tmp_path)}}
    completions = {"class_path": "erpo_lightning.callbacks.SampledCompletions", "init_args": {"every_n_steps": 2}}
    config = fit_config(
        SHIPPED_DIR,
        [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 16}],
        tmp_path,
        trainer={"max_steps": 3, "log_every_n_steps": 1, "logger": logger, "callbacks": [completions]},
    )
    result = run_erpo("fit", "--config", str(write_config(tmp_path / "fit.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    for name in ("train/query_kl", "train/loss", "rollout/reward_mean", "rollout/accuracy"):
        assert name in scalars, sorted(scalars)
    assert [event.step for event in accumulator.Scalars("train/query_kl")] == [0, 1, 2]
    texts = accumulator.Tensors("completions/text_summary")
    assert [event.step for event in texts] == [1, 2]  # the first step and every 2nd
    table = texts[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| step | prompt | response | gold | reward |")
    rows = [json.loads(line) for line in (events.parent / "completions.jsonl").read_text().splitlines()]
    assert {row["step"] for row in rows} == {1, 2}


def test_tracker_overlays_select_their_logger_and_keep_the_csv(tmp_path):
    for name, logger in OVERLAYS.items():
        args = ("fit", "--print_config", "--config", str(CONFIGS / "quickstart.yaml"), "--config", str(CONFIGS / name))
        printed = run_erpo(*args, cwd=tmp_path)
        assert printed.returncode == 0, printed.stderr[-3000:]
        loggers = yaml.safe_load(printed.stdout)["trainer"]["logger"]
        assert [entry["class_path"] for entry in loggers] == ["lightning.pytorch.loggers.CSVLogger", logger]
