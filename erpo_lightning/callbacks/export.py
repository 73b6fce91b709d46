"""Export the trained policy as a Hugging Face model directory (`save_pretrained` + tokenizer + the model card
README.md that `erpo export` writes, `model_card`); a LoRA policy merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoTokenizer

from erpo_lightning.export.model_card import CARD_NAME, model_card
from erpo_lightning.weights.gguf import share_like_other_files
from erpo_lightning.weights.merged import base_model_items, lora_layers


def export_policy(
    policy: torch.nn.Module, tokenizer_path: str, output_dir: str | Path, is_global_zero: bool, card: str | None = None
) -> Path:
    """Write `policy` (plain or FSDP2-sharded) and its tokenizer to `output_dir`, loadable by transformers and vLLM,
    and `card` (the model card's text, None: none) as its README.md.

    Every rank must call this: gathering a sharded state dict is a collective; only rank 0 writes. A LoRA policy is
    written merged, under the base model's names (`weights.merged.base_model_items`): a plain model, loadable without
    peft. Its files get the permissions of any file the run writes (0644 under the usual umask), not the 0600
    `save_pretrained` gives the weights.
    """
    output_dir = Path(output_dir)
    state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    state = dict(base_model_items(state, lora_layers(policy)))
    if is_global_zero:
        policy.save_pretrained(output_dir, state_dict=state)
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(output_dir)
        if card is not None:
            (output_dir / CARD_NAME).write_text(card, encoding="utf-8")
        share_like_other_files(output_dir)
    return output_dir


def run_state(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """What a checkpoint of the run saved now would hold for its model card (`model_card.model_card`): the module's
    hyper-parameters, the run config the CLI records (`RunConfigRecorder`, when there is one), the global step and
    the sweep history of each TemperatureSweepCallback."""
    from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback
    from erpo_lightning.checkpoints.resume_config import CONFIG_KEY, RunConfigRecorder

    recorders = [callback for callback in trainer.callbacks if isinstance(callback, RunConfigRecorder)]
    sweeps = [callback for callback in trainer.callbacks if isinstance(callback, TemperatureSweepCallback)]
    state: dict[str, Any] = {
        "hyper_parameters": dict(pl_module.hparams),
        "global_step": trainer.global_step,
        "callbacks": {callback.state_key: callback.state_dict() for callback in sweeps},
    }
    if recorders:
        state[CONFIG_KEY] = recorders[0].config
    return state


class HFExportCallback(pl.Callback):
    """Saves the policy with `save_pretrained` at the end of training, and every `every_n_steps` if > 0, with the
    model card `erpo export` writes (README.md: the same sections; its checkpoint line says the folder was written
    from the policy in memory, and its sweep comes from the sweep history the run keeps, not from a metrics file).

    Args:
        output_dir: where to write; None = `<trainer.log_dir or default_root_dir>/hf_model`. Periodic exports go
            to `<output_dir>/step_<global_step>`, the final one to `output_dir` itself.
        every_n_steps: also export every this many optimizer steps (0 = only at the end).
    """

    def __init__(self, output_dir: str | None = None, every_n_steps: int = 0) -> None:
        if every_n_steps < 0:
            raise ValueError(f"HFExportCallback every_n_steps must be >= 0 (0 = only at the end), got {every_n_steps}")
        self.output_dir = output_dir
        self.every_n_steps = every_n_steps
        self._last_exported_step = -1
        self.final_directory: Path | None = None  # the end-of-training export, once written (RunFilesReport reads it)

    def _directory(self, trainer: pl.Trainer) -> Path:
        if self.output_dir is not None:
            return Path(self.output_dir)
        return Path(trainer.log_dir or trainer.default_root_dir) / "hf_model"

    def _export(self, trainer: pl.Trainer, pl_module: pl.LightningModule, directory: Path) -> None:
        from erpo_lightning.export.hf_model import initial_model_reference

        card = None
        if trainer.is_global_zero:
            base = initial_model_reference(str(pl_module.hparams.model_path))
            card = model_card(run_state(trainer, pl_module), None, base, writer="`HFExportCallback` (during training)")
        path = export_policy(pl_module.policy, pl_module.hparams.model_path, directory, trainer.is_global_zero, card)
        self._last_exported_step = trainer.global_step
        if trainer.is_global_zero:
            print(f"[erpo] exported the policy at step {trainer.global_step} to {path}", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Several optimizer steps may pass per batch (manual optimization): export when a multiple was crossed.
        step = trainer.global_step
        if (
            self.every_n_steps > 0
            and step // self.every_n_steps > max(self._last_exported_step, 0) // self.every_n_steps
        ):
            self._export(trainer, pl_module, self._directory(trainer) / f"step_{step}")

    def on_train_end(self, trainer, pl_module) -> None:
        directory = self._directory(trainer)
        self._export(trainer, pl_module, directory)
        self.final_directory = directory
