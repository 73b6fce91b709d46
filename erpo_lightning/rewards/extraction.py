"""Pull the final answer out of a model response (or out of a reference solution).

Order of preference for a response: the last group of ``\\boxed{}``/``\\fbox{}`` (none when a box just
before it is offered as an alternative: ``\\boxed{7} or perhaps \\boxed{19}``); then the
configured textual fallbacks ("The final answer is X", "Answer: X", a closing "Therefore, ... X");
then, for a short response only, the whole text as a bare answer. Everything here is linear-time
regex work: no parsing of the answer itself happens in this module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from erpo_lightning.rewards.normalize import strip_invisible
from erpo_lightning.rewards.sentences import reduce_to_answer, sentence_prefix

DEFAULT_FALLBACKS: tuple[str, ...] = ("final_answer", "answer_label", "conclusion")
# How an answer was found: one box, several boxes read as a list, a textual marker, the whole short response.
Source = Literal["box", "boxes", "marker", "bare", "none"]
BARE_MAX_CHARS = 200

_MARKERS: dict[str, re.Pattern[str]] = {
    "final_answer": re.compile(r"final\s+answer\**\s*(?:is\b|:)\s*:?\**", re.IGNORECASE),
    "answer_label": re.compile(
        r"\banswer\**\s*(?:is\b|:)\s*:?\**|(?:^|\n)[ \t*#]*answer\**[ \t]*(?=[$\\])", re.IGNORECASE
    ),
}
# Conclusion sentences are used only when no explicit answer marker is present.
_CONCLUSION = re.compile(r"(?<!\S)(?:Therefore|Thus|Hence|So|THEREFORE)\b,?")
_THINK_CLOSE = "</think>"
_CHAT_TOKEN = re.compile(r"<\|[A-Za-z0-9_]+\|>")
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)
# Text allowed between two boxes that together form one answer ("\boxed{1} and \boxed{2}").
_CONNECTOR = re.compile(
    r"(?:\s|[,;$&.]|\\[()\[\]]|\\q?quad(?![A-Za-z])|\\[,;:! ]|\\text\{[^{}]{0,30}\}"
    r"|\band\b|\bor\b|[A-Za-z](?:_\{?\w+\}?)?\s*=)*"
)
_CONNECTOR_MAX_CHARS = 60
# Words that, between two boxes, offer the second value as an alternative to the first ("\boxed{7} or perhaps
# \boxed{19}"); a correction ("Wait, that is wrong: ... \boxed{19}") uses none of them and keeps the last box.
_BOX_HEDGE = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|alternatively)\b", re.IGNORECASE)
# Test literals and JSON round trips sometimes double every backslash ("\\frac{1}{2}").
_DOUBLED_COMMAND = re.compile(
    r"(?<!\\)\\\\(?:boxed|fbox|frac|dfrac|tfrac|sqrt|text|left|right|begin|end|pi|cdot|times|infty"
    r"|leq?|geq?|pm|mathrm|cup|quad)(?![A-Za-z])"
)
_BACKSLASH_RUN = re.compile(r"\\\\(\\\\)?")


def has_doubled_commands(text: str) -> bool:
    """Whether ``text`` writes LaTeX commands with doubled backslashes (``\\\\frac``)."""
    return _DOUBLED_COMMAND.search(text) is not None


def clean_text(text: str | bytes, undouble: bool = True, invisible: bool = True) -> str:
    """Make untrusted text safe to regex: decode bytes, replace lone surrogates, undouble ``\\\\`` (``undouble``),
    drop the characters that print as nothing (``invisible``: zero-width, direction marks, BOM)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    if invisible:
        text = strip_invisible(text)
    if undouble and _DOUBLED_COMMAND.search(text):
        text = _BACKSLASH_RUN.sub(lambda m: "\\\\" if m.group(1) else "\\", text)
    return text


def strip_reasoning(text: str) -> str:
    """Keep what follows the last ``</think>`` and drop anything after a chat-template token."""
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    text = text.lstrip()
    while (lead := _CHAT_TOKEN.match(text)) is not None:
        text = text[lead.end() :].lstrip()
    end = _CHAT_TOKEN.search(text)
    return text[: end.start()] if end else text


def _matching_braces(text: str) -> dict[int, int]:
    """Map the index of every unescaped ``{`` to the index of its matching ``}``."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text):
        token = m.group()
        if token == "{":
            stack.append(m.start())
        elif token == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def find_boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Top-level boxes as ``(start, end, content)``; content is None for an unterminated box."""
    pairs = _matching_braces(text)
    boxes: list[tuple[int, int, str | None]] = []
    for m in _BOX_START.finditer(text):
        if boxes and m.start() < boxes[-1][1]:
            continue  # nested inside the previous box
        close = pairs.get(m.end() - 1)
        if close is None:
            boxes.append((m.start(), len(text), None))
            break  # an unterminated box swallows the rest of the text
        boxes.append((m.start(), close + 1, text[m.end() : close]))
    return boxes


def _last_box_group(text: str, boxes: list[tuple[int, int, str | None]], join: bool = True) -> list[str] | None:
    """Contents of the last box and (when ``join``) of the boxes chained to it by connector text only.

    None when the last box is empty or unterminated, or when the box just before the group holds another value and
    the short text between them hedges (``\\boxed{7} or perhaps \\boxed{19}``, ``\\boxed{7}. Hmm, maybe
    \\boxed{19}``): like prose that offers two values, that is no answer.
    """
    start, _, content = boxes[-1]
    if content is None or not content.strip():
        return None
    group = [content]
    first = len(boxes) - 1  # the group's earliest box
    while join and first > 0:
        _, prev_end, prev_content = boxes[first - 1]
        between = text[prev_end:start]
        if len(between) > _CONNECTOR_MAX_CHARS or not _CONNECTOR.fullmatch(between):
            break
        group.append(prev_content or "")
        first -= 1
        start = boxes[first][0]
    if first > 0 and _offers_another_value(text[boxes[first - 1][1] : start], boxes[first - 1][2], group):
        return None
    return [c for c in reversed(group) if c.strip()]


