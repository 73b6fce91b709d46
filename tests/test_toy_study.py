"""Smoke test of experiments/toy_study.py: every method trains and sweeps once, and the report is written."""

import shutil
import subprocess
import sys
from pathlib import Path

from erpo_lightning.toy import ensure_toy_assets
from test_quickstart import QUICK_TOY

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
