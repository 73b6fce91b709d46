"""What a study's report reads from its runs, and the pieces every study's report is written from.

Reads each run's `metrics.csv` (CSVLogger), `hparams.yaml` (which Query-KL estimator it optimised) and
`sweep_summary.json` (TemperatureSweepCallback) into one per-seed table (`collect`: arm -> quantity -> one value per
seed; `per_seed_table`: with a study's own quantities per run and the base model's row), and formats it: mean ±
std, median [min, max], per-seed values, markdown tables. The studies' report texts (studies/toy/study.py,
studies/real_model/study.py) are written from these pieces and studies/engine/figures.py. A file that cannot be
read as what it should be (a `metrics.csv` cut short, a JSON or YAML file that does not parse or lacks a key) is a
`DamagedRunFile` naming the file and what is wrong.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from erpo_lightning.objectives.algorithms import resolve_algorithm
from studies.engine.claims import BASE_ARM

FINAL_WINDOW = 10  # "final" training metrics: the mean over the last this many logged steps
TRAIN_METRICS = {"Query-KL": "train/query_kl", "Policy-KL": "train/policy_kl", "entropy": "train/entropy",
                 "train reward": "rollout/reward_mean", "grad norm": "train/grad_norm",
                 "query loglik change": "train/query_loglik_change"}  # fmt: skip
# One Query-KL estimator for every arm, so that rows optimising different estimators compare. A run logs it as its
# own `train/query_kl` when it optimises this estimator; other runs need COMMON_COLUMN logged beside it.
COMMON_ESTIMATOR = "token_k3"
COMMON_COLUMN = f"train/query_kl_{COMMON_ESTIMATOR}"
TRAIN_SAMPLE = "train"  # the label TemperatureSweepCallback gives its sample of training queries
VALIDATION = "validation"  # the label of a study's validation benchmark (definition.StudySettings.validation)
SWEEP_KEYS = ("first_step", "last_step", "before", "after")  # what sweep_summary.json holds


class DamagedRunFile(ValueError):
    """A run's file that cannot be read as what it should be; the message names the file and what is wrong."""


def read_mapping(path: Path, keys: Sequence[str] = ()) -> dict:
    """The JSON (`.json`) or YAML (any other suffix) mapping in `path`, which must hold `keys`; DamagedRunFile when it
    does not parse, is not a mapping or lacks a key."""
    kind, parse, errors = ("JSON", json.loads, json.JSONDecodeError) if path.suffix == ".json" else (
        "YAML", yaml.safe_load, yaml.YAMLError)  # fmt: skip
    try:
        data = parse(path.read_text())
    except (OSError, UnicodeDecodeError, errors) as error:
        raise DamagedRunFile(f"{path}: not readable as {kind} ({' '.join(str(error).split())})") from None
    if not isinstance(data, dict):
        raise DamagedRunFile(f"{path}: holds {type(data).__name__}, not a {kind} mapping")
    missing = [key for key in keys if key not in data]
    if missing:
        raise DamagedRunFile(f"{path}: no {', '.join(map(repr, missing))}")
    return data


def read_metrics(path: Path) -> pd.DataFrame:
    """A CSVLogger `metrics.csv`; DamagedRunFile when it is cut short (empty, its last line without its line end, or
    a row with another number of fields than the header) or is not CSV."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise DamagedRunFile(f"{path}: not readable ({error})") from None
    if not text.endswith("\n"):
        raise DamagedRunFile(f"{path}: cut short ({'empty' if not text else 'its last line has no line end'})")
    try:
        header, *rows = csv.reader(io.StringIO(text))
    except csv.Error as error:
        raise DamagedRunFile(f"{path}: not CSV ({error})") from None
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DamagedRunFile(f"{path}: cut short (row {number} has {len(row)} fields, the header {len(header)})")
    return pd.read_csv(io.StringIO(text))


def check_metrics_reach(frame: pd.DataFrame, last_step: int, path: Path) -> None:
    """DamagedRunFile unless the metrics reach the final sweep's step, which the sweep logs as the last row: a file
    cut at a line end is still CSV, but ends earlier. A final sweep that ran as one of the sweeps during training
    (`sweep_every` divides the steps) is logged one step earlier, at the step of the batch it followed: its row
    there counts."""
    if "step" not in frame or frame["step"].isna().all():
        raise DamagedRunFile(f"{path}: no logged step")
    if frame["step"].max() < last_step and not (sweep_rows(frame)["step"] == last_step - 1).any():
        ends = int(frame["step"].max())
        raise DamagedRunFile(f"{path}: cut short (it ends at step {ends}, before the final sweep's step {last_step})")


def sweep_column(benchmark: str, temperature: float) -> str:
    """The metrics.csv column of a sweep's Avg@k on `benchmark` at `temperature`: `val/avg@k/<benchmark>/T=<t>`."""
    return f"val/avg@k/{benchmark}/T={temperature:g}"


