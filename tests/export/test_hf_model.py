"""`erpo export`: a training checkpoint (a file or an FSDP2 sharded folder) as a Hugging Face folder holding the
trained weights, which transformers and vLLM load; and it says which step it ships (issue 54 item 10)."""

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from helpers.fit_configs import run_erpo
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.callbacks.export import export_policy
from erpo_lightning.checkpoints.files import add_tensor_digest
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.export.hf_model import checkpoint_model_settings, export_checkpoint
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.toy import SHIPPED_DIR

PROBE = "Compute 7 + 8 - 5.\n"


@pytest.fixture(scope="module")
def trained_checkpoint(healthy_toy_run, tmp_path_factory) -> Path:
    """A copy of the healthy toy run's checkpoint (12 sampled steps of the shipped toy model), its policy weights then
    moved by a fixed amount: the export must carry the checkpoint's weights, whatever those steps did to them."""
    path = Path(shutil.copy(healthy_toy_run.checkpoint, tmp_path_factory.mktemp("export_run") / "trained.ckpt"))
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for name, value in checkpoint["state_dict"].items():
        if name.startswith("policy.") and value.is_floating_point():
            value.add_(0.05 * torch.randn(value.shape, generator=generator, dtype=value.dtype))
    add_tensor_digest(checkpoint)  # the weights were changed on purpose: their digest with them
    torch.save(checkpoint, path)
    return path


def checkpoint_policy(ckpt_path: Path) -> torch.nn.Module:
    """The trained policy as the run holds it: the initial model with the checkpoint's `policy.*` weights."""
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)
    state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")})
    return model.eval()


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    ids = AutoTokenizer.from_pretrained(SHIPPED_DIR)(PROBE, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def sharded_copy(ckpt_path: Path, folder: Path) -> Path:
    """`ckpt_path` rewritten as ModelParallelStrategy writes it: the state dict as a torch.distributed.checkpoint
    folder, everything else in its `meta.pt`."""
    from torch.distributed.checkpoint import save

    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        save({"state_dict": checkpoint.pop("state_dict")}, checkpoint_id=str(folder), no_dist=True)
    torch.save(checkpoint, folder / "meta.pt")
    return folder


def test_cli_export_loads_in_transformers_with_the_trained_weights(trained_checkpoint, tmp_path):
    out = tmp_path / "hf"
    result = run_erpo("export", "--ckpt_path", str(trained_checkpoint), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    umask = os.umask(0o022)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {p.name: 0o666 & ~umask for p in out.iterdir()}
    exported = probe_logits(AutoModelForCausalLM.from_pretrained(out).eval())
    assert torch.equal(exported, probe_logits(checkpoint_policy(trained_checkpoint)))
    base = probe_logits(AutoModelForCausalLM.from_pretrained(SHIPPED_DIR).eval())
    assert not torch.allclose(exported, base)  # not the initial model's weights
    assert (
        AutoTokenizer.from_pretrained(out)(PROBE).input_ids
        == AutoTokenizer.from_pretrained(SHIPPED_DIR)(PROBE).input_ids
    )


def test_the_training_end_export_writes_files_as_readable_as_any_other(tiny_model, tiny_model_path, tmp_path):
    """HFExportCallback's export (`export_policy`): transformers writes model.safetensors 0600; the folder is shared
    like every file the run writes (0644 under the usual umask)."""
    out = export_policy(tiny_model, str(tiny_model_path), tmp_path / "hf_model", is_global_zero=True)
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert "model.safetensors" in modes
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)


def test_sharded_checkpoint_folder_exports_the_same_model(trained_checkpoint, tmp_path):
    folder = sharded_copy(trained_checkpoint, tmp_path / "sharded.ckpt")
    out = export_checkpoint(folder, tmp_path / "hf")
    exported = probe_logits(AutoModelForCausalLM.from_pretrained(out).eval())
    assert torch.equal(exported, probe_logits(checkpoint_policy(trained_checkpoint)))


def test_moved_initial_model_is_named_and_model_path_overrides(trained_checkpoint, tmp_path):
    checkpoint = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["model_path"] = str(tmp_path / "gone")
    moved = tmp_path / "moved.ckpt"
    torch.save(checkpoint, moved)
    with pytest.raises(SettingsError, match="cannot be loaded from here.*pass --model_path"):
        export_checkpoint(moved, tmp_path / "hf")
    out = export_checkpoint(moved, tmp_path / "hf", model_path=str(SHIPPED_DIR))
    assert torch.equal(probe_logits(AutoModelForCausalLM.from_pretrained(out)), probe_logits(checkpoint_policy(moved)))


def test_missing_checkpoint_is_one_line_error(tmp_path):
    result = run_erpo("export", "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "hf"), cwd=tmp_path)
    assert result.returncode == 2
    assert "erpo: error: --ckpt_path: no checkpoint at" in result.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_generates_from_the_export_with_its_weights(trained_checkpoint, tmp_path):
    """vLLM loads the exported folder and samples from the trained weights: its log-probs of the sampled tokens
    are the exported model's (recomputed by transformers) within float32 noise."""
    from erpo_lightning.rollout.vllm_engine import import_vllm

    out = export_checkpoint(trained_checkpoint, tmp_path / "hf")
    vllm = import_vllm()
    llm = vllm.LLM(
        model=str(out), dtype="float32", max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=64 * 2**20
    )
    prompt = AutoTokenizer.from_pretrained(out)(PROBE).input_ids
    params = vllm.SamplingParams(max_tokens=8, temperature=1.0, seed=0, logprobs=0, ignore_eos=True)
    (request,) = llm.generate([vllm.TokensPrompt(prompt_token_ids=prompt)], params)
    sample = request.outputs[0]
    assert len(sample.token_ids) == 8
    sampled = torch.tensor([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids, strict=True)])
    ids = torch.tensor([prompt + list(sample.token_ids)])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        recomputed = sequence_logprobs(model, ids, torch.ones_like(ids), 1.0)[0, len(prompt) :]
    assert torch.allclose(recomputed, sampled, atol=1e-3)


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
