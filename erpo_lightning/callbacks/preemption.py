"""PreemptionCheckpoint: SIGTERM or SIGUSR1 during fit saves the last finished step and stops the run, non-zero.

A cluster announces preemption with SIGTERM (SLURM's `--signal`, Kubernetes, most schedulers) or SIGUSR1 (Lightning's
SLURM requeue signal). Lightning alone finishes the step and exits 0 without a checkpoint on one process, so a
requeue loop or a `fit && validate` pipeline takes the run as finished. Here the signal only sets a flag; the step in
progress ends normally, its checkpoint is written (atomically, by the trainer's CheckpointIO) as `last.ckpt` where
`--ckpt_path last` looks, its logged metrics are written to the loggers (Lightning writes them only after the hooks
that `Preempted` ends), and `Preempted` ends the run: `erpo` exits with 128 + the signal's number (143 for
SIGTERM). The callback also notes a Ctrl-C (KeyboardInterrupt), which the CLI turns into exit status 130.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """A run stopped on a signal after saving its last finished step; `erpo` prints it and exits `exit_status`."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class PreemptionCheckpoint(pl.Callback):
    """On SIGTERM / SIGUSR1 during training: finish the step, save it as `last.ckpt`, raise `Preempted`.

    The checkpoint goes to the first ModelCheckpoint's folder (where `--ckpt_path last` finds it), or to
    `<default_root_dir>/checkpoints` without one. Under several ranks every rank learns of a signal any rank got at
    the end of the same step (one boolean all-reduce per step), so all of them save and stop together.
    """

    def __init__(self) -> None:
        self.received: int | None = None  # the first signal's number
        self.interrupted = False  # a KeyboardInterrupt ended the fit
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Install the handlers (after Lightning's own, which they replace for the time of training). A SIGTERM that
        Lightning's handler noted since it was installed (checkpoint restore, sweeps at start) counts too."""
        self.received = signal.SIGTERM if trainer.received_sigterm else None
        self.interrupted = False
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._note)

    def _note(self, number: int, frame: Any) -> None:
        if self.received is None:
            self.received = number

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After a finished step: when a signal arrived (on any rank), save this step, log its metrics and raise
        `Preempted`."""
        got = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if not got:
            return
        number = self.received or signal.SIGTERM  # a rank that got none stops as if it had SIGTERM
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank: a collective under sharding
        log_finished_step(trainer)
        raise Preempted(
            f"preempted by {signal.Signals(number).name}: saved global step {trainer.global_step} to {path}; resume "
            f"with --ckpt_path last (or {path})",
            exit_status=128 + number,
        )

    def checkpoint_path(self, trainer: pl.Trainer) -> Path:
        """`last.ckpt` in the first ModelCheckpoint's folder, else in `<default_root_dir>/checkpoints`."""
        callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
        folder = callbacks[0].dirpath if callbacks else Path(trainer.default_root_dir) / "checkpoints"
        return Path(folder) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.interrupted = isinstance(exception, KeyboardInterrupt)
        self._restore()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def _restore(self) -> None:
        """Put back the handlers that were installed before training."""
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


def log_finished_step(trainer: pl.Trainer) -> None:
    """Write the finished step's logged metrics to every logger and flush them, as Lightning does after the
    `on_train_batch_end` hooks (which `Preempted` ends before it gets there).

    The row is written whatever `trainer.log_every_n_steps` says, as Lightning writes the step a run stops on, and at
    the step Lightning would give it: the resumed run's first row is the next step, so no row is written twice. Called
    after the checkpoint is saved, so the checkpoint is the one an unsignalled run would have written.
    """
    connector = trainer._logger_connector
    connector.on_batch_end()
    connector.log_metrics(connector.metrics["log"])  # every logger's `save()` follows its `log_metrics`
