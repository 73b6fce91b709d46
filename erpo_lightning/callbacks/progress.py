"""Progress a person can watch: the step's headline numbers on the terminal's bar, or as plain lines in a log file.

`erpo fit` picks one by where stderr goes (`ERPOLightningTrainer`): a terminal gets `ERPOProgressBar` (Lightning's
rich bar with the numbers below beside it); a file or a pipe, as under SLURM or nohup, gets `ProgressLines`, one plain
line every N steps, since a bar redrawn with carriage returns leaves nothing readable in a log. The bar prints the
same step lines above itself. Long phases (the rollout engine's start-up, a temperature sweep) print a start line
with their size and an end line with their duration through `phase`; at the end of a fit, `RunFilesReport` says
where the run's files are.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only

# (label, logged metric, format): what a progress line and the bar show, from `trainer.callback_metrics`.
HEADLINE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("accuracy", "rollout/accuracy", "{:.1%}"),
    ("query_kl", "train/query_kl", "{:.3g}"),
    ("response_len", "rollout/response_length_mean", "{:.1f}"),
    ("tokens/s", "rollout/tokens_per_s", "{:.0f}"),
)
# Recent steps whose median duration gives the ETA: a sweep or checkpoint inside the window moves it by nothing.
ETA_WINDOW = 20


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


def eta_seconds(marks: Sequence[tuple[float, int]], total: int | None, window: int = ETA_WINDOW) -> float | None:
    """Seconds left: the median seconds per optimizer step over the last `window` intervals between `marks`, times
    the steps from the last mark to `total`.

    Args:
        marks: (time in seconds, global step) when training started and after each batch, oldest first; an
            interval of several optimizer steps (one batch, several updates) counts as its mean per step.
        total: the run's last step; None (unbounded) gives None, and so do fewer than two marks.
    The median, not the mean since the start: one slow step (a temperature sweep, a checkpoint, the engine's first
    compile) neither doubles the ETA nor leaves a tail in it, so the estimate moves with the step time itself.
    """
    recent = list(marks)[-(window + 1) :]
    per_step = [(t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(recent, recent[1:], strict=False) if s1 > s0]
    if total is None or not per_step:
        return None
    return statistics.median(per_step) * max(total - recent[-1][1], 0)


class StepLines:
    """When to print a step line and what it says: the first step, every `every_n_steps` and the last.

        [erpo] step 40/500 | reward 0.512 | accuracy 48.4% | query_kl 0.00123 | response_len 12.3 | tokens/s 345 |
        elapsed 1m10s | eta 13m25s

    (one line). The ETA is `eta_seconds`: the median step time of the last ETA_WINDOW steps times the steps left.

    Args:
        every_n_steps: None = the trainer's `log_every_n_steps`.
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                f"ProgressLines every_n_steps must be >= 1 (or None for log_every_n_steps), got {every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self._start: tuple[float, int] | None = None  # (time, global step) when this process started training
        self._marks: deque[tuple[float, int]] = deque(maxlen=ETA_WINDOW + 1)
        self._last_printed = -1

    def start(self, trainer: pl.Trainer) -> None:
        self._start = (perf_counter(), trainer.global_step)
        self._marks.clear()
        self._marks.append(self._start)

    def after_batch(self, trainer: pl.Trainer) -> str | None:
        """Record the step's time; its line when one is due, else None."""
        step, total = trainer.global_step, total_steps(trainer)
        if self._start is not None and (not self._marks or step > self._marks[-1][1]):
            self._marks.append((perf_counter(), step))
        every = self.every_n_steps or max(trainer.log_every_n_steps, 1)
        first = self._start is not None and step == self._start[1] + 1
        if step != self._last_printed and (first or step % every == 0 or step == total):
            self._last_printed = step
            return self.line(trainer, step, total)
        return None

    def line(self, trainer: pl.Trainer, step: int, total: int | None) -> str:
        """The progress line of `step` (see the class docstring)."""
        parts = [f"step {step}/{total if total is not None else '?'}"]
        parts += [f"{label} {value}" for label, value in headline_values(trainer.callback_metrics).items()]
        if self._start is not None:
            parts.append(f"elapsed {format_duration(perf_counter() - self._start[0])}")
            eta = eta_seconds(self._marks, total)
            if eta is not None:
                parts.append(f"eta {format_duration(eta)}")
        return " | ".join(parts)


