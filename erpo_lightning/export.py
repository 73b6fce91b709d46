"""`erpo export`: a training checkpoint as a Hugging Face model folder that transformers and vLLM load.

    erpo export --ckpt_path runs/quickstart/checkpoints/last.ckpt --out runs/quickstart/hf_model
    erpo export --ckpt_path CKPT --out DIR --push_to_hub user/name      # also upload the folder to the Hub
    erpo export --ckpt_path CKPT --out DIR --adapter_out ADAPTER_DIR    # a LoRA run: also the adapter alone

The checkpoint is a single file (one device, DDP) or an FSDP2 sharded folder (ModelParallelStrategy), read in one
process without a GPU or a process group. What the policy was built from is read from the checkpoint itself (the
module's hyper-parameters: `model_path`, `dtype`, `trust_remote_code`); the architecture, tokenizer and generation
config come from that initial model, the weights from the checkpoint. `--model_path` points elsewhere when the
initial model has moved since training (the weights must still fit it).

A LoRA run's checkpoint (`model.peft`) is written merged (W + scale·B·A per adapted layer, `merged_weights`): a plain
model that transformers and vLLM load without peft. `--adapter_out` also writes the adapter alone in peft's format
(`adapter_config.json`, `adapter_model.safetensors`: `PeftModel.from_pretrained(base, ADAPTER_DIR)`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from erpo_lightning.checkpointing import read_checkpoint
from erpo_lightning.errors import SettingsError
from erpo_lightning.merged_weights import base_model_state_dict
from erpo_lightning.modules.lora import lora_config, lora_settings
from erpo_lightning.resume_config import CONFIG_KEY


def checkpoint_model_settings(ckpt_path: str | Path) -> dict[str, Any]:
    """`model_path`, `dtype`, `trust_remote_code` and `peft` (None: full fine-tuning) of the run that wrote
    `ckpt_path` (its module hyper-parameters, else the `model:` group of the run config the CLI stores in every
    checkpoint)."""
    if not Path(ckpt_path).exists():
        raise SettingsError(f"--ckpt_path: no checkpoint at {ckpt_path}")
    checkpoint = read_checkpoint(ckpt_path)
    settings = checkpoint.get("hyper_parameters") or (checkpoint.get(CONFIG_KEY) or {}).get("model") or {}
    if not settings.get("model_path"):
        raise SettingsError(
            f"--ckpt_path {ckpt_path}: the checkpoint names no model_path (not an ERPOModule checkpoint?); "
            "pass --model_path, the run's initial model"
        )
    return {
        "model_path": str(settings["model_path"]),
        "dtype": settings.get("dtype") or "float32",
        "trust_remote_code": bool(settings.get("trust_remote_code", False)),
        "peft": lora_settings(settings.get("peft")),
    }


def export_checkpoint(
    ckpt_path: str | Path, out: str | Path, model_path: str | None = None, adapter_out: str | Path | None = None
) -> Path:
    """Write the policy of `ckpt_path` to `out` as a Hugging Face folder (weights as safetensors, config.json,
    generation_config.json, tokenizer files) and return `out`.

    Args:
        ckpt_path: a Lightning checkpoint file or FSDP2 sharded checkpoint folder of an ERPOModule run.
        out: the folder to write (created; files of the same names are replaced).
        model_path: the run's initial model; None = the one the checkpoint names.
        adapter_out: a LoRA run only: also write the adapter alone there, in peft's `save_pretrained` format.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from erpo_lightning.evaluation.validate import load_policy_weights

    settings = checkpoint_model_settings(ckpt_path)
    source = model_path or settings["model_path"]
    if not (Path(source) / "config.json").is_file() and Path(source).exists():
        raise SettingsError(f"--model_path: no model at {source} (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, settings["dtype"]), trust_remote_code=settings["trust_remote_code"]
        )
    except OSError as error:
        raise SettingsError(
            f"the checkpoint's initial model {source} cannot be loaded from here ({error.__class__.__name__}); "
            "pass --model_path, the run's initial model as it is now"
        ) from None
    lora = settings["peft"]
    if adapter_out is not None and lora is None:
        raise SettingsError(f"--adapter_out: {ckpt_path} is not from a LoRA run (its model.peft is null)")
    adapters = None
    if lora is not None:  # the checkpoint's policy names: the base model with the run's adapters in place
        from peft import get_peft_model

        adapters = get_peft_model(model, lora_config(lora))  # wraps `model`, adding the adapters to it in place
    load_policy_weights(model, str(ckpt_path))
    if adapter_out is not None:
        adapters.save_pretrained(Path(adapter_out))
    out = Path(out)
    # Also writes generation_config.json, the initial model's (or transformers' default).
    model.save_pretrained(out, state_dict=base_model_state_dict(model))
    AutoTokenizer.from_pretrained(source, trust_remote_code=settings["trust_remote_code"]).save_pretrained(out)
    return out


def push_to_hub(folder: Path, repo_id: str) -> str:
    """Upload `folder` to the Hub model repository `repo_id` (made if missing; needs `huggingface-cli login` or
    HF_TOKEN); the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="erpo export")
    return str(url)


def main(args: list[str] | None = None) -> None:
    """`erpo export` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="erpo export", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint file or an FSDP2 sharded checkpoint folder")
    parser.add_argument("--out", required=True, help="the Hugging Face folder to write")
    parser.add_argument("--model_path", default=None, help="the run's initial model, if it moved since training")
    parser.add_argument("--push_to_hub", default=None, metavar="REPO_ID", help="also upload the folder to the Hub")
    parser.add_argument("--adapter_out", default=None, help="a LoRA run: also write the adapter alone (peft format)")
    parsed = parser.parse_args(args)
    folder = export_checkpoint(parsed.ckpt_path, parsed.out, parsed.model_path, parsed.adapter_out)
    print(f"[erpo] exported the policy of {parsed.ckpt_path} to {folder}", flush=True)
    if parsed.adapter_out:
        print(f"[erpo] wrote its LoRA adapter to {parsed.adapter_out}", flush=True)
    if parsed.push_to_hub:
        print(f"[erpo] uploaded {folder} to {push_to_hub(folder, parsed.push_to_hub)}", flush=True)
