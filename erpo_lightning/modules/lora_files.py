"""LoRA adapters on disk: a policy that starts from a peft adapter folder (`model.peft.adapter_path`), and the checks
of `model.peft` against the model and that folder before anything loads (`check_lora_targets_before_loading`).
docs/lora.md.

An adapter folder is peft's `save_pretrained` format, which `erpo export --adapter_out` writes: `adapter_config.json`
and `adapter_model.safetensors`, whose tensors are named `base_model.model.<layer>.lora_A.weight`; the policy's
adapters (peft's `inject_adapter_in_model`) are `<layer>.lora_A.default.weight`. An adapter trained on another base
than `model.model_path` is refused where the two can be compared (`base_weights_hash`, as adapters-only checkpoints
record their base: `checkpoints/adapters_only.py`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from erpo_lightning.checkpoints.adapters_only import base_weights_hash
from erpo_lightning.modules.lora import (
    LoraSettings,
    adapted_layer_names,
    check_lora_targets,
    lora_settings,
    model_skeleton,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # peft's name of the wrapped model, in front of every saved tensor name
ADAPTER_NAME = "default"  # the one adapter `add_lora_adapters` adds
# adapter_config.json fields of LoRA variants this project does not train, with plain LoRA's value.
_PLAIN_LORA = (
    ("use_dora", False),
    ("use_rslora", False),
    ("bias", "none"),
    ("modules_to_save", None),
    ("layers_to_transform", None),
    ("rank_pattern", {}),
    ("alpha_pattern", {}),
)


# --------------------------------------------------------------------------------------- starting from a folder
def read_adapter_config(folder: str) -> dict[str, Any]:
    """The `adapter_config.json` of the adapter folder `folder`; ValueError naming `model.peft.adapter_path` when
    the folder does not exist, lacks the config or the weights, or its config does not parse."""
    where = f"model.peft.adapter_path {folder}"
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ValueError(f"{where}: no such folder (a peft adapter folder, as `erpo export --adapter_out` writes)")
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(
                f"{where} holds no {name}: not a peft adapter folder (`erpo export --adapter_out` and peft's "
                f"save_pretrained write {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})"
            )
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: its {ADAPTER_CONFIG} does not parse ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: its {ADAPTER_CONFIG} is not a JSON object")
    return config


def check_adapter_weights_file(folder: str) -> None:
    """ValueError naming the file when the `adapter_model.safetensors` of the adapter folder `folder` cannot be read
    (a header that does not parse, a file cut short of the tensors its header lists). Reads the header only."""
    from safetensors import SafetensorError, safe_open

    path = Path(folder).expanduser() / ADAPTER_WEIGHTS
    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError) as error:
        raise ValueError(adapter_file_problem(path, error)) from None


def adapter_file_problem(path: Path, error: Exception) -> str:
    """The line for an adapter weight file that safetensors cannot read: the file, its size and safetensors' cause."""
    cause = " ".join(str(error).split()) or type(error).__name__
    size = f"{path.stat().st_size} bytes" if path.is_file() else "missing"
    return (
        f"model.peft.adapter_path: {path} cannot be read ({size}; {cause}): a damaged or cut-short file (an "
        "interrupted copy or save?); copy or export the adapter again (`erpo export --adapter_out`)"
    )


def adapter_base_problem(
    config: Mapping[str, Any], folder: str, model_path: str | None
) -> tuple[str | None, str | None]:
    """(refusal, warning) about the base model the adapter at `folder` was trained on: its `adapter_config.json`'s
    `base_model_name_or_path` against `model.model_path`. Nothing when either is unknown or they name the same file
    or folder (or Hub id). Both local folders: compared by the sha256 of their weight files (`base_weights_hash`,
    remembered per file version): equal is a copy (nothing), different is the refusal. Otherwise (a Hub id against a
    local folder, or a base not on this machine) the names alone differ: the warning."""
    recorded = config.get("base_model_name_or_path")
    if not recorded or not model_path or str(recorded) == str(model_path):
        return None, None
    ours, theirs = Path(str(model_path)).expanduser(), Path(str(recorded)).expanduser()
    if ours.exists() and theirs.exists():
        if ours.resolve() == theirs.resolve():
            return None, None
        if ours.is_dir() and theirs.is_dir():
            found, trained = base_weights_hash(str(ours)), base_weights_hash(str(theirs))
            if found == trained:
                return None, None
            return (
                f"model.peft.adapter_path {folder} was trained on {recorded} (base_model_name_or_path in its "
                f"{ADAPTER_CONFIG}), whose weight files hash to {trained[:16]}, but model.model_path {model_path} "
                f"hashes to {found[:16]}: the adapter would sit on another model's weights; set model.model_path to "
                f"{recorded}, or start from an adapter trained on {model_path}",
                None,
            )
    return None, (
        f"model.peft.adapter_path {folder} was trained on {recorded} (base_model_name_or_path in its "
        f"{ADAPTER_CONFIG}), and model.model_path is {model_path}; they cannot be compared here (not both local "
        f"folders): if {model_path} is not a copy of {recorded}, the adapter sits on another model's weights"
    )


