"""The toy study's report: tables (mean ± std over seeds) and figures from the runs' own logs.

Reads each run's `metrics.csv` (CSVLogger) and `sweep_summary.json` (TemperatureSweepCallback) and writes a markdown
report with two PNG figures beside it. Every number in the report comes from those files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

if TYPE_CHECKING:
    from toy_study import StudySettings

FINAL_WINDOW = 10  # "final" training metrics: the mean over the last this many logged steps
TRAIN_METRICS = {"Query-KL": "train/query_kl", "Policy-KL": "train/policy_kl", "entropy": "train/entropy",
                 "train reward": "rollout/reward_mean"}  # fmt: skip
BENCHMARK = "toy_test"


@dataclass(frozen=True)
class RunRecord:
    """One finished (method, seed) run: its CSVLogger directory and wall time."""

    method: str
    seed: int
    log_dir: Path
    seconds: float

    @cached_property
    def logged(self) -> pd.DataFrame:
        """The run's `metrics.csv` as logged (read once)."""
        return pd.read_csv(self.log_dir / "metrics.csv")

    def metrics(self) -> pd.DataFrame:
        """Per-step training metrics (one row per RL step; the sweep rows are dropped)."""
        frame = self.logged
        columns = [c for c in TRAIN_METRICS.values() if c in frame]
        return frame.dropna(subset=["train/query_kl"]).groupby("step")[columns].mean()

    def sweep(self) -> dict:
        """`before` / `after` sweep values of sweep_summary.json."""
        return json.loads((self.log_dir / "sweep_summary.json").read_text())


def temperature_columns(settings: StudySettings) -> dict[str, str]:
    """Table column -> the suffix of its `val/avg@k/<benchmark>/...` metric."""
    columns = {f"T={t:g}": f"T={t:g}" for t in settings.temperatures}
    columns.update({"T≤1.0": "T<=1.0", "T>1.0": "T>1.0"})
    return columns


