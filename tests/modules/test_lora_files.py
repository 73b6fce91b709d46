"""LoRA adapters on disk (issue 55, item 6; erpo_lightning/modules/lora_files.py, docs/lora.md): a policy that starts
from a peft adapter folder (`model.peft.adapter_path`), refused before anything loads when the folder does not fit
the settings; checkpoints that hold the adapters alone (`model.peft.checkpoint: adapters`), which `erpo export` and
`erpo validate` load onto the base they were trained on, refusing another base; `erpo export --adapter_out` read
back by `adapter_path` to the bit; and an exact resume from an adapters-only checkpoint.

Checkpoints are built in this process from the shipped toy model with the module's own `on_save_checkpoint` (no
training run), except the resume test, which trains the tiny Qwen2 for a few steps."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config
from helpers.resume_runs import resumed_equals_full_run
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from erpo_lightning.checkpoints.adapters_only import ADAPTERS_ONLY_KEY
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.checkpoints.resume_config import check_checkpoint_model, check_resume_config
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.data.fingerprint import weights_hash
from erpo_lightning.export.hf_model import export_checkpoint
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora import LoraSettings, lora_config
from erpo_lightning.toy import SHIPPED_DIR

LORA = {"r": 4, "alpha": 8.0}
TESTS_DIR = Path(__file__).parents[1]


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def lora_module(model_path: Path = SHIPPED_DIR, **settings) -> ERPOModule:
    """The module with its LoRA policy built, every B moved off 0 by a fixed draw (as training would)."""
    module = ERPOModule(str(model_path), peft=LoraSettings(**{**LORA, **settings}))
    module.configure_model()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in module.policy.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return module


def write_checkpoint(path: Path, module: ERPOModule) -> Path:
    """What Lightning writes for `module`: its state dict and hyper-parameters, after its `on_save_checkpoint`."""
    checkpoint = {"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict(), "global_step": 3}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


def save_adapter(folder: Path, **config) -> Path:
    """A peft adapter folder of the toy model (B off 0), as peft's `save_pretrained` writes it; `config` changes
    entries of its adapter_config.json afterwards."""
    from peft import get_peft_model

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(SHIPPED_DIR), lora_config(LoraSettings(**LORA)))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.fill_(0.05)
    model.save_pretrained(folder)
    if config:
        path = folder / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


# ------------------------------------------------------------------------------------- starting from an adapter
@pytest.fixture(scope="module")
def adapter_folder(tmp_path_factory) -> Path:
    return save_adapter(tmp_path_factory.mktemp("adapter") / "adapter")


def test_the_policy_starts_at_the_adapter_folder_weights_on_the_base(adapter_folder):
    module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA, adapter_path=str(adapter_folder)))
    module.configure_model()
    saved = load_file(adapter_folder / "adapter_model.safetensors")
    adapters = {n: p for n, p in module.policy.named_parameters() if p.requires_grad}
    assert len(adapters) == len(saved) == 56
    for name, tensor in saved.items():  # base_model.model.X.lora_A.weight -> X.lora_A.default.weight
        policy_name = name.removeprefix("base_model.model.").replace(".weight", ".default.weight")
        assert torch.equal(adapters[policy_name], tensor), name
    assert all(p.abs().max() > 0 for n, p in adapters.items() if ".lora_B." in n)  # not B = 0: the folder's
    base = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR).state_dict()
    frozen = {n.replace(".base_layer.", "."): v for n, v in module.policy.state_dict().items() if not is_adapter(n)}
    assert frozen.keys() == base.keys() and all(torch.equal(frozen[n], v) for n, v in base.items())


@pytest.mark.parametrize(
    "problem, lora, config, message",
    [
        ("missing", LORA, {}, r"model\.peft\.adapter_path .*/missing: no such folder"),
        ("no_config", LORA, {}, r"model\.peft\.adapter_path .* holds no adapter_config\.json"),
        ("rank", {**LORA, "r": 8}, {}, r"model\.peft\.r is 8, but the adapter .* has r 4: set model\.peft\.r 4"),
        ("alpha", {**LORA, "alpha": 16.0}, {}, r"model\.peft\.alpha is 16\.0, but .* has lora_alpha 8"),
        ("targets", LORA, {"target_modules": ["q_proj"]}, r"model\.peft\.target_modules 'all-linear' adapts other"),
        ("dora", LORA, {"use_dora": True}, r"adapter_config\.json sets use_dora True; only plain LoRA"),
    ],
)
def test_an_adapter_folder_that_does_not_fit_is_refused_before_any_weight_loads(
    problem, lora, config, message, tmp_path, monkeypatch
):
    folder = tmp_path / problem
    if problem != "missing":
        save_adapter(folder, **config)
    if problem == "no_config":
        (folder / "adapter_config.json").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the adapter folder was refused")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    with pytest.raises(ValueError, match=message):
        ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**lora, adapter_path=str(folder)))


def test_an_adapter_file_without_a_tensor_of_the_policy_is_refused_when_it_loads(tmp_path):
    folder = save_adapter(tmp_path / "adapter")
    weights = load_file(folder / "adapter_model.safetensors")
    dropped = sorted(weights)[0]
    save_file({name: value for name, value in weights.items() if name != dropped}, folder / "adapter_model.safetensors")
    module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA, adapter_path=str(folder)))  # its config fits
    expected = dropped.removeprefix("base_model.model.").replace(".weight", ".default.weight")
    with pytest.raises(ValueError, match=rf"adapter_model\.safetensors has no tensor for {re.escape(expected)}"):
        module.configure_model()


def test_the_command_line_refuses_a_missing_adapter_folder_in_one_line(
    tmp_path, tiny_model_path, benchmarks_dir, capsys
):
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    missing = tmp_path / "no_adapter"
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--model.peft.adapter_path", str(missing))
    assert line.startswith(f"erpo: error: model.peft.adapter_path {missing}: no such folder"), line


def test_export_adapter_out_then_adapter_path_starts_at_the_exported_weights(tmp_path):
    trained = lora_module()
    checkpoint = write_checkpoint(tmp_path / "full.ckpt", trained)
    export_checkpoint(checkpoint, tmp_path / "merged", adapter_out=tmp_path / "adapter")
    restarted = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA, adapter_path=str(tmp_path / "adapter")))
    restarted.configure_model()
    expected = {n: p for n, p in trained.policy.named_parameters() if p.requires_grad}
    started = {n: p for n, p in restarted.policy.named_parameters() if p.requires_grad}
    assert started.keys() == expected.keys()
    assert all(torch.equal(started[name], value) for name, value in expected.items())


# ------------------------------------------------------------------------------------- adapters-only checkpoints
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The same trained LoRA policy written whole (`full`) and as its adapters alone (`adapters`)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    module = lora_module(checkpoint="adapters")
    adapters_only = write_checkpoint(folder / "adapters.ckpt", module)
    module.lora = LoraSettings(**LORA)  # checkpoint: full
    return {"adapters": adapters_only, "full": write_checkpoint(folder / "full.ckpt", module)}


def test_an_adapters_only_checkpoint_holds_the_adapters_and_the_base_hash(checkpoints):
    adapters_only = torch.load(checkpoints["adapters"], weights_only=True)
    full = torch.load(checkpoints["full"], weights_only=True)
    assert set(adapters_only["state_dict"]) == {name for name in full["state_dict"] if is_adapter(name)}
    assert len(adapters_only["state_dict"]) == 56 < len(full["state_dict"])
    assert adapters_only[ADAPTERS_ONLY_KEY] == {
        "base_model_path": str(SHIPPED_DIR),
        "base_weights_hash": weights_hash(SHIPPED_DIR),
    }
    assert ADAPTERS_ONLY_KEY not in full
    assert checkpoints["adapters"].stat().st_size < checkpoints["full"].stat().st_size / 5


def test_validate_loads_an_adapters_only_checkpoint_as_the_full_one(checkpoints):
    policies = {}
    for kind, path in checkpoints.items():
        module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA))
        module.configure_model()
        load_policy_weights(module.policy, str(path))
        policies[kind] = module.policy.state_dict()
    assert policies["adapters"].keys() == policies["full"].keys()
    assert all(torch.equal(policies["adapters"][n], v) for n, v in policies["full"].items())
    assert any(v.abs().max() > 0 for n, v in policies["adapters"].items() if ".lora_B." in n)  # trained, not fresh


def test_export_of_an_adapters_only_checkpoint_equals_the_full_ones(checkpoints, tmp_path):
    for kind, path in checkpoints.items():
        export_checkpoint(path, tmp_path / kind / "merged", adapter_out=tmp_path / kind / "adapter")
    for name in ("merged/model.safetensors", "adapter/adapter_model.safetensors"):
        written = load_file(tmp_path / "adapters" / name)
        expected = load_file(tmp_path / "full" / name)
        assert written.keys() == expected.keys()
        assert all(torch.equal(written[key], value) for key, value in expected.items()), name


def test_an_adapters_only_checkpoint_refuses_another_base_naming_model_path(tmp_path):
    base = shutil.copytree(SHIPPED_DIR, tmp_path / "base")
    checkpoint = write_checkpoint(tmp_path / "adapters.ckpt", lora_module(base, checkpoint="adapters"))
    weights = load_file(base / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3  # the same path, other weights: a re-downloaded or overwritten base
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    message = r"^model\.model_path: .*adapters\.ckpt holds LoRA adapters only .* hash to"
    module = ERPOModule(str(base), peft=LoraSettings(**LORA))
    module.configure_model()
    with pytest.raises(SettingsError, match=message):  # erpo validate, erpo export
        load_policy_weights(module.policy, str(checkpoint))
    loaded = torch.load(checkpoint, weights_only=True)
    with pytest.raises(SettingsError, match=message):  # erpo fit --ckpt_path, before anything loads
        check_resume_config(loaded, {"model": {**loaded["hyper_parameters"]}}, str(checkpoint))
    with pytest.raises(SettingsError, match=message):  # erpo validate, before anything loads
        check_checkpoint_model(loaded, str(base), str(checkpoint))
    with pytest.raises(SettingsError, match=r"^model\.model_path: the checkpoint holds LoRA adapters only"):
        module.on_load_checkpoint(loaded)  # a resume in this process


def test_adapters_only_checkpoints_are_refused_under_fsdp2():
    module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA, checkpoint="adapters"))
    module._device_mesh = object()  # what ModelParallelStrategy sets before configure_model
    with pytest.raises(ValueError, match=r"^model\.peft\.checkpoint 'adapters' is not supported under .*FSDP2"):
        module.configure_model()
    assert module.policy is None  # refused before the model loads


@pytest.mark.slow  # trains the tiny Qwen2 4 steps and resumes from its step-2 checkpoint for 2 more, in this process
def test_resume_from_an_adapters_only_checkpoint_is_exact(tiny_model_path, benchmarks_dir, tmp_path):
    lora = {"peft": LoraSettings(r=4, alpha=8, checkpoint="adapters")}
    weights = resumed_equals_full_run(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, module_kwargs=lora)
    assert any(value.abs().max() > 0 for name, value in weights.items() if ".lora_B." in name)  # they trained
    resumed_from = torch.load(tmp_path / "full" / "ckpt" / "step=2.ckpt", weights_only=True)
    assert resumed_from["state_dict"] and all(is_adapter(name) for name in resumed_from["state_dict"])
    assert resumed_from[ADAPTERS_ONLY_KEY]["base_weights_hash"] == weights_hash(tiny_model_path)


def test_a_resume_may_change_what_checkpoints_hold_and_no_other_peft_setting():
    from erpo_lightning.checkpoints.resume_config import CONFIG_KEY

    def config(**peft) -> dict:
        return {"model": {"model_path": str(SHIPPED_DIR), "peft": {**LORA, "checkpoint": "full", **peft}}}

    check_resume_config({CONFIG_KEY: config()}, config(checkpoint="adapters"), "last.ckpt")
    with pytest.raises(SettingsError, match=r"model\.peft\.r: 4 -> 8"):
        check_resume_config({CONFIG_KEY: config()}, config(checkpoint="adapters", r=8), "last.ckpt")


@pytest.mark.slow  # three `erpo` subprocesses: a 1-step fit, its resume to step 2, and the export
def test_erpo_fit_from_an_adapter_folder_with_adapters_only_checkpoints_resumes_and_exports(adapter_folder, tmp_path):
    peft = {**LORA, "adapter_path": str(adapter_folder), "checkpoint": "adapters"}
    config = fit_config(
        SHIPPED_DIR, [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 16}], tmp_path,
        data={"max_prompt_length": 64}, model={"learning_rate": 1e-2, "peft": peft},
        rollout={"reward": "helpers.resume_runs.character_parity_reward", "group_size": 4},
        trainer={"max_steps": 1, "logger": csv_logger(tmp_path / "logs"), "log_every_n_steps": 1},
    )  # fmt: skip
    path, env = write_config(tmp_path / "lora.yaml", config), {"PYTHONPATH": str(TESTS_DIR)}
    first = run_erpo("fit", "--config", str(path), cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    query_kl = [float(row["train/query_kl"]) for row in csv.DictReader(metrics.open()) if row.get("train/query_kl")]
    assert query_kl[0] > 0  # θ0 is the base model, and the policy starts at the adapter, not at B = 0
    resumed = run_erpo("fit", "--config", str(path), "--trainer.max_steps", "2", "--ckpt_path", "last", cwd=tmp_path,
                       env=env)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    checkpoints = {torch.load(p, weights_only=True)["global_step"]: p for p in (tmp_path / "logs").rglob("*.ckpt")}
    saved = torch.load(checkpoints[2], weights_only=True)
    assert len(saved["state_dict"]) == 56 and all(is_adapter(name) for name in saved["state_dict"])
    out, adapter = tmp_path / "merged", tmp_path / "adapter"
    done = run_erpo("export", "--ckpt_path", str(checkpoints[2]), "--out", str(out), "--adapter_out", str(adapter),
                    cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    exported = load_file(adapter / "adapter_model.safetensors")
    for name, tensor in exported.items():
        policy_name = "policy." + name.removeprefix("base_model.model.").replace(".weight", ".default.weight")
        assert torch.equal(tensor, saved["state_dict"][policy_name]), name
    started = load_file(adapter_folder / "adapter_model.safetensors")
    assert any(not torch.equal(tensor, started[name]) for name, tensor in exported.items())  # it trained on
