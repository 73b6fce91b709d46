"""A checkpoint's policy weights read into a model: `erpo validate`, `erpo export` and the tests all load them here.

A checkpoint is a file (one device, DDP: its `policy.*` entries, digest checked, an adapters-only file completed with
the base model's frozen weights) or an FSDP2 sharded folder (`ModelParallelStrategy`'s `torch.distributed.checkpoint`
directory, read in one process without a process group). A policy built with other LoRA settings than the
checkpoint's run is refused in one line naming `model.peft` (`lora_mismatch`, `check_weight_names`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import yaml

from erpo_lightning.checkpoints.adapters_only import check_adapters_base, fill_frozen_weights, trainable_state_names
from erpo_lightning.checkpoints.files import check_tensor_digest, read_checkpoint
from erpo_lightning.common.errors import SettingsError

# Where the policy lives inside the LightningModule's state dict (`ERPOModule.policy`).
POLICY_PREFIX = "policy."


def load_policy_weights(policy: torch.nn.Module, ckpt_path: str) -> None:
    """Load the `policy.*` weights of a Lightning checkpoint into `policy` (strict: every weight must match).

    `ckpt_path` is a checkpoint file (single device, DDP) or a sharded checkpoint directory (FSDP2), read in one
    process without a process group. A file of LoRA adapters alone (`model.peft.checkpoint: adapters`) loads into the
    adapters of `policy`, whose base must be the one they were trained on: its weight files, at `policy.name_or_path`,
    hash as the checkpoint records (`adapters_only.check_adapters_base`). A file's tensors must hash as its digest
    records (`files.check_tensor_digest`: CheckpointDigestError naming the file and the tensor; a file without a
    digest loads with a warning line).
    """
    path = Path(ckpt_path)
    if is_sharded_checkpoint(path):
        load_sharded_policy(policy, path)
        return
    if not path.is_file():
        raise FileNotFoundError(
            f"{ckpt_path}: neither a checkpoint file nor a sharded checkpoint directory (one with a .metadata file)"
        )
    checkpoint = read_checkpoint(path)  # memory-mapped; an unreadable file is named
    check_tensor_digest(checkpoint, path)  # a changed byte in a weight is refused, naming the tensor
    state = checkpoint.get("state_dict", {})
    weights = {key.removeprefix(POLICY_PREFIX): value for key, value in state.items() if key.startswith(POLICY_PREFIX)}
    if not weights:
        raise ValueError(f"{ckpt_path}: its state_dict has no `policy.*` weights (not an ERPOModule checkpoint?)")
    if check_adapters_base(checkpoint, str(getattr(policy, "name_or_path", "")), ckpt_path):
        fill_frozen_weights(weights, policy.state_dict(), trainable_state_names(policy))
    check_weight_names(checkpoint, weights, policy.state_dict().keys(), ckpt_path)
    policy.load_state_dict(weights)


LORA_WEIGHT = (".lora_A.", ".lora_B.")  # in the names of a LoRA policy's adapter weights
LORA_SHAPING_FIELDS = ("r", "alpha", "target_modules")  # what a checkpoint's adapters were trained with and need


def peft_flag(peft: dict[str, Any]) -> str:
    """The LoRA settings of a checkpoint's run as a command-line value, `{r: 4, alpha: 8.0, ...}` (adapter_path
    null: the checkpoint's weights replace whatever the adapters start at)."""
    return yaml.safe_dump({**peft, "adapter_path": None}, default_flow_style=True, width=10**6).strip()


