"""Checkpoints that hold a LoRA run's adapters alone (`model.peft.checkpoint: adapters`; docs/lora.md).

Such a checkpoint drops every frozen weight from the Lightning state dict and records the base model the adapters
were trained on by the hash of its weight files (`data.fingerprint.weights_hash`, the reference cache's own).
Reading it (a resume, `erpo validate`, `erpo export`) checks the base the adapters are to sit on against that hash
and completes the state dict with that base's frozen weights, so a strict load still checks every adapter.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from erpo_lightning.common.errors import SettingsError
from erpo_lightning.data.fingerprint import resolve_model_dir, weights_hash

# The checkpoint entry of an adapters-only checkpoint: {"base_model_path": ..., "base_weights_hash": ...}.
ADAPTERS_ONLY_KEY = "erpo_lora_adapters_only"


def base_weights_hash(model_path: str) -> str:
    """sha256 over the names and contents of the weight files of `model_path` (a folder or a Hub id); each file is
    read once per version on this machine (`file_hashes.cached_file_sha256`)."""
    return weights_hash(resolve_model_dir(model_path))


def trainable_state_names(module: torch.nn.Module) -> set[str]:
    """The state-dict names of the parameters of `module` that train (a LoRA policy's adapters)."""
    return {name for name, parameter in module.named_parameters() if parameter.requires_grad}


def keep_adapters_only(checkpoint: dict[str, Any], adapter_names: Collection[str], model_path: str) -> None:
    """Drop from `checkpoint["state_dict"]` every entry but `adapter_names` (the frozen base, and a Policy-KL
    reference model's copy of it) and record the base model they were trained on (ADAPTERS_ONLY_KEY)."""
    state = checkpoint["state_dict"]
    checkpoint["state_dict"] = {name: value for name, value in state.items() if name in adapter_names}
    checkpoint[ADAPTERS_ONLY_KEY] = {"base_model_path": model_path, "base_weights_hash": base_weights_hash(model_path)}


def check_adapters_base(checkpoint: Mapping[str, Any], model_path: str, ckpt_path: str) -> bool:
    """Whether `checkpoint` holds the adapters alone; SettingsError naming `model.model_path` when it does and the
    weight files of `model_path` hash otherwise than those of the base it was trained on."""
    record = checkpoint.get(ADAPTERS_ONLY_KEY)
    if record is None:
        return False
    if not model_path:
        raise SettingsError(
            f"{ckpt_path} holds LoRA adapters only (model.peft.checkpoint: adapters), and the model to load them on "
            f"names no base model (its name_or_path is empty); load it from {record['base_model_path']}"
        )
    found = base_weights_hash(model_path)
    if found != record["base_weights_hash"]:
        raise SettingsError(
            f"model.model_path: {ckpt_path} holds LoRA adapters only (model.peft.checkpoint: adapters), trained on "
            f"the base model {record['base_model_path']} whose weight files hash to {record['base_weights_hash'][:16]}"
            f", but the weight files of {model_path} hash to {found[:16]}: the adapters would sit on other weights; "
            "load them on the base they were trained on"
        )
    return True


def fill_frozen_weights(
    state: dict[str, torch.Tensor], current: Mapping[str, torch.Tensor], adapter_names: Collection[str]
) -> None:
    """Complete an adapters-only `state` with the frozen entries of `current` (the model's own state dict: the base
    just loaded from `model_path`), so that a strict load still checks every adapter's name and shape and leaves the
    base as it was loaded."""
    for name, value in current.items():
        if name not in adapter_names:
            state.setdefault(name, value)
