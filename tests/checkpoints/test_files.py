"""Checkpoint files (`checkpoints/files.py`). Which checkpoint a run starts from (issue 43): a checkpoint write that
fails names its file and errno, `--ckpt_path last` falls back to the newest complete checkpoint when `last.ckpt` is
missing or incomplete (and says so), and a fresh run refuses a checkpoint folder that holds an earlier run's
checkpoints. The resume keywords `last` and `last_or_none`, the atomic writer (a save killed half-way leaves the
previous file whole, issue 18), and a checkpoint file that cannot be read (empty, random bytes, cut short), named with
what is wrong and what to do (issue 54 item 11).

A full disk is made real by pointing the writer's temporary file at /dev/full, whose every write the kernel answers
with ENOSPC: nothing in the writer is replaced."""

import errno
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers.cli_runs import tiny_config
from helpers.fit_configs import ERPO
from helpers.resume_runs import run_main
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from erpo_lightning.checkpoints.files import (
    AtomicCheckpointIO,
    CheckpointReadError,
    CheckpointWriteError,
    check_fresh_run_folders,
    partial_path,
    read_checkpoint,
    resolve_resume_path,
)
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.cli.command import ERPOLightningTrainer
from erpo_lightning.common.errors import SettingsError

DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full (Linux)")


def fill_disk_for(target: Path) -> None:
    """Make this process's next save of `target` fail for real with ENOSPC: its temporary file is a link to
    /dev/full (the save removes the link when it fails, as it removes any temporary file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial_path(target).symlink_to(DEV_FULL)


def trainer_saving_to(folder: Path, logger=False) -> ERPOLightningTrainer:
    """The `erpo` trainer with one ModelCheckpoint (`save_last`) in `folder` (None: the logger's version folder)."""
    return ERPOLightningTrainer(
        accelerator="cpu", logger=logger, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)], max_steps=1,
        enable_progress_bar=False,
    )  # fmt: skip


def save_at(path: Path, step: int, mtime: int) -> None:
    """A complete checkpoint of `step` at `path`, last modified at `mtime` (seconds): the order does not depend on
    the filesystem's clock resolution."""
    AtomicCheckpointIO().save_checkpoint({"global_step": step}, path)
    os.utime(path, (mtime, mtime))


@needs_dev_full
def test_a_checkpoint_write_on_a_full_disk_names_the_file_and_the_errno(tmp_path):
    target = tmp_path / "ckpt" / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"global_step": 1}, target)
    fill_disk_for(target)
    expected = f"could not write checkpoint {target}: ENOSPC (No space left on device); last.ckpt was not replaced"
    with pytest.raises(CheckpointWriteError, match=re.escape(expected)) as failed:
        writer.save_checkpoint({"global_step": 2, "weights": torch.zeros(2**16)}, target)
    assert failed.value.errno == errno.ENOSPC and "free space there, then resume with --ckpt_path last" in str(failed)
    assert torch.load(target, weights_only=True)["global_step"] == 1  # the previous checkpoint is whole
    assert [path.name for path in target.parent.iterdir()] == ["last.ckpt"]  # no temporary file or link is left


