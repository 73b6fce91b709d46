"""Rows of a local query file (`data/files.py`), each error naming the file, row, line and field (issue 18 item 3): a
file without rows, bytes that are not UTF-8 (or skipped and counted), a JSON syntax error; and a missing file named
with the working directory (issue 54 item 14)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.data_rows import good, write_lines

from erpo_lightning.data import DataError, load_queries
from erpo_lightning.data.files import read_local_file


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("empty.jsonl", b"", "the file is empty"),
        ("blank.jsonl", b"\n  \n\n", "the file is empty"),
        ("empty.json", b"[]", "no records"),
        ("header.csv", b"problem,answer\n", "only a header"),
    ],
)
def test_a_file_without_rows_is_an_error_naming_it(tmp_path, name, content, why):
    path = tmp_path / name
    path.write_bytes(content)
    for skip_invalid in (False, True):
        with pytest.raises(DataError) as error:
            load_queries({"path": str(path)}, skip_invalid=skip_invalid)
        assert str(error.value) == f"{path}: no rows to read ({why}); a source needs at least one row"


def test_a_byte_that_is_not_utf8_names_file_row_line_and_field_and_can_be_skipped(tmp_path):
    path = write_lines(tmp_path / "enc.jsonl", [good("a"), b"", b'{"problem": "b\xff", "answer": "2"}', good("c")])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 3, row 2, field 'problem': byte 0xff is not UTF-8" in str(error.value)
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["a", "c"] and skipped == {"bad encoding": 1}
    assert [q.row for q in queries] == [1, 3]

    csv_path = tmp_path / "enc.csv"
    csv_path.write_bytes(b'problem,answer\nfine,1\n"two\nlines",2\nbad,\xe9\n')
    with pytest.raises(DataError, match=rf"{csv_path} line 5, row 3, field 'answer': byte 0xe9 is not UTF-8"):
        load_queries({"path": str(csv_path)})
    queries, skipped = load_queries({"path": str(csv_path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["fine", "two\nlines"] and skipped == {"bad encoding": 1}


def test_a_json_syntax_error_names_file_row_line_and_column(tmp_path):
    deep = b'{"problem": ' + b"[" * 100_000 + b"]" * 100_000 + b', "answer": "1"}'
    lines = [good("a"), b'{"problem": "b", "answer": 2,, }', b"[1, 2]", deep]
    path = write_lines(tmp_path / "broken.jsonl", lines)
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    message = str(error.value)
    assert message.startswith(f"3 invalid row(s) in {path}:")
    assert f"{path} line 2, row 2: JSON syntax error: Expecting property name enclosed in double quotes at " in message
    assert f"{path} line 3, row 3: a JSON list [1, 2], not an object" in message
    assert f"{path} line 4, row 4: values nested too deeply" in message
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["a"] and skipped == {"bad JSON": 3}

    array = tmp_path / "broken.json"
    array.write_text('[\n  {"problem": "a", "answer": "1"},\n  {"problem": "b" "answer": "2"}\n]')
    with pytest.raises(DataError, match=rf"^{array} line 3, column 19: JSON syntax error: Expecting ','"):
        load_queries({"path": str(array)}, skip_invalid=True)  # the array as a whole does not parse


def test_a_missing_data_file_names_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as raised:
        read_local_file(Path("data") / "train.jsonl")
    message = str(raised.value)
    assert message.startswith("data/train.jsonl: no such file")
    assert str(tmp_path / "data" / "train.jsonl") in message and f"working directory {tmp_path}" in message
