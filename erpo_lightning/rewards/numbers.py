"""Exact parsing of plain numbers written in LaTeX or text, without sympy.

Numbers become :class:`fractions.Fraction` so that ``0.5``, ``1/2``, ``\\frac{1}{2}``,
``5 \\times 10^{-1}`` and ``.5`` compare exactly. A side written as a decimal is compared after rounding both
sides to a number of places (:func:`numbers_equal`, as Math-Verify does); anything looser is a named convention.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# Exponents beyond this are refused: Fraction(10) ** 10**9 would never finish.
MAX_EXPONENT = 400
DEFAULT_FLOAT_ROUNDING = 6

_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(rf"({_DECIMAL})(?:[eE]([+-]?\d+))?")
_SCIENTIFIC = re.compile(rf"({_DECIMAL})\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?")
_POWER_OF_TEN = re.compile(r"10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?")
_LATEX_FRACTION = re.compile(rf"([+-]?)\\frac\{{\s*({_DECIMAL})\s*\}}\{{\s*({_DECIMAL})\s*\}}")
_SLASH_FRACTION = re.compile(rf"({_DECIMAL})\s*/\s*({_DECIMAL})")
_MIXED = re.compile(r"([+-]?)(\d+)\s*(?:\\frac\{(\d+)\}\{(\d+)\}|\s(\d+)\s*/\s*(\d+))")


def _scaled(mantissa: str, exponent: str) -> Fraction | None:
    power = int(exponent)
    if abs(power) > MAX_EXPONENT:
        return None
    return Fraction(mantissa) * Fraction(10) ** power


def _ratio(numerator: str, denominator: str) -> Fraction | None:
    den = Fraction(denominator)
    return Fraction(numerator) / den if den else None


def _mixed(match: re.Match[str]) -> Fraction | None:
    sign, whole, num, den = match.group(1), match.group(2), *[g for g in match.groups()[2:] if g]
    if int(num) >= int(den) or int(den) == 0:
        return None  # "2 3/2" is not how anyone writes a mixed number
    value = int(whole) + Fraction(int(num), int(den))
    return -value if sign == "-" else value


def is_mixed_number(text: str) -> bool:
    """Whether ``text`` is written as a mixed number (``3\\frac{1}{2}``, ``1 1/2``)."""
    return _MIXED.fullmatch(text.strip()) is not None


def is_scientific(text: str) -> bool:
    """Whether ``text`` is a number in scientific notation (``1.5e3``, ``2.3 \\times 10^{-3}``)."""
    text = text.strip()
    m = _PLAIN.fullmatch(text)
    return (m is not None and m.group(2) is not None) or _SCIENTIFIC.fullmatch(text) is not None


def is_decimal(text: str) -> bool:
    """Whether ``text`` is a number written with a decimal point (plain, or scientific): a float, not an exact value."""
    text = text.strip()
    plain = _PLAIN.fullmatch(text)
    return "." in text and ((plain is not None and plain.group(2) is None) or is_scientific(text))


def parse_number(text: str, mixed: bool = True, scientific: bool = True) -> Fraction | None:
    """The exact value of ``text`` if it is a plain number, else None.

    Accepted: integers (leading zeros too), decimals (``.35``), ``1.5e3`` and
    ``1.5 \\times 10^{3}`` (when ``scientific``), ``10^{3}``, ``a/b``, ``\\frac{a}{b}`` and mixed numbers
    (``3\\frac{1}{2}``, ``1 1/2``; when ``mixed``). The caller removes thousands separators, units and signs
    such as ``%`` beforehand.
    """
    text = text.strip()
    if len(text) > 200:
        return None
    if m := _PLAIN.fullmatch(text):
        if m.group(2) and not scientific:
            return None
        return _scaled(m.group(1), m.group(2) or "0")
    if scientific and (m := _SCIENTIFIC.fullmatch(text)):
        return _scaled(m.group(1), m.group(2))
    if m := _POWER_OF_TEN.fullmatch(text):
        return _scaled("1", m.group(1))
    if m := _LATEX_FRACTION.fullmatch(text):
        value = _ratio(m.group(2), m.group(3))
        return -value if value is not None and m.group(1) == "-" else value
    if m := _SLASH_FRACTION.fullmatch(text):
        return _ratio(m.group(1), m.group(2))
    if mixed and (m := _MIXED.fullmatch(text)):
        return _mixed(m)
    return None


def numbers_close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    """Exact equality, or a relative difference of at most ``rel_tol`` (of the larger magnitude)."""
    if a == b:
        return True
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))


def numbers_equal(gold: Fraction, pred: Fraction, decimal: bool, float_rounding: int = DEFAULT_FLOAT_ROUNDING) -> bool:
    """Exact equality; when either side was written as a decimal, equality after rounding both to ``float_rounding``
    places, but only for a ``gold`` that no decimal of ``float_rounding`` places equals exactly.

    Rounding lets a decimal stand for a value it cannot write out: ``0.333333`` (or ``0.3333333``) for 1/3,
    ``0.007813`` for 1/128. A gold that has an exact short decimal (3, 0, 0.5) must be matched exactly: ``3.0000001``
    is not 3 and ``0.0000001`` is not 0, whatever the rounding.
    """
    if gold == pred:
        return True
    rounded = round(gold, float_rounding)
    return decimal and rounded != gold and rounded == round(pred, float_rounding)


def is_literal(text: str, mixed: bool = True, scientific: bool = True) -> bool:
    """Whether ``text`` is one number written out, with no operation left to do: an integer or decimal (``-5``,
    ``0.75``), a fraction in lowest terms with a denominator above 1 (``\\frac{3}{4}``, ``-7/2``), a mixed number
    (``3\\frac{1}{2}``, when ``mixed``), scientific notation (``1.5 \\times 10^{3}``, ``1.5e3``, when
    ``scientific``) or a power of ten (``10^{6}``).

    ``38/2``, ``\\frac{2}{4}`` and ``\\frac{8}{1}`` are divisions still to be carried out, so not literals; nor is
    anything :func:`parse_number` cannot read (``5 + 9 + 5``, ``\\sqrt{16}``, ``\\binom{8}{4}``, ``5 9 5``).
    """
    text = text.strip()
    if parse_number(text, mixed, scientific) is None:
        return False
    fraction = _LATEX_FRACTION.fullmatch(text) or _SLASH_FRACTION.fullmatch(text)
    if fraction is not None:
        numerator, denominator = fraction.groups()[-2:]
        return _in_lowest_terms(numerator, denominator, proper=False)
    if mixed and (m := _MIXED.fullmatch(text)):
        numerator, denominator = [g for g in m.groups()[2:] if g]
        return _in_lowest_terms(numerator, denominator, proper=True)
    return True


def _in_lowest_terms(numerator: str, denominator: str, proper: bool) -> bool:
    """Whether ``numerator/denominator`` are integers written in lowest terms, with a denominator above 1 in size."""
    if not re.fullmatch(r"[+-]?\d+", numerator) or not re.fullmatch(r"[+-]?\d+", denominator):
        return False
    num, den = abs(int(numerator)), abs(int(denominator))
    return den > 1 and math.gcd(num, den) == 1 and (num < den or not proper)


_ROUNDED_DECIMAL = re.compile(r"[+-]?(\d*)\.(\d{2,})")


def is_terminating(value: Fraction) -> bool:
    """Whether ``value`` has a finite decimal expansion (denominator of the form 2^a 5^b)."""
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    return den == 1


def within_last_place(value: Fraction, text: str) -> bool:
    """Whether the decimal ``text`` is ``value`` rounded or cut to its last written place.

    The decimal needs at least two decimals and three significant digits (``1.732``, not ``1.7``).
    """
    m = _ROUNDED_DECIMAL.fullmatch(text.strip())
    if m is None or len((m.group(1) + m.group(2)).lstrip("0")) < 3:
        return False
    return abs(value - Fraction(text.strip())) < Fraction(1, 10 ** len(m.group(2)))


def approximates(exact: Fraction, text: str) -> bool:
    """Whether ``text`` approximates a non-terminating rational (``2.6667`` for 8/3).

    A terminating value (5, 7.78) is never approximated: there the decimal must be equal.
    """
    return not is_terminating(exact) and within_last_place(exact, text)
