"""One run per run folder (issue 30): a second `erpo fit` on the same checkpoint folder fails at once, naming the
holder's pid; the lock of a killed run is taken over."""

import os
import socket
import subprocess
import sys

import pytest
import yaml
from helpers.cli_runs import run_main, tiny_config

from erpo_lightning.checkpoints.files import RunDirectoryInUse, RunDirectoryLock, lock_path

HOLD = """
import sys, time
from erpo_lightning.checkpoints.files import RunDirectoryLock
RunDirectoryLock([sys.argv[1]]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_lock_names_the_holder_and_a_released_one_is_free(tmp_path):
    first = RunDirectoryLock([tmp_path / "ckpt", tmp_path / "logs"]).acquire()
    with pytest.raises(RunDirectoryInUse, match=f"is in use by another erpo run \\(pid {os.getpid()} on "):
        RunDirectoryLock([tmp_path / "logs"]).acquire()
    first.release()
    again = RunDirectoryLock([tmp_path / "logs"]).acquire()
    assert again.taken_over == []  # released cleanly: not a stale lock
    again.release()


def test_the_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(RunDirectoryInUse, match=f"pid {holder.pid} on {socket.gethostname()}"):
        RunDirectoryLock([tmp_path]).acquire()
    holder.kill()  # SIGKILL: no clean-up ran, the file still names it
    holder.wait()
    assert lock_path(tmp_path).read_text().split()[0] == str(holder.pid)
    lock = RunDirectoryLock([tmp_path]).acquire()
    assert lock.taken_over == [f"{tmp_path.resolve()} (pid {holder.pid} on {socket.gethostname()})"]
    assert lock_path(tmp_path).read_text().split()[0] == str(os.getpid())
    lock.release()


def test_a_second_fit_on_a_locked_checkpoint_folder_fails_at_once(tmp_path, tiny_model_path, benchmarks_dir, capsys):
    folder = tmp_path / "ckpt"
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": str(folder)}}
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=[checkpoint])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert run_main("fit", "--config", str(config)) == 1
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"{folder} is in use by another erpo run (pid {holder.pid} on" in err, err[-2000:]
    assert not (tmp_path / "cache").exists()  # failed before the reference cache was built
    assert yaml.safe_load(config.read_text())  # the config is untouched


def test_checkpoints_in_the_loggers_folder_put_no_lock_file_there(healthy_toy_run):
    """Lightning's default checkpoints sit in the logger's version folder; the logger folder's lock covers them, so
    no lock file lands inside it and the CSV logger never warns that a fresh run's folder "is not empty"."""
    log_dir = healthy_toy_run.log_dir
    assert healthy_toy_run.checkpoint.parent.parent == log_dir  # the nested case
    assert not list(log_dir.glob(".*.erpo.lock"))
    assert lock_path(log_dir).exists()  # beside the logger's folder, released (empty) at the end
    assert lock_path(log_dir).read_text() == ""
    assert "exists and is not empty" not in healthy_toy_run.stderr
