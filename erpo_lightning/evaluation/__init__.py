"""Evaluation: temperature sweeps (Avg@k, Pass@1, unbiased Pass@k per benchmark × temperature) and their reports."""

from erpo_lightning.evaluation.report import SweepRun, plot_accuracy, print_tables, result_rows, write_results
from erpo_lightning.evaluation.sweep import (
    Benchmark,
    PreparedBenchmark,
    Sweep,
    SweepConfig,
    SweepResult,
    SweepTiming,
    prepare_benchmarks,
)
from erpo_lightning.evaluation.sweep_metrics import SweepMetric, metric_name, pass_at_k, temperature_label
from erpo_lightning.evaluation.validate import run_validate

__all__ = [
    "Benchmark",
    "PreparedBenchmark",
    "Sweep",
    "SweepConfig",
    "SweepMetric",
    "SweepResult",
    "SweepRun",
    "SweepTiming",
    "metric_name",
    "pass_at_k",
    "plot_accuracy",
    "prepare_benchmarks",
    "print_tables",
    "result_rows",
    "run_validate",
    "temperature_label",
    "write_results",
]
