"""`erpo export` guards (issue 54, items 2 and 3, and the tied-head export of item 1): output paths refused before
anything loads, the written folder read back before "exported" is printed, the adapter folder naming its base model
by an absolute path, a trained head never written under `tie_word_embeddings: true`, and an empty checkpoint named
in one line (item 11).

The checkpoints are built in this process from the shipped toy model (no training run): the export reads only the
module's hyper-parameters and the `policy.*` weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import fails_in_one_line, run_main
from helpers.lora_exports import LORA, lora_module, move_adapters, probe_logits
from safetensors import safe_open
from transformers import AutoModelForCausalLM, PreTrainedModel

from erpo_lightning.export.hf_model import export_checkpoint, initial_model_reference
from erpo_lightning.toy import SHIPPED_DIR


def save_checkpoint(path: Path, policy: torch.nn.Module, hyper_parameters: dict) -> Path:
    torch.save({"hyper_parameters": hyper_parameters, "state_dict": {f"policy.{k}": v for k, v in
                                                                     policy.state_dict().items()}}, path)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory) -> Path:
    """A full fine-tuning checkpoint of the toy model (its initial weights: what the export carries is checked in
    tests/export/test_hf_model.py)."""
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)
    path = tmp_path_factory.mktemp("full") / "full.ckpt"
    return save_checkpoint(path, model, {"model_path": str(SHIPPED_DIR), "dtype": "float32"})


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory) -> Path:
    """A LoRA checkpoint (r = 4 on every linear layer, B moved off 0) whose `model_path` is relative to SHIPPED_DIR's
    parent, as a run started there records it."""
    module = lora_module()
    hyper_parameters = {**dict(module.hparams), "model_path": SHIPPED_DIR.name}
    return save_checkpoint(tmp_path_factory.mktemp("lora") / "lora.ckpt", module.policy, hyper_parameters)


@pytest.fixture()
def nothing_loads(monkeypatch):
    """Loading the initial model fails the test: the refusals need the command line alone."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the output folders were refused")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


# ---------------------------------------------------------------------------------- item 2: --out a file
@pytest.mark.parametrize("flag", ["--out", "--adapter_out"])
def test_an_existing_file_as_output_folder_is_refused_before_loading(
    flag, full_checkpoint, tmp_path, capsys, nothing_loads
):
    existing = tmp_path / "model.bin"
    existing.write_text("not a folder")
    folders = {"--out": str(tmp_path / "hf"), "--adapter_out": str(tmp_path / "adapter"), flag: str(existing)}
    args = [arg for pair in folders.items() for arg in pair]
    line = fails_in_one_line(capsys, "export", "--ckpt_path", str(full_checkpoint), *args)
    assert line == f"erpo: error: {flag}: {existing} is a file, not a folder; name a folder to write the model into"
    assert existing.read_text() == "not a folder" and not (tmp_path / "hf").exists()


def keep_all_but_the_final_norm(save_pretrained):
    def save(self, folder, state_dict=None, **kwargs):
        kept = {name: value for name, value in state_dict.items() if name != "model.norm.weight"}
        return save_pretrained(self, folder, state_dict=kept, **kwargs)

    return save


