"""`erpo plot RUN_DIR`: reward, accuracy, Query-KL and response length from a run's metrics.csv, as a PNG."""

from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config

from erpo_lightning.plot import PANELS, read_series, running_mean
from erpo_lightning.toy import SHIPPED_DIR


def test_plot_of_a_toy_run_draws_every_panel(tmp_path):
    config = fit_config(
        SHIPPED_DIR,
        [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 16}],
        tmp_path,
        trainer={"max_steps": 4, "log_every_n_steps": 1, "logger": csv_logger(tmp_path / "logs")},
    )
    trained = run_erpo("fit", "--config", str(write_config(tmp_path / "fit.yaml", config)), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    plotted = run_erpo("plot", str(tmp_path / "logs"), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    png = metrics.parent / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    series = read_series(metrics)
    assert {column: [step for step, _ in series[column]] for column, _, _ in PANELS} == {
        column: [0, 1, 2, 3] for column, _, _ in PANELS
    }


def test_running_mean_and_missing_run_dir(tmp_path):
    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    result = run_erpo("plot", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "no metrics.csv under" in result.stderr
