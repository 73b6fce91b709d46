"""Progress a batch job's log can read: plain lines when stderr is not a terminal, the numbers on a terminal's bar."""

import re
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from erpo_lightning.callbacks.progress import ERPOProgressBar, ProgressLines, format_duration, headline_values, phase
from erpo_lightning.callbacks.temperature_sweep import sweep_size
from erpo_lightning.cli.command import ERPOLightningTrainer
from erpo_lightning.evaluation.sweep import PreparedBenchmark, SweepConfig

PROGRESS_LINE = re.compile(r"^\[erpo\] step (\d+)/12 \| reward [0-9.]+ \| accuracy [0-9.]+% \| query_kl \S.*eta", re.M)


def test_redirected_toy_run_prints_progress_lines_and_phases(healthy_toy_run):
    """The healthy toy run (12 steps, stderr a pipe, as under SLURM or nohup, lines every 5 steps): a line at the
    first step, every 5th and the last, each with the step, reward, accuracy, Query-KL and ETA; the engine start-up
    has a start and an end. (A ProgressLines without an interval follows `log_every_n_steps`: the test below.)"""
    stderr = healthy_toy_run.stderr
    steps = [int(step) for step in PROGRESS_LINE.findall(stderr)]
    assert steps == [1, 5, 10, 12], stderr[-3000:]
    started = "[erpo] rollout engine start-up (HFEngine): started (2 samples per query, up to 6 new tokens)"
    assert started in stderr
    assert re.search(r"\[erpo\] rollout engine start-up \(HFEngine\): done in \d+s", stderr)
    assert "\r" not in stderr  # no bar redrawn in place


def test_headline_values_format_the_logged_metrics():
    metrics = {
        "rollout/reward_mean": torch.tensor(0.5),
        "rollout/accuracy": torch.tensor(0.25),
        "train/query_kl": torch.tensor(0.00123),
        "rollout/tokens_per_s": 345.4,
        "train/loss": torch.tensor(1.0),
    }
    assert headline_values(metrics) == {
        "reward": "0.500",
        "accuracy": "25.0%",
        "query_kl": "0.00123",
        "tokens/s": "345",
    }
    assert headline_values({"train/query_kl": float("nan")}) == {"query_kl": "nan"}
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]


def test_terminal_bar_shows_the_headline_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr("erpo_lightning.cli.command.stderr_is_terminal", lambda: True)
    trainer = ERPOLightningTrainer(accelerator="cpu", logger=False, max_steps=5, default_root_dir=tmp_path)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, ERPOProgressBar)
    trainer.callback_metrics.update({"rollout/reward_mean": torch.tensor(0.75), "train/query_kl": torch.tensor(0.01)})
    shown = bar.get_metrics(trainer, pl.LightningModule())
    assert shown["reward"] == "0.750" and shown["query_kl"] == "0.01"


def test_log_file_gets_progress_lines_and_rejects_a_bad_interval(tmp_path, monkeypatch):
    monkeypatch.setattr("erpo_lightning.cli.command.stderr_is_terminal", lambda: False)
    trainer = ERPOLightningTrainer(accelerator="cpu", logger=False, max_steps=5, default_root_dir=tmp_path)
    assert isinstance(trainer.progress_bar_callback, ProgressLines)
    with pytest.raises(ValueError, match="ProgressLines every_n_steps must be >= 1"):
        ProgressLines(every_n_steps=0)


def test_sweep_start_line_states_its_size(capsys):
    benchmarks = [
        PreparedBenchmark("a", 4, 4, [[1], [2], [3]], ["1", "2", "3"]),
        PreparedBenchmark("b", 2, 2, [[1]], ["1"]),
    ]
    size = sweep_size(benchmarks, SweepConfig(temperatures=[0.6, 1.0]))
    assert size == "4 problems in 2 benchmark(s) x 2 temperature(s): 28 samples"  # (3x4 + 1x2) x 2
    with phase("temperature sweep at step 0", size):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"[erpo] temperature sweep at step 0: started ({size})"
    assert lines[1] == "[erpo] temperature sweep at step 0: done in 0s"


def test_lines_without_an_interval_follow_log_every_n_steps(capsys):
    """What a default run's ProgressLines (no interval) prints over 12 steps at `log_every_n_steps` 5: the first
    step, every 5th and the last, as the healthy toy run's configured interval does."""
    lines = ProgressLines()
    trainer = SimpleNamespace(global_step=0, max_steps=12, log_every_n_steps=5, callback_metrics={})
    lines.on_train_start(trainer, None)
    for step in range(1, 13):
        trainer.global_step = step
        lines.on_train_batch_end(trainer, None, None, None, step - 1)
    printed = capsys.readouterr().err
    assert [int(step) for step in re.findall(r"^\[erpo\] step (\d+)/12 \|", printed, re.M)] == [1, 5, 10, 12], printed
