"""The model card `erpo export` and `HFExportCallback` write beside the weights (`README.md`, Hugging Face's card
format).

It says what the folder was trained from (the initial model, the training data), how (the algorithm preset and the
loss settings it resolves to, LoRA, the rollout's group size and temperature), for how long (the checkpoint's global
step), how it scored in the run's last temperature sweep, and which erpo-lightning wrote it. Everything but the sweep
comes from the checkpoint (its module hyper-parameters, and the run config the CLI stores in it).

The sweep's numbers are read, first found first used, from: the metrics file given as `erpo export --metrics`; the
sweep history a `TemperatureSweepCallback` keeps in the checkpoint (the sweeps run up to its save, each with its
global step); the `metrics.csv` a CSVLogger wrote beside the checkpoint (in its folder, or the folder above: Lightning
puts `checkpoints/` inside the logger's version folder), when it is the log of the run that wrote the checkpoint
(`other_runs_metrics`: the checkpoint records its run's CSV log folder; another run's file is skipped, with a note in
the card naming it; a checkpoint older than that record takes the file, with a note saying it was not checked). In
a metrics file the sweep is the last row holding `val/avg@k/mean` logged at a step no later than the checkpoint's
logger step (`logger_step`): a later row measured weights the checkpoint does not hold. The callback logs the sweep
after u training steps at step u - 1 and a final sweep at the last step, so for a checkpoint saved mid-run a row
logged at its very step may be the sweep one step after it; the checkpoint's own history has no such doubt, which is
why it comes before the file beside it. When none is found the card says "No sweep was logged"; a source that
cannot be read is named in the card with the cause, and the export goes on.
"""

from __future__ import annotations

import csv
import importlib.metadata
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from erpo_lightning.checkpoints.resume_config import CONFIG_KEY
from erpo_lightning.evaluation.sweep_metrics import ALL, HIGH, LOW, MEAN, STATS, metric_name
from erpo_lightning.objectives.algorithms import Algorithm, resolve_algorithm

CARD_NAME = "README.md"
METRICS_FILE = "metrics.csv"  # what Lightning's CSVLogger writes in its version folder
SWEEP_KEY = metric_name("val", "avg@k", MEAN)  # present in every logged sweep
SWEEP_STATE = "TemperatureSweepCallback"  # the callback's key among a checkpoint's callback states
GAP = "train_eval_gap"
ROLLOUT_KEYS = ("group_size", "temperature", "max_new_tokens")  # of the run config's `rollout:` group


@dataclass(frozen=True)
class LoggedSweep:
    """One temperature sweep of the run: `values` (metric name -> value, as `SweepMetric` names them, plus
    `train_eval_gap`), and where they were read and at which step (`origin`, a phrase for the card)."""

    values: dict[str, float]
    origin: str


def package_version() -> str:
    """This erpo-lightning's installed version ("unknown" when it is not installed, e.g. run from a source tree)."""
    try:
        return importlib.metadata.version("erpo-lightning")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def metrics_beside(ckpt_path: Path) -> Path | None:
    """The CSVLogger `metrics.csv` in the checkpoint's folder or the folder above it, or None."""
    for folder in (ckpt_path.parent, ckpt_path.parent.parent):
        if (folder / METRICS_FILE).is_file():
            return folder / METRICS_FILE
    return None


