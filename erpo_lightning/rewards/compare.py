"""Equivalence of two extracted answers: structure first, then cheap exact rules, then sympy.

The cheap rules (strings, exact numbers, bases, choices, words) run anywhere. Leaves that need
symbolic algebra call the ``symbolic`` callable; when it is None (the parent process), they
raise :class:`NeedsSymbolic` so that the pair can be sent to a worker process instead.
Every leniency is a convention of :class:`GraderSettings`: it applies only when on, and a
comparison records in ``used`` the conventions that its verdict relied on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from erpo_lightning.rewards.conventions import GraderSettings
from erpo_lightning.rewards.normalize import THOUSANDS_SEPARATOR, Leaf, normalize_leaf
from erpo_lightning.rewards.numbers import (
    approximates,
    is_decimal,
    is_literal,
    is_mixed_number,
    is_scientific,
    numbers_close,
    numbers_equal,
    parse_number,
)
from erpo_lightning.rewards.restatement import restates, unsimplified_value
from erpo_lightning.rewards.structure import Node, Seq, parse_answer, parse_item, split_top

# (gold, pred, conventions used) -> equal; the callee adds to the set the conventions its verdict relied on.
Symbolic = Callable[[str, str, set[str]], bool]


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
_CURRENCY = re.compile(r"\\\$|\\euro(?![A-Za-z])|€|£")
_FONT = re.compile(r"\\(?:mathcal|mathbb|mathbf|mathit|mathsf|mathscr|boldsymbol|textbf|textit)(?![A-Za-z])")
_PLUS_MINUS_SIGN = re.compile(r"\\(?:pm|mp)(?![A-Za-z])")
_SPACE = re.compile(r"(?P<gap>(?<=\d)\s+(?=\d))|\s+")
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(?:([ap])\.?\s*m\.?)?", re.IGNORECASE)


def _squash(text: str) -> str:
    """``text`` without whitespace, except one space kept between two digits: ``1 9`` is two numbers set side by
    side, not 19 (a thousands grouping such as ``1 000`` is joined by ``normalize_answer`` under ``thousands``)."""
    return _SPACE.sub(lambda m: " " if m.group("gap") else "", text)


def _is_label(text: str) -> bool:
    """``x``, ``a_{37}``, ``f(x)``, ``(p, q)``, ``\\frac{NO}{BO}``: a name, not an expression."""
    label = _LABEL_MARKUP.sub("", _SUBSCRIPT.sub("", text))
    return len(text) <= 40 and bool(_SIMPLE_LHS.fullmatch(label))


def assignment_value(text: str) -> str | None:
    """The value of ``x = 5``, ``f(x) = 2x``, ``a = z = 2`` (last part), ``1/3 \\approx 0.33``.

    None when ``text`` is not a named value (a real equation such as ``x + y = 1``).
    """
    parts = split_top(text, _EQUALS)
    if not _consistent_chain(parts):
        return None  # "x = 7 = 19" names two values: a hedge, not an assignment
    value = parts[-1]
    approximations = _APPROX.split(value)
    if len(approximations) > 1:  # "x \\approx 11" names 11; "1/3 \\approx 0.33" means 1/3
        value = approximations[-1] if _is_label(approximations[0]) else approximations[0]
    elif len(parts) < 2 or not _is_label(parts[0]):
        return None
    return value.strip() or None


def _consistent_chain(parts: list[str]) -> bool:
    """Whether the numbers among the sides of an equation chain are all the same value (``x = 0.5 = \\frac{1}{2}``
    is, ``x = 7 = 19`` is not); sides that are not numbers are not judged."""
    numbers = []
    for part in parts:
        text = normalize_leaf(part).text
        if (value := parse_number(text)) is not None:
            numbers.append((value, is_decimal(text)))
    first, first_decimal = numbers[0] if numbers else (None, False)
    return all(
        numbers_equal(first, value, first_decimal or decimal) or numbers_equal(value, first, first_decimal or decimal)
        for value, decimal in numbers[1:]
    )


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


def _is_choice(text: str) -> bool:
    """Whether ``text`` is a multiple-choice letter (``C``, ``(C)``), whose answer is read by its letter alone."""
    return re.fullmatch(r"[A-E]", normalize_leaf(text).text) is not None


def _is_words(text: str) -> bool:
    return bool(_WORDS.fullmatch(text)) and max(map(len, text.split())) >= 3


class AnswerComparer:
    """Compares a gold answer with a predicted one under ``settings``; see :meth:`equal`."""

    def __init__(self, symbolic: Symbolic | None = None, settings: GraderSettings | None = None) -> None:
        self.symbolic = symbolic
        self.settings = settings or GraderSettings()
        self.used: set[str] = set()
        self.problem_numbers: frozenset[Fraction] | None = None

    def equal(self, gold: str, pred: str, problem_numbers: frozenset[Fraction] | None = None) -> bool:
        """True when ``pred`` expresses the same answer as ``gold`` (both already extracted).

        ``problem_numbers``: the numbers the problem writes (``restatement.problem_numbers``), which decide whether
        an unsimplified value restates the problem; None when the problem is unknown. Afterwards ``used`` holds the
        conventions this verdict relied on (empty for a plain equality).
        """
        self.used = set()
        self.problem_numbers = problem_numbers
        asymmetric = {
            name
            for name, pattern in (
                ("units", _CURRENCY),
                ("thousands", THOUSANDS_SEPARATOR),
                ("plus_minus", _PLUS_MINUS_SIGN),
                ("font_markup", _FONT),
            )
            if bool(pattern.search(gold)) != bool(pattern.search(pred))
        }
        if any(not self.settings.allows(name) for name in asymmetric - {"plus_minus"}):
            return False  # markup on one side only that its convention would have removed
        if _squash(gold) == _squash(pred):
            self.used |= asymmetric
            return True
        options = {"thousands": self.settings.thousands, "plus_minus": self.settings.plus_minus}
        verdict = self.nodes(parse_answer(gold, **options), parse_answer(pred, **options))
        if verdict:
            self.used |= {name for name in asymmetric if self.settings.allows(name)}
        return verdict

    def _uses(self, name: str, verdict: bool) -> bool:
        if verdict:
            self.used.add(name)
        return verdict

    def nodes(self, gold: Node, pred: Node) -> bool:
        """Compare two structure nodes."""
        if isinstance(gold, str) and isinstance(pred, str):
            return self.leaves(gold, pred)
        if isinstance(gold, Seq) and isinstance(pred, Seq):
            return self._sequences(gold, pred)
        seq = gold if isinstance(gold, Seq) else pred
        if seq.kind in _UNORDERED:
            return False  # several answers against one
        if isinstance(gold, str) and self._is_number(gold):  # "(8, 0)", a one-entry matrix: not one literal
            return self.settings.unevaluated_arithmetic and self._uses(
                "unevaluated_arithmetic", self._symbolic(gold, pred.text)
            )
        gold_text = gold.text if isinstance(gold, Seq) else gold
        pred_text = pred.text if isinstance(pred, Seq) else pred
        return self._symbolic(gold_text, pred_text)

    def _is_number(self, text: str) -> bool:
        """Whether ``text`` reads as one number (signs and units removed): a numeric gold."""
        leaf = normalize_leaf(text, self.settings.units, self.settings.choice_letters)
        return parse_number(leaf.text, self.settings.mixed_numbers, self.settings.scientific) is not None

    def _sequences(self, gold: Seq, pred: Seq) -> bool:
        kinds = {gold.kind, pred.kind}
        if kinds == {"set"}:
            return self._unordered(gold.items, pred.items)
        if kinds <= _UNORDERED:
            if not self.settings.list_as_set:
                return gold.kind == pred.kind and self._ordered(gold, pred)
            in_order = gold.kind == pred.kind and [_key(n) for n in gold.items] == [_key(n) for n in pred.items]
            return self._uses("list_as_set", self._unordered(gold.items, pred.items)) if not in_order else True
        if kinds == {"set", "()"}:
            return self.settings.set_as_tuple and self._uses("set_as_tuple", self._unordered(gold.items, pred.items))
        if kinds & _UNORDERED:
            return False
        if len(kinds) == 1:
            return self._ordered(gold, pred)
        vector_as_tuple = "vector" in kinds and bool(kinds & _VECTOR_SHAPES)
        return (
            vector_as_tuple
            and self.settings.matrix_as_tuple
            and self._uses("matrix_as_tuple", self._ordered(gold, pred))
        )

    def _ordered(self, gold: Seq, pred: Seq) -> bool:
        if len(gold.items) != len(pred.items):
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
        """Compare two atomic answers.

        An answer that is an equation whose left side is not a name (``5 = 7``), against a gold that is neither an
        equation nor a choice letter, or a chain whose sides are different numbers (``x = 7 = 19``, a hedge), is
        refused unless ``equation_right_side`` is on (then its last side is the answer): otherwise
        ``\\boxed{<anything> = 7}`` would pay.
        """
        if _squash(gold) == _squash(pred):
            return True
        sides = split_top(pred, _EQUALS)
        unnamed_equation = len(sides) > 1 and (
            not _consistent_chain(sides)
            or (assignment_value(pred) is None and not _is_equation(gold) and not _is_choice(gold))
        )
        if not unnamed_equation:
            return self._atoms(gold, pred)
        return self.settings.equation_right_side and self._uses("equation_right_side", self._atoms(gold, sides[-1]))

    def _atoms(self, gold: str, pred: str) -> bool:
        settings, plus_minus = self.settings, self.settings.plus_minus
        gold_value, pred_value = assignment_value(gold), assignment_value(pred)
        if settings.assignment:
            if gold_value is not None and (pred_value is not None or not _is_equation(pred)):
                verdict = self.nodes(parse_item(gold_value, plus_minus), parse_item(pred_value or pred, plus_minus))
                return self._uses("assignment", verdict)
            if pred_value is not None and not _is_equation(gold):
                verdict = self.nodes(parse_item(gold, plus_minus), parse_item(pred_value, plus_minus))
                return self._uses("assignment", verdict)
        elif (gold_value is None) != (pred_value is None):
            return False  # a named value against a bare one
        if self.settings.clock_times:
            gold_time, pred_time = _seconds_of_day(gold), _seconds_of_day(pred)
            if gold_time is not None and pred_time is not None:
                return self._uses("clock_times", gold_time == pred_time)
        if not settings.units and (normalize_leaf(gold).units or normalize_leaf(pred).units):
            return False  # units are part of the answer then (Math-Verify would drop them)
        gold_leaf = normalize_leaf(gold, settings.units, settings.choice_letters)
        pred_leaf = normalize_leaf(pred, settings.units, settings.choice_letters)
        verdict = self._leaf_values(gold_leaf, pred_leaf)
        if verdict and (gold_leaf.units or pred_leaf.units):
            self.used.add("units")
        if verdict and gold_leaf.choice != pred_leaf.choice:
            self.used.add("choice_letters")
        return verdict

    def _signs_match(self, gold: Leaf, pred: Leaf) -> bool:
        """Percent and degree signs on one side only need their convention (which the caller then records)."""
        return (gold.percent == pred.percent or self.settings.percent) and (
            gold.degrees == pred.degrees or self.settings.degrees
        )

    def _note_signs(self, gold: Leaf, pred: Leaf, verdict: bool) -> bool:
        if verdict and gold.percent != pred.percent:
            self.used.add("percent")
        if verdict and gold.degrees != pred.degrees:
            self.used.add("degrees")
        return verdict

    def _leaf_values(self, gold: Leaf, pred: Leaf) -> bool:
        if not self._signs_match(gold, pred):
            return False
        if _squash(gold.text) == _squash(pred.text):
            return self._note_signs(gold, pred, True)
        mixed, scientific = self.settings.mixed_numbers, self.settings.scientific
        if not mixed and (is_mixed_number(gold.text) or is_mixed_number(pred.text)):
            return False  # refused here: Math-Verify's own reading would decide otherwise
        gold_number = parse_number(gold.text, mixed, scientific)
        pred_number = parse_number(pred.text, mixed, scientific)
        if gold_number is not None and not is_literal(pred.text, mixed, scientific):
            unsimplified = self._unsimplified(gold_number, gold, pred)
            if unsimplified is not None:
                return unsimplified
        if gold_number is not None and pred_number is not None:
            literal = is_literal(pred.text, mixed, scientific)
            if not literal and not self.settings.unevaluated_arithmetic:
                return False  # "38/2", "\\frac{2}{4}": a division left to do
            verdict = self._numbers(gold_number, gold, pred_number, pred)
            if verdict and not literal:
                self.used.add("unevaluated_arithmetic")
            if verdict and (is_mixed_number(gold.text) or is_mixed_number(pred.text)):
                self.used.add("mixed_numbers")
            if verdict and (is_scientific(gold.text) or is_scientific(pred.text)):
                self.used.add("scientific")
            return self._note_signs(gold, pred, verdict)
        if (gold_number is not None and _GLUED_UNIT.fullmatch(pred.text)) or (
            pred_number is not None and _GLUED_UNIT.fullmatch(gold.text)
        ):
            return False  # "10cm" is kept as the product 10*c*m: no number equals it
        gold_base, pred_base = _base_value(gold.text), _base_value(pred.text)
        if self.settings.base_subscripts and (gold_base is not None or pred_base is not None):
            gold_int = gold_base if gold_base is not None else gold_number
            pred_int = pred_base if pred_base is not None else pred_number
            return self._uses("base_subscripts", gold_int is not None and gold_int == pred_int)
        if re.fullmatch(r"[A-E]", gold.text):
            choice = _CHOICE_LETTER.match(pred.text)
            if not self.settings.choice_letters:
                return pred.text == gold.text
            return self._uses("choice_letters", choice is not None and choice.group(1) == gold.text)
        if _is_words(gold.text) or _is_words(pred.text):
            if gold.text.split() == pred.text.split():
                return True
            same = gold.text.casefold().split() == pred.text.casefold().split()
            return self.settings.text_case and self._uses("text_case", same)
        # A numeric gold is matched by a literal number, or an unsimplified value that restates nothing (decided
        # above): anything else here ("5 + 9 + 5", "\\lceil 8 \\rceil", "\\binom{8}{4}", "5 9 5", a restating
        # "\\sqrt{16}") is only paid through evaluation, which pays restatements.
        computed = gold_number is not None
        if computed and not self.settings.unevaluated_arithmetic:
            return False
        gold_text, pred_text = _symbolic_text(gold), _symbolic_text(pred)
        inner_degrees = "°" in gold_text + pred_text
        if inner_degrees:  # "\\sin(90^\\circ - x)": a degree is pi/180, under the `degrees` convention only
            if not self.settings.degrees:
                return False
            gold_text, pred_text = (t.replace("°", "\\cdot\\frac{\\pi}{180}") for t in (gold_text, pred_text))
        verdict = self._note_signs(gold, pred, self._symbolic(gold_text, pred_text))
        verdict = self._uses("degrees", verdict) if inner_degrees else verdict
        return self._uses("unevaluated_arithmetic", verdict) if computed else verdict

    def _unsimplified(self, gold_number: Fraction, gold: Leaf, pred: Leaf) -> bool | None:
        """The verdict on ``pred`` as its value left unsimplified (``\\frac{2}{4}``, ``\\sqrt{16}``, ``2^{10}``,
        ``(9+1)``) that does not restate the problem (``unsimplified_values``): its value against the gold's. None when
        this rule does not decide: ``pred`` is no such arithmetic, it restates the problem, the convention is off, or
        its value is an irrational root and the gold no decimal to round it to (then only ``unevaluated_arithmetic``
        may evaluate it)."""
        if not self.settings.unsimplified_values:
            return None
        form = unsimplified_value(pred.text)
        if form is None or restates(form, self.problem_numbers) or not (form.exact or is_decimal(gold.text)):
            return None
        verdict = self._uses("unsimplified_values", self._numbers(gold_number, gold, form.value, pred))
        return self._note_signs(gold, pred, verdict)

    def _numbers(self, gold: Fraction, gold_leaf: Leaf, pred: Fraction, pred_leaf: Leaf) -> bool:
        decimal = is_decimal(gold_leaf.text) or is_decimal(pred_leaf.text)
        candidates = [(gold, pred)]
        # "28%" against "0.28": either side may carry the percent sign.
        if gold_leaf.percent and not pred_leaf.percent:
            candidates.append((gold / 100, pred))
        elif pred_leaf.percent and not gold_leaf.percent:
            candidates.append((gold, pred / 100))
        settings = self.settings
        if any(numbers_equal(g, p, decimal, settings.float_rounding) for g, p in candidates):
            return True
        if settings.rel_tol > 0 and any(numbers_close(g, p, settings.rel_tol) for g, p in candidates):
            return self._uses("numeric_tolerance", True)
        approximate = settings.approximations and gold_leaf.percent == pred_leaf.percent
        return approximate and self._uses("approximations", approximates(gold, pred_leaf.text))

    def _symbolic(self, gold: str, pred: str) -> bool:
        if self.symbolic is None:
            raise NeedsSymbolic
        return self.symbolic(gold, pred, self.used)


def _key(node: Node) -> str:
    return _squash(node.text if isinstance(node, Seq) else node)


def _symbolic_text(leaf: Leaf) -> str:
    return f"{leaf.text}\\%" if leaf.percent else leaf.text
