"""LoRA training (`model.peft`, erpo_lightning/modules/lora.py; docs/lora.md) on the shipped toy model and the tiny
Qwen2: only the adapters train, θ0 stays the base model (its reference cache is reused and the first step's Query-KL
is exactly 0), rollout engines and exports receive the merged weights, checkpoints resume exactly, and DDP / FSDP2
equal one process. Runs are a few steps of the toy model; every assertion holds whatever was sampled."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.docs import example
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config
from helpers.resume_runs import resumed_equals_full_run, run_main
from helpers.scaleout import assert_same_run
from helpers.trl_setup import make_trainer, requires_trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.callbacks.export import export_policy
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora import LoraSettings, check_lora_settings
from erpo_lightning.rollout.vllm_engine import stream_full_tensors
from erpo_lightning.toy import SHIPPED_DIR
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model
from erpo_lightning.weights.merged import base_model_state_dict

TESTS_DIR = Path(__file__).parents[1]
LORA = {"r": 4, "alpha": 8}  # 23,552 adapter parameters on the toy model's 283,968: 7.7% of 307,520
PROBE = "Compute 7 + 8 - 5.\n"
VLLM_ENGINE = {
    "class_path": "erpo_lightning.rollout.VLLMEngine",
    "init_args": {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 32 * 2**20},
}


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """A LoRA policy's state-dict name of a base weight, as the base model names it."""
    return name.removeprefix("policy.").replace(".base_layer.", ".")


def lora_policy(settings: dict | None = None, **module_kwargs) -> torch.nn.Module:
    """The toy model with adapters, as ERPOModule builds it (B = 0: still the base model)."""
    module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**(settings or LORA)), **module_kwargs)
    module.configure_model()
    return module.policy


