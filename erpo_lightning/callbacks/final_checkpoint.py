"""FinalStepCheckpoint: the step a run ends on is in its checkpoints, whatever the checkpoint interval.

A ModelCheckpoint with `every_n_train_steps: n` saves at the multiples of n. When `max_steps` is not one, Lightning
keeps the last multiple as the run's newest checkpoint: 5 steps at n = 2 leave `last.ckpt` at step 4, and
`erpo export` would ship a policy one step short (Lightning saves `last` at the end of training only when it saved
nothing before). This callback saves the final step at the end of training instead, for every ModelCheckpoint that
has not saved it yet.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


class FinalStepCheckpoint(pl.Callback):
    """At the end of a finished fit, each ModelCheckpoint that has not saved the final step saves it:

    - one with `save_last` writes `last.ckpt` (a file, even under `save_last: link`, whose link would name an
      earlier step's file);
    - one without `save_last` that saves every n training steps writes the final step as an interval step would be
      written (its `filename` pattern and `save_top_k`).

    Nothing is saved when the fit stops on an exception (a signal's stop saves through PreemptionCheckpoint), under
    `fast_dev_run`, or when the final step was saved already (it was a multiple of the interval).
    """

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and not callback._should_skip_saving_checkpoint(trainer):
                save_final_step(callback, trainer)


def save_final_step(callback: ModelCheckpoint, trainer: pl.Trainer) -> None:
    """Save the trainer's current step with `callback`, as FinalStepCheckpoint says."""
    candidates = callback._monitor_candidates(trainer)
    if callback.save_last:
        callback._last_checkpoint_saved = ""  # `save_last: link` would link to an earlier step's file
        callback._save_last_checkpoint(trainer, candidates)
    elif callback._every_n_train_steps >= 1 and (callback.monitor is None or callback.monitor in candidates):
        callback._save_topk_checkpoint(trainer, candidates)
