"""Smoke test of experiments/toy_study.py: every method trains and sweeps once, the report is written, and
`toy_study_compare.py` tells a reproduced study from a changed one."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from test_quickstart import QUICK_TOY

from erpo_lightning.toy import ensure_toy_assets

REPO = Path(__file__).resolve().parents[1]
METHODS = ("grpo", "grpo + w(q)", "grpo + Query-KL", "erpo", "grpo_kl")


def test_quick_toy_study_writes_report_and_figures(tmp_path):
    ensure_toy_assets(tmp_path / ".cache" / "toy-arith-v1", config=QUICK_TOY)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    command = [
        sys.executable, str(REPO / "experiments" / "toy_study.py"), "--quick", "--workdir", str(tmp_path),
        "--steps", "2", "--eval-problems", "4", "--train-sample-size", "4",
        "--fit-args=--data.batch_size 4 --rollout.group_size 4 --rollout.max_new_tokens 16",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    out = tmp_path / "runs" / "toy_study_quick"
    report = (out / "toy_study.md").read_text()
    for figure in ("toy_study_curves.png", "toy_study_evaluation.png"):
        assert (out / figure).stat().st_size > 10_000 and f"]({figure})" in report
    tables = report.split("\n## ")
    kl_table = next(t for t in tables if t.startswith("Final training metrics"))
    accuracy_table = next(t for t in tables if t.startswith("Held-out accuracy"))
    for method in METHODS:  # one row per method in each table (the accuracy table also has the base row)
        assert sum(line.startswith(f"| {method} |") for line in kl_table.splitlines()) == 1, method
        assert sum(line.startswith(f"| {method} |") for line in accuracy_table.splitlines()) == 1, method
    assert "| base |" in accuracy_table
    assert "n/a" not in kl_table  # Query-KL, Policy-KL and entropy are logged for every method

    # The rerun check: a study compared with itself agrees; one whose final Query-KL moved is flagged.
    compare = [sys.executable, str(REPO / "experiments" / "toy_study_compare.py")]
    same = subprocess.run([*compare, str(out), str(out)], capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    metrics_csv = next((moved / "erpo" / "seed0").glob("erpo/version_*/metrics.csv"))
    frame = pd.read_csv(metrics_csv)
    frame["train/query_kl"] += 1.0
    frame.to_csv(metrics_csv, index=False)
    changed = subprocess.run([*compare, str(out), str(moved)], capture_output=True, text=True)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert json.loads(changed.stdout)["outside_seed_spread"] == ["erpo/Query-KL"]
