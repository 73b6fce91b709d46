"""The toy study's report: claims paired per seed, tables and figures, all from the runs' own logs.

Reads each run's `metrics.csv` (CSVLogger), `hparams.yaml` (which Query-KL estimator it optimised) and
`sweep_summary.json` (TemperatureSweepCallback), and writes a markdown report, two PNG figures and the claims as JSON
(`<report>_claims.json`, which `toy_study_compare.py` checks a rerun against) beside it.
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
import yaml  # noqa: E402
from toy_study_claims import describe as describe_claim  # noqa: E402
from toy_study_claims import evaluate_all  # noqa: E402

from erpo_lightning.algorithms import resolve_algorithm  # noqa: E402

if TYPE_CHECKING:
    from toy_study import StudySettings

FINAL_WINDOW = 10  # "final" training metrics: the mean over the last this many logged steps
TRAIN_METRICS = {"Query-KL": "train/query_kl", "Policy-KL": "train/policy_kl", "entropy": "train/entropy",
                 "train reward": "rollout/reward_mean"}  # fmt: skip
# One Query-KL estimator for every method, so that rows optimising different estimators compare. A run logs it as
# its own `train/query_kl` when it optimises this estimator; other runs need COMMON_COLUMN logged beside it.
COMMON_ESTIMATOR = "token_k3"
COMMON_COLUMN = f"train/query_kl_{COMMON_ESTIMATOR}"
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
        columns = [c for c in [*TRAIN_METRICS.values(), COMMON_COLUMN] if c in frame]
        return frame.dropna(subset=["train/query_kl"]).groupby("step")[columns].mean()

    @cached_property
    def estimator(self) -> str:
        """The Query-KL estimator the run optimised (and logged as `train/query_kl`): its preset's, or the override."""
        hparams = yaml.safe_load((self.log_dir / "hparams.yaml").read_text())
        return resolve_algorithm(
            hparams["algorithm"], query_kl_estimator=hparams.get("query_kl_estimator")
        ).query_kl_estimator

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


def median_range(values: Sequence[float]) -> str:
    """`median [min, max]` over seeds, for quantities whose spread spans orders of magnitude; `n/a` if not logged."""
    array = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float)
    if array.size == 0:
        return "n/a"
    if array.size == 1:
        return f"{array[0]:.3g}"
    return f"{np.median(array):.3g} [{array.min():.3g}, {array.max():.3g}]"


def per_seed_values(values: Sequence[float], scale: float) -> str:
    """One seed's value after another, `a / b / c`."""
    return " / ".join(
        "n/a" if np.isnan(v) else f"{scale * v:.3g}" if scale == 1.0 else f"{scale * v:.1f}" for v in values
    )


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
    """Per method, per quantity: one value per seed, in seed order (final training metrics, accuracies in [0, 1],
    the gap). `Query-KL` is each run's own estimator, `Query-KL (common)` the COMMON_ESTIMATOR (NaN where a run
    neither optimises nor logs it)."""
    order = list(dict.fromkeys(record.method for record in records))
    table: dict[str, dict[str, list[float]]] = {}
    for record in sorted(records, key=lambda r: r.seed):
        values = table.setdefault(record.method, {})
        final = record.metrics().tail(FINAL_WINDOW).mean()
        for name, column in TRAIN_METRICS.items():
            values.setdefault(name, []).append(float(final.get(column, np.nan)))
        own = COMMON_COLUMN if COMMON_COLUMN in final else "train/query_kl"
        common = float(final[own]) if own == COMMON_COLUMN or record.estimator == COMMON_ESTIMATOR else np.nan
        values.setdefault("Query-KL (common)", []).append(common)
        after = record.sweep()["after"]
        for column, suffix in temperature_columns(settings).items():
            values.setdefault(column, []).append(after[f"val/avg@k/{BENCHMARK}/{suffix}"])
        values.setdefault("gap", []).append(after.get("train_eval_gap", np.nan))
        values.setdefault("minutes", []).append(record.seconds / 60)
    return dict(sorted(table.items(), key=lambda item: order.index(item[0])))


def estimators(records: list[RunRecord]) -> dict[str, str]:
    """Method -> the Query-KL estimator its runs optimise (one per method, or an error naming the method)."""
    found: dict[str, set[str]] = {}
    for record in records:
        found.setdefault(record.method, set()).add(record.estimator)
    mixed = {method: sorted(names) for method, names in found.items() if len(names) > 1}
    if mixed:
        raise ValueError(f"runs of one method optimise different Query-KL estimators: {mixed}")
    return {method: names.pop() for method, names in found.items()}


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
        title="Query-KL(ρθ ‖ ρθ0) on the training batch (each run's own estimator)",
        xlabel="RL step",
        ylabel="Query-KL (running mean, symlog)",
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


def methods_line(methods: dict[str, list[str]]) -> str:
    """The methods and their `erpo fit` flags, as the report lists them."""
    return "; ".join(f"`{label}` (`{' '.join(flags)}`)" for label, flags in methods.items())


