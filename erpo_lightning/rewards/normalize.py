"""String normalization of an extracted answer: presentation-only LaTeX is removed.

Two levels: :func:`normalize_answer` for a whole answer (delimiters, spacing macros,
thousands separators, ``\\dfrac``...), :func:`normalize_leaf` for one atomic item of an answer
(units, percent and degree signs, text wrappers), which also reports what it removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\\(?:displaystyle|textstyle|limits)(?![A-Za-z])", ""),
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg)(?![A-Za-z])\.?", ""),
        (r"\\\$|\\euro|€|£", ""),
        (r"(?<!\\)\\[()\[\]]|\$", " "),
        (r"(\d)\s*\{,\}\s*(?=\d{3})", r"\1"),
        (r"(\d),\\!\s*(?=\d)", r"\1"),
        (r"\\q?quad|(?<!\\)\\[!,;: ]|~", " "),
        (r"\\text(?:normal|rm)?\{\s*(and|or)\s*\}", r" \1 "),
        (r"\\text(?:normal|rm)?\{\s*,\s*\}", ", "),
        (r"\\[dtc]frac(?![A-Za-z])", r"\\frac"),
        (r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}"),
        (r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{"),
        (r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}"),
        (r"\\frac\s+\{", r"\\frac{"),
        (r"\\sqrt\s*(\d+|[A-Za-z])(?![A-Za-z])", r"\\sqrt{\1}"),
        (r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])|\^\s*\{?\s*\\text\{\s*o\s*\}\s*\}?", "°"),
        (r"\\%", "%"),
        (r"\\(?:le|leqslant)(?![A-Za-z])", r"\\leq"),
        (r"\\(?:ge|geqslant)(?![A-Za-z])", r"\\geq"),
        (r"\\(?:neq|ne)(?![A-Za-z])", "!="),
        (r"^\s*[A-Za-z]\s*\\in\s+", ""),
        (r"\s+", " "),
    )
)
_TRAILING = re.compile(r"(?:\s|\.|\\(?![A-Za-z{}()\[\]]))+$")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])")

_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|textnormal|textrm|mathrm|mathbf|mathit|mathcal|mathsf|mbox|rm)"
    r"\s*\{([^{}]*)\}"
)
_TEXT_UNIT = re.compile(r"\s*\\(?:text|textnormal|textrm|mathrm|mbox)\s*\{[^{}\d]*\}\s*(?:\^\s*\{?\d\}?)?$")
_WORD_UNIT = re.compile(r"(?<=\d)(?:\s+[A-Za-z]{2,}|\s*[A-Za-z]{3,})(?:\s+[A-Za-z]+)*(?:\^\s*\{?\d\}?)?$")
_PERCENT = re.compile(r"\s*(?:%|\bpercent(?:age)?\b|\bpct\b)\s*$", re.IGNORECASE)
_DEGREE = re.compile(r"\s*°\s*$")
_CHOICE = re.compile(r"\(([A-Z])\)")


def normalize_answer(text: str) -> str:
    """Remove presentation-only LaTeX from a whole answer; keep its mathematical content."""
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
    return _TRAILING.sub("", text).strip()


@dataclass(frozen=True)
class Leaf:
    """One atomic answer item after normalization, with the signs stripped from it."""

    text: str
    percent: bool = False
    degrees: bool = False


def _unwrap_text(text: str) -> str:
    while (unwrapped := _TEXT_WRAPPER.sub(r"\1", text)) != text:
        text = unwrapped
    return text


def normalize_leaf(text: str) -> Leaf:
    """Normalize one item: drop trailing units, percent/degree signs and text wrappers."""
    text = text.strip()
    stripped = _TEXT_UNIT.sub("", text)
    if stripped.strip() and not stripped.strip().startswith("\\text"):
        text = stripped
    text = _unwrap_text(text).strip()
    text = _WORD_UNIT.sub("", text)
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text)
    degrees = bool(_DEGREE.search(text))
    text = _DEGREE.sub("", text)
    if choice := _CHOICE.fullmatch(text):
        text = choice.group(1)
    return Leaf(text.strip(), percent, degrees)
