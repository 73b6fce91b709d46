"""studies/real_model/table.py: the docs/real_model.md table from a run's CSV log, sweep summary and time log."""

import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TABLE = [sys.executable, "-m", "studies.real_model.table"]  # run from the repository root


def fake_run(root: Path, rewards: list[float], query_kl: list[float], before: float, after: float) -> Path:
    """A run directory laid out as the example config writes it (CSV logger version dir, summary beside it)."""
    version = root / "seed7" / "erpo" / "version_0"
    version.mkdir(parents=True)
    fields = ["step", "rollout/reward_mean", "train/query_kl", "train/query_kl_token_k3", "val/avg@k/toy_test/T=1"]
    with (version / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow({"step": 0, "val/avg@k/toy_test/T=1": before})  # a sweep row: no reward, not a step
        for step, (reward, kl) in enumerate(zip(rewards, query_kl, strict=True)):
            writer.writerow(
                {"step": step, "rollout/reward_mean": reward, "train/query_kl": kl, "train/query_kl_token_k3": kl / 10}
            )
    values = {"val/avg@k/toy_test/T=0.6": before, "val/avg@k/toy_test/T=1": before}
    summary = {"before": values, "after": {key: after for key in values}, "first_step": 0, "last_step": 7}
    (version / "sweep_summary.json").write_text(json.dumps(summary))
    (root / "seed7.log").write_text(
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 41:02.50\n\tMaximum resident set size (kbytes): 3145728\n"
    )
    return root / "seed7"


def test_the_table_reads_what_the_run_wrote(tmp_path):
    rewards = [0.0, 0.1, 0.2, 0.1, 0.1, 0.3, 0.4, 0.5]
    run = fake_run(tmp_path, rewards, [0.0, 2.0, 9.0, 1.0, 0.5, 0.4, 0.3, 0.25], before=0.03, after=0.105)
    done = subprocess.run([*TABLE, str(run)], capture_output=True, text=True, check=True, cwd=REPO)
    header, rule, row = done.stdout.strip().splitlines()
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == len(header.strip("|").split("|")) == rule.count("---")
    # By hand: 8 steps; 3.0% -> 10.5% (+7.5 pts) at both temperatures; mean reward of steps 1-5 = 0.5 / 5 = 10%,
    # of steps 4-8 = 1.4 / 5 = 28%; the last step's Query-KL 0.25 (token_k3 0.025); wall and RSS from the time log.
    assert cells == [
        "seed7", "8", "3.0%", "10.5%", "+7.5 pts", "3.0%", "10.5%", "+7.5 pts", "10.0%", "28.0%", "0.25", "0.025",
        "41:02.50", "3.0 GiB",
    ]  # fmt: skip


def test_an_unfinished_run_is_named(tmp_path):
    run = tmp_path / "seed3"
    run.mkdir()
    done = subprocess.run([*TABLE, str(run)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and f"{run}: expected one sweep_summary.json, found 0" in done.stderr
