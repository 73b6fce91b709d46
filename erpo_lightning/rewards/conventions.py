"""The grader's conventions: every leniency beyond plain equality of values is a named switch.

A convention is a rule that makes two written answers equal although a strict reading would not: ``x = 5`` for
``5``, ``28\\%`` for ``0.28``, ``1.414`` for ``\\sqrt{2}``... Each has a name, a default and a one-line meaning
(see docs/rewards.md for how Math-Verify and Qwen2.5-Math's ``math_equal`` treat the same case). A comparison records
the conventions it relied on, so that a verdict can be traced to the rules that produced it.

Two presets: ``strict`` (the default, for training and evaluation alike) and ``lenient`` (``strict`` plus
approximate decimals, a relative tolerance of 1e-6 on numbers, unevaluated arithmetic and the right side of any
equation: the grader's behaviour before conventions were named).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

Preset = Literal["strict", "lenient"]

CONVENTIONS: dict[str, str] = {
    "approximations": "a decimal rounded or cut at its own last written place equals a non-terminating value "
    "(1.414 for \\sqrt{2}, 0.333 for 1/3; at least 3 significant digits)",
    "assignment": "`x = 5` equals `5` (a name, or a function of names, on the left)",
    "percent": "`28\\%` equals `28` and `0.28`",
    "degrees": "`90^\\circ` equals `90`",
    "units": "trailing units and currency signs are ignored (`10\\text{ cm}`, `\\$18.90`)",
    "thousands": "thousands separators are ignored (`7,425,000`, `10{,}080`)",
    "list_as_set": "a comma-separated list equals a set or list of the same elements in any order",
    "set_as_tuple": "a set `\\{1, 2\\}` equals a tuple `(1, 2)` in any order",
    "text_case": "text answers compare case-insensitively, ignoring `\\text{}` wrappers (`\\text{Evelyn}` = `evelyn`)",
    "multiple_boxes": "several boxes joined only by connectors (`\\boxed{2} and \\boxed{3}`) form one list answer",
    "choice_letters": "a multiple-choice letter equals its decorated forms (`(C)`, `C.`, `\\text{(C)}`)",
    "base_subscripts": "`52_8` is the base-8 numeral 42",
    "clock_times": "`20:34`, `20:34:00` and `8:34 PM` are the same time",
    "mixed_numbers": "`3\\frac{1}{2}` and `3 1/2` are 7/2 (not 3 times 1/2)",
    "plus_minus": "`\\pm 2` equals the list `2, -2`",
    "scientific": "`1.5e3` and `2.3 \\times 10^{-3}` are read as decimals (compared at `float_rounding` places)",
    "matrix_as_tuple": "a one-column matrix equals a tuple or bracketed list of its entries",
    "font_markup": "font commands are ignored (`\\mathcal{B}` = `B`, `\\mathbf{v}` = `v`)",
    "doubled_backslashes": "LaTeX whose every backslash is doubled (`\\\\frac`, a JSON or test-literal artifact) is "
    "read with single ones",
    "symbolic_extras": "rules beyond Math-Verify's sympy checks: written-out operations evaluated, a lone `i` as the "
    "imaginary unit, expressions equal at random real points",
    "numeric_tolerance": "numbers within relative tolerance `rel_tol` are equal (off when rel_tol is 0)",
    "unsimplified_values": "an answer to a numeric gold written as arithmetic on numbers (`\\frac{2}{4}`, "
    "`\\sqrt{16}`, `2^{10}`, `(9+1)`) is evaluated by hand and paid by its value, unless it restates the problem: one "
    "operation on numbers all of which the problem writes (`\\frac{38}{2}` for 'Compute 38/2.'), or several on any "
    "of them (decided when the reward is given the problem texts)",
    "unevaluated_arithmetic": "an answer to a numeric gold that is neither one literal number nor arithmetic that "
    "restates nothing is evaluated symbolically (`\\binom{8}{4}` for 70, `\\lceil 8 \\rceil` for 8, a restating "
    "`5 + 9 + 5` for 19): off by default, since it pays for restating the problem",
    "equation_right_side": "an equation whose left side is not a name, or a chain of different numbers, is read as its "
    "last side (`5 = 7` for 7, `x = 7 = 19` for 19); off by default: `x = 7` needs only `assignment`",
    "invisible_characters": "zero-width characters, direction marks, byte-order marks and other invisible format "
    "characters are ignored in golds and answers (`1\\u200b2` for 12)",
}


# Extraction conventions, switched by MathReward's `fallbacks` (empty: off) and `bare_max_chars` (0: off).
EXTRACTION_CONVENTIONS: dict[str, str] = {
    "answer_markers": "without a box, the answer after a marker is read: 'The final answer is X', 'Answer: X', a "
    "closing 'Therefore, ... X' sentence (the `fallbacks` list names which)",
    "bare_answers": "a response of at most `bare_max_chars` characters without box or marker is the answer itself",
}


@dataclass(frozen=True)
class GraderSettings:
    """Which conventions are on, and the numeric rules.

    Attributes:
        float_rounding: decimal places both sides are rounded to when one of them is written as a decimal (as
            Math-Verify's default, 6): `0.333333` equals 1/3, `0.333` does not.
        rel_tol: relative tolerance on numbers (a convention: `numeric_tolerance`); 0 = exact after rounding.
        the boolean fields: see :data:`CONVENTIONS`.
    """

    approximations: bool = False
    assignment: bool = True
    percent: bool = True
    degrees: bool = True
    units: bool = True
    thousands: bool = True
    list_as_set: bool = True
    set_as_tuple: bool = False
    text_case: bool = True
    multiple_boxes: bool = True
    choice_letters: bool = True
    base_subscripts: bool = True
    clock_times: bool = True
    mixed_numbers: bool = True
    plus_minus: bool = True
    scientific: bool = True
    matrix_as_tuple: bool = True
    font_markup: bool = True
    doubled_backslashes: bool = True
    symbolic_extras: bool = True
    unsimplified_values: bool = True
    unevaluated_arithmetic: bool = False
    equation_right_side: bool = False
    invisible_characters: bool = True
    float_rounding: int = 6
    rel_tol: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.float_rounding <= 15:
            raise ValueError(f"float_rounding={self.float_rounding}: must be between 0 and 15 decimal places")
        if not 0.0 <= self.rel_tol < 1.0:
            raise ValueError(f"rel_tol={self.rel_tol}: must be in [0, 1)")

    def allows(self, name: str) -> bool:
        """Whether convention ``name`` is on."""
        if name == "numeric_tolerance":
            return self.rel_tol > 0
        return bool(getattr(self, name))

    def enabled(self) -> list[str]:
        """Names of the conventions that are on."""
        return [name for name in CONVENTIONS if self.allows(name)]

    def as_dict(self) -> dict[str, bool | int | float]:
        """Every setting by name (for results files and logs)."""
        return asdict(self)


_PRESETS: dict[str, dict[str, bool | float]] = {
    "strict": {},
    "lenient": {"approximations": True, "rel_tol": 1e-6, "unevaluated_arithmetic": True, "equation_right_side": True},
}


def make_settings(
    preset: Preset = "strict",
    overrides: dict[str, bool] | None = None,
    **numeric: float | int | bool | None,
) -> GraderSettings:
    """Settings of ``preset``, then ``overrides`` (convention name -> on/off), then the non-None ``numeric`` values.

    Raises:
        ValueError naming an unknown preset or convention.
    """
    if preset not in _PRESETS:
        raise ValueError(f"unknown grader preset {preset!r}: choose one of {sorted(_PRESETS)}")
    switches = {f.name for f in fields(GraderSettings) if f.type in ("bool", bool)}
    unknown = sorted(set(overrides or {}) - switches)
    if unknown:
        raise ValueError(f"unknown grader conventions {unknown}: known are {sorted(switches)}")
    settings = replace(GraderSettings(), **_PRESETS[preset])
    settings = replace(settings, **{name: bool(value) for name, value in (overrides or {}).items()})
    return replace(settings, **{name: value for name, value in numeric.items() if value is not None})