def sweep_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a metrics.csv that a temperature sweep logged (its `val/avg@k/...` values), in file order."""
    columns = [column for column in frame if column.startswith("val/avg@k/")]
    return frame[frame[columns].notna().any(axis=1)] if columns else frame.iloc[:0]


@dataclass(frozen=True)
class RunRecord:
    """One finished (arm, seed) run: its CSVLogger directory and wall time."""

    method: str
    seed: int
    log_dir: Path
    seconds: float

    @cached_property
    def logged(self) -> pd.DataFrame:
        """The run's `metrics.csv` as logged (read once)."""
        return read_metrics(self.log_dir / "metrics.csv")

    def metrics(self) -> pd.DataFrame:
        """Per-step training metrics (one row per RL step; the sweep rows are dropped)."""
        frame = self.logged
        missing = [column for column in ("step", "train/query_kl") if column not in frame]
        if missing:
            raise DamagedRunFile(f"{self.log_dir / 'metrics.csv'}: no column {', '.join(map(repr, missing))}")
        columns = [c for c in [*TRAIN_METRICS.values(), COMMON_COLUMN] if c in frame]
        return frame.dropna(subset=["train/query_kl"]).groupby("step")[columns].mean()

    @cached_property
    def estimator(self) -> str:
        """The Query-KL estimator the run optimised (and logged as `train/query_kl`): its preset's, or the override."""
        path = self.log_dir / "hparams.yaml"
        hparams = read_mapping(path)
        try:
            algorithm = resolve_algorithm(hparams["algorithm"], query_kl_estimator=hparams.get("query_kl_estimator"))
        except (KeyError, ValueError) as error:
            raise DamagedRunFile(f"{path}: no usable algorithm ({error})") from None
        return algorithm.query_kl_estimator

    def sweep(self) -> dict:
        """`before` / `after` sweep values of sweep_summary.json (and `first_step` / `last_step`)."""
        return read_mapping(self.log_dir / "sweep_summary.json", SWEEP_KEYS)

    def check(self) -> None:
        """Read every file the report reads; DamagedRunFile naming the first that cannot be read."""
        self.metrics()
        check_metrics_reach(self.logged, self.sweep()["last_step"], self.log_dir / "metrics.csv")
        _ = self.estimator

    def common_query_kl(self) -> pd.Series:
        """Query-KL on the common estimator, per step: COMMON_COLUMN, or the run's own estimate when that is it
        (empty when neither was logged)."""
        frame = self.metrics()
        if COMMON_COLUMN in frame:
            return frame[COMMON_COLUMN]
        return frame["train/query_kl"] if self.estimator == COMMON_ESTIMATOR else pd.Series(dtype=float)


def temperature_columns(temperatures: Sequence[float]) -> dict[str, str]:
    """Table column -> the suffix of its `val/avg@k/<benchmark>/...` metric: one per temperature, then the means
    over T ≤ 1.0 and T > 1.0."""
    columns = {f"T={t:g}": f"T={t:g}" for t in temperatures}
    columns.update({"T≤1.0": "T<=1.0", "T>1.0": "T>1.0"})
    return columns


def benchmark_label(records: list[RunRecord]) -> str:
    """The label of the held-out benchmark the runs swept (every `val/avg@k/<label>/...` but the `mean` over
    benchmarks, the training sample and a validation benchmark)."""
    labels = {name.split("/")[2] for record in records for name in record.sweep()["after"]
              if name.startswith("val/avg@k/") and name.count("/") == 3}  # fmt: skip
    labels -= {"mean", TRAIN_SAMPLE, VALIDATION}
    if len(labels) != 1:
        raise SystemExit(f"the runs swept {sorted(labels)}: a study sweeps one held-out benchmark")
    return labels.pop()


def base_sweep(records: list[RunRecord]) -> dict:
    """The base model's sweep: the `before` values of the first run that swept before its first step (at step 0: a
    run that sweeps during training has an earlier first sweep than its last, but not at step 0)."""
    for record in records:
        sweep = record.sweep()
        if sweep["first_step"] == 0 < sweep["last_step"]:
            return sweep["before"]
    raise SystemExit("no run swept the base model before its first step (the study's first run does)")


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


def seeds_line(records: list[RunRecord]) -> str:
    """The seeds the runs cover, `0, 1, 2`."""
    return ", ".join(map(str, sorted({record.seed for record in records})))


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def accuracy_rows(
    table: dict, base: dict, benchmark: str, columns: dict[str, str], quantity: str = ""
) -> list[list[str]]:
    """Accuracy table rows (points): `base` (one value) and one row per arm (mean ± std over seeds).

    Args:
        benchmark: the benchmark label of the base model's values (`val/avg@k/<benchmark>/...`).
        columns: table column -> the suffix of its `val/avg@k/<benchmark>/...` metric (temperature_columns).
        quantity: what precedes a column's name in the arms' quantities (`train ` for the training sample's).
    """
    rows = [["base"] + [f"{100 * base[f'val/avg@k/{benchmark}/{suffix}']:.1f}" for suffix in columns.values()]]
    rows += [[arm] + [mean_std(values[quantity + column], scale=100) for column in columns]
             for arm, values in table.items()]  # fmt: skip
    return rows


