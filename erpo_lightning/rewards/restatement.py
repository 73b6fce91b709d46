"""Unsimplified values and restatements: is ``\\frac{16}{2}`` an answer, or the problem written back?

An answer to a numeric gold may be its value left unsimplified: a fraction not in lowest terms (``\\frac{2}{4}``),
the root of a perfect power (``\\sqrt{16}``), a small power (``2^{10}``), a sum or product of numbers (``(9+1)``).
:func:`unsimplified_value` reads such an answer by hand (no ``eval``, no sympy: a small parser of numbers, ``+ - * /``,
``\\times \\cdot \\div``, ``^``, ``\\frac`` and ``\\sqrt`` with bounded sizes) and gives its value and the numbers it
is written with. Whether it restates the problem is decided from the problem's own text (:func:`problem_numbers`,
:func:`restates`): ``\\frac{38}{2}`` restates "Compute 38/2.", while ``\\frac{3}{6}`` for "the chance that a die
shows an even number" restates nothing and is paid by its value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from erpo_lightning.rewards.numbers import is_literal

# Bounds on what is read by hand: the answer's length and tokens, its nesting, an exponent, a root's index, the size
# of any value on the way (in bits, about 400 digits), the digits a root is worked out to, the problem text.
MAX_CHARS = 200
MAX_TOKENS = 100
MAX_NESTING = 16
MAX_EXPONENT = 64
MAX_ROOT_INDEX = 12
MAX_BITS = 1_330
ROOT_DIGITS = 40
MAX_PROBLEM_CHARS = 20_000

_TOKEN = re.compile(
    r"\s*(?:(\d{1,40}(?:\.\d{1,40})?|\.\d{1,40})"  # a number
    r"|(\\(?:frac|sqrt|times|cdot|div))(?![A-Za-z])"  # a command
    r"|([-+*/^(){}\[\]]))"  # an operator or a bracket
)
_PRODUCT = {"*", "\\times", "\\cdot"}
_QUOTIENT = {"/", "\\div"}
_PROBLEM_NUMBER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d{1,40}(?:\.\d{1,40})?")
_WORD = re.compile(r"[A-Za-z]+")
_SMALL_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty"
).split()
_TENS = "thirty forty fifty sixty seventy eighty ninety".split()
# Words that name a number in a problem's text: "the cube root of 27", "half of 38", "twice 9", "five squared".
_NUMBER_WORDS: dict[str, int] = {
    **{word: value for value, word in enumerate(_SMALL_NUMBERS)},
    **{word: 30 + 10 * i for i, word in enumerate(_TENS)},
    "hundred": 100,
    "thousand": 1000,
    "million": 10**6,
    **dict.fromkeys(("half", "halve", "halves", "twice", "double", "square", "squared", "squares"), 2),
    **dict.fromkeys(("third", "thirds", "triple", "cube", "cubed", "cubes", "cubic"), 3),
    **dict.fromkeys(("quarter", "quarters", "fourth", "fourths"), 4),
    **{word: 5 + i for i, word in enumerate(("fifth", "sixth", "seventh", "eighth", "ninth", "tenth"))},
}


@dataclass(frozen=True)
class ValueForm:
    """An answer read as arithmetic on numbers.

    Attributes:
        value: its value, exact unless ``exact`` is False (the root of a number that is no perfect power, worked out
            to ``ROOT_DIGITS`` digits).
        numbers: the numbers it is written with (absolute values, exponents and a root's index included).
        operations: how many operations it holds (each of ``+ - * /``, a power, a ``\\frac``, a root).
    """

    value: Fraction
    numbers: tuple[Fraction, ...]
    operations: int
    exact: bool = True


class _NotArithmetic(Exception):
    """The text is not arithmetic this module reads, or it is too large to work out."""


def _tokens(text: str) -> list[str]:
    """The tokens of ``text`` (numbers, the commands above, operators and brackets); _NotArithmetic otherwise."""
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position:].strip():
                raise _NotArithmetic
            break
        tokens.append(match.group(match.lastindex))
        position = match.end()
        if len(tokens) > MAX_TOKENS:
            raise _NotArithmetic
    return tokens


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise _NotArithmetic
    return value


def _integer_root(radicand: int, index: int) -> int:
    """The largest integer ``r`` with ``r ** index <= radicand`` (a bisection: about ``bit_length / index`` steps)."""
    low, high = 0, 1 << (radicand.bit_length() // index + 1)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if middle**index <= radicand else (low, middle - 1)
    return low


def _root(radicand: Fraction, index: int) -> tuple[Fraction, bool]:
    """The ``index``-th root of a non-negative ``radicand``: exact for a perfect power, else to ``ROOT_DIGITS`` digits
    (then False)."""
    numerator, denominator = radicand.numerator, radicand.denominator
    top, bottom = _integer_root(numerator, index), _integer_root(denominator, index)
    if top**index == numerator and bottom**index == denominator:
        return Fraction(top, bottom), True
    scale = 10**ROOT_DIGITS
    approximate = _integer_root(numerator * denominator ** (index - 1) * scale**index, index)
    return Fraction(approximate, denominator * scale), False


class _Reader:
    """Recursive descent over the tokens: sum -> product -> signed -> power -> atom."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.position = tokens, 0
        self.numbers: list[Fraction] = []
        self.operations = 0
        self.exact = True

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NotArithmetic
        self.position += 1
        return token

    def sum(self, depth: int) -> Fraction:
        value = self.product(depth)
        while self.peek() in ("+", "-"):
            sign = self.take()
            right = self.product(depth)
            value, self.operations = _bounded(value + right if sign == "+" else value - right), self.operations + 1
        return value

    def product(self, depth: int) -> Fraction:
        value = self.signed(depth)
        while self.peek() in _PRODUCT | _QUOTIENT:
            operator = self.take()
            right = self.signed(depth)
            if operator in _QUOTIENT and right == 0:
                raise _NotArithmetic
            value = _bounded(value / right if operator in _QUOTIENT else value * right)
            self.operations += 1
        return value

    def signed(self, depth: int) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            value = self.signed(depth)
            return -value if sign == "-" else value
        return self.power(depth)

    def power(self, depth: int) -> Fraction:
        base = self.atom(depth)
        if self.peek() != "^":
            return base
        self.take()
        if self.peek() in ("{", "("):
            exponent = self.atom(depth)
        else:
            digit = self.take()
            if not re.fullmatch(r"\d", digit):  # `2^10` is 2^1 then 0 in LaTeX: not read
                raise _NotArithmetic
            exponent = self.number(digit)
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT or not self.exact or (base == 0 and exponent < 0):
            raise _NotArithmetic
        size = abs(base.numerator) * base.denominator
        if size > 1 and abs(exponent) * math.log2(size) > MAX_BITS:
            raise _NotArithmetic
        self.operations += 1
        return _bounded(base ** int(exponent))

    def number(self, token: str) -> Fraction:
        value = Fraction(token)
        self.numbers.append(value)
        return value

    def group(self, depth: int, opening: str = "{", closing: str = "}") -> Fraction:
        self.take(opening)
        value = self.sum(depth + 1)
        self.take(closing)
        return value

    def atom(self, depth: int) -> Fraction:
        if depth > MAX_NESTING:
            raise _NotArithmetic
        token = self.peek()
        if token == "(":
            return self.group(depth, "(", ")")
        if token == "{":
            return self.group(depth)
        self.take()
        if token == "\\frac":
            numerator, denominator = self.group(depth), self.group(depth)
            if denominator == 0:
                raise _NotArithmetic
            self.operations += 1
            return _bounded(numerator / denominator)
        if token == "\\sqrt":
            index = self.group(depth, "[", "]") if self.peek() == "[" else Fraction(2)
            radicand = self.group(depth)
            if index.denominator != 1 or not 2 <= index <= MAX_ROOT_INDEX or radicand < 0:
                raise _NotArithmetic
            value, exact = _root(radicand, int(index))
            self.exact, self.operations = self.exact and exact, self.operations + 1
            return value
        if token is not None and token[0] in "0123456789.":
            return self.number(token)
        raise _NotArithmetic


def unsimplified_value(text: str) -> ValueForm | None:
    """``text`` read as arithmetic on numbers (a fraction not in lowest terms, a root, a power, a sum or product:
    ``\\frac{2}{4}``, ``\\sqrt{16}``, ``2^{10}``, ``(9+1)``), or None: a literal number (``\\frac{1}{2}``, ``10^{6}``),
    anything else (a function such as ``\\binom``, a wrapper such as ``\\lceil``, numbers set side by side, letters),
    or arithmetic past the bounds (an exponent above ``MAX_EXPONENT``, a value above ``MAX_BITS`` bits)."""
    text = text.strip()
    if len(text) > MAX_CHARS or is_literal(text):
        return None
    try:
        reader = _Reader(_tokens(text))
        value = reader.sum(0)
        if reader.peek() is not None or reader.operations == 0:
            return None  # "5 9 5": numbers set side by side; "(8)": brackets around a literal
    except (_NotArithmetic, ZeroDivisionError, OverflowError, ValueError):
        return None
    return ValueForm(value, tuple(abs(n) for n in reader.numbers), reader.operations, reader.exact)


def problem_numbers(problem: str) -> frozenset[Fraction]:
    """The numbers a problem text writes (absolute values): digits (``38``, ``1,000``, ``2.5``) and number words
    ("twenty", "half", "cube"), from its first ``MAX_PROBLEM_CHARS`` characters."""
    text = str(problem)[:MAX_PROBLEM_CHARS]
    numbers = {Fraction(found.replace(",", "")) for found in _PROBLEM_NUMBER.findall(text)}
    numbers |= {Fraction(_NUMBER_WORDS[word]) for word in map(str.lower, _WORD.findall(text)) if word in _NUMBER_WORDS}
    return frozenset(numbers)


def restates(form: ValueForm, numbers: Iterable[Fraction] | None) -> bool:
    """Whether ``form`` hands the problem's arithmetic back undone, ``numbers`` being those the problem writes
    (:func:`problem_numbers`): one operation on numbers all of which the problem writes (``\\frac{38}{2}`` for
    "Compute 38/2."), or several operations on any number it writes (padding a copied sum with ``+ 1 - 1`` does not
    hide it). False when the problem is unknown (None)."""
    if numbers is None:
        return False
    known = set(numbers)
    mentioned = [number in known for number in form.numbers]
    return all(mentioned) if form.operations == 1 else any(mentioned)
