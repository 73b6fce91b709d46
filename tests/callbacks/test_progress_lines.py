"""Issue 67 item 5: an ETA that holds still, step lines that survive the terminal's bar, and the end of a fit saying
where its files are.

`eta_seconds` is a pure function of (time, step) marks; the fit is one real 3-step `erpo fit` of the shipped toy
model (the installed command, stderr a pipe) with the terminal's `ERPOProgressBar`, a CSV logger, checkpoints and the
Hugging Face export configured.
"""

import re
from pathlib import Path

import pytest
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config

from erpo_lightning.callbacks.progress import ETA_WINDOW, eta_seconds, run_files_lines
from erpo_lightning.toy import SHIPPED_DIR


def marks_of(durations: list[float], steps_each: int = 1) -> list[tuple[float, int]]:
    """(time, global step) marks of a run whose batches took `durations` seconds, `steps_each` steps each."""
    marks, now = [(0.0, 0)], 0.0
    for number, seconds in enumerate(durations, start=1):
        now += seconds
        marks.append((now, number * steps_each))
    return marks


def test_the_eta_is_the_median_step_time_times_the_steps_left():
    assert eta_seconds(marks_of([10.0] * 5), total=100) == pytest.approx(10.0 * 95)
    # Two updates per batch: the interval's time is shared by its steps.
    assert eta_seconds(marks_of([20.0] * 5, steps_each=2), total=100) == pytest.approx(10.0 * 90)
    assert eta_seconds(marks_of([]), total=100) is None  # no finished step yet
    assert eta_seconds(marks_of([10.0]), total=None) is None  # unbounded run
    assert eta_seconds(marks_of([10.0] * 3), total=3) == 0.0


def test_a_slow_step_does_not_swing_the_eta():
    """Steps of 10 s with a 5-minute temperature sweep inside one of them: the mean since the start (the former ETA)
    jumps from 17 to 49 minutes across five steps, the median of the recent steps stays put."""
    durations = [10.0] * 4 + [310.0] + [10.0] * 4
    marks = marks_of(durations)
    former, smoothed = [], []
    for done in range(4, len(durations) + 1):
        seen = marks[: done + 1]
        former.append(seen[-1][0] / done * (100 - done))
        smoothed.append(eta_seconds(seen, total=100))
    assert max(former) / min(former) > 2.5  # what the newcomer saw: a swing of several times
    assert smoothed == pytest.approx([10.0 * (100 - done) for done in range(4, len(durations) + 1)])
    # The window forgets: once the step time changes for good, the ETA follows it within half a window.
    slower = marks_of([10.0] * ETA_WINDOW + [30.0] * (ETA_WINDOW // 2 + 1))
    assert eta_seconds(slower, total=1000) == pytest.approx(30.0 * (1000 - len(slower) + 1))


def test_the_end_of_run_message_lists_each_file_aligned():
    files = {"run folder": Path("runs/a/version_0"), "metrics": Path("runs/a/version_0/metrics.csv")}
    assert run_files_lines(files, 12) == [
        "fit finished at step 12; its files:",
        "  run folder  runs/a/version_0",
        "  metrics     runs/a/version_0/metrics.csv",
    ]


@pytest.fixture(scope="module")
def bar_run(tmp_path_factory):
    """A 3-step toy fit with the terminal's bar, a CSV logger, a checkpoint every step and the HF export."""
    root = tmp_path_factory.mktemp("bar_run")
    callbacks = [
        {"class_path": "erpo_lightning.callbacks.progress.ERPOProgressBar", "init_args": {"every_n_steps": 1}},
        {"class_path": "erpo_lightning.callbacks.HFExportCallback"},
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
    ]
    config = fit_config(
        SHIPPED_DIR,
        [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 8}],
        root,
        trainer={"max_steps": 3, "log_every_n_steps": 1, "logger": csv_logger(root / "logs"), "callbacks": callbacks},
        data={"max_prompt_length": 64},
    )
    result = run_erpo("fit", "--config", str(write_config(root / "fit.yaml", config)), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result.stderr, result.stdout


def test_the_bar_keeps_the_step_lines_and_drops_the_rate(bar_run):
    _, stderr, stdout = bar_run
    steps = re.findall(r"^\[erpo\] step (\d)/3 \| reward [0-9.]+ .*\| elapsed \S+ \| eta \S+$", stderr, re.M)
    assert steps == ["1", "2", "3"], stderr[-3000:]
    bar = [line for line in stdout.splitlines() if line.startswith("Epoch 0")]  # rich draws on stdout
    assert bar and "3/3" in bar[-1] and "it/s" not in bar[-1], stdout[-2000:]


def test_the_end_of_a_fit_says_where_its_files_are(bar_run):
    root, stderr, _ = bar_run
    version = root / "logs" / "lightning_logs" / "version_0"
    tail = stderr[stderr.index("[erpo] fit finished at step 3; its files:") :].splitlines()
    listed = dict(re.match(r"\[erpo\]   (\S.*?\S)  +(\S+)$", line).groups() for line in tail[1:5])
    assert listed == {
        "run folder": str(version),
        "checkpoints": str(version / "checkpoints"),
        "metrics": str(version / "metrics.csv"),
        "hf_model": str(version / "hf_model"),
    }, stderr[-3000:]
    assert (version / "checkpoints" / "last.ckpt").is_file() and (version / "metrics.csv").is_file()
    assert (version / "hf_model" / "config.json").is_file()
