"""Preemption (issue 30): SIGTERM / SIGUSR1 during fit save the last finished step and exit non-zero, and resuming
from that checkpoint is exact; Ctrl-C exits 130. SIGTERM during the reference cache build (`erpo cache`, or at fit
start) keeps the finished chunks, writes nothing partial, releases the run's lock and exits 143 too."""

import csv
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers.cli_runs import run_main, tiny_config
from helpers.fit_configs import ERPO, fit_config, write_config
from helpers.resume_runs import LOGGED, run
from lightning.pytorch.loggers import CSVLogger

from erpo_lightning.callbacks.preemption import Preempted
from erpo_lightning.checkpoints.files import lock_path
from erpo_lightning.data.reference_logprobs import CacheBuildStopped, StopOnSignals
from erpo_lightning.toy import SHIPPED_DIR


class SignalAt(pl.Callback):
    """Sends `signal_name` to this process at the start of training step `step` (1-based), i.e. while it runs."""

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step, self.signal_name = step, signal_name

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step + 1 == self.step:
            os.kill(os.getpid(), getattr(signal, self.signal_name))


@dataclass
class PreemptedRun:
    """A 4-step run stopped by SIGTERM at its 2nd step, resumed to the end, and the same run uninterrupted."""

    full_steps: list  # the uninterrupted run's steps (helpers.resume_runs.run) and final weights
    full_weights: dict
    stopped: Exception | None  # what the preempted run raised
    handler_before: object  # SIGTERM's handler before the preempted run, and after it
    handler_after: object
    last: Path  # the preempted run's last.ckpt, as it left it: its global step
    last_step: int
    resumed_steps: list  # the run resumed from `last`: its steps and final weights
    resumed_weights: dict
    logs: dict  # {"full", "preempted", "resumed"}: each run's CSVLogger version folder


@pytest.fixture(scope="module")
def preempted_run(tiny_model_path, benchmarks_dir, tmp_path_factory) -> PreemptedRun:
    """Shared by the two tests of a fit, a SIGTERM and a resume (one set of three runs instead of one per test): the
    full and resumed runs log every step; the preempted one keeps `log_every_n_steps` at 50, which alone would not log
    the step it stops at."""
    data_file, root = benchmarks_dir / "gsm8k.jsonl", tmp_path_factory.mktemp("preempted")
    full_log, part_log = CSVLogger(root / "full"), CSVLogger(root / "part")
    full_steps, full_weights = run(tiny_model_path, data_file, root / "full", 4, logger=full_log, log_every_n_steps=1)
    last = root / "part" / "ckpt" / "last.ckpt"
    handler, stopped = signal.getsignal(signal.SIGTERM), None
    try:
        run(tiny_model_path, data_file, root / "part", 4, extra_callbacks=[SignalAt(2)], logger=part_log)
    except Preempted as error:
        stopped = error
    handler_after = signal.getsignal(signal.SIGTERM)
    last_step = torch.load(last, weights_only=False)["global_step"]
    resumed_log = CSVLogger(root / "part")  # the next version folder
    resumed_steps, resumed_weights = run(
        tiny_model_path, data_file, root / "part", 4, ckpt_path=last, logger=resumed_log, log_every_n_steps=1
    )
    logs = {"full": full_log, "preempted": part_log, "resumed": resumed_log}
    return PreemptedRun(
        full_steps, full_weights, stopped, handler, handler_after, last, last_step, resumed_steps, resumed_weights,
        {name: Path(log.log_dir) for name, log in logs.items()},
    )  # fmt: skip


@pytest.mark.slow  # end-to-end: a fit, a SIGTERM and a resume
def test_sigterm_saves_the_step_in_progress_and_resuming_from_it_is_exact(preempted_run):
    runs = preempted_run
    assert isinstance(runs.stopped, Preempted)
    expected = f"preempted by SIGTERM: saved global step 2 to {re.escape(str(runs.last))};"
    assert re.search(expected, str(runs.stopped)), runs.stopped
    assert runs.stopped.exit_status == 128 + signal.SIGTERM
    assert runs.handler_after == runs.handler_before  # put back after the run
    assert runs.last_step == 2  # the step that was running when it came
    assert [s[0] for s in runs.resumed_steps] == [3, 4]
    for (step, queries, rows, metrics), (r_step, r_queries, r_rows, r_metrics) in zip(
        runs.full_steps[2:], runs.resumed_steps, strict=True
    ):
        assert (step, queries, rows) == (r_step, r_queries, r_rows)
        for name in LOGGED:
            assert abs(metrics[name] - r_metrics[name]) < 1e-6, (step, name, metrics[name], r_metrics[name])
    for key in runs.full_weights:
        torch.testing.assert_close(runs.resumed_weights[key], runs.full_weights[key], atol=1e-6, rtol=0)