def test_ckpt_path_last_falls_back_to_the_newest_complete_checkpoint(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    trainer = trainer_saving_to(folder)
    save_at(folder / "step=1.ckpt", 1, 1_000)
    save_at(folder / "step=2.ckpt", 2, 2_000)
    capsys.readouterr()
    assert resolve_resume_path(trainer, "last") == str(folder / "step=2.ckpt")  # the first last.ckpt never came
    note = f"[erpo] --ckpt_path last: resuming from {folder / 'step=2.ckpt'}, the newest complete checkpoint"
    assert capsys.readouterr().out == f"{note} (there is no last*.ckpt)\n"
    whole = (folder / "step=2.ckpt").read_bytes()
    (folder / "last.ckpt").write_bytes(whole[: len(whole) // 2])  # cut short (a writer that is not atomic, a copy)
    os.utime(folder / "last.ckpt", (3_000, 3_000))
    assert resolve_resume_path(trainer, "last_or_none") == str(folder / "step=2.ckpt")
    assert capsys.readouterr().out.startswith(f"{note} (last.ckpt: incomplete (")
    save_at(folder / "last.ckpt", 2, 3_000)
    assert resolve_resume_path(trainer, "last") == str(folder / "last.ckpt")  # a whole last.ckpt: as before, quietly
    assert capsys.readouterr().out == ""


def test_ckpt_path_last_with_only_incomplete_checkpoints_says_why(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "last.ckpt").write_bytes(b"PK\x03\x04 half a checkpoint")
    with pytest.raises(SettingsError, match=r"'last' has nothing to resume: no complete checkpoint in .*last\.ckpt"):
        resolve_resume_path(trainer_saving_to(folder), "last")


def test_a_fresh_run_refuses_a_folder_that_holds_an_earlier_runs_checkpoints(tmp_path):
    folder = tmp_path / "ckpt"
    check_fresh_run_folders(trainer_saving_to(folder))  # no folder yet
    save_at(folder / "last.ckpt", 2, 1_000)
    with pytest.raises(SettingsError) as refused:
        check_fresh_run_folders(trainer_saving_to(folder))
    message = str(refused.value)
    assert message.startswith(f"{folder} already holds checkpoints of an earlier run (last.ckpt): "), message
    assert "add --ckpt_path last; to start over, give this run another folder" in message
    assert message.endswith(f"or delete {folder}")
    # Without a dirpath, a run with a logger saves into its new version's folder: nothing of the earlier run there.
    save_at(tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", 2, 1_000)
    check_fresh_run_folders(trainer_saving_to(None, logger=CSVLogger(tmp_path / "runs")))


@needs_dev_full
@pytest.mark.slow  # two `erpo fit` runs
def test_erpo_fit_on_a_full_disk_then_ckpt_path_last(tmp_path, tiny_model_path, benchmarks_dir, capsys):
    """The first save of `last.ckpt` fails (ENOSPC) after the step's own checkpoint was written: the run stops naming
    the file and the errno, and `--ckpt_path last` resumes from the step checkpoint beside it, saying so."""
    folder = tmp_path / "ckpt"
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(folder), "every_n_train_steps": 1, "save_last": True, "filename": "{step}"},
    }
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=[checkpoint], max_steps=2)
    fill_disk_for(folder / "last.ckpt")  # `erpo fit` runs in this process: the same pid
    assert run_main("fit", "--config", str(config)) == 1
    err = capsys.readouterr().err
    expected = f"erpo: error: CheckpointWriteError: could not write checkpoint {folder / 'last.ckpt'}: ENOSPC ("
    assert expected in err, err[-3000:]
    assert sorted(path.name for path in folder.iterdir()) == ["step=1.ckpt"]
    assert run_main("fit", "--config", str(config), "--ckpt_path", "last") == 0
    out = capsys.readouterr().out
    assert f"[erpo] --ckpt_path last: resuming from {folder / 'step=1.ckpt'}, the newest complete checkpoint" in out
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 2


TESTS = Path(__file__).parent


def test_resume_keywords(tmp_path):
    folder = tmp_path / "ckpt"
    trainer = ERPOLightningTrainer(
        accelerator="cpu", logger=False, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)], max_steps=1
    )
    with pytest.raises(SettingsError, match=f"'last' has nothing to resume: no last\\*.ckpt in {folder}"):
        resolve_resume_path(trainer, "last")
    assert resolve_resume_path(trainer, "last_or_none") is None
    assert resolve_resume_path(trainer, "run.ckpt") == "run.ckpt"
    folder.mkdir()
    partial_path(folder / "last.ckpt", pid=2**22 + 1).write_bytes(b"half a checkpoint")  # a killed save's leftover
    with pytest.raises(SettingsError):  # a temporary file is not a checkpoint
        resolve_resume_path(trainer, "last")
    AtomicCheckpointIO().save_checkpoint({"global_step": 3}, folder / "last.ckpt")
    found = str(folder / "last.ckpt")
    assert resolve_resume_path(trainer, "last") == resolve_resume_path(trainer, "last_or_none") == found


def test_resume_keywords_find_the_checkpoint_in_the_loggers_version_folder(tmp_path):
    """A ModelCheckpoint without dirpath writes into `<save_dir>/<name>/version_<n>/checkpoints`, and a new run gets
    a new version: `last_or_none` must still find the earlier run's checkpoint, and `last`'s error names the folders."""

    def trainer():
        logger = pl.loggers.CSVLogger(tmp_path / "runs", name="erpo")
        return ERPOLightningTrainer(
            accelerator="cpu", logger=logger, callbacks=[ModelCheckpoint(save_last=True)], max_steps=1
        )

    pattern = tmp_path / "runs" / "erpo" / "*" / "checkpoints"
    with pytest.raises(SettingsError, match=re.escape(f"nothing to resume: no last*.ckpt in {pattern};")):
        resolve_resume_path(trainer(), "last")
    assert resolve_resume_path(trainer(), "last_or_none") is None
    first = tmp_path / "runs" / "erpo" / "version_0" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 3}, first)
    (tmp_path / "runs" / "erpo" / "version_1").mkdir()  # a later run that wrote no checkpoint
    assert resolve_resume_path(trainer(), "last_or_none") == resolve_resume_path(trainer(), "last") == str(first)
    newer = first.parents[2] / "version_2" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 5}, newer)
    os.utime(newer, ns=(first.stat().st_mtime_ns + 10**9,) * 2)
    assert resolve_resume_path(trainer(), "last_or_none") == str(newer)  # the newest run's