@pytest.mark.parametrize(
    "writer, problem",
    [
        (lambda save_pretrained: lambda self, folder, **kwargs: None, "no config.json"),
        (keep_all_but_the_final_norm, "1 of the model's tensors are not in its safetensors (first: model.norm.weight)"),
    ],
    ids=["nothing written", "a tensor missing"],
)
def test_an_export_whose_folder_does_not_load_fails_naming_the_folder(
    writer, problem, full_checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", writer(PreTrainedModel.save_pretrained))
    out = tmp_path / "hf"
    assert run_main("export", "--ckpt_path", str(full_checkpoint), "--out", str(out)) == 1
    captured = capsys.readouterr()
    assert f"\nerpo: error: the exported folder {out} does not hold a loadable model: {problem}\n" in captured.err
    assert "exported" not in captured.out


def test_a_tied_model_exports_with_its_head_written_once(full_checkpoint, tmp_path):
    out = export_checkpoint(full_checkpoint, tmp_path / "hf")  # read back: config.json and every tensor name
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert "lm_head.weight" not in handle.keys() and "model.embed_tokens.weight" in handle.keys()


# ---------------------------------------------------------------------- item 3: overlapping folders
@pytest.mark.parametrize(
    "out, adapter_out",
    [
        (("both",), ("both",)),
        (("both",), ("elsewhere", os.pardir, "both")),
        (("merged",), ("merged", "adapter")),
        (("adapter", "merged"), ("adapter",)),
    ],
    ids=["same folder", "same folder spelt apart", "adapter inside", "merged inside"],
)
def test_overlapping_out_and_adapter_out_are_refused_before_loading(
    out, adapter_out, lora_checkpoint, tmp_path, capsys, nothing_loads
):
    out, adapter_out = tmp_path.joinpath(*out), tmp_path.joinpath(*adapter_out)
    line = fails_in_one_line(capsys, "export", "--ckpt_path", str(lora_checkpoint), "--out", str(out),
                             "--adapter_out", str(adapter_out))  # fmt: skip
    assert line.startswith(f"erpo: error: --adapter_out {adapter_out} and --out {out} overlap (the same folder"), line
    assert "give them separate folders" in line
    assert not any(tmp_path.iterdir())


def test_the_adapter_names_its_base_model_by_absolute_path(lora_checkpoint, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    monkeypatch.chdir(SHIPPED_DIR.parent)  # where the checkpoint's relative model_path resolves
    export_checkpoint(lora_checkpoint, tmp_path / "merged", adapter_out=tmp_path / "adapter")
    recorded = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(SHIPPED_DIR.resolve())
    monkeypatch.chdir(tmp_path)  # the adapter loads from anywhere, and its model is the merged export's
    reloaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(probe_logits(reloaded), probe_logits(merged), atol=1e-4, rtol=1e-5)


def test_a_hub_id_is_recorded_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert initial_model_reference("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


# ------------------------------------------------------------ item 1's export side: an adapted tied head
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")  # peft's, on the tied head
@pytest.mark.parametrize("trained", [True, False], ids=["head moved", "head at B = 0"])
def test_an_old_checkpoint_with_lora_on_the_tied_head_never_exports_a_second_head_under_the_tie(trained, tmp_path):
    """A checkpoint from before the refusal (target_modules [q_proj, lm_head] on the tied toy model). A trained head
    is written on its own and config.json untied, so the folder loads as the policy computed; a head the adapter
    has not moved is the embeddings, written once under the tie."""
    from peft import LoraConfig, inject_adapter_in_model

    policy = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]), policy)
    if trained:
        move_adapters(policy)
    settings = {"model_path": str(SHIPPED_DIR), "peft": {**LORA, "target_modules": ["q_proj", "lm_head"]}}
    checkpoint = save_checkpoint(tmp_path / "old.ckpt", policy, settings)
    out = export_checkpoint(checkpoint, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is not trained
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert ("lm_head.weight" in handle.keys()) is trained and "model.embed_tokens.weight" in handle.keys()
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(exported.lm_head.weight, exported.model.embed_tokens.weight) is not trained
    torch.testing.assert_close(probe_logits(exported), probe_logits(policy), atol=1e-4, rtol=1e-5)


# ----------------------------------------------------------- issue 54 item 11: an export on a full disk
# What safetensors raises when the disk fills during a write (its own error type; the text the issue quotes). It writes
# to a temporary file and renames it, so /dev/full cannot stand in for the file here.
FULL_DISK = "Error while serializing: I/O error: No space left on device (os error 28)"


def write_on_a_full_disk(tensors, filename, metadata=None):
    """transformers' `safe_save_file` on a full disk: a partial file, then safetensors' error."""
    from safetensors import SafetensorError

    Path(filename).write_bytes(b"\0" * 1024)
    raise SafetensorError(FULL_DISK)


@pytest.mark.parametrize("existed", [False, True], ids=["new folder", "existing folder"])
def test_an_export_on_a_full_disk_names_the_folder_and_leaves_no_partial_one(
    existed, full_checkpoint, tmp_path, capsys, monkeypatch
):
    import transformers.modeling_utils

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", write_on_a_full_disk)
    out = tmp_path / "hf"
    if existed:
        out.mkdir()
    assert run_main("export", "--ckpt_path", str(full_checkpoint), "--out", str(out)) == 1
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if line.startswith("erpo: error: ")]
    assert line.startswith(f"erpo: error: could not write the export to {out}: {FULL_DISK}; "), line
    if existed:
        assert line.endswith(f"; {out} existed before and may hold a partial export: delete it or export again")
        assert out.is_dir()
    else:
        assert line.endswith("; the partial export was removed") and not out.exists()
    assert "exported" not in captured.out


def test_an_empty_checkpoint_given_to_export_is_one_line_naming_it(tmp_path, capsys):
    empty = tmp_path / "last.ckpt"
    empty.touch()
    assert run_main("export", "--ckpt_path", str(empty), "--out", str(tmp_path / "hf")) == 1
    err = capsys.readouterr().err
    assert f"erpo: error: checkpoint {empty} cannot be read: it is empty (0 bytes)" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()
