"""One row of a query source, checked: its problem (text or a conversation), its gold answer (one a response can
match), its id (unique in the source) and the extra columns it carries to the reward.

`sources.load_queries` calls `check_columns` once per source, with the source's field map as `RowFields`, then
`row_issue` per row; each issue is a (field, reason counted in the skip summary, detail) triple, so one bad row is
reported, or skipped, without losing the rest.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from erpo_lightning.data.files import DataError, RawRow
from erpo_lightning.rewards.normalize import shows_nothing, strip_invisible


def _answer_text(value: object, transform: str | None) -> str | None:
    """The gold answer as text, or None when it is not usable. Numbers are written as text, lists need `first`."""
    if transform == "first" and isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    if transform == "after_hash":
        value = value.rsplit("####", 1)[-1] if "####" in value else ""
    return value.strip() or None


def unmatchable_answer(answer: str) -> str | None:
    """Why the gold `answer` can never be matched, or None when it can.

    The grader compares the gold with a response's final answer, which comes from a brace-balanced `\\boxed{...}`:
    a gold with an unclosed `{` or a stray `}` (e.g. an unterminated `\\boxed{`) equals no such answer, nor does an
    empty `\\boxed{}`, nor a gold that shows nothing once the grader has removed invisible characters, math
    delimiters and empty markup (`\\u200b`, `$$`, `\\text{}`). Escaped braces `\\{`, `\\}` are text, not groups.
    """
    open_at: list[int] = []
    position = 0
    while position < len(answer):
        char = answer[position]
        if char == "\\":
            position += 2  # an escaped character (`\\{`, `\\}`, `\\\\`) or the first letter of a command
            continue
        if char == "{":
            open_at.append(position)
        elif char == "}":
            if not open_at:
                return f"the '}}' at character {position + 1} closes no '{{'"
            open_at.pop()
        position += 1
    if open_at:
        return f"the '{{' at character {open_at[-1] + 1} is never closed"
    if re.search(r"\\(?:boxed|fbox)\s*\{\s*\}", answer):
        return "its \\boxed{} is empty"
    if shows_nothing(answer):
        return "it shows nothing (only invisible characters, math delimiters or empty markup)"
    return None


@dataclass(frozen=True)
class RowFields:
    """Which column of a source holds each part of a row (its `SourceSpec`'s field map).

    Attributes:
        problem: the problem's column (None: "problem").
        answer: the gold answer's column; None for a source without golds.
        id: the stable id's column (None: "id" when the source has that column, else a hash of the problem).
        answer_transform: "first" (element 0 of a list answer), "after_hash" (the text after the last "####") or None.
        carried: the extra columns carried with each query to the reward.
    """

    problem: str | None = None
    answer: str | None = "answer"
    id: str | None = None
    answer_transform: str | None = None
    carried: tuple[str, ...] = ()


def check_columns(columns: list[str], fields: RowFields, where: str) -> RowFields:
    """`fields` with the problem and id columns resolved against the source's `columns`; DataError naming the first
    column `fields` names that the source lacks. A source whose rows could not be read (no `columns`) is not checked:
    each row is reported on its own."""
    problem = fields.problem or "problem"
    id_column = fields.id if fields.id is not None else ("id" if "id" in columns else None)
    resolved = replace(fields, problem=problem, id=id_column)
    if not columns:
        return resolved
    for key, column in (("problem_field", problem), ("answer_field", fields.answer), ("id_field", id_column)):
        if column is not None and column not in columns:
            raise DataError(f"{where}: no column {column!r} ({key}); its columns are {columns}. Set {key}.")
    for column in fields.carried:
        if column not in columns:
            raise DataError(f"{where}: no column {column!r} (named in columns); its columns are {columns}")
    return resolved


def _carried(row: RawRow, columns: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, str, str] | None]:
    """The values of the named `columns` in `row`, and the issue of the first one it has no value in (or None)."""
    values = {}
    for column in columns:
        value = row.values.get(column)
        if value is None:
            return {}, (column, "missing column", f"no value in column {column!r} (named in columns)")
        values[column] = value
    return values, None


CHAT_ROLES = ("system", "user", "assistant", "tool")


def conversation_issue(turns: list) -> str | None:
    """Why a conversational cell (a list of {role, content} turns) cannot be a prompt, or None when it can: every
    turn must be a mapping with a known `role` and a text `content`, and the last must be the user's (the policy
    answers it)."""
    if not turns:
        return "the conversation has no turns"
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or "content" not in turn:
            return f"turn {number} is {turn!r:.60}, not a {{role, content}} mapping"
        if turn["role"] not in CHAT_ROLES:
            return f"turn {number} has role {turn['role']!r:.30}; roles are {', '.join(CHAT_ROLES)}"
        if not isinstance(turn["content"], str):
            return f"turn {number} has content {turn['content']!r:.40}, not text"
    if turns[-1]["role"] != "user":
        return f"the last turn is the {turns[-1]['role']}'s; a prompt ends with a user turn"
    return None


def _problem_of(value: object) -> tuple[str | None, tuple[dict, ...] | None, str | None]:
    """(problem text, conversation turns or None, why the cell is unusable or None) of a problem cell: a text, or a
    list of turns whose last (user) turn is the problem text."""
    messages = None
    if isinstance(value, list):
        why = conversation_issue(value)
        if why is not None:
            return None, None, why
        messages = tuple({"role": turn["role"], "content": turn["content"]} for turn in value)
        value = messages[-1]["content"]
    if not isinstance(value, str) or not strip_invisible(value).strip():
        return None, None, f"problem is {value!r:.60} (empty, only invisible characters, or not text)"
    return value, messages, None


@dataclass(frozen=True)
class ProblemKinds:
    """How a source's problem column is filled: the rows holding text and those holding a valid conversation
    (1-based row numbers; rows that could not be read, and malformed conversations, which are bad rows of their own,
    left out). A column holds one kind: the rows of the other kind (the
    fewer; text on a tie) are bad rows, since each kind is rendered with its own template."""

    column: str
    text_rows: frozenset[int] = frozenset()
    conversation_rows: frozenset[int] = frozenset()

    @classmethod
    def of(cls, rows: list[RawRow], column: str) -> ProblemKinds:
        cells = [(row.number, row.values.get(column)) for row in rows if row.error is None]
        return cls(
            column,
            frozenset(number for number, cell in cells if isinstance(cell, str)),
            frozenset(number for number, cell in cells if isinstance(cell, list) and conversation_issue(cell) is None),
        )

    def issue(self, row: RawRow) -> tuple[str, str, str] | None:
        """The issue of `row` when its cell is of the column's minority kind, else None."""
        if not self.text_rows or not self.conversation_rows:
            return None
        text_is_odd = len(self.text_rows) <= len(self.conversation_rows)
        odd, usual = (
            (self.text_rows, self.conversation_rows) if text_is_odd else (self.conversation_rows, self.text_rows)
        )
        if row.number not in odd:
            return None
        if text_is_odd:
            what = "text, while"
            usual_kind, fix = "conversations", "write it as a list of turns, [{role: user, content: ...}]"
        else:
            what = "a conversation, while"
            usual_kind, fix = "text", "write it as the problem text"
        detail = (
            f"problem is {what} {len(usual)} other row(s) of column {self.column!r} hold {usual_kind} (first: row "
            f"{min(usual)}); a column holds one kind, since text is rendered with the plain template and a "
            f"conversation with the chat template: {fix}"
        )
        return self.column, "mixed problem kinds", detail


