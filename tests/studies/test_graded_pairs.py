"""studies/graded_pairs.py: the logged pairs of a run's reward and what the strict default would have refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

from studies.graded_pairs import LENIENT_ONLY, GradedPairsReward, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_lenient_only_conventions_are_the_presets_difference():
    assert set(LENIENT_ONLY) == {"approximations", "equation_right_side", "numeric_tolerance", "unevaluated_arithmetic"}


def test_each_call_is_logged_with_its_verdicts_and_a_restated_problem_is_counted_as_lenient_only(tmp_path):
    log = tmp_path / "not_yet" / "graded.jsonl"  # the folder is made at construction
    reward = GradedPairsReward(log_path=str(log), num_workers=0, preset="lenient")
    responses = ["0 + 2 + 8", "The answer is 10.", "The answer is 8 + 6 - 3 = 11.", "The answer is 12."]
    # Given the problems, as the rollout gives them: "0 + 2 + 8" restates its problem, which only lenient pays.
    problems = ["Compute 0 + 2 + 8.", "Compute 0 + 2 + 8.", "Compute 8 + 6 - 3.", "Compute 8 + 6 - 3."]
    assert reward(responses, ["10", "10", "11", "11"], problems=problems) == [1.0, 1.0, 1.0, 0.0]
    assert reward(["0 + 2 + 8"], ["10"], problems=problems[:1]) == [1.0]
    calls = summarize(log)
    assert [call["pairs"] for call in calls] == [4, 1]
    assert calls[0]["correct"] == 3
    assert calls[0]["correct_only_by_lenient_conventions"] == 2  # the restatement and the unnamed equation
    assert calls[0]["conventions_of_correct"]["unevaluated_arithmetic"] == 1
    assert calls[0]["conventions_of_correct"]["equation_right_side"] == 1
    assert [list(pair) for pair in calls[1]["common_responses"]] == [["0 + 2 + 8", 1]]
    strict = GradedPairsReward(log_path=str(tmp_path / "strict.jsonl"), num_workers=0)
    assert strict(responses, ["10", "10", "11", "11"], problems=problems) == [0.0, 1.0, 0.0, 0.0]
    assert summarize(tmp_path / "strict.jsonl")[0]["correct_only_by_lenient_conventions"] == 0


def test_summary_command_prints_json(tmp_path):
    log = tmp_path / "graded.jsonl"
    GradedPairsReward(log_path=str(log), num_workers=0, preset="lenient")(
        ["3 + 1 + 6"], ["10"], problems=["Compute 3 + 1 + 6."]
    )
    out = subprocess.run(
        [sys.executable, "-m", "studies.graded_pairs", str(log)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    summary = json.loads(out.stdout)
    assert summary["calls"][0]["correct_only_by_lenient_conventions"] == 1


def test_the_cli_takes_it_as_the_rollout_reward(tmp_path):
    """The documented flags parse: `erpo fit` resolves the class and its `log_path` beside MathReward's arguments."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "erpo_lightning.cli", "fit", "--config", str(ROOT / "configs" / "smollm2_arith.yaml"),
         "--model.model_path", str(tmp_path), "--rollout.reward.class_path",
         "studies.graded_pairs.GradedPairsReward", "--rollout.reward.init_args.log_path",
         str(tmp_path / "g.jsonl"), "--rollout.reward.init_args.preset", "lenient", "--print_config"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "class_path: studies.graded_pairs.GradedPairsReward" in out.stdout
    assert f"log_path: {tmp_path / 'g.jsonl'}" in out.stdout and "preset: lenient" in out.stdout