def logged_rows(log_dir) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} of the training rows of a CSVLogger's metrics.csv (one row per logged step)."""
    with open(log_dir / "metrics.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train/loss")]
    steps = [int(row["step"]) for row in rows]
    assert len(steps) == len(set(steps)), steps  # no step logged twice
    return {int(row["step"]): {name: float(row[name]) for name in LOGGED} for row in rows}


@pytest.mark.slow  # end-to-end: a fit, a SIGTERM and a resume
def test_the_preempted_steps_metrics_are_logged_once(preempted_run):
    """The preempted step's row reaches metrics.csv before the run stops, though `log_every_n_steps` (50) would not
    log it; the resumed run logs the steps after it, with the uninterrupted run's values."""
    full, preempted, resumed = (logged_rows(preempted_run.logs[name]) for name in ("full", "preempted", "resumed"))
    assert sorted(full) == [0, 1, 2, 3]
    assert sorted(preempted) == [1] and sorted(resumed) == [2, 3]  # step 1 (the 2nd) in the first log only
    for step, values in {**preempted, **resumed}.items():
        for name in LOGGED:
            assert abs(values[name] - full[step][name]) < 1e-6, (step, name, values[name], full[step][name])


@pytest.mark.slow  # three `erpo fit` runs
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_erpo_fit_exits_non_zero_on_a_signal(tiny_model_path, benchmarks_dir, tmp_path, capsys, signal_name):
    folder = tmp_path / "ckpt"
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": str(folder)}},
        {"class_path": "test_preemption.SignalAt", "init_args": {"step": 1, "signal_name": signal_name}},
    ]
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=callbacks, max_steps=3)
    try:
        code = run_main("fit", "--config", str(config))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    err = capsys.readouterr().err
    if signal_name == "SIGINT":  # Ctrl-C: like `erpo validate`, 130
        assert code == 130 and err.strip().splitlines()[-1] == "erpo: interrupted", err[-2000:]
        return
    assert code == 128 + getattr(signal, signal_name), err[-2000:]
    last = folder / "last.ckpt"
    assert f"erpo: preempted by {signal_name}: saved global step 1 to {last}; resume with --ckpt_path last" in err
    assert torch.load(last, weights_only=False)["global_step"] == 1


class SignalAtTrainStart(pl.Callback):
    """Sends SIGTERM in `on_train_start`, before the PreemptionCheckpoint's handlers are installed (Lightning's are)."""

    def on_train_start(self, trainer, pl_module) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_before_the_first_step_stops_after_it(tiny_model_path, benchmarks_dir, tmp_path):
    with pytest.raises(Preempted, match="preempted by SIGTERM: saved global step 1 to"):
        run(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, 3, extra_callbacks=[SignalAtTrainStart()])
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 1


@pytest.mark.slow  # a cache build stopped and built again, in subprocesses
@pytest.mark.parametrize("subcommand", ["cache", "fit"])
def test_sigterm_during_the_cache_build_keeps_finished_chunks_writes_nothing_partial_and_exits_143(
    tmp_path, subcommand
):
    """A real `erpo` process gets a real SIGTERM once its cache build has written a chunk: 1905 queries of the shipped
    toy set in chunks of one query, so that the build is still running when the signal comes."""
    train = [{"path": str(SHIPPED_DIR / "train.jsonl")}]
    data = {"max_prompt_length": 64, "cache_chunk_size": 1, "cache_batch_size": 1}
    config = write_config(tmp_path / "fit.yaml", fit_config(SHIPPED_DIR, train, tmp_path, data=data))
    env = {**os.environ, "ERPO_CACHE_HOME": str(tmp_path / "home")}
    command = [ERPO, subcommand, "--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    cache = tmp_path / "cache"
    deadline = time.monotonic() + 600
    while not list(cache.glob("partial/*/chunk_*.safetensors")):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no chunk written in 600 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped = "erpo: stopped by SIGTERM while building the reference score cache: no partial cache was written"
    assert err.strip().splitlines()[-1].startswith(f"{stopped}; finished chunks stay in {cache / 'partial'}"), err
    assert not (cache / "scores.safetensors").exists() and not (cache / "manifest.json").exists()
    assert not list(tmp_path.rglob("*.tmp"))  # no chunk or file cut mid-write
    assert 0 < len(list(cache.glob("partial/*/chunk_*.safetensors"))) < 1905  # kept for the next run to resume
    if subcommand == "fit":  # the run's folder lock was released (emptied), not left to be taken over as stale
        assert lock_path(tmp_path / "checkpoints").read_text() == ""


def test_a_signal_during_the_final_cache_write_stops_after_it(tmp_path):
    """The scores file and its manifest are written whole: a signal in between takes effect after both."""
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    written = False
    with pytest.raises(CacheBuildStopped, match="by SIGUSR1 .*: the cache was written whole first") as stopped:
        with StopOnSignals(tmp_path) as stop, stop.deferred():
            os.kill(os.getpid(), signal.SIGUSR1)
            written = True
    assert written and stopped.value.exit_status == 128 + signal.SIGUSR1
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == handlers  # put back