def lora_mismatch(checkpoint: dict[str, Any], peft: dict[str, Any] | None, ckpt_path: str | Path) -> str | None:
    """Why a policy built with the LoRA settings `peft` (None: none) cannot take the weights of `checkpoint`, whose
    run's settings its hyper-parameters hold, in one line naming `model.peft`; None when they agree (or the
    checkpoint does not say)."""
    settings = checkpoint.get("hyper_parameters") or {}
    if "peft" not in settings:
        return None
    trained = settings["peft"]
    if trained is not None and peft is None:
        return (
            f"model.peft: {ckpt_path} is a LoRA run's checkpoint (its model.peft: {peft_flag(trained)}), but this "
            "config has no model.peft, so the policy has no adapters to load it into; validate with the run's config, "
            f"or add --model.peft '{peft_flag(trained)}'"
        )
    if trained is None and peft is not None:
        return (
            f"model.peft: {ckpt_path} is a full fine-tuning checkpoint (its run's model.peft is null), but this config "
            "sets model.peft, so the policy has adapters the checkpoint does not hold; drop it (--model.peft null)"
        )
    if trained is not None:
        for name in LORA_SHAPING_FIELDS:
            ours, theirs = peft.get(name), trained.get(name)
            if (list(ours) if isinstance(ours, tuple) else ours) != (
                list(theirs) if isinstance(theirs, tuple) else theirs
            ):
                return (
                    f"model.peft.{name}: {ckpt_path} was trained with {name} {theirs!r}, but this config has {ours!r}; "
                    f"set --model.peft.{name} to the run's value (its model.peft: {peft_flag(trained)})"
                )
    return None


def check_weight_names(
    checkpoint: dict[str, Any], weights: dict[str, Any], names: Iterable[str], ckpt_path: str | Path
) -> None:
    """SettingsError, in one line, when the checkpoint's `policy.*` `weights` and the policy's state-dict `names` differ
    (torch's own error lists every layer): naming `model.peft` and the run's LoRA settings when adapters are on one
    side only, else the counts and the first name missing on each side."""
    names = set(names)
    missing, unexpected = sorted(names - weights.keys()), sorted(weights.keys() - names)
    if not missing and not unexpected:
        return
    has_adapters = any(marker in name for name in names for marker in LORA_WEIGHT)
    holds_adapters = any(marker in name for name in weights for marker in LORA_WEIGHT)
    if has_adapters != holds_adapters:
        settings = checkpoint.get("hyper_parameters") or {}
        trained = settings.get("peft") if holds_adapters else None
        said = lora_mismatch({"hyper_parameters": {"peft": trained}}, {} if has_adapters else None, ckpt_path)
        if said is None:  # the checkpoint holds adapters and does not say with which settings
            said = f"model.peft: {ckpt_path} holds LoRA adapter weights, but this config has no model.peft"
        raise SettingsError(said)
    parts = [f"{len(missing)} of the policy's weights are not in it (first: {missing[0]})"] if missing else []
    parts += [f"{len(unexpected)} of its weights are not the policy's (first: {unexpected[0]})"] if unexpected else []
    raise SettingsError(
        f"{ckpt_path}: its policy weights do not fit the model built from model.model_path: {'; '.join(parts)}; "
        "validate with the config of the run that wrote it"
    )


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a `torch.distributed.checkpoint` directory (what ModelParallelStrategy saves)."""
    return (Path(path) / ".metadata").is_file()


def load_sharded_policy(policy: torch.nn.Module, checkpoint_dir: str | Path) -> None:
    """Read the policy weights of a sharded Lightning checkpoint into `policy`, in place.

    Runs in one process without a process group; `policy` is an unsharded model of the run's architecture. Every
    policy weight must be in the checkpoint (a missing one raises); its other entries (optimizer state) are not read.
    """
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.api import CheckpointException

    state = {POLICY_PREFIX + name: tensor for name, tensor in policy.state_dict().items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            load({"state_dict": state}, checkpoint_id=str(checkpoint_dir), no_dist=True)
        except CheckpointException as error:  # its message is a per-rank traceback dump; keep the cause
            failure = next(iter(error.failures.values()), error)
            cause = failure[0] if isinstance(failure, tuple) else failure
            raise ValueError(
                f"{checkpoint_dir}: cannot load it into this {type(policy).__name__}: {cause} Is `model.model_path` "
                "the initial model of the run that wrote this checkpoint?"
            ) from error