def _gold_issue(raw_answer: object, fields: RowFields):
    """(gold answer text, None), or (None, None) for a source without golds, or (None, issue) for an unusable one."""
    answer_field = fields.answer
    if answer_field is None:
        return None, None
    answer = _answer_text(raw_answer, fields.answer_transform)
    if answer is None:
        return None, (answer_field, "bad answer", f"answer is {raw_answer!r:.60} (missing, empty or not text)")
    why = unmatchable_answer(answer)
    if why is not None:
        return None, (answer_field, "unmatchable answer", f"answer {answer!r:.60} can never be matched: {why}")
    return answer, None


def row_issue(
    row: RawRow,
    fields: RowFields,
    label: str,
    seen: dict,
    kinds: ProblemKinds | None = None,
):
    """((id, problem, answer, carried columns, messages), None) for a usable row, else (None, (field, reason counted
    in the summary, detail)). `fields`: as `check_columns` resolved them. `kinds`: the source's problem column as a
    whole, which refuses a row of the kind (text or conversation) its other rows are not."""
    if row.error is not None:
        return None, row.error
    problem_field, answer_field, id_field = fields.problem, fields.answer, fields.id
    problem, messages, why = _problem_of(row.values.get(problem_field))
    if why is not None:
        return None, (problem_field, "bad problem", why)
    mixed = kinds.issue(row) if kinds is not None else None
    if mixed is not None:
        return None, mixed
    answer, issue = _gold_issue(row.values.get(answer_field) if answer_field else None, fields)
    if issue is not None:
        return None, issue
    hashed = problem if messages is None else json.dumps(messages, ensure_ascii=False, sort_keys=True)
    raw_id = row.values.get(id_field) if id_field else hashlib.sha256(hashed.encode()).hexdigest()[:16]
    if raw_id is None or str(raw_id).strip() == "":
        return None, (id_field, "bad id", f"id is {raw_id!r}")
    query_id = f"{label}/{raw_id}"
    if query_id in seen:
        same = "same id" if id_field else "same problem text"
        detail = f"duplicate id {query_id!r} ({same} as row {seen[query_id]})"
        return None, (id_field or problem_field, "duplicate id", detail)
    carried, issue = _carried(row, fields.carried)
    return (None, issue) if issue is not None else ((query_id, problem, answer, carried, messages), None)
