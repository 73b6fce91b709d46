"""Sampled completions, on by default: each written row holds the prompt, response, gold, reward and the grader's
conventions, bounded in rows and bytes, and the setting that turns it off."""

import json

from helpers.healthy_run import TRAIN_FILE

from erpo_lightning.callbacks.completions import SampledCompletions, markdown_table
from erpo_lightning.cli import ERPOLightningTrainer

ROW_KEYS = {
    "step", "query_index", "prompt", "response", "gold", "reward", "correct", "grader_status", "conventions",
    "temperature", "truncated", "response_tokens",
}  # fmt: skip


def test_a_run_writes_completions_with_grading(healthy_toy_run):
    """The healthy toy run (completions every 5 steps) writes the rows of the first step and every 5th (2 queries x
    2 responses each) to its log folder; each gold is the dataset's answer and each reward agrees with the grader's
    verdict. A run without the setting gets the default instance (the next test)."""
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
    table = markdown_table([[1, "a|b\nc", "x", "7", 1.0, True, ["cv"], False]])
    assert table.splitlines()[2] == '| 1 | a\\|b⏎c | x | 7 | 1.0 | true | ["cv"] | false |'
