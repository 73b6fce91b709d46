"""What a sweep leaves behind: a terminal table (rich), results.json, results.csv and a plot against temperature.

Everything is read from the flat metric dict of `SweepMetric.compute()`, so the files show exactly the logged
numbers. Accuracies in the table and the plot are percentages; the files keep fractions.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from rich import box  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from erpo_lightning.evaluation.sweep import PreparedBenchmark, SweepConfig  # noqa: E402
from erpo_lightning.evaluation.sweep_metrics import ALL, HIGH, LOW, MEAN, STATS, metric_name, temperature_label  # noqa: E402

RESULTS_JSON, RESULTS_CSV, PLOT_PNG = "results.json", "results.csv", "accuracy_vs_temperature.png"


@dataclass
class SweepRun:
    """One evaluated set of weights: its label ("base" or the checkpoint's name), its metrics and its throughput."""

    label: str
    model_path: str
    ckpt_path: str | None
    values: dict[str, float]
    timing: dict[str, float] = field(default_factory=dict)
    grader: dict[str, float] = field(default_factory=dict)


def result_rows(
    run: SweepRun, benchmarks: list[PreparedBenchmark], temperatures: list[float], prefix: str = "val"
) -> list[dict[str, Any]]:
    """One row per benchmark (then `mean`) × temperature (then `T<=1.0`, `T>1.0`, `all`), fractions."""
    groups = [temperature_label(t) for t in temperatures]
    groups += [g for g in (LOW, HIGH, ALL) if metric_name(prefix, STATS[0], MEAN, g) in run.values]
    entries = [(b.label, b.k, b.pass_k, len(b.prompt_ids)) for b in benchmarks]
    entries.append((MEAN, None, None, sum(len(b.prompt_ids) for b in benchmarks)))
    rows = []
    for label, k, pass_k, problems in entries:
        for group in groups:
            row = {"run": run.label, "benchmark": label, "temperature": group.removeprefix("T="), "k": k,
                   "pass_k": pass_k, "problems": problems}  # fmt: skip
            row.update({stat: run.values[metric_name(prefix, stat, label, group)] for stat in STATS})
            rows.append(row)
    return rows


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}"


def print_tables(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    """Avg@k (%) of each run × benchmark per temperature, then Pass@1 / Pass@k (%) per temperature group."""
    console = console or Console(stderr=False)
    groups = list(dict.fromkeys(r["temperature"] for r in rows))
    keys = list(dict.fromkeys((r["run"], r["benchmark"]) for r in rows))
    cell = {(r["run"], r["benchmark"], r["temperature"]): r for r in rows}
    several = len({run for run, _ in keys}) > 1

    accuracy = Table(title="Avg@k (%) by temperature", box=box.SIMPLE_HEAD)
    split = [g for g in groups if g in (LOW, HIGH, ALL)]
    for name in (["run"] if several else []) + ["benchmark", "k", "problems"] + groups:
        accuracy.add_column(name, justify="left" if name in ("run", "benchmark") else "right")
    passes = Table(title="Pass@1 / Pass@k (%)", box=box.SIMPLE_HEAD)
    for name in (
        (["run"] if several else [])
        + ["benchmark", "pass@k k"]
        + [f"{s} {g}" for g in split for s in ("pass@1", "pass@k")]
    ):
        passes.add_column(name, justify="left" if name in ("run", "benchmark") else "right")
    for run, benchmark in keys:
        first = cell[(run, benchmark, groups[0])]
        lead = [run] if several else []
        k = "" if first["k"] is None else str(first["k"])
        accuracy.add_row(*lead, benchmark, k, str(first["problems"]),
                         *(_percent(cell[(run, benchmark, g)]["avg@k"]) for g in groups),
                         end_section=benchmark == MEAN)  # fmt: skip
        pass_k = "" if first["pass_k"] is None else str(first["pass_k"])
        passes.add_row(*lead, benchmark, pass_k,
                       *(_percent(cell[(run, benchmark, g)][s]) for g in split for s in ("pass@1", "pass@k")),
                       end_section=benchmark == MEAN)  # fmt: skip
    console.print(accuracy)
    console.print(passes)


def _nan_to_none(value: Any) -> Any:
    """NaN (a cell without problems) is not JSON: it is written as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(item) for item in value]
    return value


def write_results(
    output_dir: Path,
    config: SweepConfig,
    runs: list[SweepRun],
    rows: list[dict[str, Any]],
    grader_settings: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """results.json (config, the grader's settings, runs with every logged metric, throughput, grader counters,
    rows) and results.csv."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": output_dir / RESULTS_JSON, "csv": output_dir / RESULTS_CSV}
    document = {
        "config": asdict(config),
        "grader_settings": grader_settings or {},
        "runs": [asdict(run) for run in runs],
        "rows": rows,
    }
    paths["json"].write_text(json.dumps(_nan_to_none(document), indent=2, default=str, allow_nan=False) + "\n")
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return paths


def plot_accuracy(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Avg@k (%) against temperature: one line per benchmark (colour) and run (line style); `mean` in black."""
    points = [r for r in rows if r["temperature"] not in (LOW, HIGH, ALL)]
    runs = list(dict.fromkeys(r["run"] for r in points))
    benchmarks = [b for b in dict.fromkeys(r["benchmark"] for r in points) if b != MEAN]
    colours = dict(zip(benchmarks, plt.get_cmap("tab10").colors * 3, strict=False))
    # Distinct markers keep benchmarks apart where their lines coincide (e.g. all at 0% for a weak model).
    markers = dict(zip(benchmarks, "osD^vP*Xph" * 3, strict=False))
    styles = ["-", "--", ":", "-."]
    figure, axes = plt.subplots(figsize=(10, 5))
    temperatures = sorted({float(r["temperature"]) for r in points})
    if temperatures[-1] > 1.0:
        axes.axvspan(1.0, temperatures[-1] + 0.05, color="0.92", zorder=0, label="T > 1.0")
    for r, run in enumerate(runs):
        for benchmark in [*benchmarks, MEAN]:
            line = sorted((float(p["temperature"]), 100 * p["avg@k"]) for p in points
                          if p["run"] == run and p["benchmark"] == benchmark)  # fmt: skip
            label = benchmark if len(runs) == 1 else f"{benchmark} ({run})"
            mean = benchmark == MEAN
            axes.plot(*zip(*line, strict=True), marker="." if mean else markers[benchmark], markersize=4 if mean else 7,
                      fillstyle="full" if mean else "none", linestyle=styles[r % len(styles)],
                      color="black" if mean else colours[benchmark], linewidth=2.2 if mean else 1.4,
                      zorder=3 if mean else 2, label=label)  # fmt: skip
    axes.set_xlabel("sampling temperature")
    axes.set_ylabel("Avg@k accuracy (%)")
    axes.set_title("Accuracy against decoding temperature")
    axes.set_xticks(temperatures)
    top = max((100 * p["avg@k"] for p in points if not math.isnan(p["avg@k"])), default=0.0)
    axes.set_ylim(-0.02 * max(top, 5.0), max(top * 1.1, 5.0))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
