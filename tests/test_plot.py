"""`erpo plot RUN_DIR`: reward, accuracy, Query-KL and response length from a run's metrics.csv, as a PNG."""

import shutil

from helpers.fit_configs import run_erpo
from helpers.healthy_run import STEPS

from erpo_lightning.plot import PANELS, read_series, running_mean


def test_plot_of_a_toy_run_draws_every_panel(healthy_toy_run, tmp_path):
    run = shutil.copytree(healthy_toy_run.root / "logs", tmp_path / "logs")  # the plot is written beside the CSV
    plotted = run_erpo("plot", str(run), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    (metrics,) = run.rglob("metrics.csv")
    png = metrics.parent / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    series = read_series(metrics)
    assert {column: [step for step, _ in series[column]] for column, _, _ in PANELS} == {
        column: list(range(STEPS)) for column, _, _ in PANELS
    }


def test_running_mean_and_missing_run_dir(tmp_path):
    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    result = run_erpo("plot", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "no metrics.csv under" in result.stderr
