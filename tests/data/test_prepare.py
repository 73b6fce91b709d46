"""The training set from the configured sources (`data/prepare.py`, issue 67): an empty in-memory dataset named by
its place in `data.train`, a list of rows refused saying how to pass it, and a source losing most of its rows to
`data.max_prompt_length` warned about with the flag named (a few lost rows only counted). Built on the shipped toy
model's tokenizer (with its chat template) and the shipped training problems."""

from __future__ import annotations

import warnings
from pathlib import Path

import datasets
import pytest
from helpers.data_rows import PLAIN, SHIPPED, chat, shipped_rows, write
from transformers import AutoTokenizer

from erpo_lightning.data import DataError, prepare_queries
from erpo_lightning.data.prepare import OVERLONG_WARN_SHARE
from erpo_lightning.data.sources import DatasetSource


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED)


# -- an empty in-memory dataset -------------------------------------------------------------------------------------


def test_an_empty_in_memory_dataset_is_named_by_its_place_in_data_train(tokenizer):
    shipped = {"path": str(SHIPPED / "train.jsonl"), "limit": 2}
    empty = datasets.Dataset.from_dict({"problem": [], "answer": []})
    with pytest.raises(DataError) as refused:
        prepare_queries([shipped, empty], tokenizer, PLAIN, 64)
    assert str(refused.value) == (
        "data.train[1], the in-memory dataset 'dataset' (a datasets.Dataset with columns ['problem', 'answer']), has "
        "no rows: a source needs at least one row"
    )
    labelled = DatasetSource(dataset=empty, label="mine")
    with pytest.raises(DataError, match=r"^data.train\[0\], the in-memory dataset 'mine' "):
        prepare_queries([labelled, shipped], tokenizer, PLAIN, 64)


def test_a_list_of_rows_is_refused_saying_how_to_pass_it(tokenizer):
    for rows in ([], shipped_rows(2)):
        with pytest.raises(DataError) as refused:
            prepare_queries([rows], tokenizer, PLAIN, 64)
        assert f"got a list of {len(rows)} item(s)" in str(refused.value)
        assert "pass datasets.Dataset.from_list(rows)" in str(refused.value)


# -- a source losing most of its rows to max_prompt_length ----------------------------------------------------------


def long_and_short(tmp_path: Path, long_rows: int) -> Path:
    """16 conversations of shipped problems, `long_rows` of them padded past 64 tokens by a long system turn."""
    rows = []
    for index, row in enumerate(shipped_rows(16)):
        turns = chat(row["problem"])
        if index < long_rows:
            turns = [{"role": "system", "content": "Think it through step by step. " * 2}, *turns]
        rows.append({"id": row["id"], "messages": turns, "answer": row["answer"]})
    return write(tmp_path / "chat.jsonl", rows)


def test_a_source_losing_half_its_rows_to_max_prompt_length_is_warned_with_the_flag(tmp_path, tokenizer):
    path = long_and_short(tmp_path, 8)
    with pytest.warns(UserWarning) as warned:
        prepared = prepare_queries([{"path": str(path), "problem_field": "messages"}], tokenizer, PLAIN, 64)
    assert len(prepared.queries) == 8 and prepared.dropped_overlong == 8
    (message,) = [str(w.message) for w in warned if "max_prompt_length" in str(w.message)]
    assert message.startswith(
        f"data.train[0] ({path}) lost 8 of its 16 rows (50%, more than 25%) to prompts longer than "
        "data.max_prompt_length=64 tokens (longest "
    )
    assert "raise data.max_prompt_length (the model's context must hold it plus rollout.max_new_tokens)" in message


def test_a_source_losing_a_few_rows_is_only_counted(tmp_path, tokenizer):
    path = long_and_short(tmp_path, int(16 * OVERLONG_WARN_SHARE))  # exactly the share: not more
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = prepare_queries([{"path": str(path), "problem_field": "messages"}], tokenizer, PLAIN, 64)
    assert prepared.dropped_overlong == 4 and len(prepared.queries) == 12