def seed_std(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sample standard deviation over seeds (the last axis); 0 with a single seed."""
    return values.std(axis=axis, ddof=1) if values.shape[axis] > 1 else np.zeros_like(values.mean(axis=axis))


def mean_std(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    """`m ± s` over seeds (sample std; only `m` for one seed); `n/a` when the metric was not logged."""
    array = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float) * scale
    if array.size == 0:
        return "n/a"
    if array.size == 1:
        return f"{array[0]:.{digits}g}" if scale == 1.0 else f"{array[0]:.1f}"
    fmt = (lambda x: f"{x:.{digits}g}") if scale == 1.0 else (lambda x: f"{x:.1f}")
    return f"{fmt(array.mean())} ± {fmt(seed_std(array))}"


def per_seed_values(values: Sequence[float], scale: float) -> str:
    """One seed's value after another, `a / b / c`."""
    return " / ".join(f"{scale * v:.3g}" if scale == 1.0 else f"{scale * v:.1f}" for v in values)


def query_weight_range(records: list[RunRecord]) -> tuple[float, float]:
    """Lowest and highest w(q) logged in any run (NaN when no run logged them)."""
    lows, highs = [], []
    for record in records:
        frame = record.logged
        if "train/query_weight_min" in frame:
            lows.append(frame["train/query_weight_min"].min())
            highs.append(frame["train/query_weight_max"].max())
    return (min(lows), max(highs)) if lows else (float("nan"), float("nan"))


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def collect(records: list[RunRecord], settings: StudySettings) -> dict[str, dict[str, list[float]]]:
    """Per method, per quantity: one value per seed (final training metrics, accuracies in [0, 1], the gap)."""
    table: dict[str, dict[str, list[float]]] = {}
    for record in records:
        values = table.setdefault(record.method, {})
        final = record.metrics().tail(FINAL_WINDOW).mean()
        for name, column in TRAIN_METRICS.items():
            values.setdefault(name, []).append(float(final.get(column, np.nan)))
        after = record.sweep()["after"]
        for column, suffix in temperature_columns(settings).items():
            values.setdefault(column, []).append(after[f"val/avg@k/{BENCHMARK}/{suffix}"])
        values.setdefault("gap", []).append(after.get("train_eval_gap", np.nan))
        values.setdefault("minutes", []).append(record.seconds / 60)
    return table


def curve_figure(records: list[RunRecord], path: Path) -> None:
    """Query-KL and rollout reward over steps: one line per method (mean over seeds), a band from the lowest to the
    highest seed. Query-KL is on a symmetric-log axis: it spans four orders of magnitude between methods."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    methods = list(dict.fromkeys(r.method for r in records))
    for method in methods:
        frames = [r.metrics() for r in records if r.method == method]
        for ax, column in zip(axes, ("train/query_kl", "rollout/reward_mean"), strict=True):
            curves = pd.concat([f[column] for f in frames], axis=1)
            window = max(1, len(curves) // 20)
            smooth = curves.rolling(window, min_periods=1).mean()  # reward is noisy at 16 queries per step
            (line,) = ax.plot(smooth.index, smooth.mean(axis=1).values, label=method)
            ax.fill_between(smooth.index, smooth.min(axis=1), smooth.max(axis=1), color=line.get_color(), alpha=0.2)
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[0].set(
        title="Query-KL(ρθ ‖ ρθ0) on the training batch", xlabel="RL step", ylabel="Query-KL (running mean, symlog)"
    )
    axes[1].set(title="mean reward of the rollouts", xlabel="RL step", ylabel="reward (running mean)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluation_figure(table: dict, base: dict, settings: StudySettings, path: Path) -> None:
    """Held-out Avg@k against temperature (base dashed) and the final train-vs-eval gap, mean ± std over seeds."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    temperatures = list(settings.temperatures)
    left.plot(temperatures, [100 * base[f"val/avg@k/{BENCHMARK}/T={t:g}"] for t in temperatures], "k--", label="base")
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


def paper_checks(table: dict) -> list[str]:
    """The paper's qualitative claims, each checked against the measured means (std printed beside them)."""

    def stat(method: str, name: str) -> tuple[float, float]:
        values = np.asarray(table[method][name], dtype=float)
        return float(values.mean()), float(seed_std(values))

    def check(claim: str, a: tuple[str, str], b: tuple[str, str], lower: bool, scale: float = 1.0) -> str:
        (ma, sa), (mb, sb) = stat(*a), stat(*b)
        holds = ma < mb if lower else ma > mb
        close = abs(ma - mb) <= max(sa, sb)
        verdict = ("holds" if holds else "does not hold") + (" (difference within one seed std)" if close else "")
        # Seeds are paired: seed s of both methods starts from the same data order and rollout seeds.
        per_seed = zip(table[a[0]][a[1]], table[b[0]][b[1]], strict=True)
        wins = sum((x < y) if lower else (x > y) for x, y in per_seed)
        return (f"- {claim}: {verdict}, in {wins} of {len(table[a[0]][a[1]])} seeds: {a[0]} {scale * ma:.4g} ± "
                f"{scale * sa:.2g} vs {b[0]} {scale * mb:.4g} ± {scale * sb:.2g}")  # fmt: skip

    return [
        check("ERPO ends with a lower Query-KL than GRPO", ("erpo", "Query-KL"), ("grpo", "Query-KL"), True),
        check(
            "Query-KL alone (no w(q)) lowers Query-KL vs GRPO",
            ("grpo + Query-KL", "Query-KL"),
            ("grpo", "Query-KL"),
            True,
        ),  # fmt: skip
        check("grpo_kl keeps Policy-KL below GRPO's", ("grpo_kl", "Policy-KL"), ("grpo", "Policy-KL"), True),
        check(
            "grpo_kl (Policy-KL) does not keep Query-KL as low as ERPO",
            ("grpo_kl", "Query-KL"),
            ("erpo", "Query-KL"),
            False,
        ),  # fmt: skip
        check("ERPO is more accurate than GRPO at T > 1.0 (%)", ("erpo", "T>1.0"), ("grpo", "T>1.0"), False, 100),
        check("ERPO is more accurate than GRPO at T ≤ 1.0 (%)", ("erpo", "T≤1.0"), ("grpo", "T≤1.0"), False, 100),
        check("ERPO's train-vs-eval gap is smaller than GRPO's (points)", ("erpo", "gap"), ("grpo", "gap"), True, 100),
    ]


def write_report(records: list[RunRecord], settings: StudySettings, path: Path, command: str, minutes: float,
                 jobs: int) -> None:  # fmt: skip
    """Write `path` (markdown) and its two PNG figures beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = collect(records, settings)
    base = records[0].sweep()["before"]
    curves, evaluation = path.with_name(path.stem + "_curves.png"), path.with_name(path.stem + "_evaluation.png")
    curve_figure(records, curves)
    evaluation_figure(table, base, settings, evaluation)
    seeds = ", ".join(map(str, settings.seeds))
    kl_rows = [[m] + [mean_std(v[name]) for name in ("Query-KL", "Policy-KL", "entropy")] for m, v in table.items()]
    columns = list(temperature_columns(settings))
    accuracy_rows = [["base"] + [f"{100 * base[f'val/avg@k/{BENCHMARK}/{temperature_columns(settings)[c]}']:.1f}"
                                 for c in columns]]  # fmt: skip
    accuracy_rows += [[m] + [mean_std(v[c], scale=100) for c in columns] for m, v in table.items()]
    gap_rows = [[m, mean_std(v["train reward"]), mean_std(v["gap"], scale=100), mean_std(v["minutes"])]
                for m, v in table.items()]  # fmt: skip
    per_seed = ["Query-KL", "Policy-KL", "T≤1.0", "T>1.0", "gap"]
    seed_rows = [[m] + [per_seed_values(v[name], 1.0 if "KL" in name else 100) for name in per_seed]
                 for m, v in table.items()]  # fmt: skip
    weights = query_weight_range(records)
    text = f"""# Toy study: GRPO, its ERPO ablations, ERPO and GRPO + Policy-KL (issue 9)

Generated by `experiments/toy_study.py`; every number below is read from the runs' logs. Command:

```bash
{command}
```

Setup: the quickstart's embedded model and task (`configs/quickstart.yaml`: 0.28M-parameter Qwen2, single-digit
two-step arithmetic, 16 queries × 8 rollouts per step, lr 1e-4), {settings.steps} RL steps per run, seeds {seeds}
(`seed_everything`, `rollout.seed`, `data.seed`), Policy-KL monitored for every method against the frozen initial
model. After the last step one temperature sweep: Avg@{settings.eval_k} on the first {settings.eval_problems}
held-out test problems, and on a fixed sample of {settings.train_sample_size} training queries for the gap. Study wall
time: {minutes:.1f} min with {jobs} run(s) in parallel. Methods: `grpo` (β = 0); `grpo + w(q)` (`use_query_weights:
true`); `grpo + Query-KL` (`query_kl_coef: 0.01`); `erpo` (both); `grpo_kl` (Policy-KL k3, β = 0.001).

