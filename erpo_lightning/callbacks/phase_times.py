"""PhaseTimes: where each training step's time goes, one JSON line per step (bench/profile_fit.py reads them)."""

from __future__ import annotations

import json
from pathlib import Path
from time import perf_counter

import lightning.pytorch as pl
import torch

from erpo_lightning.common import step_phases


class PhaseTimes(pl.Callback):
    """Records the seconds of every training step's phases (`common/step_phases.py`: `weight_sync`,
    `engine_wake_sleep`, `generation`, `grading`, `rollout_batch`, `logprob_check`, `old_logprobs`,
    `query_weights`, `query_pass`, `forward`, `backward`, `optimizer`, `metrics`, `release_heap`, `sweep`) and
    writes one JSON line per step: `{"step", "wall_s", "<phase>_s"..., "other_s"}`. `wall_s` runs from the previous
    step's line (the training start for the first) to this step's end, so it holds the data loader, the rollout,
    the update and the callbacks that end the step before this one; `other_s` is `wall_s` minus the phases: the
    Lightning loop, the loggers, and the callbacks that end the step after this one (checkpoints, completions,
    progress lines), which land in the next step's line. On CUDA each phase synchronises the device at its bounds,
    and each line also holds `cuda_peak_mib`, the most memory allocated since the previous line (the peak counter is
    reset after each). Recorded on rank 0 only; without this callback nothing is recorded.

    Args:
        path: the JSON-lines file; None = `phase_times.jsonl` in the logger's folder (else `default_root_dir`).
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._file = None
        self._last = 0.0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        cuda = pl_module.device.type == "cuda"
        step_phases.start_recording(torch.cuda.synchronize if cuda else None)
        path = Path(self.path or Path(trainer.log_dir or trainer.default_root_dir) / "phase_times.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")
        self._last = perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: object) -> None:
        if self._file is None:
            return
        now = perf_counter()
        phases = step_phases.take()
        wall = now - self._last
        line = {"step": trainer.global_step, "wall_s": wall, **{f"{name}_s": s for name, s in sorted(phases.items())}}
        line["other_s"] = wall - sum(phases.values())
        if pl_module.device.type == "cuda":
            line["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        self._last = perf_counter()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            step_phases.stop_recording()