def other_runs_metrics(checkpoint: dict[str, Any], ckpt_path: Path, metrics_file: Path) -> tuple[bool, str | None]:
    """(whether `metrics_file`, found beside `ckpt_path`, is read as the log of the run that wrote `checkpoint`, a note
    for the card or None).

    The checkpoint records where its run logged (`logged_run` in its `erpo` entry: each CSVLogger's version folder and
    the checkpoint folder, resolved). The file is the run's when its folder is one of those; or, for a run folder moved
    or copied whole, when its folder has the same name as one of them and the checkpoint sits where the run saved
    relative to it. A run that logged no metrics.csv has none beside its checkpoint. A checkpoint that does not record
    where it logged (older ones) takes the file, saying so."""
    record = (checkpoint.get("erpo") or {}).get("logged_run")
    folder = metrics_file.parent.resolve()
    if not isinstance(record, dict):
        return True, (
            f"{metrics_file} was taken as this run's log without a check: the checkpoint does not record where its "
            "run logged (written before erpo-lightning recorded it)"
        )
    logged = [Path(path) for path in record.get("csv_log_dirs") or []]
    if not logged:
        return False, (
            f"{metrics_file} was not read: the run that wrote the checkpoint logged no metrics.csv (no CSVLogger)"
        )
    if folder in logged:
        return True, None
    saved_in = record.get("checkpoint_dir")
    for log_dir in logged:
        if log_dir.name != folder.name:
            continue
        if saved_in is None or _relative(Path(saved_in), log_dir) == _relative(ckpt_path.parent.resolve(), folder):
            return True, None
    return False, (
        f"{metrics_file} was not read: it is not the log of the run that wrote the checkpoint, which logged to "
        f"{', '.join(map(str, logged))}; pass that run's file with --metrics"
    )


def _relative(path: Path, start: Path) -> str | None:
    """`path` relative to `start` (`..` allowed), or None when they share no root."""
    try:
        return os.path.relpath(path, start)
    except ValueError:
        return None


def logger_step(checkpoint: dict[str, Any]) -> int | None:
    """The step the run's loggers had reached when `checkpoint` was saved (training batches that stepped the
    optimizer; the global step counts optimizer steps, several per batch under `num_iterations`); None if unknown."""
    loop = ((checkpoint.get("loops") or {}).get("fit_loop") or {}).get("epoch_loop.state_dict") or {}
    step = loop.get("_batches_that_stepped", checkpoint.get("global_step"))
    return None if step is None else int(step)


def last_sweep_in_file(metrics_file: Path, max_step: int | None) -> LoggedSweep | None:
    """The last row of a CSVLogger metrics file that holds a sweep (`val/avg@k/mean`) logged at a step <= `max_step`
    (None: any step), or None. OSError, csv.Error, UnicodeDecodeError or ValueError when the file cannot be read."""
    found = None
    with metrics_file.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if not row.get(SWEEP_KEY) or not row.get("step"):
                continue
            step = int(float(row["step"]))
            if max_step is None or step <= max_step:
                values = {name: float(value) for name, value in row.items() if value and is_sweep_metric(name)}
                found = LoggedSweep(values, f"read from {metrics_file}, its row logged at step {step}")
    return found


def last_sweep_in_checkpoint(checkpoint: dict[str, Any], ckpt_path: Path | None) -> LoggedSweep | None:
    """The last sweep of the history (global step, values) a TemperatureSweepCallback keeps in `checkpoint`, or
    None."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        history = state.get("history") if isinstance(state, dict) and str(key).startswith(SWEEP_STATE) else None
        if history:
            step, values = history[-1]
            kept = {name: float(value) for name, value in values.items() if is_sweep_metric(name)}
            where = f"in {ckpt_path}" if ckpt_path is not None else "the run kept"
            return LoggedSweep(kept, f"run at global step {int(step)}, read from the sweep history {where}")
    return None


def is_sweep_metric(name: str) -> bool:
    """Whether `name` is one of a sweep's numbers shown in the card: `val/<stat>/...` or `train_eval_gap...`."""
    parts = name.split("/")
    return (len(parts) >= 3 and parts[0] == "val" and parts[1] in STATS) or parts[0] == GAP


