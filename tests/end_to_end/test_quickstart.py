"""A shortened quickstart: the real configs/quickstart.yaml, run by the real `erpo` command, on the shipped model."""

import json
from pathlib import Path

import pytest
from helpers.fit_configs import run_erpo
from helpers.quickstart import copy_quickstart_inputs

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_shortened_quickstart_runs_and_summarises(tmp_path):
    copy_quickstart_inputs(tmp_path, test_problems=40)  # two sweeps of 200 problems take minutes on 2 busy cores
    result = run_erpo(
        "fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "3", "--data.batch_size", "4",
        "--rollout.group_size", "4", cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "held-out accuracy before and after training" in output
    assert "final Query-KL" in output
    summary = json.loads(next((tmp_path / "runs" / "quickstart").rglob("sweep_summary.json")).read_text())
    assert (summary["first_step"], summary["last_step"]) == (0, 3)
    before, after = summary["before"]["val/avg@k/toy_test/T=1"], summary["after"]["val/avg@k/toy_test/T=1"]
    # The shipped model is pre-trained to a middling accuracy: it solves some problems, not all.
    assert 0.1 < before < 0.7 and 0.1 < after < 0.7
    # Three steps with rewarded groups move the policy, so the query likelihoods move a little from θ0 (0.039 here).
    assert 0.0 < summary["query_kl"] < 0.1
