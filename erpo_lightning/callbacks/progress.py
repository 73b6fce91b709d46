"""Progress a person can watch: the step's headline numbers on the terminal's bar, or as plain lines in a log file.

`erpo fit` picks one by where stderr goes (`ERPOLightningTrainer`): a terminal gets `ERPOProgressBar` (Lightning's
rich bar with the numbers below beside it); a file or a pipe, as under SLURM or nohup, gets `ProgressLines`, one plain
line every N steps, since a bar redrawn with carriage returns leaves nothing readable in a log. Long phases (the
rollout engine's start-up, a temperature sweep) print a start line with their size and an end line with their
duration through `phase`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.utilities import rank_zero_only

# (label, logged metric, format): what a progress line and the bar show, from `trainer.callback_metrics`.
HEADLINE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("accuracy", "rollout/accuracy", "{:.1%}"),
    ("query_kl", "train/query_kl", "{:.3g}"),
    ("response_len", "rollout/response_length_mean", "{:.1f}"),
    ("tokens/s", "rollout/tokens_per_s", "{:.0f}"),
)


def headline_values(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The HEADLINE_METRICS present in `metrics` (name -> tensor or float), formatted; missing ones left out."""
    values = {}
    for label, name, spec in HEADLINE_METRICS:
        if name in metrics:
            value = float(metrics[name])
            values[label] = spec.format(value) if math.isfinite(value) else str(value)
    return values


def format_duration(seconds: float) -> str:
    """`seconds` as `1h02m`, `4m05s` or `12s`."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def total_steps(trainer: pl.Trainer) -> int | None:
    """The run's last optimizer step: `max_steps` when set, else Lightning's estimate; None when unbounded."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if math.isfinite(estimate) else None


@rank_zero_only
def say(message: str) -> None:
    """One `[erpo]` line on stderr, where the progress goes, printed by the first rank only."""
    print(f"[erpo] {message}", file=sys.stderr, flush=True)


@contextmanager
def phase(name: str, size: str) -> Iterator[None]:
    """Print `<name>: started (<size>)` on entry and `<name>: done in <duration>` on a normal exit."""
    say(f"{name}: started ({size})")
    start = perf_counter()
    yield
    say(f"{name}: done in {format_duration(perf_counter() - start)}")


class ProgressLines(ProgressBar):
    """A plain progress line on stderr every `every_n_steps` optimizer steps, plus the first and the last step:

        [erpo] step 40/500 | reward 0.512 | accuracy 48.4% | query_kl 0.00123 | response_len 12.3 | tokens/s 345 |
        elapsed 1m10s | eta 13m25s

    (one line). The ETA is the mean time per step of this process so far times the steps left.

    Args:
        every_n_steps: None = the trainer's `log_every_n_steps`.
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        super().__init__()
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                f"ProgressLines every_n_steps must be >= 1 (or None for log_every_n_steps), got {every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self._enabled = True
        self._start: tuple[float, int] | None = None  # (time, global step) when this process started training
        self._last_printed = -1

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = (perf_counter(), trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        step, total = trainer.global_step, total_steps(trainer)
        every = self.every_n_steps or max(trainer.log_every_n_steps, 1)
        first = self._start is not None and step == self._start[1] + 1
        if self._enabled and step != self._last_printed and (first or step % every == 0 or step == total):
            self._last_printed = step
            say(self.line(trainer, step, total))

    def line(self, trainer: pl.Trainer, step: int, total: int | None) -> str:
        """The progress line of `step` (see the class docstring)."""
        parts = [f"step {step}/{total if total is not None else '?'}"]
        parts += [f"{label} {value}" for label, value in headline_values(trainer.callback_metrics).items()]
        if self._start is not None:
            elapsed = perf_counter() - self._start[0]
            parts.append(f"elapsed {format_duration(elapsed)}")
            done = step - self._start[1]
            if total is not None and done > 0:
                parts.append(f"eta {format_duration(elapsed / done * (total - step))}")
        return " | ".join(parts)


class ERPOProgressBar(RichProgressBar):
    """Lightning's rich progress bar with the headline numbers (`HEADLINE_METRICS`) beside it, and without the
    "Epoch 4/-2" label of runs bounded by `max_steps` only."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            description += f"/{self.trainer.max_epochs - 1}"
        return f"{description:{len(self.validation_description)}}"

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, int | str | float | dict]:
        return {**super().get_metrics(trainer, pl_module), **headline_values(trainer.callback_metrics)}


def stderr_is_terminal() -> bool:
    """Whether stderr, where progress goes, is a terminal (not a file or pipe, as under SLURM or nohup)."""
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
