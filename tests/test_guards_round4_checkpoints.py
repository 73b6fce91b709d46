"""Checkpoints (issue 54): the step a run ends on is saved whatever the checkpoint interval (item 10: 5 steps at
interval 2 left `last.ckpt` at step 4), `erpo export` says which step it ships, and a checkpoint file that cannot be
read (empty, random bytes, cut short) is named with what is wrong and what to do (item 11).

The runs are Lightning's BoringModel under the `erpo` trainer (ERPOLightningTrainer: its callbacks, its atomic
checkpoint writer), a few steps in this process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import run_main
from transformers import AutoModelForCausalLM

from erpo_lightning.checkpoints.files import CheckpointReadError, read_checkpoint
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.export.hf_model import checkpoint_model_settings
from erpo_lightning.toy import SHIPPED_DIR


def test_export_says_which_step_it_ships(tmp_path, capsys):
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)
    checkpoint = tmp_path / "last.ckpt"
    state = {f"policy.{name}": value for name, value in model.state_dict().items()}
    hyper_parameters = {"model_path": str(SHIPPED_DIR)}
    torch.save({"global_step": 5, "hyper_parameters": hyper_parameters, "state_dict": state}, checkpoint)
    assert checkpoint_model_settings(checkpoint)["global_step"] == 5
    from erpo_lightning.export.hf_model import main as export

    export(["--ckpt_path", str(checkpoint), "--out", str(tmp_path / "hf")])
    assert f"exported the policy of {checkpoint} (global step 5) to {tmp_path / 'hf'}" in capsys.readouterr().out


# ------------------------------------------------------------------ item 11: a checkpoint file that cannot be read
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


def test_an_empty_checkpoint_given_to_export_is_one_line_naming_it(tmp_path, capsys):
    empty = tmp_path / "last.ckpt"
    empty.touch()
    assert run_main("export", "--ckpt_path", str(empty), "--out", str(tmp_path / "hf")) == 1
    err = capsys.readouterr().err
    assert f"erpo: error: checkpoint {empty} cannot be read: it is empty (0 bytes)" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_a_whole_checkpoint_reads(whole_checkpoint):
    assert read_checkpoint(whole_checkpoint)["global_step"] == 3
