"""Sampled completions, on by default: each written row holds the prompt, response, gold, reward, advantage, reward
components and the grader's conventions, bounded in rows and bytes, and the setting that turns it off (whole groups
and CombinedReward components: test_completions_rows.py)."""

import json
import statistics

import pytest
from helpers.healthy_run import TRAIN_FILE

from erpo_lightning.callbacks.completions import SampledCompletions, markdown_table
from erpo_lightning.cli.command import ERPOLightningTrainer

ROW_KEYS = {
    "step", "group_index", "query_index", "prompt", "response", "gold", "reward", "advantage", "reward_components",
    "correct", "grader_status", "conventions", "temperature", "truncated", "response_tokens",
}  # fmt: skip
GRPO_EPS = 1e-6  # the healthy run's `erpo` preset: the grpo estimator, (r - mean) / (std + eps)


def test_a_run_writes_completions_with_grading(healthy_toy_run):
    """The healthy toy run (completions every 5 steps) writes the rows of the first step and every 5th (2 queries x
    2 responses each) to its log folder; each gold is the dataset's answer, each reward agrees with the grader's
    verdict and is the math reward's one component, and each advantage is the grpo estimator over its group (the
    rows of a step with its group_index). A run without the setting gets the default instance (the next test)."""
    source = TRAIN_FILE
    (path,) = healthy_toy_run.root.rglob("completions.jsonl")
    assert path.parent == healthy_toy_run.log_dir  # the run's log folder, beside the CSV logger's files
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 12 and [row["step"] for row in rows] == [1] * 4 + [5] * 4 + [10] * 4
    answers = [json.loads(line)["answer"] for line in source.read_text().splitlines()]
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["prompt"] and row["gold"] == str(answers[row["query_index"]])
        assert row["reward"] == (1.0 if row["correct"] else 0.0)
        assert row["grader_status"] and isinstance(row["conventions"], list)
        assert row["temperature"] == 1.0 and row["response_tokens"] <= 6
        assert row["reward_components"] == {"math_reward": row["reward"]}  # a single reward: its own one component
    groups = {}
    for row in rows:
        groups.setdefault((row["step"], row["group_index"]), []).append(row)
    assert len(groups) == 6 and all(len(group) == 2 for group in groups.values())
    for group in groups.values():
        assert len({row["query_index"] for row in group}) == 1
        rewards = [row["reward"] for row in group]
        expected = [(r - statistics.fmean(rewards)) / (statistics.stdev(rewards) + GRPO_EPS) for r in rewards]
        assert [row["advantage"] for row in group] == pytest.approx(expected, abs=1e-5)
    for step in range(0, 12, 4):  # the first response of each query comes first
        assert rows[step]["query_index"] != rows[step + 1]["query_index"]


def test_configured_instance_replaces_the_default_and_zero_turns_it_off(tmp_path):
    default = ERPOLightningTrainer(accelerator="cpu", logger=False, max_steps=1, default_root_dir=tmp_path)
    assert [(c.every_n_steps, c.max_rows) for c in default.callbacks if isinstance(c, SampledCompletions)] == [(50, 8)]
    off = ERPOLightningTrainer(
        accelerator="cpu", logger=False, max_steps=1, default_root_dir=tmp_path,
        callbacks=[SampledCompletions(every_n_steps=0)],
    )  # fmt: skip
    assert [c.every_n_steps for c in off.callbacks if isinstance(c, SampledCompletions)] == [0]


def test_file_stops_at_max_bytes_and_text_is_cut(tmp_path, capsys):
    callback = SampledCompletions(max_chars=5, max_bytes=100)
    assert callback._cut("abcdefgh") == "abcd…"
    path = tmp_path / "completions.jsonl"
    assert callback._write(path, [{"response": "x" * 40}])
    assert not callback._write(path, [{"response": "y" * 40}])  # 2 x 57 bytes > 100
    assert path.read_text().count("\n") == 1 and callback._full
    assert "reached SampledCompletions max_bytes (100)" in capsys.readouterr().err


def test_markdown_table_keeps_each_row_on_one_line():
    table = markdown_table([[1, 0, "a|b\nc", "x", "7", 1.0, -0.5, {"math": 1.0}, True, ["cv"], False]])
    assert table.splitlines()[0] == (
        "| step | group_index | prompt | response | gold | reward | advantage | reward_components | correct | "
        "conventions | truncated |"
    )
    assert table.splitlines()[2] == '| 1 | 0 | a\\|b⏎c | x | 7 | 1.0 | -0.5 | {"math": 1.0} | true | ["cv"] | false |'
