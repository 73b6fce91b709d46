"""Range rules of a config group's settings, checked the same way by every owner (rollout, data, model).

A rule is `(field, test, allowed range as the error states it)`; an owner keeps its table beside its constructor and
calls `check_rules` there and from the CLI's early checks, so both raise the same line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Rule = tuple[str, Callable[[Any], bool], str]


def at_least(minimum: int) -> Callable[[Any], bool]:
    """The test of a count that must be set and at least `minimum`."""
    return lambda value: value is not None and value >= minimum


def or_null(rule: Rule) -> Rule:
    """`rule` for a setting that may also be null (None: a default its owner fills in), "(or null)" in its range."""
    name, allowed, description = rule
    return name, lambda value: value is None or allowed(value), f"{description} (or null)"


def check_rules(group: str, settings: Mapping[str, Any], rules: tuple[Rule, ...]) -> None:
    """ValueError naming the first setting outside its range (`<group>.<field> must be <range>, got <value>`); a
    field missing from `settings` is not checked."""
    for name, allowed, description in rules:
        if name in settings and not allowed(settings[name]):
            raise ValueError(f"{group}.{name} must be {description}, got {settings[name]!r}")
