"""A study's figures: training curves (one panel per logged metric) and accuracy against temperature with the
train-vs-eval gap, one line or bar per arm, mean over seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from studies.engine.report import RunRecord, seed_std  # noqa: E402


@dataclass(frozen=True)
class CurvePanel:
    """One panel of the training curves: a per-step series of each run, its title and axis label; `symlog` for
    quantities that span orders of magnitude between arms."""

    series: Callable[[RunRecord], pd.Series]
    title: str
    ylabel: str
    symlog: bool = False


def logged(column: str) -> Callable[[RunRecord], pd.Series]:
    """A CurvePanel series: one logged training metric per step."""
    return lambda record: record.metrics()[column]


def curve_figure(records: list[RunRecord], path: Path, panels: Sequence[CurvePanel]) -> None:
    """One panel per CurvePanel over RL steps: one line per arm (mean over seeds, a running mean over a 20th of the
    steps), a band from the lowest to the highest seed; the legend on the last panel."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
    methods = list(dict.fromkeys(r.method for r in records))
    for method in methods:
        runs = [r for r in records if r.method == method]
        for ax, panel in zip(axes, panels, strict=True):
            curves = pd.concat([panel.series(run) for run in runs], axis=1)
            window = max(1, len(curves) // 20)
            smooth = curves.rolling(window, min_periods=1).mean()  # reward is noisy at 16 queries per step
            (line,) = ax.plot(smooth.index, smooth.mean(axis=1).values, label=method)
            ax.fill_between(smooth.index, smooth.min(axis=1), smooth.max(axis=1), color=line.get_color(), alpha=0.2)
    for ax, panel in zip(axes, panels, strict=True):
        if panel.symlog:
            ax.set_yscale("symlog", linthresh=0.01)
        ax.set(title=panel.title, xlabel="RL step", ylabel=panel.ylabel)
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluation_figure(table: dict, base: dict, temperatures: Sequence[float], benchmark: str, path: Path) -> None:
    """Held-out Avg@k against temperature (base dashed) and the final train-vs-eval gap, mean ± std over seeds."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    temperatures = list(temperatures)
    left.plot(temperatures, [100 * base[f"val/avg@k/{benchmark}/T={t:g}"] for t in temperatures], "k--", label="base")
    for method, values in table.items():
        accuracy = 100 * np.array([values[f"T={t:g}"] for t in temperatures])  # temperatures x seeds
        left.errorbar(temperatures, accuracy.mean(axis=1), yerr=seed_std(accuracy), marker="o", capsize=3,
                      label=method)  # fmt: skip
    left.axvspan(1.0, max(temperatures) + 0.05, color="grey", alpha=0.1)
    left.set(title="held-out Avg@k after training", xlabel="temperature", ylabel="accuracy (%)")
    left.legend()
    gaps = [100 * np.array(values["gap"]) for values in table.values()]
    right.bar(list(table), [g.mean() for g in gaps], yerr=[seed_std(g) for g in gaps], capsize=4, color="tab:grey")
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set(title="train − held-out Avg@k (all temperatures)", ylabel="points")
    right.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
