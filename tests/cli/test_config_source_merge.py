"""A second config file's `data.train` item landing on another source (issue 67): jsonargparse merges a later file's
list into an earlier list of the same length key by key, item by item, so a user's own source silently inherited the
first file's `label`, `limit`, `hub_id`... Now such an item is refused in one line naming both files, the position and
the inherited keys; an item that names no other source (a deliberate tweak) and a list of another length (which
replaces the earlier one) still parse. The `erpo` runs are in this process, on the shipped quickstart config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line

from erpo_lightning.cli.command import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = "configs/quickstart.yaml"  # data.train: [{path: erpo_lightning/toy/shipped/train.jsonl, label: toy_train}]
SMOLLM2 = "configs/smollm2_arith.yaml"  # the same source with limit: 320


def overlay(tmp_path: Path, name: str, train: list[dict]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"data": {"train": train}}, sort_keys=False))
    return str(path)


def printed_config(capsys, *args) -> dict:
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, "--print_config"])
    assert stopped.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.fixture(autouse=True)
def from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_a_second_files_own_source_is_refused_naming_what_it_would_inherit(tmp_path, capsys):
    mine = overlay(tmp_path, "mine.yaml", [{"path": "data/mine.jsonl", "problem_field": "question"}])
    line = fails_in_one_line(capsys, "fit", "--config", SMOLLM2, "--config", mine)
    assert line == (
        f"erpo: error: {mine}: data.train[0] (path: data/mine.jsonl) would be merged key by key into data.train[0] "
        f"of {SMOLLM2}, a list of the same length, and silently inherit label: toy_train, limit: 320. Start the list "
        f"afresh with --data.train=[] before --config {mine}, give the whole list in one file, or write the item in "
        "full"
    )


def test_another_label_is_another_source(tmp_path, capsys):
    relabelled = overlay(tmp_path, "relabelled.yaml", [{"label": "mine"}])
    line = fails_in_one_line(capsys, "fit", "--config", QUICKSTART, "--config", relabelled)
    assert "data.train[0] (label: mine) would be merged key by key" in line
    assert "silently inherit path: erpo_lightning/toy/shipped/train.jsonl." in line


def test_starting_the_list_afresh_takes_the_second_files_source_alone(tmp_path, capsys):
    mine = overlay(tmp_path, "mine.yaml", [{"path": "data/mine.jsonl", "problem_field": "question"}])
    (source,) = printed_config(capsys, "--config", SMOLLM2, "--data.train=[]", "--config", mine)["data"]["train"]
    assert source["path"] == "data/mine.jsonl" and source["label"] is None and source["limit"] is None


def test_a_tweak_of_the_same_source_and_a_list_of_another_length_still_parse(tmp_path, capsys):
    tweak = overlay(tmp_path, "tweak.yaml", [{"limit": 5}])
    (source,) = printed_config(capsys, "--config", QUICKSTART, "--config", tweak)["data"]["train"]
    assert source["limit"] == 5 and source["label"] == "toy_train"  # merged on purpose
    same = overlay(tmp_path, "same.yaml", [{"path": "erpo_lightning/toy/shipped/train.jsonl", "limit": 7}])
    assert printed_config(capsys, "--config", QUICKSTART, "--config", same)["data"]["train"][0]["limit"] == 7
    two = overlay(tmp_path, "two.yaml", [{"path": "a.jsonl"}, {"path": "b.jsonl"}])
    replaced = printed_config(capsys, "--config", QUICKSTART, "--config", two)["data"]["train"]
    assert [(s["path"], s["label"]) for s in replaced] == [("a.jsonl", None), ("b.jsonl", None)]
