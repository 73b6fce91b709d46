"""A short fit with the `erpo` command's trainer, read back from the metrics.csv its CSV logger writes
(tests/modules/test_fit_numerics.py, tests/rollout/test_sampler.py)."""

import csv
from pathlib import Path

import lightning.pytorch as pl

from erpo_lightning.cli.command import ERPOLightningTrainer


def logged_fit(root: Path, module, data, callbacks: list, max_steps: int, checkpointing: bool = False) -> list[dict]:
    """`module` fitted on `data` on the CPU for `max_steps`, logging every step to `root`/…/metrics.csv; its rows,
    read also when the fit raises (the exception then passes on)."""
    trainer = ERPOLightningTrainer(
        max_steps=max_steps, accelerator="cpu", logger=pl.loggers.CSVLogger(root), log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=checkpointing, callbacks=callbacks,
    )  # fmt: skip
    try:
        trainer.fit(module, datamodule=data)
    finally:
        files = list(root.rglob("metrics.csv"))
        rows = list(csv.DictReader(files[0].open())) if files else []
    return rows