def collect(records: list[RunRecord], temperatures: Sequence[float], benchmark: str) -> dict[str, dict[str, list]]:
    """Per arm, per quantity: one value per seed, in seed order (`seed`: the seeds). Final training metrics
    (TRAIN_METRICS; NaN where not logged); held-out accuracies in [0, 1] by temperature column (temperature_columns),
    the training sample's (`train T=...`) and the gap between them (`gap`: over all temperatures, `gap T=...`).
    `Query-KL` is each run's own estimator, `Query-KL (common)` the COMMON_ESTIMATOR (NaN where a run neither
    optimises nor logs it)."""
    order = list(dict.fromkeys(record.method for record in records))
    table: dict[str, dict[str, list]] = {}
    for record in sorted(records, key=lambda r: r.seed):
        values = table.setdefault(record.method, {})
        values.setdefault("seed", []).append(record.seed)
        final = record.metrics().tail(FINAL_WINDOW).mean()
        for name, column in TRAIN_METRICS.items():
            values.setdefault(name, []).append(float(final.get(column, np.nan)))
        own = COMMON_COLUMN if COMMON_COLUMN in final else "train/query_kl"
        common = float(final[own]) if own == COMMON_COLUMN or record.estimator == COMMON_ESTIMATOR else np.nan
        values.setdefault("Query-KL (common)", []).append(common)
        after = record.sweep()["after"]
        for column, suffix in temperature_columns(temperatures).items():
            values.setdefault(column, []).append(after[f"val/avg@k/{benchmark}/{suffix}"])
            values.setdefault(f"train {column}", []).append(after.get(f"val/avg@k/{TRAIN_SAMPLE}/{suffix}", np.nan))
            values.setdefault(f"gap {column}", []).append(after.get(f"train_eval_gap/{suffix}", np.nan))
        values.setdefault("gap", []).append(after.get("train_eval_gap", np.nan))
        values.setdefault("minutes", []).append(record.seconds / 60)
    return dict(sorted(table.items(), key=lambda item: order.index(item[0])))


def with_base_model(table: dict, base: dict, temperatures: Sequence[float], benchmark: str) -> dict:
    """`table` with the base model's row (BASE_ARM) first: its held-out and training-sample accuracies (the same
    columns as collect's) from its sweep `base`, repeated for every seed an arm ran (the base model is swept once),
    so that claims and gates can pair an arm with it."""
    seeds = sorted({seed for values in table.values() for seed in values["seed"]})
    row: dict[str, list] = {"seed": seeds}
    for column, suffix in temperature_columns(temperatures).items():
        row[column] = [base[f"val/avg@k/{benchmark}/{suffix}"]] * len(seeds)
        row[f"train {column}"] = [base.get(f"val/avg@k/{TRAIN_SAMPLE}/{suffix}", np.nan)] * len(seeds)
    return {BASE_ARM: row, **table}


def per_seed_table(
    records: list[RunRecord],
    temperatures: Sequence[float],
    benchmark: str,
    base: dict,
    quantities: Callable[[RunRecord], dict[str, float]] | None = None,
) -> dict:
    """`collect`'s table with each run's own `quantities(record)` (a study's trajectory quantities) added to its arm's
    row, in seed order as collect's, and the base model's row first from its sweep `base` (`with_base_model`)."""
    table = collect(records, temperatures, benchmark)
    for record in sorted(records, key=lambda r: r.seed):
        for name, value in (quantities(record) if quantities else {}).items():
            table[record.method].setdefault(name, []).append(value)
    return with_base_model(table, base, temperatures, benchmark)


def add_retention(table: dict, high: str, low: str) -> None:
    """Add `retention` to every row of `table`: held-out accuracy at the `high` temperature column over the `low`
    one's (`T=1.5`, `T=1`), a share in [0, 1] (NaN where the low one is 0)."""
    for values in table.values():
        values["retention"] = [
            hot / cool if cool > 0 else np.nan for hot, cool in zip(values[high], values[low], strict=True)
        ]


def estimators(records: list[RunRecord]) -> dict[str, str]:
    """Arm -> the Query-KL estimator its runs optimise (one per arm, or an error naming the arm)."""
    found: dict[str, set[str]] = {}
    for record in records:
        found.setdefault(record.method, set()).add(record.estimator)
    mixed = {method: sorted(names) for method, names in found.items() if len(names) > 1}
    if mixed:
        raise ValueError(f"runs of one method optimise different Query-KL estimators: {mixed}")
    return {method: names.pop() for method, names in found.items()}


def arms_line(arms: dict[str, list[str]]) -> str:
    """The arms and their `erpo fit` flags, as the reports list them."""
    return "; ".join(f"`{label}` (`{' '.join(flags)}`)" for label, flags in arms.items())


def write_claims(path: Path, study: dict, claims: list[dict]) -> Path:
    """`<stem>_claims.json` beside the report at `path`: the study's description and its evaluated claims."""
    claims_path = path.with_name(path.stem + "_claims.json")
    claims_path.write_text(json.dumps({"study": study, "claims": claims}, indent=1, ensure_ascii=False) + "\n")
    return claims_path
