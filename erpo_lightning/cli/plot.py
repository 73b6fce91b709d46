"""`erpo plot RUN_DIR`: a run's training curves from its `metrics.csv`, as a PNG, without a tracker.

    erpo plot runs/quickstart                      # the newest metrics.csv under it -> curves.png beside that file
    erpo plot runs/quickstart/erpo/version_0 --out curves.png
    erpo plot runs/quickstart --out figures/                 # figures/curves.png

One panel each for reward, accuracy, Query-KL and response length against the optimizer step: the logged value of
every step (thin) and its running mean over a 20th of the run (thick), since a step of 16 queries is noisy. A panel
whose series was logged with only NaN or infinite values says so (not "not logged"); when every panel is like that the
command stops with that message.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from pathlib import Path

from erpo_lightning.common.errors import SettingsError

# (metric column, panel title, y-axis label)
PANELS: tuple[tuple[str, str, str], ...] = (
    ("rollout/reward_mean", "reward", "mean reward"),
    ("rollout/accuracy", "accuracy", "share correct"),
    ("train/query_kl", "Query-KL(ρθ ‖ ρθ0)", "nats"),
    ("rollout/response_length_mean", "response length", "tokens"),
)


def find_metrics(run_dir: str | Path) -> Path:
    """`run_dir/metrics.csv`, else the newest `metrics.csv` below `run_dir`; SettingsError naming the folder."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.name.endswith(".csv"):
        return run_dir
    if not run_dir.is_dir():
        raise SettingsError(f"RUN_DIR: no such folder {run_dir}")
    found = sorted(run_dir.rglob("metrics.csv"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise SettingsError(f"RUN_DIR: no metrics.csv under {run_dir} (the run needs a CSVLogger in trainer.logger)")
    return found[-1]


def read_logged(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Per PANELS column, the (step, value) pairs of `path` (CSVLogger's metrics.csv) where it was logged, NaN and
    infinite values included."""
    series: dict[str, list[tuple[int, float]]] = {column: [] for column, _, _ in PANELS}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            for column in series:
                text = row.get(column) or ""
                if text and row.get("step"):
                    series[column].append((int(float(row["step"])), float(text)))
    return series


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Per PANELS column, the (step, value) pairs of `path` where it was logged as a finite number (what is drawn)."""
    return {
        column: [(step, value) for step, value in points if math.isfinite(value)]
        for column, points in read_logged(path).items()
    }


def panel_note(logged: list[tuple[int, float]]) -> str:
    """What an empty panel says: the series was never logged, or every value it holds is NaN or infinite."""
    if not logged:
        return "not logged"
    return f"only NaN / inf\n({len(logged)} logged steps)"


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to `window - 1` before it."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def plot_curves(metrics: Path, out: Path) -> Path:
    """Draw PANELS from `metrics` to the PNG `out`; SettingsError when none of them was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = read_logged(metrics)
    series = read_series(metrics)
    if not any(series.values()):
        names = ", ".join(column for column, _, _ in PANELS)
        non_finite = [column for column, points in logged.items() if points]
        if non_finite:
            raise SettingsError(
                f"{metrics}: {', '.join(non_finite)} hold only NaN or infinite values, and no other of {names} was "
                "logged: nothing to draw (did the run diverge?)"
            )
        raise SettingsError(f"{metrics}: none of {names} was logged (an `erpo fit` run's metrics.csv?)")
    figure, axes = plt.subplots(2, 2, figsize=(10, 7))
    for axis, (column, title, label) in zip(axes.flat, PANELS, strict=True):
        points = series[column]
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(steps, values, linewidth=0.6, alpha=0.4, color="tab:blue")
            smooth = running_mean(list(values), max(1, len(values) // 20))
            axis.plot(steps, smooth, linewidth=2.0, color="tab:blue")
        else:
            axis.text(0.5, 0.5, panel_note(logged[column]), ha="center", va="center", transform=axis.transAxes)
        axis.set(title=title, xlabel="optimizer step", ylabel=label)
        axis.grid(alpha=0.3)
    figure.suptitle(str(metrics.parent), fontsize=9)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main(args: list[str] | None = None) -> None:
    """`erpo plot` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="erpo plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's log folder (or any folder above it), or a CSV")
    where = "the PNG to write (a folder: curves.png in it); default: curves.png beside metrics.csv"
    parser.add_argument("--out", default=None, help=where)
    parsed = parser.parse_args(args)
    metrics = find_metrics(parsed.run_dir)
    out = plot_curves(metrics, output_path(parsed.out, metrics))
    print(f"[erpo] plotted {metrics} to {out}", flush=True)


def output_path(out: str | None, metrics: Path) -> Path:
    """The file `--out` names: `curves.png` beside `metrics` when not given, `curves.png` inside it when it is a
    folder (an existing one, or a path ending in a separator), `.png` added when it has no extension (matplotlib
    would add it without a word, and the message would name a file that does not exist)."""
    if out is None:
        return metrics.parent / "curves.png"
    path = Path(out)
    if path.is_dir() or out.endswith(("/", os.sep)):
        return path / "curves.png"
    return path if path.suffix else path.with_name(path.name + ".png")
