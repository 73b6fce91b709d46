"""What an ERPOModule checkpoint holds beyond the weights, and what it refuses to hold.

`save_module_state` completes Lightning's checkpoint dict in `ERPOModule.on_save_checkpoint`: it keeps only the LoRA
adapters' weights when `model.peft.checkpoint` is `adapters` (`adapters_only.py`), refuses (ValueError naming the
weight) a checkpoint with a NaN or infinite weight, records the sha256 of every tensor of the state dict
(`files.DIGEST_KEY`; not for FSDP2's sharded state dicts), and adds the `erpo` entry: the module's counters, every RNG
state, so a resumed run continues where it stopped, and where the run logs (`logged_run`: its CSV logger's folder,
which the model card checks a metrics.csv against). `load_module_state` runs in `on_load_checkpoint`: it refuses a
checkpoint whose tensors no longer hash as recorded (`files.check_tensor_digest`, naming the file and the tensor)
before any weight is loaded, completes an adapters-only checkpoint, restores the RNG states and returns the counters.
The RNG states are plain data, which Lightning's `weights_only` checkpoint loading accepts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from erpo_lightning.checkpoints.adapters_only import check_adapters_base, fill_frozen_weights, keep_adapters_only
from erpo_lightning.checkpoints.files import add_tensor_digest, check_tensor_digest

LOGGED_RUN_KEY = "logged_run"  # in the checkpoint's `erpo` entry: `logged_run`
# The module's counters in the `erpo` entry, each 0 when a checkpoint lacks it.
COUNTERS = ("policy_version", "zero_signal_skips", "skipped_steps", "consecutive_skips")


def save_module_state(
    checkpoint: dict,
    counters: Mapping[str, int],
    model_path: str,
    adapters_only: Collection[str] | None = None,
    trainer: Any = None,
) -> None:
    """Complete `checkpoint` (Lightning's dict, about to be written); see the module docstring.

    Args:
        counters: the module's value of each name of COUNTERS.
        model_path: the run's initial model, the base an adapters-only checkpoint records.
        adapters_only: the state-dict names of the adapters when only they are kept; None keeps every weight.
        trainer: the Lightning trainer, for `logged_run`; None without one.
    """
    if adapters_only is not None:
        keep_adapters_only(checkpoint, adapters_only, model_path)
    for name, tensor in checkpoint.get("state_dict", {}).items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard under FSDP2
        if torch.is_floating_point(local) and not torch.isfinite(local).all():
            raise ValueError(f"refusing to write a checkpoint whose weight {name} is not finite (NaN/inf)")
    add_tensor_digest(checkpoint)  # last: the state dict is final here
    # Unseeded rollouts and any other sampling draw from the RNG states: a resumed run continues their streams.
    checkpoint["erpo"] = {**{name: counters[name] for name in COUNTERS}, "rng": rng_state()}
    if trainer is not None:
        checkpoint["erpo"][LOGGED_RUN_KEY] = logged_run(trainer)


def logged_run(trainer: Any) -> dict[str, Any]:
    """Where the run logs and saves, for the model card to tell its own metrics.csv from another run's
    (`model_card.metrics_beside`): the resolved version folder of each CSVLogger (`csv_log_dirs`, [] without one) and
    the checkpoint callback's folder (`checkpoint_dir`, None when unknown)."""
    from lightning.pytorch.loggers import CSVLogger

    folders = [str(Path(logger.log_dir).resolve()) for logger in trainer.loggers if isinstance(logger, CSVLogger)]
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return {"csv_log_dirs": folders, "checkpoint_dir": str(Path(dirpath).resolve()) if dirpath else None}


def load_module_state(
    checkpoint: dict,
    ckpt_path: str | None,
    model_path: str,
    module_state: Callable[[], Mapping[str, torch.Tensor]],
    trainable: Collection[str],
) -> dict[str, int]:
    """Check the tensors of `checkpoint` against their recorded digest (CheckpointDigestError naming the file and the
    first tensor that differs; a line of warning when there is none), restore the RNG states it holds (as loaded,
    before its weights are) and return its counters (COUNTERS, 0 for one it lacks). An adapters-only checkpoint is
    checked against the base model just loaded from `model_path` (same weight files) and completed with the frozen
    weights of `module_state()`, which the strict load then leaves as they are.

    Args:
        ckpt_path: the file or sharded folder it was read from (a folder's tensors are loaded apart from this dict);
            None when unknown.
        module_state: the module's `state_dict`, called for an adapters-only checkpoint only.
        trainable: the state-dict names of the parameters that train (a LoRA policy's adapters).
    """
    where = str(ckpt_path) if ckpt_path else "the checkpoint"
    if not (ckpt_path and Path(ckpt_path).is_dir()):
        check_tensor_digest(checkpoint, where)
    if check_adapters_base(checkpoint, model_path, where):
        fill_frozen_weights(checkpoint["state_dict"], module_state(), trainable)
    state = checkpoint.get("erpo", {})
    if "rng" in state:
        set_rng_state(state["rng"])
    return {name: state.get(name, 0) for name in COUNTERS}


def rng_state() -> dict:
    """torch, Python and NumPy generator states as plain data (what `weights_only` checkpoint loading accepts)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), position, has_gauss, cached],
    }


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