def _offers_another_value(between: str, previous: str | None, group: list[str]) -> bool:
    """Whether a box holding ``previous``, followed by ``between`` and then the boxes of ``group``, offers a second
    value as an alternative: ``between`` is short and hedges, and ``previous`` is not already in the group."""
    if previous is None or not previous.strip() or len(between) > _CONNECTOR_MAX_CHARS:
        return False
    return _BOX_HEDGE.search(between) is not None and previous.strip() not in {c.strip() for c in group}


def _read_through_boxes(content: str, levels: int = 3) -> str:
    """``\\boxed{\\boxed{8}}`` reads as ``8``: a box that holds exactly one box, and nothing else, is read through
    (a few ``levels`` deep; deeper nesting is left for the depth bound)."""
    for _ in range(levels):
        inner = content.strip()
        boxes = find_boxes(inner)
        if len(boxes) != 1 or boxes[0][2] is None or (boxes[0][0], boxes[0][1]) != (0, len(inner)):
            break
        content = boxes[0][2]
    return content


def _from_markers(text: str, fallbacks: Sequence[str]) -> str | None:
    """Answer after the last configured textual marker, or None."""
    last: re.Match[str] | None = None
    for name in fallbacks:
        pattern = _MARKERS.get(name)
        for m in pattern.finditer(text) if pattern else ():
            if last is None or m.end() > last.end():
                last = m
    if last is None and "conclusion" in fallbacks:
        text = text[-4000:]  # a conclusion is only looked for near the end
        conclusions = list(_CONCLUSION.finditer(text))
        last = conclusions[-1] if conclusions else None
    if last is None:
        return None
    return reduce_to_answer(sentence_prefix(text[last.end() :]))


def _unknown_fallbacks(fallbacks: Sequence[str]) -> list[str]:
    return [f for f in fallbacks if f not in _MARKERS and f != "conclusion"]


def extract_answer(
    response: str | bytes,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    bare_max_chars: int = BARE_MAX_CHARS,
    join_boxes: bool = True,
) -> str | None:
    """The final answer of a model response, or None when it has none.

    The last ``\\boxed{}`` wins (with ``join_boxes``, several boxes joined only by connectors such as
    ", " or "\\quad and" form one list answer); an empty or unterminated last box gives None, and so does a box
    offered as an alternative to the box before it (``_offers_another_value``). Without a
    box, the configured ``fallbacks`` (names: ``final_answer``, ``answer_label``, ``conclusion``)
    are tried, and a response of at most ``bare_max_chars`` characters is a bare answer.
    """
    return extract_final(response, fallbacks, bare_max_chars, join_boxes)[0]


def extract_final(
    response: str | bytes,
    fallbacks: Sequence[str],
    bare_max_chars: int,
    join_boxes: bool,
    undouble: bool = True,
    invisible: bool = True,
) -> tuple[str | None, Source]:
    """:func:`extract_answer`, and how the answer was found (``undouble``, ``invisible``: see :func:`clean_text`)."""
    if unknown := _unknown_fallbacks(fallbacks):
        raise ValueError(f"unknown answer fallbacks: {unknown}")
    text = strip_reasoning(clean_text(response, undouble, invisible))
    boxes = find_boxes(text)
    if boxes:
        # An explicit answer marker written after the last box restates the final answer.
        markers = [f for f in fallbacks if f != "conclusion"]
        restated = _from_markers(text[boxes[-1][1] :], markers)
        if restated and any(c.isdigit() or c == "\\" for c in restated):
            return restated, "marker"
        group = _last_box_group(text, boxes, join_boxes)
        if not group:
            return None, "none"
        return ", ".join(map(_read_through_boxes, group)), "boxes" if len(group) > 1 else "box"
    answer = _from_markers(text, fallbacks)
    if answer:
        return answer, "marker"
    text = text.strip()
    if not text or len(text) > bare_max_chars:
        return None, "none"
    return reduce_to_answer(text, allow_number=False), "bare"


def extract_gold(gold: str) -> str:
    """The reference answer inside a gold string, leniently (golds are trusted).

    Every box of the gold counts (deduplicated, in order); an unterminated box runs to the end.
    A long gold without a box goes through the textual fallbacks; otherwise it is taken whole.
    """
    return extract_gold_parts(gold)[0]


def extract_gold_parts(
    gold: str, join_boxes: bool = True, undouble: bool = True, invisible: bool = True
) -> tuple[str, bool]:
    """:func:`extract_gold` (only its last box unless ``join_boxes``), and whether it joins several boxes."""
    text = strip_reasoning(clean_text(gold, undouble, invisible))
    contents: list[str] = []
    for start, end, content in find_boxes(text):
        body = content if content is not None else text[start:end].split("{", 1)[1]
        if body.strip() and body not in contents:
            contents.append(body)
    if contents:
        return (", ".join(contents), len(contents) > 1) if join_boxes else (contents[-1], False)
    if len(text.strip()) > BARE_MAX_CHARS:
        answer = _from_markers(text, ("final_answer", "answer_label"))
        if answer:
            return answer, False
    return text.strip(), False
