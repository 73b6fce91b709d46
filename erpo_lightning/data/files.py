"""Rows of a local query file (.jsonl, .json, .csv, .parquet), each with the place it came from.

Text files are read here, line by line, rather than by `datasets`, so that whatever goes wrong names the file, the
row and the line: a row that cannot be read (a JSON syntax error, a value that is not an object, bytes that are not
UTF-8, more cells than the header) becomes a `RawRow` with an `error`, which `sources.load_queries` reports or, with
`skip_invalid`, skips and counts like any other bad row. A file with no rows, or a JSON array that does not parse,
is a `DataError` naming the file (and the line).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import datasets

# A byte that is not UTF-8 decodes (errors="surrogateescape") to U+DC80..U+DCFF; JSON's "\ud800" escapes give the
# other lone surrogates. No tokenizer accepts either.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class DataError(ValueError):
    """A source cannot be used as configured; the message says where and what to change."""


@dataclass(frozen=True)
class RawRow:
    """One row of a source, readable or not.

    Attributes:
        number: 1-based position among the source's rows (blank lines are not rows).
        line: 1-based line of the file where the row starts; None where rows have no line (parquet, a JSON array,
            a Hub dataset).
        values: column -> value; empty when `error` is set.
        error: (field or None, reason counted in the summary, detail) when the row cannot be used as read.
    """

    number: int
    line: int | None
    values: dict
    error: tuple[str | None, str, str] | None = None

    @property
    def position(self) -> str:
        """'line 5, row 3' (the editor's place first), or 'row 3' where rows have no line."""
        return (f"line {self.line}, " if self.line is not None else "") + f"row {self.number}"


@dataclass
class Table:
    """The rows of a source and the union of their columns, in first-seen order."""

    rows: list[RawRow]
    columns: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, rows: list[RawRow]) -> Table:
        columns: dict[str, None] = {}
        for row in rows:
            columns.update(dict.fromkeys(row.values))
        return cls(rows, list(columns))


def _bad_text(value: object) -> str | None:
    """The first string inside `value` (nested lists and dicts too) that is not valid Unicode text, else None."""
    if isinstance(value, str):
        return value if _LONE_SURROGATE.search(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _bad_text(key) or _bad_text(item)
        if found is not None:
            return found
    return None


def _encoding_error(values: dict) -> tuple[str, str, str] | None:
    """(field, reason, detail) for the first field holding text that is not UTF-8, else None."""
    for key, value in values.items():
        text = _bad_text(key) or _bad_text(value)
        if text is None:
            continue
        char = _LONE_SURROGATE.search(text).group()
        code = ord(char)
        what = f"byte 0x{code - 0xDC00:02x} is not UTF-8" if code >= 0xDC80 else f"lone surrogate U+{code:04X}"
        return str(key).encode("utf-8", "backslashreplace").decode(), "bad encoding", f"{what} (not valid text)"
    return None


def _decode(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 survive as lone surrogates, to be reported with their row."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read it ({error.strerror or error})") from None
    return data.decode("utf-8-sig", "surrogateescape")


def _json_value_row(number: int, line: int | None, value: object) -> RawRow:
    if not isinstance(value, dict):
        detail = f"a JSON {type(value).__name__} {json.dumps(value)[:40]}, not an object"
        return RawRow(number, line, {}, (None, "bad JSON", detail))
    try:
        return RawRow(number, line, value, _encoding_error(value))
    except RecursionError:
        return RawRow(number, line, {}, (None, "bad JSON", "values nested too deeply"))


def _jsonl_rows(text: str, limit: int | None) -> list[RawRow]:
    rows: list[RawRow] = []
    # Not str.splitlines: JSON strings may hold U+2028 and other characters that it takes for line breaks.
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if limit is not None and len(rows) >= limit:
            break
        number = len(rows) + 1
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            detail = f"JSON syntax error: {error.msg} at column {error.colno}"
            rows.append(RawRow(number, line_number, {}, (None, "bad JSON", detail)))
        except RecursionError:
            rows.append(RawRow(number, line_number, {}, (None, "bad JSON", "values nested too deeply")))
        else:
            rows.append(_json_value_row(number, line_number, value))
    return rows


def _json_rows(path: Path, text: str, limit: int | None) -> list[RawRow]:
    """A `.json` file: one array of objects, or JSON Lines."""
    if not text.lstrip().startswith("["):
        return _jsonl_rows(text, limit)
    try:
        items = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(
            f"{path} line {error.lineno}, column {error.colno}: JSON syntax error: {error.msg}. Fix the file "
            "(a .json file holds one array of objects, or one object per line)"
        ) from None
    except RecursionError:
        raise DataError(f"{path}: JSON values nested too deeply to read") from None
    items = items if limit is None else items[:limit]
    return [_json_value_row(number, None, item) for number, item in enumerate(items, start=1)]


def _csv_rows(path: Path, text: str, limit: int | None) -> list[RawRow]:
    """Every cell as text (an answer like "025" stays "025"); a missing cell is None."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        bad_header = _encoding_error({name: name for name in header})
        if bad_header is not None:
            raise DataError(f"{path} line 1 (the header), column {bad_header[0]!r}: {bad_header[2]}")
        rows: list[RawRow] = []
        next_line = reader.line_num + 1
        for record in reader:
            start, next_line = next_line, reader.line_num + 1
            if not any(cell.strip() for cell in record):
                continue
            if limit is not None and len(rows) >= limit:
                break
            number = len(rows) + 1
            if len(record) > len(header):
                detail = f"{len(record)} cells, the header names {len(header)}"
                rows.append(RawRow(number, start, {}, (None, "bad CSV", detail)))
                continue
            values = {name: record[i] if i < len(record) else None for i, name in enumerate(header)}
            rows.append(RawRow(number, start, values, _encoding_error(values)))
    except csv.Error as error:
        raise DataError(f"{path} line {reader.line_num}: CSV syntax error: {error}") from None
    return rows


def _parquet_rows(path: Path, limit: int | None) -> Table:
    try:
        table = datasets.load_dataset("parquet", data_files=str(path), split="train")
    except Exception as error:  # pyarrow raises a variety of types for a damaged file
        raise DataError(f"{path}: cannot read it as parquet ({type(error).__name__}: {str(error)[:200]})") from None
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    return Table([RawRow(number, None, row) for number, row in enumerate(table, start=1)], table.column_names)


def where_relative(path: Path) -> str:
    """For a relative `path`, where it was looked for: a newcomer who runs from another folder sees the cause."""
    if path.is_absolute():
        return ""
    return f" (looked for {Path.cwd() / path}: a relative path is read from the working directory {Path.cwd()})"


def read_local_file(path: Path, limit: int | None = None) -> Table:
    """The first `limit` rows (all when None) of a local `.jsonl`, `.json`, `.csv` or `.parquet` file.

    Raises:
        DataError when the file is missing, unreadable, empty or not parseable as a whole.
    """
    if not path.is_file():
        raise DataError(f"{path}: no such file{where_relative(path)}")
    if path.suffix == ".parquet":
        table, what = _parquet_rows(path, limit), "a table without rows"
    else:
        text = _decode(path)
        what = "the file is empty" if not text.strip() else "only a header" if path.suffix == ".csv" else "no records"
        if path.suffix == ".csv":
            table = Table.of(_csv_rows(path, text, limit))
        elif path.suffix == ".json":
            table = Table.of(_json_rows(path, text, limit))
        else:
            table = Table.of(_jsonl_rows(text, limit))
    if not table.rows and limit != 0:
        raise DataError(f"{path}: no rows to read ({what}); a source needs at least one row")
    return table
