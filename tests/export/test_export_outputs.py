"""What `erpo export` finds in its output folders (`export/hf_model.py`, issue 67): an `--out` folder holding an
earlier `--adapter_out` export is refused before anything loads (from_pretrained would apply that adapter over the
merged weights), an earlier model export there is replaced file by file, saying so, and an `--adapter_out` folder
holding a model's files is refused. The checkpoints are built in this process from the shipped toy model (no
training run), as test_export_guards.py's are."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cli_runs import fails_in_one_line
from helpers.lora_exports import lora_module, probe_logits
from transformers import AutoModelForCausalLM

from erpo_lightning.export.hf_model import export_checkpoint
from erpo_lightning.toy import SHIPPED_DIR


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory) -> Path:
    """A LoRA checkpoint of the toy model (r = 4 on every linear layer) whose every B is moved off 0, so that the
    adapter changes the model's logits."""
    module = lora_module()
    checkpoint = {
        "hyper_parameters": dict(module.hparams),
        "state_dict": {f"policy.{name}": value for name, value in module.policy.state_dict().items()},
        "global_step": 3,
    }
    module.on_save_checkpoint(checkpoint)  # as Lightning writes it
    path = tmp_path_factory.mktemp("lora") / "lora.ckpt"
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def exported(lora_checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """(merged model folder, adapter folder) of one `export_checkpoint` of the LoRA checkpoint into fresh folders."""
    root = tmp_path_factory.mktemp("exported")
    export_checkpoint(lora_checkpoint, root / "merged", adapter_out=root / "adapter")
    return root / "merged", root / "adapter"


def test_out_holding_an_earlier_adapter_export_is_refused_before_loading(lora_checkpoint, exported, tmp_path, capsys,
                                                                          monkeypatch):  # fmt: skip
    """The issue's case: `--out` into the folder of an earlier `--adapter_out`. Refused, naming the folder and the
    adapter's files, with nothing loaded and the folder unchanged; with the adapter's files deleted, the same export
    loads as exactly the merged model of a clean folder."""
    merged, adapter = exported
    stale = tmp_path / "stale"
    stale.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (stale / name).write_bytes((adapter / name).read_bytes())
    before = {path.name: path.read_bytes() for path in stale.iterdir()}

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the output folder was refused")

    with monkeypatch.context() as patched:
        patched.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
        line = fails_in_one_line(capsys, "export", "--ckpt_path", str(lora_checkpoint), "--out", str(stale))
    assert line == (
        f"erpo: error: --out: {stale} holds adapter_config.json, adapter_model.safetensors: a LoRA adapter (an earlier "
        "--adapter_out export?), which transformers' from_pretrained of the folder would apply on top of the merged "
        "weights written here; delete them (or the folder), or give --out an empty folder"
    )
    assert {path.name: path.read_bytes() for path in stale.iterdir()} == before

    for name in before:
        (stale / name).unlink()
    export_checkpoint(lora_checkpoint, stale)
    clean = probe_logits(AutoModelForCausalLM.from_pretrained(merged))
    assert torch.equal(probe_logits(AutoModelForCausalLM.from_pretrained(stale)), clean)
    base = probe_logits(AutoModelForCausalLM.from_pretrained(SHIPPED_DIR))
    assert (clean - base).abs().max() > 1e-3  # the adapter moves the logits: applying it twice would show


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.bin"])
def test_a_single_adapter_file_in_out_is_refused_too(name, lora_checkpoint, tmp_path):
    from erpo_lightning.common.errors import SettingsError

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / name).write_text("{}")
    with pytest.raises(SettingsError, match=rf"--out: {tmp_path / 'hf'} holds {name}: a LoRA adapter .* delete it "):
        export_checkpoint(lora_checkpoint, tmp_path / "hf")


def test_an_earlier_model_export_in_out_is_replaced_saying_so(lora_checkpoint, exported, tmp_path, capsys):
    """An earlier export's files in `--out`, and ones the new export does not write (a second weight shard, another
    tokenizer's vocabulary), are deleted before writing, with a line naming them; a file of neither kind is kept."""
    merged, _ = exported
    out = tmp_path / "hf"
    out.mkdir()
    for path in merged.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    (out / "model-00002-of-00002.safetensors").write_bytes(b"an earlier export's second shard")
    (out / "tokenizer.model").write_bytes(b"an earlier tokenizer's vocabulary")
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    export_checkpoint(lora_checkpoint, out)
    said = capsys.readouterr().out
    assert f"[erpo] --out {out} holds an earlier export (" in said and ": replacing it\n" in said
    assert "model-00002-of-00002.safetensors" in said and "notes.txt" not in said
    written = sorted([path.name for path in merged.iterdir()] + ["notes.txt"])
    assert sorted(path.name for path in out.iterdir()) == written
    assert torch.equal(
        probe_logits(AutoModelForCausalLM.from_pretrained(out)),
        probe_logits(AutoModelForCausalLM.from_pretrained(merged)),
    )


def test_adapter_out_holding_a_model_is_refused_and_an_earlier_adapter_replaced(lora_checkpoint, exported, tmp_path):
    from erpo_lightning.common.errors import SettingsError

    merged, adapter = exported
    with pytest.raises(SettingsError, match=rf"--adapter_out: {merged} holds config.json, .*model.safetensors.*: a "
                                            "model's files"):  # fmt: skip
        export_checkpoint(lora_checkpoint, tmp_path / "hf", adapter_out=merged)
    again = tmp_path / "adapter"
    again.mkdir()
    (again / "adapter_model.bin").write_bytes(b"an earlier adapter in another format")
    export_checkpoint(lora_checkpoint, tmp_path / "hf", adapter_out=again)
    assert not (again / "adapter_model.bin").exists()
    assert (again / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