def perturb_adapters(policy: torch.nn.Module, scale: float = 0.2) -> None:
    """Move every B off 0 by a fixed draw, as training would."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    ids = AutoTokenizer.from_pretrained(SHIPPED_DIR)(PROBE, return_tensors="pt").input_ids
    with torch.no_grad():
        return model.eval()(ids).logits


def base_model() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------ settings, θ0
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"r": 0}, r"model\.peft\.r must be an integer >= 1, got 0"),
        ({"alpha": 0.0}, r"model\.peft\.alpha must be > 0, got 0\.0"),
        ({"dropout": 1.0}, r"model\.peft\.dropout must be in \[0, 1\), got 1\.0"),
        ({"target_modules": []}, r"model\.peft\.target_modules must be 'all-linear' or a non-empty list"),
        ({"rank": 4}, r"model\.peft has no field 'rank'"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        check_lora_settings(settings)
    with pytest.raises(ValueError, match=message):  # the module's constructor, before any model loads
        ERPOModule("/nonexistent/model", peft=settings)


def test_the_command_line_refuses_a_bad_rank_in_one_line(tmp_path, tiny_model_path, benchmarks_dir, capsys):
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--model.peft.r", "0")
    assert line == "erpo: error: model.peft.r must be an integer >= 1, got 0"


def test_the_configuration_page_yaml_example_parses_into_these_settings(tmp_path, tiny_model_path, benchmarks_dir,
                                                                         capsys):  # fmt: skip
    documented = yaml.safe_load(example("configuration.md", "lora-yaml", "yaml"))["model"]
    config = yaml.safe_load(tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl").read_text())
    config["model"].update({key: value for key, value in documented.items() if key != "model_path"})  # offline
    assert run_main("fit", "--config", str(write_config(tmp_path / "lora.yaml", config)), "--print_config") == 0
    printed = yaml.safe_load(capsys.readouterr().out)["model"]["peft"]
    assert printed == {**documented["peft"], "seed": 0, "adapter_path": None, "checkpoint": "full"}
    assert ERPOModule(str(tiny_model_path), peft=printed).lora == LoraSettings(r=16, alpha=32.0)


def test_without_peft_installed_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # what `import peft` finds when it is not installed
    with pytest.raises(ImportError, match=r"pip install -e '\.\[lora\]' from the repository root"):
        ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA))
    ERPOModule(str(SHIPPED_DIR))  # full fine-tuning never needs it


def test_importing_the_package_and_the_cli_does_not_import_peft():
    code = "import sys, erpo_lightning.cli, erpo_lightning.export.hf_model; print('peft' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_adapters_start_at_the_base_model_and_only_they_train():
    policy = lora_policy()
    assert type(policy).__name__ == "Qwen2ForCausalLM"  # the same class: generate, FSDP2 layers, log-probs unchanged
    assert torch.equal(probe_logits(policy), probe_logits(base_model()))  # B = 0: θ0 to the bit
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter(name) for name in trainable)
    assert len(trainable) == 4 * 7 * 2  # A and B of the 7 linear layers of each of the 4 decoder layers
    # The same seed draws the same A (every rank, every run), another seed another A.
    same, other = lora_policy().state_dict(), lora_policy({**LORA, "seed": 1}).state_dict()
    a_names = [name for name in same if ".lora_A." in name]
    assert all(torch.equal(same[n], policy.state_dict()[n]) for n in a_names)
    assert not any(torch.equal(other[n], same[n]) for n in a_names)


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients():
    ids = AutoTokenizer.from_pretrained(SHIPPED_DIR)(PROBE, return_tensors="pt").input_ids
    grads = []
    for checkpointing in (False, True):
        policy = lora_policy(gradient_checkpointing=checkpointing)
        perturb_adapters(policy)  # B ≠ 0, so A gets a gradient too
        policy.train()
        assert policy.is_gradient_checkpointing == checkpointing
        policy(ids, labels=ids).loss.backward()
        assert all(p.grad is None for p in policy.parameters() if not p.requires_grad)
        grads.append({name: p.grad for name, p in policy.named_parameters() if p.requires_grad})
    assert all(grad is not None and grad.abs().sum() > 0 for grad in grads[1].values())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


# ------------------------------------------------------------------------------------------- merged weights
def test_engines_and_exports_get_the_merged_weights_under_the_base_names():
    policy = lora_policy()
    base = base_model()
    streamed = dict(stream_full_tensors(policy))
    assert streamed.keys() == base.state_dict().keys()
    assert all(torch.equal(streamed[name], value) for name, value in base.state_dict().items())  # at B = 0: W
    perturb_adapters(policy)
    streamed = dict(stream_full_tensors(policy))
    layer = policy.model.layers[1].mlp.down_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = base.model.layers[1].mlp.down_proj.weight + (LORA["alpha"] / LORA["r"]) * (b @ a)
    torch.testing.assert_close(streamed["model.layers.1.mlp.down_proj.weight"], expected, atol=1e-6, rtol=0)
    assert all(not p.requires_grad or p.grad is None for p in policy.parameters())  # the policy is left as it was
    base.load_state_dict(streamed)
    merged = probe_logits(base)
    torch.testing.assert_close(merged, probe_logits(policy), atol=1e-4, rtol=1e-5)
    assert (merged - probe_logits(base_model())).abs().max() > 0.1  # and not the base model's


def test_fsdp2_sharded_policy_streams_and_exports_the_same_merged_weights(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from erpo_lightning.modules.sharding import shard_causal_lm

    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        plain, sharded = lora_policy(), lora_policy()
        perturb_adapters(plain)
        perturb_adapters(sharded)
        expected = base_model_state_dict(plain)
        shard_causal_lm(sharded, init_device_mesh("cpu", (1,)))
        streamed = dict(stream_full_tensors(sharded))
        assert streamed.keys() == expected.keys()
        assert all(torch.equal(streamed[name], value) for name, value in expected.items())
        export_policy(sharded, str(SHIPPED_DIR), tmp_path / "hf", is_global_zero=True)  # HFExportCallback's writer
    finally:
        if owns_group:
            dist.destroy_process_group()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert all(torch.equal(exported[name], value) for name, value in expected.items())


# ------------------------------------------------------------------------- erpo fit, 3 steps, HF and vLLM
@dataclass
class LoraRun:
    output: str  # the fit's stdout + stderr
    metrics: list[dict[str, str]]  # metrics.csv rows
    checkpoint: Path
    root: Path


def lora_fit(root: Path, engine: dict | None = None) -> LoraRun:
    """`erpo cache` of full fine-tuning's config, then a 3-step `erpo fit` of the same config with `model.peft`, in
    the same cache folder: 4 rollouts of 2 queries per step, rewarded by character parity (a signal whatever the toy
    model writes), engine logprobs checked every step, HFExportCallback at the end."""
    train = [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 16}]
    rollout = {"reward": "helpers.resume_runs.character_parity_reward", "group_size": 4, "logprob_check_every": 1}
    export = {"class_path": "erpo_lightning.callbacks.HFExportCallback", "init_args": {"output_dir": str(root / "hf")}}
    full = fit_config(
        SHIPPED_DIR, train, root, data={"max_prompt_length": 64}, model={"learning_rate": 1e-2},
        rollout={**rollout, **({"engine": engine} if engine else {})},
        trainer={"max_steps": 3, "logger": csv_logger(root / "logs"), "log_every_n_steps": 1, "callbacks": [export]},
    )  # fmt: skip
    env = {"PYTHONPATH": str(TESTS_DIR)}
    cached = run_erpo("cache", "--config", str(write_config(root / "full.yaml", full)), cwd=root, env=env)
    assert cached.returncode == 0, cached.stderr[-3000:]
    config = write_config(root / "lora.yaml", {**full, "model": {**full["model"], "peft": LORA}})
    done = run_erpo("fit", "--config", str(config), cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = list(csv.DictReader(next(root.rglob("metrics.csv")).open()))
    return LoraRun(done.stdout + done.stderr, metrics, next(root.rglob("*.ckpt")), root)


def logged(run: LoraRun, name: str) -> list[float]:
    return [float(row[name]) for row in run.metrics if row.get(name)]


def check_only_the_adapters_trained(run: LoraRun) -> dict[str, torch.Tensor]:
    """The done-when: 3 steps, under 10% of the parameters train, the adapters moved, the base did not, and the
    first step's Query-KL is exactly 0. Returns the checkpoint's policy weights."""
    assert len(logged(run, "train/query_kl")) == 3
    assert logged(run, "train/query_kl")[0] == 0.0  # the base model's cache, the base model's scores: exactly
    shown = re.search(r"LoRA r=4 alpha=8 on all-linear: ([\d,]+) of ([\d,]+) parameters train", run.output)
    assert shown, run.output[-2000:]
    trainable, total = (int(group.replace(",", "")) for group in shown.groups())
    weights = torch.load(run.checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    adapters = {name: value for name, value in weights.items() if is_adapter(name)}
    assert trainable == sum(value.numel() for value in adapters.values())
    assert total == sum(value.numel() for name, value in weights.items() if name != "policy.lm_head.weight")  # tied
    assert trainable / total < 0.10
    assert any(value.abs().max() > 0 for name, value in adapters.items() if ".lora_B." in name)  # B left 0
    base = base_model().state_dict()
    frozen = {base_name(name): value for name, value in weights.items() if not is_adapter(name)}
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[name], value) for name, value in base.items())
    return weights


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> LoraRun:
    return lora_fit(tmp_path_factory.mktemp("lora_hf"))


@pytest.mark.slow  # end-to-end: the module's 3-step LoRA fit
def test_a_3_step_run_with_the_hf_engine_trains_only_the_adapters(hf_run):
    check_only_the_adapters_trained(hf_run)


@pytest.mark.slow  # reads the module's 3-step LoRA fit
def test_the_full_fine_tuning_reference_cache_is_reused(hf_run):
    assert "loaded reference scores" in hf_run.output
    assert "computing reference scores" not in hf_run.output


@pytest.mark.slow  # reads the module's 3-step LoRA fit
def test_the_checkpoint_holds_the_adapters_optimizer_state_only(hf_run):
    checkpoint = torch.load(hf_run.checkpoint, map_location="cpu", weights_only=True)
    adapters = [value for name, value in checkpoint["state_dict"].items() if is_adapter(name)]
    (optimizer,) = checkpoint["optimizer_states"]
    assert len(optimizer["param_groups"][0]["params"]) == len(adapters) == 56
    state = optimizer["state"].values()
    assert sorted(tuple(s["exp_avg"].shape) for s in state) == sorted(tuple(a.shape) for a in adapters)
    assert all(s["exp_avg_sq"].abs().max() > 0 for s in state)  # every adapter was stepped


@pytest.mark.slow  # the module's 3-step LoRA fit, then `erpo export`
def test_export_writes_the_merged_model_and_the_adapter(hf_run, tmp_path):
    from peft import PeftModel

    policy = lora_policy()
    load_policy_weights(policy, str(hf_run.checkpoint))
    expected = probe_logits(policy)
    out, adapter = tmp_path / "merged", tmp_path / "adapter"
    done = run_erpo("export", "--ckpt_path", str(hf_run.checkpoint), "--out", str(out), "--adapter_out", str(adapter),
                    cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(out)  # a plain model: no peft needed
    assert not any("lora" in name or "base_layer" in name for name in merged.state_dict())
    torch.testing.assert_close(probe_logits(merged), expected, atol=1e-4, rtol=1e-5)  # merging rounds
    assert (expected - probe_logits(base_model())).abs().max() > 1e-3  # the trained policy, not the base model
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    reloaded = PeftModel.from_pretrained(base_model(), adapter)
    torch.testing.assert_close(probe_logits(reloaded), expected, atol=1e-5, rtol=1e-5)
    # HFExportCallback wrote the same merged model from the policy in memory at the end of training.
    callback = AutoModelForCausalLM.from_pretrained(hf_run.root / "hf").state_dict()
    assert all(torch.equal(callback[name], value) for name, value in merged.state_dict().items())


def test_adapter_out_of_a_full_fine_tuning_checkpoint_is_refused(tmp_path):
    from erpo_lightning.common.errors import SettingsError
    from erpo_lightning.export.hf_model import export_checkpoint

    checkpoint = {"hyper_parameters": {"model_path": str(SHIPPED_DIR)}, "state_dict": {}}
    torch.save(checkpoint, tmp_path / "full.ckpt")
    with pytest.raises(SettingsError, match="--adapter_out: .* is not from a LoRA run"):
        export_checkpoint(tmp_path / "full.ckpt", tmp_path / "out", adapter_out=tmp_path / "adapter")


@pytest.mark.vllm
@pytest.mark.slow
def test_a_3_step_run_with_the_vllm_engine_samples_from_the_merged_adapters(tmp_path):
    run = lora_fit(tmp_path, VLLM_ENGINE)
    weights = check_only_the_adapters_trained(run)
    # vLLM loaded W + scale·B·A after each step: its log-probs are the LoRA policy's, which moved from the base.
    assert all(diff < 1e-4 for diff in logged(run, "rollout/logprob_abs_diff"))
    assert len(logged(run, "rollout/logprob_abs_diff")) == 3
    policy = lora_policy()
    policy.load_state_dict({name.removeprefix("policy."): value for name, value in weights.items()})
    assert (probe_logits(policy) - probe_logits(base_model())).abs().max() > 1e-2


# ------------------------------------------------------------------------------------ resume, DDP / FSDP2, TRL
@pytest.mark.slow  # end-to-end: a fit, a stop and a resume
def test_resume_continues_identically_with_adapters(tiny_model_path, benchmarks_dir, tmp_path):
    lora = {"peft": LoraSettings(**LORA)}
    weights = resumed_equals_full_run(tiny_model_path, benchmarks_dir / "gsm8k.jsonl", tmp_path, module_kwargs=lora)
    assert any(value.abs().max() > 0 for name, value in weights.items() if ".lora_B." in name)  # they trained


@pytest.mark.distributed
def test_ddp_and_fsdp2_train_the_adapters_as_one_process(scaleout_runs):
    single = scaleout_runs("single")["lora"]
    assert single["activation_checkpointing"]
    initial = AutoModelForCausalLM.from_pretrained(scaleout_runs.model_dir).state_dict()
    weights = single["weights"]
    assert all(torch.equal(weights[n], initial[base_name(n)]) for n in weights if not is_adapter(n))
    assert any(weights[n].abs().max() > 1e-3 for n in weights if ".lora_B." in n)
    assert all(record["train/query_kl"] > 1e-3 for record in single["records"])
    for strategy in ("ddp", "fsdp"):
        distributed = scaleout_runs(strategy)["lora"]
        assert distributed["sharded"] == (strategy == "fsdp")
        assert_same_run(single, distributed)


@pytest.mark.slow
@requires_trl
def test_trl_erpo_trainer_with_peft_config_is_exact_at_theta0(tmp_path):
    """TRL wraps the model in a PeftModel: θ0 is still the base model (the θ0 scores' fingerprint hashes the base
    weights, not the adapters), Query-KL is exactly 0 at the first step, and only the adapters move."""
    from peft import LoraConfig

    from erpo_lightning.integrations.reference_scores import parameters_hash

    model_path = save_tiny_model(tmp_path / "model", seed=0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    trainer = make_trainer(model_path, tmp_path / "run", max_steps=3, learning_rate=1e-2,
                           inputs={"peft_config": config})  # fmt: skip
    assert parameters_hash(trainer.model) == parameters_hash(AutoModelForCausalLM.from_pretrained(model_path))
    frozen = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train()
    query_kl = [entry["query_kl/token_k3"] for entry in trainer.state.log_history if "query_kl/token_k3" in entry]
    assert len(query_kl) == 3 and query_kl[0] == 0.0 and query_kl[-1] > 0  # fixed rollouts and rewards
    assert all(torch.equal(p, frozen[name]) for name, p in trainer.model.named_parameters() if name in frozen)
    assert any(p.abs().max() > 0 for name, p in trainer.model.named_parameters() if ".lora_B." in name)
