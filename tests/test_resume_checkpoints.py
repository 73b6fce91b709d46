"""Which checkpoint a run starts from (issue 43): a checkpoint write that fails names its file and errno,
`--ckpt_path last` falls back to the newest complete checkpoint when `last.ckpt` is missing or incomplete (and says
so), and a fresh run refuses a checkpoint folder that holds an earlier run's checkpoints.

A full disk is made real by pointing the writer's temporary file at /dev/full, whose every write the kernel answers
with ENOSPC: nothing in the writer is replaced."""

import errno
import os
import re
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import tiny_config
from helpers.resume_runs import run_main
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from erpo_lightning.checkpoints.files import (
    AtomicCheckpointIO,
    CheckpointWriteError,
    check_fresh_run_folders,
    partial_path,
    resolve_resume_path,
)
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
