"""Symbolic equivalence through Math-Verify, for the leaves that cheap rules cannot decide.

Only Math-Verify's LaTeX route is used: it parses with an ANTLR grammar into sympy objects and
never evaluates text, unlike its plain-expression route (``sympy.parse_expr``, which calls
``eval``). Its ``signal.alarm`` timeouts are switched off; the worker pool bounds time instead.
Inputs that would make sympy build astronomically large integers are refused up front.
"""

from __future__ import annotations

import logging
import random
import re
from fractions import Fraction

import sympy
from math_verify import LatexExtractionConfig, parse, verify

from erpo_lightning.rewards.conventions import GraderSettings
from erpo_lightning.rewards.numbers import within_last_place

MAX_SYMBOLIC_CHARS = 600
MAX_NESTING = 24

_EXTRACTION = [LatexExtractionConfig()]
_HUGE_EXPONENT = re.compile(r"\^\s*\{?\s*\d{6,}")
_HUGE_FACTORIAL = re.compile(r"\d{4,}\s*!")
# A factorial of a bracket that itself holds a factorial or a power: "((5!)!)!", "(10^{10})!".
_GROUP_FACTORIAL = re.compile(r"[!^][^!]{0,200}?[)}]\s*!(?!=)")
_INTEGER = re.compile(r"\d+")
_SAMPLE_POINTS = 6
_MAX_SAMPLED_SYMBOLS = 6

logging.getLogger("math_verify").setLevel(logging.CRITICAL)


def _group_end(text: str, open_index: int) -> int:
    depth = 0
    for i in range(open_index, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def _max_nesting(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}]":
            depth -= 1
    return deepest


def _has_power_tower(text: str) -> bool:
    """``a^{b^{c^{d}}}``, or ``a^{b^{c}}`` with a literal of 4 or more inside (``10^{10^{10}}``)."""
    for m in re.finditer(r"\^\s*\{", text):
        exponent = text[m.end() : _group_end(text, m.end() - 1)]
        powers = exponent.count("^")
        if powers >= 2 or (powers and any(int(n) >= 4 for n in _INTEGER.findall(exponent)[:50])):
            return True
    return False


def too_costly(text: str) -> bool:
    """Whether sympy could spend unbounded time or memory on ``text`` (refused, not parsed)."""
    if len(text) > MAX_SYMBOLIC_CHARS or _max_nesting(text) > MAX_NESTING:
        return True
    if _HUGE_EXPONENT.search(text) or _HUGE_FACTORIAL.search(text) or _has_power_tower(text):
        return True
    return text.count("!") - text.count("!=") > 3 or bool(_GROUP_FACTORIAL.search(text))


class SympyBackend:
    """Callable ``(gold, pred, used) -> bool`` that counts the sides it could not parse.

    ``used`` receives the conventions a True verdict relied on (``symbolic_extras``, ``approximations``).
    """

    def __init__(self, settings: GraderSettings | None = None) -> None:
        self.settings = settings or GraderSettings()
        self.parse_failures = 0

    def parse(self, text: str) -> list | None:
        """Math-Verify's LaTeX parse of one answer, or None (counted) when impossible."""
        if not too_costly(text):
            parsed = parse(
                f"${text}$",
                extraction_config=_EXTRACTION,
                fallback_mode="no_fallback",
                parsing_timeout=None,
            )
            if parsed:
                return parsed
        self.parse_failures += 1
        return None

    def __call__(self, gold: str, pred: str, used: set[str] | None = None) -> bool:
        used = set() if used is None else used
        gold_parsed, pred_parsed = self.parse(gold), self.parse(pred)
        if gold_parsed is None or pred_parsed is None:
            return False
        rounding = self.settings.float_rounding
        if verify(gold_parsed, pred_parsed, float_rounding=rounding, timeout_seconds=None):
            return True
        gold_value, pred_value = gold_parsed[0], pred_parsed[0]
        if self.settings.approximations and _approximates_irrational(gold_value, pred_value, pred):
            used.add("approximations")
            return True
        if self.settings.symbolic_extras and _equal_beyond_verify(gold_value, pred_value, rounding):
            used.add("symbolic_extras")
            return True
        return False


def _approximates_irrational(gold: object, pred: object, pred_text: str) -> bool:
    """``1.414`` for ``\\sqrt{2}``: a decimal at its last written place against an irrational number."""
    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr) or gold.free_symbols:
        return False
    if not (gold.is_number and gold.is_real and not gold.is_rational):
        return False
    return within_last_place(Fraction(float(gold)), pred_text)


def _equal_beyond_verify(gold: object, pred: object, rounding: int) -> bool:
    """Rules Math-Verify lacks: written-out operations, ``i``, numeric identity."""
    if not isinstance(gold, (sympy.Basic, sympy.MatrixBase)):
        return False
    if not isinstance(pred, (sympy.Basic, sympy.MatrixBase)):
        return False
    gold_done, pred_done = gold.doit(), pred.doit()
    if (gold_done, pred_done) != (gold, pred) and verify(
        gold_done, pred_done, float_rounding=rounding, timeout_seconds=None
    ):
        return True  # e.g. a matrix sum written out against its value
    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return False
    symbols = gold.free_symbols | pred.free_symbols
    if {str(s) for s in symbols} == {"i"}:  # a lone i on both sides is the imaginary unit
        return sympy.simplify((gold - pred).subs({s: sympy.I for s in symbols})) == 0
    return bool(symbols) and gold.free_symbols == pred.free_symbols and _numerically_identical(gold, pred)


def _numerically_identical(gold: sympy.Expr, pred: sympy.Expr) -> bool:
    """Equal at random real points where both are real (no point may disagree)."""
    symbols = sorted(gold.free_symbols, key=str)
    if not symbols or len(symbols) > _MAX_SAMPLED_SYMBOLS:
        return False
    rng = random.Random(0)
    agree = 0
    for _ in range(_SAMPLE_POINTS):
        point = {s: sympy.Float(rng.choice((-1, 1)) * rng.uniform(0.3, 3.0)) for s in symbols}
        a, b = gold.evalf(30, subs=point), pred.evalf(30, subs=point)
        if not (a.is_real and b.is_real and a.is_finite and b.is_finite):
            continue
        if abs(a - b) > 1e-12 * max(abs(a), abs(b), 1):
            return False
        agree += 1
    return agree >= 3
