"""Checkpoints carry a digest of their tensors (issue 67): `ERPOModule.on_save_checkpoint` records the sha256 of every
tensor of the state dict, and every reader of the weights (a resume, `erpo validate`'s `load_policy_weights`,
`erpo export`) refuses a file whose bytes changed after it was written, naming it and the first tensor that differs.
A checkpoint without a digest loads with a warning line.

The checkpoint is a real one: a 1-step `erpo fit` of the tiny model, in this process; its damaged copies have one
byte of one weight's data flipped inside the torch archive, which torch itself loads without a word."""

from __future__ import annotations

import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import tiny_config
from helpers.resume_runs import run_main

from erpo_lightning.checkpoints.files import (
    DIGEST_KEY,
    CheckpointDigestError,
    add_tensor_digest,
    check_tensor_digest,
    read_checkpoint,
)
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.common.errors import DEBUG_HINT
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore:.*:UserWarning")


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, tiny_model_path, benchmarks_dir) -> tuple[Path, Path]:
    """A 1-step `erpo fit` run with `last.ckpt`; (its config file, the checkpoint)."""
    root = tmp_path_factory.mktemp("digest_run")
    callback = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(root / "ckpt"), "save_last": True},
    }
    config = tiny_config(root, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=[callback], max_steps=1)
    assert run_main("fit", "--config", str(config)) == 0
    return config, root / "ckpt" / "last.ckpt"


def record_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's values as raw bytes (row-major), compared without reading them as numbers (a flip may make NaN)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def flipped_copy(checkpoint: Path, copy: Path) -> str:
    """Copy `checkpoint` to `copy` with one byte in the middle of its largest tensor record flipped (the low bit: the
    value stays finite); the name of the first tensor, in state-dict order, whose values changed."""
    shutil.copy(checkpoint, copy)
    with zipfile.ZipFile(copy) as archive:
        record = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda i: i.file_size)
    assert record.compress_type == zipfile.ZIP_STORED  # torch stores its records uncompressed
    with copy.open("r+b") as handle:
        handle.seek(record.header_offset + 26)  # the local header's name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        handle.seek(record.header_offset + 30 + name_length + extra_length + record.file_size // 2)
        byte = handle.read(1)[0]
        handle.seek(-1, 1)
        handle.write(bytes([byte ^ 0x01]))
    before = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    after = torch.load(copy, map_location="cpu", weights_only=True)["state_dict"]  # torch loads it as it is
    changed = [name for name, value in before.items() if record_bytes(value) != record_bytes(after[name])]
    assert changed, "the flipped byte changed no tensor"
    return changed[0]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[-1] == DEBUG_HINT and "Traceback" not in err, err
    return lines[-2]


def test_a_saved_checkpoint_carries_the_digest_of_every_tensor(one_step, capsys):
    checkpoint = read_checkpoint(one_step[1])
    tensors = {name for name, value in checkpoint["state_dict"].items() if isinstance(value, torch.Tensor)}
    assert checkpoint[DIGEST_KEY]["algorithm"] == "sha256"
    assert set(checkpoint[DIGEST_KEY]["tensors"]) == tensors and any(name.startswith("policy.") for name in tensors)
    capsys.readouterr()
    check_tensor_digest(checkpoint, one_step[1])  # whole: nothing said
    assert capsys.readouterr().err == ""


def test_a_flipped_byte_in_a_weight_is_refused_by_export(one_step, tmp_path, capsys):
    damaged = tmp_path / "damaged.ckpt"
    tensor = flipped_copy(one_step[1], damaged)
    assert run_main("export", "--ckpt_path", str(damaged), "--out", str(tmp_path / "hf")) == 1
    line = error_line(capsys)
    assert line.startswith(f"erpo: error: checkpoint {damaged} is damaged: its tensor {tensor} ("), line
    assert "does not hash to the sha256 recorded when it was saved" in line
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    assert run_main("export", "--ckpt_path", str(one_step[1]), "--out", str(tmp_path / "whole")) == 0  # the original
    assert (tmp_path / "whole" / "model.safetensors").is_file()


def test_a_flipped_byte_in_a_weight_is_refused_by_validate_loading(one_step, tiny_model_path, tmp_path):
    damaged = tmp_path / "damaged.ckpt"
    tensor = flipped_copy(one_step[1], damaged)
    policy = load_tiny_model(tiny_model_path)
    with pytest.raises(CheckpointDigestError, match=rf"^checkpoint {damaged} is damaged: its tensor {tensor} \("):
        load_policy_weights(policy, str(damaged))
    load_policy_weights(policy, str(one_step[1]))  # the original loads


@pytest.mark.slow  # `erpo fit` resumes
def test_a_flipped_byte_in_a_weight_is_refused_by_a_resume(one_step, tmp_path, capsys):
    config, last = one_step
    damaged = tmp_path / "damaged.ckpt"
    tensor = flipped_copy(last, damaged)
    capsys.readouterr()
    assert run_main("fit", "--config", str(config), "--ckpt_path", str(damaged), "--trainer.max_steps", "2") == 1
    line = error_line(capsys)
    assert line.startswith(f"erpo: error: checkpoint {damaged} is damaged: its tensor {tensor} ("), line
    assert torch.load(last, weights_only=True)["global_step"] == 1  # nothing trained
    whole = Path(shutil.copy(last, tmp_path / "whole.ckpt"))
    assert run_main("fit", "--config", str(config), "--ckpt_path", str(whole), "--trainer.max_steps", "2") == 0
    assert torch.load(last, weights_only=True)["global_step"] == 2


def test_a_checkpoint_without_a_digest_loads_with_a_warning(one_step, tiny_model_path, tmp_path, capsys):
    checkpoint = torch.load(one_step[1], map_location="cpu", weights_only=True)
    del checkpoint[DIGEST_KEY]
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    policy = load_tiny_model(tiny_model_path)
    capsys.readouterr()
    load_policy_weights(policy, str(old))
    assert capsys.readouterr().err == (
        f"[erpo] warning: checkpoint {old} carries no digest of its tensors (written before erpo-lightning recorded "
        "one, or not by an ERPOModule): its weights are loaded unchecked\n"
    )
    expected = {k.removeprefix("policy."): v for k, v in checkpoint["state_dict"].items() if k.startswith("policy.")}
    assert all(torch.equal(policy.state_dict()[name], value) for name, value in expected.items())


def test_weights_changed_on_purpose_load_once_their_digest_is_recorded_again(one_step, tiny_model_path, tmp_path):
    checkpoint = torch.load(one_step[1], map_location="cpu", weights_only=True)
    name = next(key for key in checkpoint["state_dict"] if key.startswith("policy.") and ".layers.0." in key)
    checkpoint["state_dict"][name] = checkpoint["state_dict"][name] * 2
    edited = tmp_path / "edited.ckpt"
    torch.save(checkpoint, edited)
    policy = load_tiny_model(tiny_model_path)
    with pytest.raises(CheckpointDigestError, match=f"its tensor {name} .*add_tensor_digest"):
        load_policy_weights(policy, str(edited))
    add_tensor_digest(checkpoint)
    torch.save(checkpoint, edited)
    load_policy_weights(policy, str(edited))
    assert torch.equal(policy.state_dict()[name.removeprefix("policy.")], checkpoint["state_dict"][name])
