"""A run's trajectory: its sweeps during training (StudySettings.sweep_every), its training-reward curve, the values
claims read off them, and the worked-steps measure on the sweeps' kept completions.

Where the values are. Every sweep is a row of the run's metrics.csv (its `val/...` and `train_eval_gap...` values).
TemperatureSweepCallback logs a sweep during training at the step of the batch it followed, so the sweep after u
optimizer steps is logged at u − 1; the sweep before the first step is logged at 0, and a final sweep that is not one
of the sweeps during training at the last step. `sweeps` reads the rows in file order and gives each the number of
optimizer steps before it (the index every value below uses), from the schedule in the run's `callbacks.yaml`, and
refuses a file whose sweep rows do not match it. A training row at step s is the rollout of the policy after s
steps, so a sweep after u steps and the training row at step u see the same policy.

With `save_completions` the sweeps' graded responses are in `<log dir>/sweep_completions.jsonl.gz`, one line per
problem and temperature; `wrong_steps` counts, per sweep, benchmark and temperature, the correct answers whose worked
steps are not right (studies.engine.worked_steps).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from studies.engine.report import DamagedRunFile, RunRecord, markdown_table, mean_std, sweep_rows
from studies.engine.worked_steps import RIGHT, check_steps

COMPLETIONS = "sweep_completions.jsonl.gz"
REWARD = "rollout/reward_mean"


def schedule(every: int, steps: int, at_start: bool) -> list[tuple[int, int]]:
    """(optimizer steps before the sweep, the step metrics.csv logs it at) of every sweep of a run of `steps` steps
    that sweeps every `every` steps, before the first (`at_start`) and after the last."""
    planned = [(0, 0)] if at_start else []
    planned += [(u, u - 1) for u in range(every, steps + 1, every)]
    if steps % every:
        planned.append((steps, steps))
    return planned


def sweep_settings(record: RunRecord) -> dict:
    """The run's TemperatureSweepCallback settings (its `callbacks.yaml`, which the study engine writes)."""
    path = record.log_dir.parents[1] / "callbacks.yaml"
    try:
        return yaml.safe_load(path.read_text())["trainer"]["callbacks"][0]["init_args"]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as error:
        raise DamagedRunFile(f"{path}: no sweep settings ({error})") from None


def sweeps(record: RunRecord) -> pd.DataFrame:
    """Every sweep of the run: one row each, indexed by the optimizer steps before it (`step`), with every value it
    logged (accuracies in [0, 1]); DamagedRunFile when the sweep rows do not follow the run's schedule."""
    settings, last = sweep_settings(record), record.sweep()["last_step"]
    planned = schedule(int(settings["every_n_steps"]), int(last), bool(settings.get("run_at_start")))
    rows = sweep_rows(record.logged)
    logged = [int(step) for step in rows["step"]]
    if logged != [at for _, at in planned]:
        raise DamagedRunFile(
            f"{record.log_dir / 'metrics.csv'}: sweep rows at steps {logged}, the schedule logs them at "
            f"{[at for _, at in planned]}"
        )
    columns = [c for c in rows if c.startswith(("val/", "train_eval_gap"))]
    frame = rows[columns].reset_index(drop=True)
    frame.index = pd.Index([u for u, _ in planned], name="step")
    return frame


def reward_curve(record: RunRecord, window: int = 10) -> pd.Series:
    """The training reward's running mean over `window` steps (NaN before `window` steps), by step."""
    return record.metrics()[REWARD].rolling(window, min_periods=window).mean()


def window_mean(curve: pd.Series, first: int, last: int) -> float:
    """The mean of a per-step curve over steps first..last (inclusive); NaN when none is logged."""
    part = curve.loc[first:last]
    return float(part.mean()) if part.size else float("nan")


def first_reaching(curve: pd.Series, level: float) -> int | None:
    """The first step whose value is at least `level`, or None when it never is."""
    reached = curve.index[curve.to_numpy() >= level]
    return int(reached[0]) if reached.size else None


def at_or_after(series: pd.Series, step: int | None) -> float:
    """The value at the first sweep at or after `step` (NaN when there is none, or no step)."""
    if step is None:
        return float("nan")
    later = series.loc[step:]
    return float(later.iloc[0]) if later.size else float("nan")