## Final training metrics (as in the paper's Table 3)

Mean over the last {FINAL_WINDOW} steps of each run, then mean ± std over seeds. Query-KL is the released code's
per-token k3 estimator (`token_k3`), Policy-KL the k3 estimator per response token, entropy in nats per response
token. Query-KL is heavy-tailed across seeds where it is not regularised: the per-seed values are below.
The weights w(q) that `grpo + w(q)` and `erpo` apply ranged over [{weights[0]:.3g}, {weights[1]:.3g}] in these runs.

{markdown_table(["method", "Query-KL", "Policy-KL", "entropy"], kl_rows)}

## Held-out accuracy by temperature (Avg@{settings.eval_k}, %)

`base` is the initial model (measured once, before the first run's first step); T≤1.0 and T>1.0 are means over
those temperatures. For scale: at 50% accuracy the binomial standard error of one run's Avg@{settings.eval_k} on
{settings.eval_problems} problems is {50 / (settings.eval_problems * settings.eval_k) ** 0.5:.1f} points (more in
fact, as the samples of one problem are correlated).

{markdown_table(["method", *columns], accuracy_rows)}

## Train-vs-eval gap

Gap = Avg@{settings.eval_k} on the training sample − Avg@{settings.eval_k} on the held-out problems, over all
temperatures of the sweep (points). Train reward: the rollouts' mean reward, last {FINAL_WINDOW} steps.

{markdown_table(["method", "train reward", "gap (points)", "run time (min)"], gap_rows)}

## Per seed

Seeds {seeds} in order, final values as in the tables above (KLs as is, accuracies and the gap in points).

{markdown_table(["method", *per_seed], seed_rows)}

## The paper's claims, checked on these runs

Each claim compares the means over seeds; "in k of n seeds" counts the seeds where it holds for that seed's pair of
runs.

{chr(10).join(paper_checks(table))}

## Figures

Training curves: a running mean over {max(1, settings.steps // 20)} steps, averaged over seeds; the band spans the
lowest to the highest seed. Accuracy: mean over seeds with ±1 std error bars.

![Query-KL and reward over training]({curves.name})

![Accuracy by temperature and train-vs-eval gap]({evaluation.name})
"""
    path.write_text(text)