def find_sweep(
    checkpoint: dict[str, Any], ckpt_path: Path | None, metrics_file: Path | None
) -> tuple[LoggedSweep | None, list[str]]:
    """The run's last sweep up to the checkpoint (the module docstring says where it is looked for), and a note for
    each source that could not be read."""

    def from_file(path: Path) -> LoggedSweep | None:
        try:
            return last_sweep_in_file(path, logger_step(checkpoint))
        except (OSError, csv.Error, UnicodeDecodeError, ValueError) as error:
            notes.append(f"{path} could not be read ({type(error).__name__}: {' '.join(str(error).split())})")
            return None

    def from_checkpoint() -> LoggedSweep | None:
        try:
            return last_sweep_in_checkpoint(checkpoint, ckpt_path)
        except (AttributeError, TypeError, ValueError) as error:  # a history kept in another shape
            notes.append(f"the sweep history in {ckpt_path or 'the run'} could not be read ({type(error).__name__})")
            return None

    notes: list[str] = []
    sweep = from_file(metrics_file) if metrics_file is not None else None
    sweep = sweep or from_checkpoint()
    beside = metrics_beside(ckpt_path) if ckpt_path is not None else None
    if sweep is None and beside is not None and beside != metrics_file:
        ours, note = other_runs_metrics(checkpoint, ckpt_path, beside)
        notes += [note] if note is not None else []
        sweep = from_file(beside) if ours else None
    return sweep, notes


def split_sweep_name(name: str) -> tuple[str, str, str] | None:
    """(stat, benchmark, temperature group) of `val/<stat>/<benchmark>[/<group>]` (group `all` when absent); a
    benchmark label may hold `/` (a Hub id), a group is `T=<t>`, `T<=1.0` or `T>1.0`; None for another name."""
    parts = name.split("/")
    if len(parts) < 3 or parts[0] != "val" or parts[1] not in STATS:
        return None
    last = parts[-1]
    if len(parts) > 3 and (last.startswith("T=") or last in (LOW, HIGH)):
        return parts[1], "/".join(parts[2:-1]), last
    return parts[1], "/".join(parts[2:]), ALL


