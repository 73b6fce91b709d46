"""Split a normalized answer into its structure: lists, sets, tuples/intervals, matrices, leaves.

``"(1,2), (3,4)"`` becomes an unordered list of two ordered pairs; ``"\\{1, 2\\}"`` a set;
``"[0, 1)"`` an interval-shaped pair; a pmatrix a matrix of rows. Anything else is a leaf
string that the comparison layer normalizes and compares as one value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from erpo_lightning.rewards.normalize import normalize_answer

_TOKEN = re.compile(
    r"\\begin\{[^{}]*\}|\\end\{[^{}]*\}|\\[{}]|[()\[\]{}]|[,;]|(?<![<>!:=])=(?!=)"
    r"|(?<![A-Za-z\\])(?:and|or)(?![a-z])"
)
_OPEN = {"(", "[", "{", "\\{"}
_CLOSE = {")", "]", "}", "\\}"}
# One environment: its body holds no other \\begin or \\end (``A + B`` of two matrices is not one matrix).
_MATRIX = re.compile(
    r"\\begin\{([pbvBV]?matrix|array|smallmatrix)\}(?:\{[^{}]*\})?((?:(?!\\(?:begin|end)\{).)*)\\end\{\1\}", re.DOTALL
)
_PLUS_MINUS = re.compile(r"\\(?:pm|mp)(?![A-Za-z])")
_MAX_ITEMS = 200


@dataclass(frozen=True)
class Seq:
    """A compound answer: ``kind`` is list, set, matrix, vector, row or a bracket pair."""

    kind: str
    items: tuple[Node, ...]
    text: str


Node = Seq | str


def split_top(text: str, separators: frozenset[str]) -> list[str]:
    """Split ``text`` at the given separator tokens that are outside every bracket."""
    parts: list[str] = []
    depth, start = 0, 0
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token in _OPEN or token.startswith("\\begin"):
            depth += 1
        elif token in _CLOSE or token.startswith("\\end"):
            depth = max(depth - 1, 0)
        elif depth == 0 and token in separators:
            parts.append(text[start : m.start()])
            start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts]


_LIST_SEPARATORS = frozenset({",", "and", "or"})
_TUPLE_SEPARATORS = frozenset({",", ";"})


def _closing_index(text: str) -> int:
    """Index of the bracket closing ``text[0]`` (intervals may close with the other shape)."""
    depth = 0
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token in _OPEN or token.startswith("\\begin"):
            depth += 1
        elif token in _CLOSE or token.startswith("\\end"):
            depth -= 1
            if depth == 0:
                return m.end() - 1
    return -1


def _matrix(body: str, text: str, plus_minus: bool) -> Seq:
    rows = [r for r in re.split(r"\\\\", body) if r.strip()]
    cells = [[c.strip() for c in row.split("&")] for row in rows]
    if cells and all(len(row) == 1 for row in cells):
        return Seq("vector", tuple(parse_item(row[0], plus_minus) for row in cells), text)
    rows_ = (Seq("row", tuple(parse_item(c, plus_minus) for c in row), text) for row in cells)
    return Seq("matrix", tuple(rows_), text)


def parse_item(text: str, plus_minus: bool = True) -> Node:
    """Structure of one item (no top-level list separators left in it); ``plus_minus``: expand ``\\pm`` items."""
    text = text.strip()
    if m := _MATRIX.fullmatch(text):
        return _matrix(m.group(2), text, plus_minus)
    if text.startswith("\\{") and text.endswith("\\}") and _closing_index(text) == len(text) - 1:
        items = _items(text[2:-2], _TUPLE_SEPARATORS, plus_minus)
        return Seq("set", tuple(parse_item(i, plus_minus) for i in items), text)
    if text[:1] in "([{" and text[-1:] in ")]}" and _closing_index(text) == len(text) - 1:
        inner = split_top(text[1:-1], _TUPLE_SEPARATORS)
        if text[0] == "{" or text[-1] == "}":
            items = _items(text[1:-1], _TUPLE_SEPARATORS, plus_minus)
            return Seq("set", tuple(parse_item(i, plus_minus) for i in items), text)
        if len(inner) == 1:
            inside = parse_item(inner[0], plus_minus)
            return inside if isinstance(inside, Seq) or text[0] == "(" else text
        return Seq(text[0] + text[-1], tuple(parse_item(i, plus_minus) for i in inner), text)
    return text


def _items(text: str, separators: frozenset[str], plus_minus: bool = True) -> list[str]:
    """Non-empty top-level items, each ``\\pm`` item expanded into its two values when ``plus_minus``."""
    items: list[str] = []
    for item in split_top(text, separators)[:_MAX_ITEMS]:
        if not item:
            continue
        if plus_minus and len(_PLUS_MINUS.findall(item)) == 1:
            items += [_PLUS_MINUS.sub("+", item), _PLUS_MINUS.sub("-", item)]
        else:
            items.append(item)
    return items


def parse_answer(text: str, thousands: bool = True, plus_minus: bool = True) -> Node:
    """Structure of a whole answer; several top-level items form an unordered list.

    ``thousands``: remove thousands separators first; ``plus_minus``: expand ``\\pm`` items into two values.
    """
    text = normalize_answer(text, thousands)
    groups = split_top(text, frozenset({";"}))
    if len(groups) > 1:
        nodes = [
            Seq("()", tuple(parse_item(p, plus_minus) for p in parts), g)
            if len(parts := _items(g, _LIST_SEPARATORS, plus_minus)) > 1
            else parse_item(g, plus_minus)
            for g in groups
            if g
        ]
    else:
        nodes = [parse_item(item, plus_minus) for item in _items(text, _LIST_SEPARATORS, plus_minus)]
    if len(nodes) == 1:
        return nodes[0]
    return Seq("list", tuple(nodes), text)
