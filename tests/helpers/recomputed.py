"""Numbers recomputed from committed files, compared with the committed ones as any CPU can reproduce them.

A mean recomputed from committed metrics can differ in its last binary digit from one machine to another (numpy picks
its summation kernel by the CPU's vector width), so these comparisons hold decisions, text, integers and keys exactly
and floats to `REL` (relative) or `ABS` (absolute), whichever is looser: far below any quantity a report prints, far
above one rounding step (docs/reliability.md, "Numbers recomputed from committed files").
"""

import math
import re

REL = 1e-12
ABS = 1e-12
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def assert_recomputes(recomputed, committed, where: str = "") -> None:
    """Fail, naming the first differing path (`claims[3].t_interval[0]`), unless `recomputed` equals `committed` with
    floats within REL / ABS; a float against an int counts as a float (JSON writes 2.0 as 2.0, a mean may be 2)."""
    if isinstance(committed, dict):
        assert isinstance(recomputed, dict), f"{where or 'top'}: {type(recomputed).__name__}, committed a dict"
        keys = f"keys {sorted(recomputed)} != {sorted(committed)}"
        assert recomputed.keys() == committed.keys(), f"{where or 'top'}: {keys}"
        for key in committed:
            assert_recomputes(recomputed[key], committed[key], f"{where}.{key}" if where else str(key))
    elif isinstance(committed, list):
        assert isinstance(recomputed, list) and len(recomputed) == len(committed), (
            f"{where}: {recomputed!r} != {committed!r}"
        )
        for index, (mine, theirs) in enumerate(zip(recomputed, committed, strict=True)):
            assert_recomputes(mine, theirs, f"{where}[{index}]")
    elif isinstance(committed, float) or isinstance(recomputed, float):
        both_numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (recomputed, committed))
        assert both_numbers, f"{where}: {recomputed!r} != {committed!r}"
        same = (math.isnan(recomputed) and math.isnan(committed)) or math.isclose(
            recomputed, committed, rel_tol=REL, abs_tol=ABS
        )
        assert same, f"{where}: recomputed {recomputed!r}, committed {committed!r} (beyond {REL:g} relative)"
    else:
        assert recomputed == committed, f"{where}: recomputed {recomputed!r}, committed {committed!r}"


def last_digit_unit(number: str) -> float:
    """One unit in the last printed digit of `number` (`12.35` -> 0.01, `7` -> 1, `1.5e-03` -> 1e-4)."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def same_up_to_printed_rounding(recomputed: str, committed: str) -> bool:
    """Whether two lines of a report are equal but for numbers that differ by at most one unit in their last printed
    digit (a value that sits on a rounding boundary may print either way after a last-bit difference)."""
    if recomputed == committed:
        return True
    if NUMBER.sub("#", recomputed) != NUMBER.sub("#", committed):
        return False
    pairs = zip(NUMBER.findall(recomputed), NUMBER.findall(committed), strict=True)
    return all(abs(float(a) - float(b)) <= last_digit_unit(b) * (1 + 1e-9) for a, b in pairs)


def assert_same_report(recomputed: list[str], committed: list[str]) -> None:
    """Fail, quoting the first differing line, unless the reports' lines match up to printed rounding."""
    assert len(recomputed) == len(committed), f"{len(recomputed)} lines rebuilt, {len(committed)} committed"
    for number, (mine, theirs) in enumerate(zip(recomputed, committed, strict=True), start=1):
        assert same_up_to_printed_rounding(mine, theirs), f"line {number}:\n rebuilt   {mine}\n committed {theirs}"