def check_adapter_folder(
    lora: LoraSettings, skeleton: torch.nn.Module | None, source: str, model_path: str | None = None
) -> None:
    """ValueError naming the field when the adapter at `lora.adapter_path` is not one these settings describe: a
    LoRA variant (DoRA, rsLoRA, biases, extra trained modules, per-layer ranks), or its r / lora_alpha differ from
    `model.peft.r` / `alpha`, or (on the model's meta-device `skeleton`, when there is one) it adapts other layers
    than `model.peft.target_modules`; its weight file cannot be read (`check_adapter_weights_file`, naming the file);
    or it was trained on another base than `model_path` (`adapter_base_problem`, naming both; the warning it may give
    instead is printed when the weights load). `dropout` may differ: it shapes no weight. Reads the config and the
    weight file's header, no weights."""
    config = read_adapter_config(lora.adapter_path)
    where = f"model.peft.adapter_path {lora.adapter_path}"
    check_adapter_weights_file(lora.adapter_path)
    refusal, _ = adapter_base_problem(config, lora.adapter_path, model_path)
    if refusal is not None:
        raise ValueError(refusal)
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: a {config.get('peft_type')} adapter; only LoRA adapters can start a run")
    for key, plain in _PLAIN_LORA:
        value = config.get(key)
        if value and value != plain:
            raise ValueError(f"{where}: its {ADAPTER_CONFIG} sets {key} {value!r}; only plain LoRA can start a run")
    for ours, theirs in (("r", "r"), ("alpha", "lora_alpha")):
        if config.get(theirs) != getattr(lora, ours):
            raise ValueError(
                f"model.peft.{ours} is {getattr(lora, ours)!r}, but the adapter at model.peft.adapter_path "
                f"{lora.adapter_path} has {theirs} {config.get(theirs)!r}: set model.peft.{ours} {config.get(theirs)}"
            )
    if skeleton is None:
        return
    targets = config.get("target_modules")
    ours, theirs = adapted_layer_names(lora.target_modules, skeleton), adapted_layer_names(targets or [], skeleton)
    if ours != theirs:
        only = sorted(theirs - ours) or sorted(ours - theirs)
        side = "the folder's adapter has" if theirs - ours else "model.peft.target_modules adds"
        raise ValueError(
            f"model.peft.target_modules {lora.target_modules!r} adapts other layers of {source} than the adapter at "
            f"model.peft.adapter_path {lora.adapter_path} (target_modules {targets!r}): {side} {only[0]}"
            f"{f' and {len(only) - 1} more' if len(only) > 1 else ''}; set model.peft.target_modules to {targets!r}"
        )


def check_lora_targets_before_loading(
    settings: LoraSettings | Mapping[str, Any] | None, model_path: str | None, trust_remote_code: bool = False
) -> None:
    """`check_lora_targets` on the skeleton of `model_path` (`model_skeleton`), and the `adapter_path` folder against
    the settings (`check_adapter_folder`), before anything loads.

    Nothing is checked without settings. The targets are not checked without a path, for a `.gguf` file (checked
    once it is converted: the CLI hands the module the converted folder) or when the config cannot be read; the
    adapter folder's layers are then checked when its weights load.
    """
    if settings is None:
        return
    lora = lora_settings(settings)
    skeleton = None
    if model_path and not str(model_path).lower().endswith(".gguf"):
        skeleton = model_skeleton(str(model_path), trust_remote_code)
    if skeleton is not None:
        check_lora_targets(lora, skeleton, str(model_path))
    if lora.adapter_path is not None:
        check_adapter_folder(lora, skeleton, str(model_path or "the model"), model_path)


def load_adapter_weights(policy: torch.nn.Module, folder: str) -> None:
    """Copy the adapter of the peft folder `folder` into the adapters of `policy` (`add_lora_adapters` with the
    same settings): every trainable parameter gets the tensor of its name, cast to its dtype. ValueError naming
    `model.peft.adapter_path` when a name is on one side only or a shape differs, when the weight file cannot be read
    (naming it), or when the adapter was trained on another base than `policy.name_or_path` (`adapter_base_problem`;
    a warning line when the two can only be compared by name)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    where = f"model.peft.adapter_path {folder}"
    refusal, warning = adapter_base_problem(read_adapter_config(folder), folder, getattr(policy, "name_or_path", None))
    if refusal is not None:
        raise ValueError(refusal)
    if warning is not None:
        print(f"[erpo] warning: {warning}", file=sys.stderr, flush=True)
    path = Path(folder).expanduser() / ADAPTER_WEIGHTS
    try:
        saved = load_file(path)
    except (SafetensorError, OSError) as error:
        raise ValueError(adapter_file_problem(path, error)) from None
    weights = {_policy_name(name): tensor for name, tensor in saved.items()}
    adapters = {name: parameter for name, parameter in policy.named_parameters() if parameter.requires_grad}
    missing, extra = sorted(adapters.keys() - weights.keys()), sorted(weights.keys() - adapters.keys())
    if missing or extra:
        problem = f"has no tensor for {missing[0]}" if missing else f"has {extra[0]}, which the policy has not"
        raise ValueError(f"{where}: its {ADAPTER_WEIGHTS} {problem}; are r and target_modules the adapter's?")
    for name, parameter in adapters.items():
        if weights[name].shape != parameter.shape:
            raise ValueError(
                f"{where}: {name} is {tuple(weights[name].shape)} in {ADAPTER_WEIGHTS}, "
                f"{tuple(parameter.shape)} in the policy"
            )
    with torch.no_grad():
        for name, parameter in adapters.items():
            parameter.copy_(weights[name])


def _policy_name(saved_name: str) -> str:
    """`base_model.model.X.lora_A.weight` (peft's file) -> `X.lora_A.default.weight` (the policy's parameter)."""
    module, _, leaf = saved_name.removeprefix(PEFT_PREFIX).rpartition(".")
    return f"{module}.{ADAPTER_NAME}.{leaf}" if module.endswith((".lora_A", ".lora_B")) else saved_name
