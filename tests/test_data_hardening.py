"""Data a newcomer brings (issue 67): a text cell among conversations is refused by file, row and column instead of
being rendered with the plain template beside chat-rendered rows; an empty in-memory dataset is named by its place in
`data.train`; a source losing most of its rows to `data.max_prompt_length` is warned about with the flag named.
Built on the shipped toy model's tokenizer (with its chat template) and the shipped training problems."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from erpo_lightning.data import DataError, prepare_queries
from erpo_lightning.data.prepare import OVERLONG_WARN_SHARE
from erpo_lightning.data.sources import DatasetSource, load_queries
from erpo_lightning.data.templates import resolve_template

SHIPPED = Path(__file__).resolve().parents[1] / "erpo_lightning" / "toy" / "shipped"
PLAIN = resolve_template("plain", suffix="\n")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED)


def shipped_rows(count: int) -> list[dict]:
    lines = (SHIPPED / "train.jsonl").read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def chat(problem: str) -> list[dict]:
    return [{"role": "user", "content": problem}]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# -- a text cell in a conversational column -------------------------------------------------------------------------


def test_a_text_cell_among_conversations_is_refused_by_file_row_and_column(tmp_path):
    rows = [{"id": r["id"], "messages": chat(r["problem"]), "answer": r["answer"]} for r in shipped_rows(4)]
    rows[2]["messages"] = rows[2]["messages"][0]["content"]  # a plain string beside chat lists
    path = write(tmp_path / "chat.jsonl", rows)
    with pytest.raises(DataError) as refused:
        load_queries({"path": str(path), "problem_field": "messages"})
    assert (
        f"{path} line 3, row 3, field 'messages': problem is text, while 3 other row(s) of column 'messages' hold "
        "conversations (first: row 1); a column holds one kind, since text is rendered with the plain template and "
        "a conversation with the chat template: write it as a list of turns, [{role: user, content: ...}]"
    ) in str(refused.value)
    queries, skipped = load_queries({"path": str(path), "problem_field": "messages"}, skip_invalid=True)
    assert [q.row for q in queries] == [1, 2, 4] and all(q.messages for q in queries)
    assert skipped == {"mixed problem kinds": 1}


def test_a_conversation_among_text_cells_is_the_odd_one(tmp_path):
    rows = [{"id": r["id"], "problem": r["problem"], "answer": r["answer"]} for r in shipped_rows(3)]
    rows[0]["problem"] = chat(rows[0]["problem"])
    path = write(tmp_path / "text.jsonl", rows)
    with pytest.raises(DataError, match=r"row 1, field 'problem': problem is a conversation, while 2 other row\(s\)"):
        load_queries({"path": str(path)})


def test_a_column_of_one_kind_is_accepted(tmp_path, tokenizer):
    rows = [{"id": r["id"], "messages": chat(r["problem"]), "answer": r["answer"]} for r in shipped_rows(3)]
    path = write(tmp_path / "chat.jsonl", rows)
    prepared = prepare_queries([{"path": str(path), "problem_field": "messages"}], tokenizer, PLAIN, 128)
    assert len(prepared.queries) == 3 and all(q.messages for q in prepared.queries)


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


def test_a_source_with_limit_0_is_named():
    with pytest.raises(DataError, match=r"train.jsonl: no rows to read \(limit: 0\); a source needs at least one row"):
        load_queries({"path": str(SHIPPED / "train.jsonl"), "limit": 0})


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
