"""studies/real_model/coasting.py: a run's query log-likelihood change split by updates with and without gradient."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from studies.real_model.coasting import coasting_split

REPO = Path(__file__).resolve().parents[2]


def write_metrics(path: Path, grad_norms: list[float], loglik: list[float]) -> Path:
    fields = ["step", "train/grad_norm", "train/query_loglik_change", "val/avg@k/toy_test/T=1"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow({"step": 0, "val/avg@k/toy_test/T=1": 0.5})  # a sweep row: not a training step
        for step, (norm, change) in enumerate(zip(grad_norms, loglik, strict=True)):
            writer.writerow({"step": step, "train/grad_norm": norm, "train/query_loglik_change": change})
    return path


def test_each_update_is_charged_to_the_step_it_trained_from(tmp_path):
    # Updates: step 0 (signal) -1.0, step 1 (zero) -2.5, step 2 (zero) +0.5, step 3 (signal) -4.0; step 4 unobserved.
    csv_path = write_metrics(tmp_path / "metrics.csv", [1.2, 0.0, 0.0, 0.7, 0.0], [0.0, -1.0, -3.5, -3.0, -7.0])
    split = coasting_split(csv_path)
    assert split == {
        "steps": 5,
        "zero_grad_steps": 2,
        "change": -7.0,
        "change_on_zero_grad": -2.0,
        "change_on_signal": -5.0,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_committed_grpo_runs_split_adds_up(seed):
    found = sorted((REPO / f"studies/real_model/runs/grpo/seed{seed}").rglob("metrics.csv"))
    split = coasting_split(found[0])
    assert split["steps"] == 40
    assert split["change_on_zero_grad"] + split["change_on_signal"] == pytest.approx(split["change"], abs=1e-9)
    assert 0 < split["zero_grad_steps"] < split["steps"]


def test_the_command_names_a_folder_without_one_metrics_file(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "studies.real_model.coasting", str(tmp_path)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode != 0 and f"{tmp_path}: expected one metrics.csv, found 0" in done.stderr