def number(value: float) -> str:
    """A sweep number as the card writes it: 4 decimals (`nan` for a cell without problems)."""
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def sweep_section(sweep: LoggedSweep | None, notes: list[str]) -> list[str]:
    """The card's `## Final temperature sweep` lines: one table of every stat over all temperatures per benchmark
    (`mean`: the unweighted mean of the eval benchmarks), one of Avg@k per temperature, and the train-eval gap."""
    lines = ["## Final temperature sweep", ""]
    lines += [f"Note: {note}." for note in notes] + ([""] if notes else [])
    if sweep is None:
        return lines + ["No sweep was logged: no metrics file holds one and the checkpoint keeps no sweep history."]
    cells: dict[tuple[str, str, str], float] = {}
    for name, value in sweep.values.items():
        if (key := split_sweep_name(name)) is not None:
            cells[key] = value
    benchmarks = sorted({b for _, b, _ in cells}, key=lambda b: (b == MEAN, b))
    groups = sorted({g for _, _, g in cells if g.startswith("T=")}, key=lambda g: float(g[2:]))
    lines += [f"The last sweep up to the checkpoint, {sweep.origin}. Each stat is the mean over the sweep's "
              "temperatures; `mean` is the unweighted mean over the eval benchmarks (a `train` row, a sample of "
              "training queries, is left out of it); `length` is in tokens, `truncated` the share of responses cut "
              "at the response cap.", ""]  # fmt: skip
    lines += table(["benchmark", *STATS], [[b, *(cells.get((s, b, ALL), math.nan) for s in STATS)] for b in benchmarks])
    if groups:
        lines += ["", "Avg@k per sampling temperature:", ""]
        rows = [[b, *(cells.get(("avg@k", b, g), math.nan) for g in groups)] for b in benchmarks]
        lines += table(["benchmark", *groups], rows)
    if GAP in sweep.values:
        lines += ["", f"{GAP} (Avg@k on the training sample − mean Avg@k): {number(sweep.values[GAP])}"]
    return lines


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table; floats written with `number` (give a setting as `str` to keep its every digit)."""
    text = [[number(cell) if isinstance(cell, float) else str(cell) for cell in row] for row in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in text]


def training_section(settings: dict[str, Any], run_config: dict[str, Any]) -> list[str]:
    """The card's `## Training` lines: algorithm and resolved loss settings, LoRA, data and rollout (from the
    checkpoint's module hyper-parameters `settings` and the CLI's run config, when it holds one)."""
    name = settings.get("algorithm") or "erpo"
    lines = ["## Training", "", f"- algorithm: `{name}`"]
    try:
        resolved = resolve_algorithm(str(name), **{f.name: settings.get(f.name) for f in fields(Algorithm)})
    except (TypeError, ValueError) as error:  # a preset or field this version does not know
        lines.append(f"- its loss settings could not be resolved by this erpo-lightning: {error}")
    else:
        lines += ["- loss settings (the preset with the run's overrides):", ""]
        rows = [[key, str(value)] for key, value in asdict(resolved).items()]
        lines += ["  " + line for line in table(["setting", "value"], rows)]
        lines.append("")
    if isinstance(settings.get("peft"), dict):
        lines.append(f"- LoRA, merged into the weights: {pairs(settings['peft'], list(settings['peft']))}")
    for source in (run_config.get("data") or {}).get("train") or []:
        if isinstance(source, dict):
            lines.append(f"- training data: {pairs(source, ['name', 'path', 'hub_id', 'limit'])}")
    rollout = run_config.get("rollout") or {}
    if any(rollout.get(key) is not None for key in ROLLOUT_KEYS):
        lines.append(f"- rollouts: {pairs(rollout, list(ROLLOUT_KEYS))}")
    return lines


def pairs(values: dict[str, Any], keys: list[str]) -> str:
    """`key value, ...` of the `keys` of `values` that are set (not None)."""
    return ", ".join(f"{key} {values[key]}" for key in keys if values.get(key) is not None)


def model_card(
    checkpoint: dict[str, Any],
    ckpt_path: str | Path | None,
    base_model: str,
    metrics_file: str | Path | None = None,
    writer: str = "`erpo export`",
) -> str:
    """The README.md text of the export of `checkpoint` (read from `ckpt_path`) trained from `base_model` (a local
    folder's absolute path or a Hub id); the sweep from `metrics_file` when given (module docstring).

    `ckpt_path` None: the folder was written from the policy in memory (`HFExportCallback`, whose `checkpoint` is
    the same entries gathered from the trainer: `callbacks.export.run_state`); no metrics file is looked for beside
    it. `writer` names what wrote the folder, in the card's last line."""
    settings = checkpoint.get("hyper_parameters") or {}
    run_config = checkpoint.get(CONFIG_KEY) or {}
    if not settings:
        settings = run_config.get("model") or {}
    algorithm = str(settings.get("algorithm") or "erpo")
    front = {"library_name": "transformers", "tags": ["erpo-lightning", "reinforcement-learning", algorithm]}
    if not Path(base_model).exists():  # a Hub id: the Hub links the card to it; a local path would not resolve
        front = {"base_model": base_model, **front}
    step = checkpoint.get("global_step")
    path = Path(ckpt_path) if ckpt_path is not None else None
    sweep, notes = find_sweep(checkpoint, path, Path(metrics_file) if metrics_file is not None else None)
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", "# Policy trained with erpo-lightning"]
    source = f"`{ckpt_path}`" if ckpt_path is not None else "none (written from the policy in memory)"
    lines += ["", f"- base model: `{base_model}`", f"- checkpoint: {source}"]
    lines += [f"- global step: {step if step is not None else 'unknown (the checkpoint does not say)'}", ""]
    lines += training_section(settings, run_config) + [""] + sweep_section(sweep, notes)
    lines += ["", "## Software", "", f"Exported by {writer} of erpo-lightning {package_version()}."]
    return "\n".join(lines) + "\n"
