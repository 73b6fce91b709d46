"""One row of a query source, checked (`data/rows.py`): a gold answer that no response can match or that shows
nothing, a problem of invisible characters only (issue 18 item 3), and a text cell among conversations (or a
conversation among text cells), refused by file, row and column instead of being rendered with the plain template
beside chat-rendered rows (issue 67). Built on the shipped toy model's tokenizer and training problems."""

from __future__ import annotations

import pytest
from helpers.data_rows import PLAIN, SHIPPED, chat, good, shipped_rows, write, write_lines
from transformers import AutoTokenizer

from erpo_lightning.data import DataError, load_queries, prepare_queries
from erpo_lightning.rewards import MathReward


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("\\boxed{", "the '{' at character 7 is never closed"),
        ("\\frac{1}{2", "the '{' at character 9 is never closed"),
        ("3}", "the '}' at character 2 closes no '{'"),
        ("\\boxed{ }", "its \\boxed{} is empty"),
    ],
)
def test_a_gold_answer_that_can_never_match_is_a_row_error(tmp_path, answer, why):
    path = write_lines(tmp_path / "golds.jsonl", [good("fine", "\\{1, 2\\}"), good("bad", answer), good("x", "{3}")])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 2, row 2, field 'answer': answer {answer!r} can never be matched: {why}" in str(error.value)
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.answer for q in queries] == ["\\{1, 2\\}", "{3}"] and skipped == {"unmatchable answer": 1}


NOTHING = "it shows nothing (only invisible characters, math delimiters or empty markup)"


@pytest.mark.parametrize(
    "answer", ["\u200b", "\ufeff", "\u200f \u200e", "\\text{}", "$$", "\\(\\)", "\\boxed{\\text{ }}"]
)
def test_a_gold_that_shows_nothing_is_a_row_error(tmp_path, answer):
    """Issue 30 item 9: such a gold passed validation, and no answer could ever match it."""
    path = write_lines(tmp_path / "golds.jsonl", [good("fine", "2"), good("bad", answer)])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 2, row 2, field 'answer': answer {answer!r} can never be matched: {NOTHING}" in str(
        error.value
    )
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.answer for q in queries] == ["2"] and skipped == {"unmatchable answer": 1}


@pytest.mark.parametrize("problem", ["\u200b", "\ufeff\u200d", " \u2060\u202e "])
def test_a_problem_of_invisible_characters_only_is_a_row_error(tmp_path, problem):
    path = write_lines(tmp_path / "problems.jsonl", [good("fine"), good(problem)])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    expected = (
        f"{path} line 2, row 2, field 'problem': problem is {problem!r} (empty, only invisible characters, or not text)"
    )
    assert expected in str(error.value)


def test_a_gold_with_invisible_characters_around_its_answer_can_be_matched(tmp_path):
    golds = ["\ufeff12", "1\u200b2", "\u200f\\frac{1}{2}\u200e", "x\u2060+1"]
    path = write_lines(tmp_path / "golds.jsonl", [good(f"p{i}", gold) for i, gold in enumerate(golds)])
    queries, _ = load_queries({"path": str(path)})
    answers = ["12", "12", "0.5", "1 + x"]
    with MathReward(num_workers=0) as reward:
        assert reward([f"\\boxed{{{a}}}" for a in answers], [q.answer for q in queries]) == [1.0] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED)


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
