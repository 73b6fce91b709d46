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
        ("\u2212", "-"),  # the Unicode minus sign
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg)(?![A-Za-z])\.?", ""),
        (r"\\\$|\\euro|€|£", ""),
        (r"(?<!\\)\\[()\[\]]|\$", " "),
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
_THOUSANDS_MARKUP: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(\d)\s*\{\s*,\s*\}\s*(?=\d{3})"), r"\1"),
    (re.compile(r"(\d),\\!\s*(?=\d)"), r"\1"),
)
_TRAILING = re.compile(r"(?:\s|\.|\\(?![A-Za-z{}()\[\]]))+$")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])")
# Groups of three digits set apart by spaces (`1 000`, `10\,080` once `\,` is a space); `1 9` is no such number.
_SPACED_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d.])")
THOUSANDS_SEPARATOR = re.compile(
    r"\d\s*\{\s*,\s*\}\s*\d{3}|\d,\\!\s*\d|\d\\,\s*\d{3}(?!\d)|(?<![\d.])\d{1,3} \d{3}(?![\d.])|" + _THOUSANDS.pattern
)

_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|textnormal|textrm|mathrm|mathbf|mathit|mathcal|mathsf|mbox|rm)"
    r"\s*\{([^{}]*)\}"
)
_TEXT_UNIT = re.compile(r"\s*\\(?:text|textnormal|textrm|mathrm|mbox)\s*\{([^{}\d]*)\}\s*(?:\^\s*\{?\d\}?)?$")
_WORD_UNIT = re.compile(r"(?<=[\d}])(?:\s+[A-Za-z]{2,}|\s*[A-Za-z]{3,})(?:\s+[A-Za-z]+)*(?:\^\s*\{?\d\}?)?$")
_UNIT_WORD = re.compile(r"[A-Za-z']+")
# Words that make the text after a number a comment on it, not its unit: a retraction ("8 is wrong"), a bound ("8 or
# more", "8 at most") or a hedge ("8 or maybe 9"). "8 more" (for "how many more") is a count and its word, as before.
_NOT_UNIT_WORDS = frozenset(
    "is isn't are aren't was were be been being equals equal seems not no none never nor wrong wrongly incorrect "
    "false invalid mistake error or and either else otherwise unless except if but maybe perhaps possibly probably "
    "likely unlikely greater larger bigger smaller higher lower at least most than over under above "
    "below about around approximately approx roughly nearly almost up to until till plus minus".split()
)
_PERCENT = re.compile(r"\s*(?:%|\bpercent(?:age)?\b|\bpct\b)\s*$", re.IGNORECASE)
_DEGREE = re.compile(r"\s*°\s*$")
_CHOICE = re.compile(r"\(([A-Z])\)")
# Characters that print as nothing: soft hyphen, zero-width space/joiners, direction marks and embeddings, word
# joiner and invisible operators, byte-order mark, variation selectors, tag characters.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufe00-\ufe0f\ufeff"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)
_EMPTY_MARKUP = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])|[{}\s]")


def strip_invisible(text: str) -> str:
    """``text`` without the characters that print as nothing (zero-width, direction marks, BOM...)."""
    return _INVISIBLE.sub("", text)


def has_invisible(text: str) -> bool:
    """Whether ``text`` holds a character that prints as nothing."""
    return _INVISIBLE.search(text) is not None


def normalize_answer(text: str, thousands: bool = True) -> str:
    """Remove presentation-only LaTeX from a whole answer; keep its mathematical content.

    ``thousands``: also remove thousands separators (``7,425,000``, ``10{,}080``, ``10,\\!080``, ``1 000``,
    ``10\\,080``).
    """
    if thousands:
        for pattern, replacement in _THOUSANDS_MARKUP:
            text = pattern.sub(replacement, text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    if thousands:
        text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
        text = _SPACED_THOUSANDS.sub(lambda m: m.group().replace(" ", ""), text)
    return _TRAILING.sub("", text).strip()


def shows_nothing(text: str) -> bool:
    """Whether ``text``, read as an answer, has no content: only invisible characters, whitespace, math delimiters,
    braces, empty text wrappers and empty boxes (``\\u200b``, ``$$``, ``\\text{}``, ``\\boxed{\\text{ }}``)."""
    return not _EMPTY_MARKUP.sub("", _unwrap_text(normalize_answer(strip_invisible(text))))


@dataclass(frozen=True)
class Leaf:
    """One atomic answer item after normalization, with the signs stripped from it."""

    text: str
    percent: bool = False
    degrees: bool = False
    units: bool = False
    choice: bool = False


def _unwrap_text(text: str) -> str:
    while (unwrapped := _TEXT_WRAPPER.sub(r"\1", text)) != text:
        text = unwrapped
    return text


def _names_a_unit(text: str) -> bool:
    """Whether the words after a number (``cm``, ``square meters``, ``dollars``) can be its unit: some words, none of
    them a retraction, comparison or hedge (``or more``, ``is wrong``, ``at least``)."""
    words = [word.lower() for word in _UNIT_WORD.findall(text)]
    return bool(words) and not any(word in _NOT_UNIT_WORDS for word in words)


def normalize_leaf(text: str, units: bool = True, choices: bool = True) -> Leaf:
    """Normalize one item: drop percent/degree signs and text wrappers, trailing units when ``units`` and the
    parentheses of a choice letter ``(C)`` when ``choices``."""
    text = text.strip()
    removed_units = False
    if units and (unit := _TEXT_UNIT.search(text)) and _names_a_unit(unit.group(1)):
        stripped = text[: unit.start()].strip()
        if stripped and not stripped.startswith("\\text"):
            text, removed_units = stripped, True
    text = _unwrap_text(text).strip()
    if units and (unit := _WORD_UNIT.search(text)) and _names_a_unit(unit.group()):
        text, removed_units = text[: unit.start()], True
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text)
    degrees = bool(_DEGREE.search(text))
    text = _DEGREE.sub("", text)
    choice = _CHOICE.fullmatch(text) if choices else None
    if choice:
        text = choice.group(1)
    return Leaf(text.strip(), percent, degrees, removed_units, choice is not None)