def test_atomic_checkpoint_io_replaces_whole_files_and_clears_orphans(tmp_path):
    target = tmp_path / "ckpt" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, target)
    orphan = partial_path(target, pid=2**22 + 7)  # no such process: a save killed half-way
    orphan.write_bytes(b"trunc")
    with pytest.raises(Exception, match="pickle"):  # a save failing half-way leaves the previous file whole
        io.save_checkpoint({"global_step": 2, "bad": lambda: None}, target)
    assert torch.load(target)["global_step"] == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [orphan.name, "last.ckpt"]
    io.save_checkpoint({"global_step": 3, "w": torch.zeros(3)}, target)
    assert torch.load(target)["global_step"] == 3
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # the orphan of a dead process is gone


class CheckpointBallast(pl.Callback):
    """Makes the checkpoints of one step large (`megabytes` of zeros), so that writing them takes a while."""

    def __init__(self, at_step: int, megabytes: int = 256) -> None:
        self.at_step, self.megabytes = at_step, megabytes

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.global_step == self.at_step:
            checkpoint["ballast"] = torch.zeros(self.megabytes * 2**18)


@pytest.mark.slow
def test_kill_during_a_slow_save_then_resume_last(tmp_path, tiny_model_path, benchmarks_dir):
    """SIGKILL while `last.ckpt` of step 3 is being written; `--ckpt_path last` resumes from step 2's, and trains on.

    TMPDIR is put on another filesystem than the checkpoints where one exists (/dev/shm): Lightning's own writer
    then copies over `last.ckpt` in place, which a kill truncates.
    """
    folder = tmp_path / "ckpt"
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(folder), "every_n_train_steps": 1, "save_last": True, "save_top_k": -1},
    }
    ballast = {"class_path": "test_files.CheckpointBallast", "init_args": {"at_step": 3}}
    data_file = benchmarks_dir / "gsm8k.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
    }
    shm = Path("/dev/shm")
    if shm.is_dir() and shm.stat().st_dev != tmp_path.stat().st_dev:
        env["TMPDIR"] = str(shm)
    config = tiny_config(tmp_path, tiny_model_path, data_file, callbacks=[checkpoint, ballast], max_steps=4)
    log = tmp_path / "killed_run.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [ERPO, "fit", "--config", str(config)], stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            start_new_session=True,
        )  # fmt: skip
    last = folder / "last.ckpt"
    before = None  # last.ckpt as step 2 left it, recorded once step 3's (slow) saving has begun
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and process.poll() is None:
        names = os.listdir(folder) if folder.is_dir() else []
        if before is None and any("step=3" in name for name in names):
            before = last.stat()
        elif before is not None:
            now = last.stat() if last.exists() else None
            changed = now is None or (now.st_size, now.st_mtime_ns) != (before.st_size, before.st_mtime_ns)
            if changed or any(name.startswith(".last.ckpt.") for name in names):
                os.killpg(process.pid, signal.SIGKILL)
                break
        time.sleep(0.002)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    assert torch.load(last, weights_only=False)["global_step"] == 2  # step 3's last.ckpt never replaced it half-way

    resume = tiny_config(tmp_path, tiny_model_path, data_file, callbacks=[checkpoint], max_steps=4)
    resumed = subprocess.run(
        [ERPO, "fit", "--config", str(resume), "--ckpt_path", "last"], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert f"Restored all states from the checkpoint at {last}" in output
    final = torch.load(last, weights_only=False)
    assert final["global_step"] == 4 and "ballast" not in final
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # the killed save's temporary file is gone
    for noise in ("ModelCheckpoint with manual optimization", "litlogger", "LeafSpec", "tensorboardX", "Epoch 0/-"):
        assert noise not in output, noise


# --------------------------------------------------------- issue 54 item 11: a checkpoint file that cannot be read
@pytest.fixture(scope="module")
def whole_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whole") / "whole.ckpt"
    torch.save({"global_step": 3, "state_dict": {"policy.w": torch.arange(4096, dtype=torch.float32)}}, path)
    return path


# how the file is damaged -> what the error says of it
DAMAGES = {
    "empty": (lambda data: b"", "it is empty (0 bytes): nothing was ever written to it"),
    "random bytes": (lambda data: os.urandom(len(data)), "it is not a torch checkpoint"),
    "cut short": (lambda data: data[: len(data) // 2], "it is cut short"),
}


@pytest.mark.parametrize("case", DAMAGES)
@pytest.mark.parametrize("reader", ["read_checkpoint", "load_policy_weights"])
def test_an_unreadable_checkpoint_is_named_with_what_is_wrong(whole_checkpoint, tmp_path, case, reader):
    damaged = tmp_path / "last.ckpt"
    cut, why = DAMAGES[case]
    damaged.write_bytes(cut(whole_checkpoint.read_bytes()))
    with pytest.raises(CheckpointReadError) as error:
        if reader == "read_checkpoint":
            read_checkpoint(damaged)
        else:
            load_policy_weights(torch.nn.Linear(1, 1), str(damaged))
    message = str(error.value)
    assert message.startswith(f"checkpoint {damaged} cannot be read: {why}"), message
    assert "another checkpoint of the run" in message and "mmap" not in message and "\n" not in message


def test_a_whole_checkpoint_reads(whole_checkpoint):
    assert read_checkpoint(whole_checkpoint)["global_step"] == 3