class ProgressLines(ProgressBar):
    """A plain progress line on stderr every `every_n_steps` optimizer steps, plus the first and the last step
    (`StepLines`, whose docstring shows one).

    Args:
        every_n_steps: None = the trainer's `log_every_n_steps`.
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        super().__init__()
        self.steps = StepLines(every_n_steps)
        self.every_n_steps = every_n_steps
        self._enabled = True

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps.start(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        line = self.steps.after_batch(trainer)
        if self._enabled and line is not None:
            say(line)

    def line(self, trainer: pl.Trainer, step: int, total: int | None) -> str:
        """The progress line of `step` (`StepLines.line`)."""
        return self.steps.line(trainer, step, total)


class ERPOProgressBar(RichProgressBar):
    """Lightning's rich progress bar with the headline numbers (`HEADLINE_METRICS`) beside it, the step lines of
    `ProgressLines` printed above it (the bar is redrawn in place; the lines stay in the terminal's scrollback), and
    without the "Epoch 4/-2" label of runs bounded by `max_steps` only or the items-per-second column, which reads
    0.00it/s when a step takes longer than its 30-second estimate window (the lines carry the ETA).

    Args:
        every_n_steps: steps between step lines; None = the trainer's `log_every_n_steps`.
    """

    def __init__(self, every_n_steps: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps = StepLines(every_n_steps)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.steps.start(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        line = self.steps.after_batch(trainer)
        if line is not None and not self.is_disabled:
            say(line)  # rich's live display prints it above the bar

    def configure_columns(self, trainer: pl.Trainer) -> list:
        return super().configure_columns(trainer)[:-1]  # all but ProcessingSpeedColumn

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


def run_files(trainer: pl.Trainer, log_dir: str | None) -> dict[str, Path]:
    """Where a finished fit's files are: `run folder` (the loggers' version folder, else `default_root_dir`),
    `checkpoints` (each checkpoint callback's folder that exists), `metrics` (a CSVLogger's metrics.csv, when it
    logged anything) and `hf_model` (an HFExportCallback's final export, when written). `log_dir`: the trainer's
    (`trainer.log_dir`, which every rank must read together), given by the caller so this runs on rank 0 alone."""
    files = {"run folder": Path(log_dir or trainer.default_root_dir)}
    folders = {Path(c.dirpath) for c in trainer.checkpoint_callbacks if getattr(c, "dirpath", None)}
    for number, folder in enumerate(sorted(f for f in folders if f.is_dir())):
        files["checkpoints" if number == 0 else f"checkpoints ({number + 1})"] = folder
    for logger in trainer.loggers:  # the rows still buffered are written when the loggers finalize, after on_fit_end
        metrics = Path(logger.experiment.metrics_file_path) if isinstance(logger, CSVLogger) else None
        if metrics is not None and (metrics.is_file() or logger.experiment.metrics):
            files.setdefault("metrics", metrics)
    for callback in trainer.callbacks:  # an HFExportCallback's final export (read, not imported: it imports this)
        exported = getattr(callback, "final_directory", None)
        if exported is not None and exported.is_dir():
            files.setdefault("hf_model", exported)
    return files


def run_files_lines(files: Mapping[str, Path], step: int) -> list[str]:
    """The end-of-run message: a first line with the step, then one aligned `name  path` line per entry of `files`
    (`run_files`)."""
    width = max(len(name) for name in files)
    return [f"fit finished at step {step}; its files:", *(f"  {name:<{width}}  {path}" for name, path in files.items())]


class RunFilesReport(pl.Callback):
    """At the end of a fit that finished, says where its files landed (`run_files_lines`), on stderr from the first
    rank: the run folder, the checkpoints' folder, metrics.csv and the exported hf_model, those that exist.

        [erpo] fit finished at step 500; its files:
        [erpo]   run folder   runs/quickstart/erpo/version_0
        [erpo]   checkpoints  runs/quickstart/erpo/version_0/checkpoints
        [erpo]   metrics      runs/quickstart/erpo/version_0/metrics.csv
        [erpo]   hf_model     runs/quickstart/erpo/version_0/hf_model
    """

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_dir = trainer.log_dir  # a broadcast from rank 0: every rank takes part
        if not trainer.is_global_zero:  # a logger's experiment is a stand-in on the other ranks
            return
        for line in run_files_lines(run_files(trainer, log_dir), trainer.global_step):
            say(line)
