"""Equivalence of two extracted answers: structure first, then cheap exact rules, then sympy.

The cheap rules (strings, exact numbers, bases, choices, words) run anywhere. Leaves that need
symbolic algebra call the ``symbolic`` callable; when it is None (the parent process), they
raise :class:`NeedsSymbolic` so that the pair can be sent to a worker process instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from erpo_lightning.rewards.normalize import Leaf, normalize_leaf
from erpo_lightning.rewards.numbers import (
    DEFAULT_REL_TOL,
    approximates,
    numbers_close,
    parse_number,
)
from erpo_lightning.rewards.structure import Node, Seq, parse_answer, parse_item, split_top

Symbolic = Callable[[str, str], bool]


class NeedsSymbolic(Exception):
    """Raised when a verdict needs sympy but no symbolic backend was given."""


_UNORDERED = frozenset({"list", "set"})
_VECTOR_SHAPES = frozenset({"()", "[]"})
_EQUALS = frozenset({"="})
_SUBSCRIPT = re.compile(r"_\s*(?:\{[^{}]*\}|\w)")
_LABEL_MARKUP = re.compile(r"\\(?:frac|mathrm|text|overline|angle|operatorname)(?![A-Za-z])|[{}\s|:/]")
_SIMPLE_LHS = re.compile(r"[A-Za-z]+'*(?:\([^()]*\))?|\([A-Za-z,]+\)")
_BASE_NUMBER = re.compile(r"(\d[0-9A-Za-z]*)_\{?(\d{1,2})\}?")
_CHOICE_LETTER = re.compile(r"\(?([A-E])\)?(?:[.:)]|\s|$)")
_WORDS = re.compile(r"[A-Za-z][A-Za-z\s'-]*")
_APPROX = re.compile(r"\\approx(?![A-Za-z])")
_GLUED_UNIT = re.compile(r"\d+(?:\.\d+)?[A-Za-z]+")
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(?:([ap])\.?\s*m\.?)?", re.IGNORECASE)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _is_label(text: str) -> bool:
    """``x``, ``a_{37}``, ``f(x)``, ``(p, q)``, ``\\frac{NO}{BO}``: a name, not an expression."""
    label = _LABEL_MARKUP.sub("", _SUBSCRIPT.sub("", text))
    return len(text) <= 40 and bool(_SIMPLE_LHS.fullmatch(label))


def assignment_value(text: str) -> str | None:
    """The value of ``x = 5``, ``f(x) = 2x``, ``a = z = 2`` (last part), ``1/3 \\approx 0.33``.

    None when ``text`` is not a named value (a real equation such as ``x + y = 1``).
    """
    parts = split_top(text, _EQUALS)
    value = parts[-1]
    approximations = _APPROX.split(value)
    if len(approximations) > 1:  # "x \\approx 11" names 11; "1/3 \\approx 0.33" means 1/3
        value = approximations[-1] if _is_label(approximations[0]) else approximations[0]
    elif len(parts) < 2 or not _is_label(parts[0]):
        return None
    return value.strip() or None


def _is_equation(text: str) -> bool:
    return len(split_top(text, _EQUALS)) > 1


def _base_value(text: str) -> int | None:
    """Value of a base-subscript numeral such as ``52_8`` (None if not one)."""
    if not (m := _BASE_NUMBER.fullmatch(text)):
        return None
    base = int(m.group(2))
    try:
        return int(m.group(1), base) if 2 <= base <= 36 else None
    except ValueError:
        return None


def _seconds_of_day(text: str) -> int | None:
    """``20:34``, ``20:34:00`` and ``08:34 PM`` as seconds after midnight (None otherwise)."""
    if not (m := _TIME.fullmatch(re.sub(r"\\text|[{}]", "", text).strip())):
        return None
    hours, minutes, seconds = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if m.group(4):
        hours = hours % 12 + (12 if m.group(4).lower() == "p" else 0)
    return hours * 3600 + minutes * 60 + seconds


def _is_words(text: str) -> bool:
    return bool(_WORDS.fullmatch(text)) and max(map(len, text.split())) >= 3


class AnswerComparer:
    """Compares a gold answer with a predicted one; see :meth:`equal`."""

    def __init__(self, symbolic: Symbolic | None = None, rel_tol: float = DEFAULT_REL_TOL) -> None:
        self.symbolic = symbolic
        self.rel_tol = rel_tol

    def equal(self, gold: str, pred: str) -> bool:
        """True when ``pred`` expresses the same answer as ``gold`` (both already extracted)."""
        if _squash(gold) == _squash(pred):
            return True
        return self.nodes(parse_answer(gold), parse_answer(pred))

    def nodes(self, gold: Node, pred: Node) -> bool:
        """Compare two structure nodes."""
        if isinstance(gold, str) and isinstance(pred, str):
            return self.leaves(gold, pred)
        if isinstance(gold, Seq) and isinstance(pred, Seq):
            return self._sequences(gold, pred)
        seq = gold if isinstance(gold, Seq) else pred
        if seq.kind in _UNORDERED:
            return False  # several answers against one
        gold_text = gold.text if isinstance(gold, Seq) else gold
        pred_text = pred.text if isinstance(pred, Seq) else pred
        return self._symbolic(gold_text, pred_text)

    def _sequences(self, gold: Seq, pred: Seq) -> bool:
        if gold.kind in _UNORDERED and pred.kind in _UNORDERED:
            return self._unordered(gold.items, pred.items)
        if gold.kind in _UNORDERED or pred.kind in _UNORDERED:
            return False
        kinds = {gold.kind, pred.kind}
        same_shape = len(kinds) == 1 or ("vector" in kinds and bool(kinds & _VECTOR_SHAPES))
        if not same_shape or len(gold.items) != len(pred.items):
            return False
        return all(self.nodes(g, p) for g, p in zip(gold.items, pred.items, strict=True))

    def _unordered(self, gold: tuple[Node, ...], pred: tuple[Node, ...]) -> bool:
        gold_left = list({_key(n): n for n in gold}.values())
        pred_left = list({_key(n): n for n in pred}.values())
        if len(gold_left) != len(pred_left):
            return False
        pred_keys = {_key(n) for n in pred_left}
        exact = {_key(n) for n in gold_left} & pred_keys
        gold_left = [n for n in gold_left if _key(n) not in exact]
        pred_left = [n for n in pred_left if _key(n) not in exact]
        for g in gold_left:
            match = next((i for i, p in enumerate(pred_left) if self.nodes(g, p)), None)
            if match is None:
                return False
            pred_left.pop(match)
        return True

    def leaves(self, gold: str, pred: str) -> bool:
        """Compare two atomic answers."""
        if _squash(gold) == _squash(pred):
            return True
        gold_value, pred_value = assignment_value(gold), assignment_value(pred)
        if gold_value is not None and (pred_value is not None or not _is_equation(pred)):
            return self.nodes(parse_item(gold_value), parse_item(pred_value or pred))
        if pred_value is not None and not _is_equation(gold):
            return self.nodes(parse_item(gold), parse_item(pred_value))
        gold_time, pred_time = _seconds_of_day(gold), _seconds_of_day(pred)
        if gold_time is not None and pred_time is not None:
            return gold_time == pred_time
        return self._leaf_values(normalize_leaf(gold), normalize_leaf(pred))

    def _leaf_values(self, gold: Leaf, pred: Leaf) -> bool:
        if _squash(gold.text) == _squash(pred.text) and gold.percent == pred.percent:
            return True
        gold_number, pred_number = parse_number(gold.text), parse_number(pred.text)
        if gold_number is not None and pred_number is not None:
            return self._numbers(gold_number, gold.percent, pred_number, pred.percent) or (
                gold.percent == pred.percent and approximates(gold_number, pred.text)
            )
        if (gold_number is not None and _GLUED_UNIT.fullmatch(pred.text)) or (
            pred_number is not None and _GLUED_UNIT.fullmatch(gold.text)
        ):
            return False  # "10cm" is kept as the product 10*c*m: no number equals it
        gold_base, pred_base = _base_value(gold.text), _base_value(pred.text)
        if gold_base is not None or pred_base is not None:
            gold_int = gold_base if gold_base is not None else gold_number
            pred_int = pred_base if pred_base is not None else pred_number
            return gold_int is not None and gold_int == pred_int
        if re.fullmatch(r"[A-E]", gold.text):
            choice = _CHOICE_LETTER.match(pred.text)
            return choice is not None and choice.group(1) == gold.text
        if _is_words(gold.text) or _is_words(pred.text):
            return gold.text.casefold().split() == pred.text.casefold().split()
        return self._symbolic(_symbolic_text(gold), _symbolic_text(pred))

    def _numbers(self, gold: Fraction, gold_pct: bool, pred: Fraction, pred_pct: bool) -> bool:
        if numbers_close(gold, pred, self.rel_tol):
            return True
        # "28%" against "0.28": either side may carry the percent sign.
        return (gold_pct and not pred_pct and numbers_close(gold / 100, pred, self.rel_tol)) or (
            pred_pct and not gold_pct and numbers_close(gold, pred / 100, self.rel_tol)
        )

    def _symbolic(self, gold: str, pred: str) -> bool:
        if self.symbolic is None:
            raise NeedsSymbolic
        return self.symbolic(gold, pred)


def _key(node: Node) -> str:
    return _squash(node.text if isinstance(node, Seq) else node)


def _symbolic_text(leaf: Leaf) -> str:
    text = leaf.text.replace("°", "\\cdot\\frac{\\pi}{180}")
    return f"{text}\\%" if leaf.percent else text
