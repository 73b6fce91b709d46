"""`erpo plot RUN_DIR`: reward, accuracy, Query-KL and response length from a run's metrics.csv, as a PNG."""

import math
import shutil
from pathlib import Path

import pytest
from helpers.cli_runs import run_main
from helpers.fit_configs import run_erpo
from helpers.healthy_run import STEPS

from erpo_lightning.cli.plot import PANELS, main, panel_note, read_series, running_mean


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


# ------------------------------------------------- issue 54 item 11: NaN-only series, and --out naming a folder
def write_metrics(folder: Path, reward: str, accuracy: str) -> Path:
    """A metrics.csv of 3 steps whose reward and accuracy columns hold `reward` and `accuracy` at every step."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["step,rollout/reward_mean,rollout/accuracy"] + [f"{step},{reward},{accuracy}" for step in range(3)]
    path = folder / "metrics.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_panel_whose_series_holds_only_nan_says_so_not_that_it_was_not_logged():
    assert panel_note([]) == "not logged"
    assert panel_note([(0, math.nan), (1, math.inf)]) == "only NaN / inf\n(2 logged steps)"


def test_plot_of_nan_only_series_says_they_hold_only_nan(tmp_path, capsys):
    metrics = write_metrics(tmp_path / "run", "nan", "nan")
    assert run_main("plot", str(metrics.parent)) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("erpo: error: ")]
    assert line.startswith(f"erpo: error: {metrics}: rollout/reward_mean, rollout/accuracy hold only NaN"), line


@pytest.mark.parametrize(
    ("out", "written"),
    [("figures", "figures/curves.png"), ("new/", "new/curves.png"), ("curves", "curves.png"), ("a.png", "a.png")],
    ids=["existing folder", "new folder", "no extension", "a png"],
)
def test_out_names_the_file_it_writes(tmp_path, capsys, out, written):
    metrics = write_metrics(tmp_path / "run", "nan", "0.5")  # one panel drawn, one of NaN only
    (tmp_path / "figures").mkdir()
    main([str(metrics.parent), "--out", str(tmp_path / out) + ("/" if out.endswith("/") else "")])
    path = tmp_path / written
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == f"[erpo] plotted {metrics} to {path}"