def value_at(series: pd.Series, step: int) -> float:
    """The value at the last sweep at or before `step` (NaN when there is none)."""
    earlier = series.loc[:step]
    return float(earlier.iloc[-1]) if earlier.size else float("nan")


def peak(series: pd.Series, width: int = 3, first: int | None = None, last: int | None = None) -> tuple[int, float]:
    """(first step of the window, mean) of the highest mean of `width` consecutive sweeps whose steps all lie in
    [first, last] (None: unbounded); (-1, NaN) when fewer than `width` sweeps lie there."""
    part = series.loc[first:last]
    if part.size < width:
        return -1, float("nan")
    means = part.rolling(width).mean().to_numpy()[width - 1 :]
    best = int(np.nanargmax(means))
    return int(part.index[best]), float(means[best])


def last_mean(series: pd.Series, width: int = 3) -> float:
    """The mean of the last `width` sweeps."""
    return float(series.iloc[-width:].mean()) if series.size >= width else float("nan")


def area_after(series: pd.Series, start: int) -> float:
    """The mean height of the curve over steps >= `start`, by the trapezoid rule (the area over the steps' span, so
    in the values' units); NaN with fewer than two sweeps there."""
    part = series.loc[start:]
    if part.size < 2:
        return float("nan")
    steps, values = part.index.to_numpy(dtype=float), part.to_numpy(dtype=float)
    area = float(((values[1:] + values[:-1]) / 2 * np.diff(steps)).sum())
    return area / float(steps[-1] - steps[0])


def read_completions(path: Path) -> list[dict]:
    """The rows of a `sweep_completions.jsonl.gz`; DamagedRunFile when it does not read as gzip JSON lines."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DamagedRunFile(f"{path}: not readable as gzip JSON lines ({error})") from None


def wrong_steps(record: RunRecord) -> pd.DataFrame:
    """Per sweep step, benchmark and temperature: `correct` (responses graded correct), `wrong_steps` (of those, the
    ones whose worked steps are not right), `share` (their ratio; NaN without a correct one) and, for the record,
    `no_steps` (correct ones with no worked step at all). Empty when the run kept no completions."""
    path = record.log_dir / COMPLETIONS
    columns = ["step", "benchmark", "temperature", "correct", "wrong_steps", "no_steps"]
    if not path.is_file():
        return pd.DataFrame(columns=[*columns, "share"])
    counts: dict[tuple, list[int]] = {}
    for row in read_completions(path):
        cell = counts.setdefault((row["step"], row["benchmark"], float(row["temperature"])), [0, 0, 0])
        for response, correct in zip(row["responses"], row["correct"], strict=True):
            if correct:
                verdict = check_steps(row.get("problem") or "", response)
                cell[0] += 1
                cell[1] += verdict != RIGHT
                cell[2] += verdict == "no_steps"
    frame = pd.DataFrame([[*key, *value] for key, value in counts.items()], columns=columns)
    frame["share"] = frame["wrong_steps"] / frame["correct"].where(frame["correct"] > 0)
    return frame.sort_values(["step", "benchmark", "temperature"]).reset_index(drop=True)


def wrong_steps_series(record: RunRecord, benchmark: str, temperature: float) -> pd.Series:
    """The share of correct answers reached through wrong steps, by sweep step, on one benchmark and temperature."""
    frame = wrong_steps(record)
    chosen = frame[(frame["benchmark"] == benchmark) & (frame["temperature"] == float(temperature))]
    return pd.Series(chosen["share"].to_numpy(dtype=float), index=pd.Index(chosen["step"], name="step"))


def by_sweep(records: list[RunRecord], curve: Callable[[RunRecord], pd.Series]) -> str:
    """A table with one row per sweep step and one column per arm: `curve` (accuracy in [0, 1]) in points, mean ±
    std over seeds."""
    arms = list(dict.fromkeys(r.method for r in records))
    curves = {arm: [curve(r) for r in records if r.method == arm] for arm in arms}
    steps = sorted({int(step) for runs in curves.values() for series in runs for step in series.index})
    rows = [[str(step)] + [mean_std([value_at(s, step) for s in curves[arm]], scale=100) for arm in arms]
            for step in steps]  # fmt: skip
    return markdown_table(["step", *arms], rows)