def write_report(records: list[RunRecord], settings: StudySettings, path: Path, command: str, minutes: float,
                 jobs: int, study: dict) -> list[dict]:  # fmt: skip
    """Write `path` (markdown), its two PNG figures and `<stem>_claims.json` beside it.

    Args:
        study: the study's description (toy_study.study_description: methods, settings, model identity); it is
            stored with the claims so that a rerun can be compared with them.
    Returns:
        the evaluated claims (toy_study_claims.evaluate).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    table = collect(records, settings)
    kinds = estimators(records)
    claims = evaluate_all(table, kinds)
    claims_path = path.with_name(path.stem + "_claims.json")
    claims_path.write_text(json.dumps({"study": study, "claims": claims}, indent=1, ensure_ascii=False) + "\n")
    base = records[0].sweep()["before"]  # the first run also swept before its first step
    curves, evaluation = path.with_name(path.stem + "_curves.png"), path.with_name(path.stem + "_evaluation.png")
    curve_figure(records, curves)
    evaluation_figure(table, base, settings, evaluation)
    seeds = ", ".join(map(str, settings.seeds))
    kl_rows = [[m, f"`{kinds[m]}`", median_range(v["Query-KL"]), median_range(v["Query-KL (common)"]),
                median_range(v["Policy-KL"]), mean_std(v["entropy"])] for m, v in table.items()]  # fmt: skip
    columns = list(temperature_columns(settings))
    accuracy_rows = [["base"] + [f"{100 * base[f'val/avg@k/{BENCHMARK}/{temperature_columns(settings)[c]}']:.1f}"
                                 for c in columns]]  # fmt: skip
    accuracy_rows += [[m] + [mean_std(v[c], scale=100) for c in columns] for m, v in table.items()]
    gap_rows = [[m, mean_std(v["train reward"]), mean_std(v["gap"], scale=100), mean_std(v["minutes"])]
                for m, v in table.items()]  # fmt: skip
    per_seed = ["Query-KL", "Query-KL (common)", "Policy-KL", "T≤1.0", "T>1.0", "gap"]
    seed_rows = [[m] + [per_seed_values(v[name], 1.0 if "KL" in name else 100) for name in per_seed]
                 for m, v in table.items()]  # fmt: skip
    weights = query_weight_range(records)
    model = study["model"]
    standard_error = 50 / (settings.eval_problems * settings.eval_k) ** 0.5
    text = f"""# Toy study: GRPO, ERPO (the paper's and the released preset) and GRPO + Policy-KL

Generated by `experiments/toy_study.py`; every number below is read from the runs' logs. Command:

```bash
{command}
```

Setup: the quickstart's shipped model and task (`configs/quickstart.yaml`: 0.28M-parameter Qwen2, single-digit
two-step arithmetic, 16 queries × 8 rollouts per step, lr 1e-4; `erpo_lightning/toy/shipped`, sha256
`{model["sha256"]}`), {settings.steps} RL steps per run, seeds {seeds} (`seed_everything`, `rollout.seed`,
`data.seed`), Policy-KL monitored for every method against the frozen initial model. After the last step one
temperature sweep: Avg@{settings.eval_k} on the first {settings.eval_problems} held-out test problems, and on a fixed
sample of {settings.train_sample_size} training queries for the gap. Study wall time: {minutes:.1f} min with {jobs}
run(s) in parallel. Methods: {methods_line(study["methods"])}.

## Claims, paired per seed

Seed s of every method starts from the same model, data order and rollout seeds, so each claim compares a method
with its baseline within each seed: a ratio for KLs, a difference in points for accuracies. A claim **holds** when it
holds in at least 80% of the seeds, **fails** when it holds in at most 20%, and is **mixed** otherwise. Query-KL
claims compare each run's own estimator when both methods optimise the same one, else the common `{COMMON_ESTIMATOR}`.
To check a rerun against these claims (a `holds` / `fails` claim is confirmed when the rerun agrees in more than half
of its seeds): `python experiments/toy_study_compare.py <rerun directory>`, against `{claims_path.name}`.

{chr(10).join(describe_claim(claim) for claim in claims)}

## Final training metrics (as in the paper's Table 3)

Mean over the last {FINAL_WINDOW} steps of each run; KLs as median [min, max] over seeds (they span orders of
magnitude between seeds where Query-KL is not regularised), entropy as mean ± std. `Query-KL` is the estimator each
run optimises (the column `estimator`), `Query-KL ({COMMON_ESTIMATOR})` the same estimator for every method (n/a where
a run neither optimises nor logs it). Policy-KL is the k3 estimator per response token, entropy in nats per response
token. The weights w(q) that the `use_query_weights` runs apply ranged over [{weights[0]:.3g}, {weights[1]:.3g}].

{markdown_table(["method", "estimator", "Query-KL", f"Query-KL ({COMMON_ESTIMATOR})", "Policy-KL", "entropy"], kl_rows)}

## Held-out accuracy by temperature (Avg@{settings.eval_k}, %)

`base` is the initial model (measured once, before the first run's first step); T≤1.0 and T>1.0 are means over
those temperatures; mean ± std over seeds. For scale: at 50% accuracy the binomial standard error of one run's
Avg@{settings.eval_k} on {settings.eval_problems} problems is {standard_error:.1f} points (more in fact, as the
samples of one problem are correlated).

{markdown_table(["method", *columns], accuracy_rows)}

## Train-vs-eval gap

Gap = Avg@{settings.eval_k} on the training sample − Avg@{settings.eval_k} on the held-out problems, over all
temperatures of the sweep (points). Train reward: the rollouts' mean reward, last {FINAL_WINDOW} steps.

{markdown_table(["method", "train reward", "gap (points)", "run time (min)"], gap_rows)}

## Per seed

Seeds {seeds} in order, final values as in the tables above (KLs as is, accuracies and the gap in points).

{markdown_table(["method", *per_seed], seed_rows)}

## Figures

Training curves: a running mean over {max(1, settings.steps // 20)} steps, averaged over seeds; the band spans the
lowest to the highest seed. Accuracy: mean over seeds with ±1 std error bars.

![Query-KL and reward over training]({curves.name})

![Accuracy by temperature and train-vs-eval gap]({evaluation.name})
"""
    path.write_text(text)
    return claims
