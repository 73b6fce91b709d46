"""LoRA checkpoints and adapter folders (issue 67; `checkpoints/policy_weights.py`, `modules/lora_files.py`):
`erpo validate` of a LoRA run's checkpoint with a config lacking its `model.peft` is one line naming the run's
settings (not torch's "Missing key(s)" listing every layer); an adapter folder whose `adapter_model.safetensors` is
cut short or has a damaged header is named; an adapter trained on another base model (its `adapter_config.json`'s
`base_model_name_or_path`) is refused when both are local folders whose weights differ, and warned about when they
can only be compared by name. The tests share one module fixture (the run below), so they stay in one file.

The checkpoint is a real one: a 1-step LoRA `erpo fit` of the tiny model in this process; the adapter folder is its
`erpo export --adapter_out`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.resume_runs import run_main

from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.export.hf_model import export_checkpoint
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora import LoraSettings
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model, save_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore:.*:UserWarning")
PEFT = {"r": 4, "alpha": 8.0}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_path, benchmarks_dir) -> Path:
    """The `last.ckpt` of a 1-step LoRA `erpo fit` (r 4, alpha 8 on every linear layer) of the tiny model."""
    root = tmp_path_factory.mktemp("lora_run")
    callback = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(root / "ckpt"), "save_last": True},
    }
    config = tiny_config(root, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=[callback], max_steps=1)
    settings = yaml.safe_load(config.read_text())
    settings["model"]["peft"] = PEFT
    config.write_text(yaml.safe_dump(settings))
    assert run_main("fit", "--config", str(config)) == 0
    return root / "ckpt" / "last.ckpt"


@pytest.fixture(scope="module")
def adapter_folder(lora_run, tmp_path_factory) -> Path:
    """The run's adapter alone, as `erpo export --adapter_out` writes it (its base: the tiny model's absolute path)."""
    root = tmp_path_factory.mktemp("lora_export")
    export_checkpoint(lora_run, root / "merged", adapter_out=root / "adapter")
    return root / "adapter"


def validate_config(folder: Path, model_path: Path, benchmarks_dir: Path) -> Path:
    """The smallest `erpo validate` config of `model_path` (no model.peft): 1 problem, 1 temperature, k 1."""
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "logger": False, "default_root_dir": str(folder)},
        "model": {"model_path": str(model_path)},
        "data": {"template": "plain"},
        "rollout": {
            "engine": {"class_path": "erpo_lightning.rollout.HFEngine"},
            "reward": {"class_path": "erpo_lightning.rewards.MathReward", "init_args": {"num_workers": 0}},
            "max_new_tokens": 2,
        },
        "sweep": {
            "benchmarks": [{"source": {"path": str(benchmarks_dir / "gsm8k.jsonl")}, "k": 1}],
            "temperatures": [1.0],
            "max_problems": 1,
            "output_dir": str(folder / "sweep"),
            "progress": False,
        },
    }
    path = folder / "validate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ----------------------------------------------------------------- validate without the run's model.peft
def test_validate_without_the_runs_peft_names_it_in_one_line(lora_run, tiny_model_path, benchmarks_dir, tmp_path,
                                                              capsys):  # fmt: skip
    config = validate_config(tmp_path, tiny_model_path, benchmarks_dir)
    capsys.readouterr()
    line = fails_in_one_line(capsys, "validate", "--config", str(config), "--ckpt_path", str(lora_run))
    flow = "{adapter_path: null, alpha: 8.0, checkpoint: full, dropout: 0.0, r: 4, seed: 0, target_modules: all-linear}"
    assert line == (
        f"erpo: error: model.peft: {lora_run} is a LoRA run's checkpoint (its model.peft: {flow}), but this config "
        f"has no model.peft, so the policy has no adapters to load it into; validate with the run's config, or add "
        f"--model.peft '{flow}'"
    )
    assert not (tmp_path / "sweep").exists()
    # The flag the line gives is enough to validate the checkpoint.
    code = run_main("validate", "--config", str(config), "--ckpt_path", str(lora_run), "--model.peft", flow)
    assert code == 0 and (tmp_path / "sweep" / "results.json").is_file()


def test_loading_a_lora_checkpoint_into_a_plain_policy_is_one_line(lora_run, tiny_model_path):
    with pytest.raises(SettingsError, match=rf"^model.peft: {lora_run} is a LoRA run's checkpoint \(its model.peft: "):
        load_policy_weights(load_tiny_model(tiny_model_path), str(lora_run))


def test_validate_with_another_rank_names_the_field(lora_run, tiny_model_path, benchmarks_dir, tmp_path, capsys):
    config = validate_config(tmp_path, tiny_model_path, benchmarks_dir)
    capsys.readouterr()
    line = fails_in_one_line(
        capsys, "validate", "--config", str(config), "--ckpt_path", str(lora_run), "--model.peft", "{r: 8, alpha: 8}"
    )
    assert line.startswith(f"erpo: error: model.peft.r: {lora_run} was trained with r 4, but this config has 8; "), line


# ------------------------------------------------------------------------------------ a damaged adapter file
def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damage_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = b"\xff\xfe\xfd\xfc"  # the JSON header starts after its 8-byte length
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [cut_short, damage_header], ids=["cut short", "header damaged"])
def test_a_damaged_adapter_weight_file_is_named(damage, adapter_folder, tiny_model_path, tmp_path):
    folder = Path(shutil.copytree(adapter_folder, tmp_path / "adapter"))
    weights = folder / "adapter_model.safetensors"
    damage(weights)
    settings = LoraSettings(**PEFT, adapter_path=str(folder))
    message = rf"^model.peft.adapter_path: {weights} cannot be read \({weights.stat().st_size} bytes; .*copy or export"
    with pytest.raises(ValueError, match=message):
        ERPOModule(str(tiny_model_path), peft=settings)  # before any weight loads
    from erpo_lightning.modules.lora import add_lora_adapters
    from erpo_lightning.modules.lora_files import load_adapter_weights

    policy = load_tiny_model(tiny_model_path)
    add_lora_adapters(policy, settings)
    with pytest.raises(ValueError, match=message):  # and where the weights load
        load_adapter_weights(policy, str(folder))


# --------------------------------------------------------------------------------- an adapter of another base
def test_an_adapter_of_another_local_base_is_refused_naming_both(adapter_folder, tiny_model_path, tmp_path):
    base = json.loads((adapter_folder / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base) == tiny_model_path.resolve()
    other = save_tiny_model(tmp_path / "other", seed=1)  # the same shapes, other weights
    settings = LoraSettings(**PEFT, adapter_path=str(adapter_folder))
    message = rf"^model.peft.adapter_path {adapter_folder} was trained on {base} .* but model.model_path {other} "
    with pytest.raises(ValueError, match=message + "hashes to [0-9a-f]{16}: the adapter would sit"):
        ERPOModule(str(other), peft=settings)
    copy = Path(shutil.copytree(tiny_model_path, tmp_path / "copy"))  # the same weights elsewhere: accepted
    module = ERPOModule(str(copy), peft=settings)
    module.configure_model()


def test_an_adapter_whose_base_cannot_be_compared_is_warned_about(adapter_folder, tiny_model_path, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = Path(shutil.copytree(adapter_folder, tmp_path / "adapter"))
    weights_name = "adapter_model.safetensors"
    weights = load_file(folder / weights_name)  # every B off 0: a loaded adapter shows
    save_file({name: t.fill_(0.05) if ".lora_B." in name else t for name, t in weights.items()}, folder / weights_name)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "someone/model"}))
    module = ERPOModule(str(tiny_model_path), peft=LoraSettings(**PEFT, adapter_path=str(folder)))
    capsys.readouterr()
    module.configure_model()
    assert (
        f"[erpo] warning: model.peft.adapter_path {folder} was trained on someone/model (base_model_name_or_path in "
        f"its adapter_config.json), and model.model_path is {tiny_model_path}; they cannot be compared here"
    ) in capsys.readouterr().err
    saved = load_file(folder / weights_name)  # loaded all the same: the folder's tensors, by name
    trained = dict(module.policy.named_parameters())
    for name, tensor in saved.items():
        layer, _, leaf = name.removeprefix("base_model.model.").rpartition(".")
        assert torch.equal(trained[f"{layer}.default.{leaf}"], tensor), name
