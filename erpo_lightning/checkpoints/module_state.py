"""What an ERPOModule checkpoint holds beyond the weights, and what it refuses to hold.

`save_module_state` runs in `on_save_checkpoint`: it keeps only the LoRA adapters' weights when
`model.peft.checkpoint` is `adapters`, refuses (ValueError naming the weight) a checkpoint with a NaN or infinite
weight, records the sha256 of every tensor of the state dict (`checkpoints.files.DIGEST_KEY`; not for FSDP2's sharded
state dicts), and adds the `erpo` entry: the optimizer-step counters, the non-finite guard's counts and every RNG
state, so a resumed run continues where it stopped, and where the run logs (`logged_run`: its CSV logger's folder,
which the model card checks a metrics.csv against). `load_module_state` runs in `on_load_checkpoint`: it refuses a
checkpoint whose tensors no longer hash as recorded (`checkpoints.files.check_tensor_digest`, naming the file and the
tensor) before any weight is loaded, and undoes the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from erpo_lightning.checkpoints.files import add_tensor_digest, check_tensor_digest
from erpo_lightning.checkpoints.rng import rng_state, set_rng_state
from erpo_lightning.modules.lora_files import (
    check_adapters_base,
    fill_frozen_weights,
    keep_adapters_only,
    trainable_state_names,
)

LOGGED_RUN_KEY = "logged_run"  # in the checkpoint's `erpo` entry: `logged_run`

if TYPE_CHECKING:
    from erpo_lightning.modules.erpo_module import ERPOModule


def save_module_state(module: ERPOModule, checkpoint: dict) -> None:
    """Complete `checkpoint` (Lightning's dict, about to be written) for `module`; see the module docstring."""
    if module.lora is not None and module.lora.checkpoint == "adapters":
        keep_adapters_only(checkpoint, trainable_state_names(module), module.hparams.model_path)
    for name, tensor in checkpoint.get("state_dict", {}).items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard under FSDP2
        if torch.is_floating_point(local) and not torch.isfinite(local).all():
            raise ValueError(f"refusing to write a checkpoint whose weight {name} is not finite (NaN/inf)")
    add_tensor_digest(checkpoint)  # last: the state dict is final here
    checkpoint["erpo"] = {
        "policy_version": module.policy_version,
        "zero_signal_skips": module.zero_signal_skips,
        "skipped_steps": module.guard.skipped_steps,
        "consecutive_skips": module.guard.consecutive_skips,
        # Unseeded rollouts and any other sampling draw from these: a resumed run continues their streams.
        "rng": rng_state(),
    }
    if module._trainer is not None:
        checkpoint["erpo"][LOGGED_RUN_KEY] = logged_run(module.trainer)


def logged_run(trainer: Any) -> dict[str, Any]:
    """Where the run logs and saves, for the model card to tell its own metrics.csv from another run's
    (`model_card.metrics_beside`): the resolved version folder of each CSVLogger (`csv_log_dirs`, [] without one) and
    the checkpoint callback's folder (`checkpoint_dir`, None when unknown)."""
    from lightning.pytorch.loggers import CSVLogger

    folders = [str(Path(logger.log_dir).resolve()) for logger in trainer.loggers if isinstance(logger, CSVLogger)]
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return {"csv_log_dirs": folders, "checkpoint_dir": str(Path(dirpath).resolve()) if dirpath else None}


def load_module_state(module: ERPOModule, checkpoint: dict) -> None:
    """Check the tensors of `checkpoint` against their recorded digest (CheckpointDigestError naming the file and the
    first tensor that differs; a line of warning when there is none), then restore `module`'s counters and the RNG
    states from it (as loaded, before its weights are). An
    adapters-only checkpoint is checked against the base model just loaded from `model_path` (same weight files) and
    completed with its frozen weights, which the strict load then leaves as they are."""
    where = str(module.trainer.ckpt_path) if module._trainer is not None else "the checkpoint"
    if not (module._trainer is not None and module.trainer.ckpt_path and Path(module.trainer.ckpt_path).is_dir()):
        check_tensor_digest(checkpoint, where)  # a sharded folder's tensors are loaded apart from this dict
    if check_adapters_base(checkpoint, module.hparams.model_path, where):
        fill_frozen_weights(checkpoint["state_dict"], module.state_dict(), trainable_state_names(module))
    state = checkpoint.get("erpo", {})
    module.policy_version = state.get("policy_version", 0)
    module.zero_signal_skips = state.get("zero_signal_skips", 0)
    module.guard.skipped_steps = state.get("skipped_steps", 0)
    module.guard.consecutive_skips = state.get("consecutive_skips", 0)
    if "rng" in state:
        set_rng_state(state["rng"])
