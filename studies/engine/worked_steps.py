"""Are a toy-task answer's worked steps right? The direct memorisation measure of studies/brake (issue 50, item 2).

A toy problem reads "Compute 6 + 2 + 0." and its worked solution "6 + 2 = 8. 8 + 0 = 8. \\boxed{8}"
(erpo_lightning/toy/task.py). A policy that memorised its training queries can reach the right box through wrong
steps ("6 + 2 = 6. 6 + 0 = 8. \\boxed{8}"); `check_steps` tells those apart. It reads untrusted model output, so it
parses with two regular expressions of bounded, non-nested repetition (linear in the text's length), reads at most
MAX_CHARS characters, converts numbers of at most MAX_DIGITS digits and evaluates nothing: it never raises.

The steps are right when the text before the last `\\boxed{` holds exactly the problem's two steps, in order: the
first `a op1 b = r` with the problem's a, op1, b and r their result, the second `r op2 c = answer` with the true r.
Anything else is one of the other verdicts (STEP_VERDICTS).
"""

from __future__ import annotations

import re

MAX_CHARS = 2000  # the toy's responses are at most 48 tokens; longer text is cut here
MAX_DIGITS = 6
_NUMBER = rf"(?<!\d)(\d{{1,{MAX_DIGITS}}})(?!\d)"
STEP = re.compile(rf"{_NUMBER}[ \t]*([+-])[ \t]*{_NUMBER}[ \t]*=[ \t]*(-?){_NUMBER}")
PROBLEM = re.compile(rf"Compute[ \t]+{_NUMBER}[ \t]*([+-])[ \t]*{_NUMBER}[ \t]*([+-])[ \t]*{_NUMBER}")
BOX = "\\boxed{"

RIGHT = "right"
# right: the problem's two steps, right; wrong_result: a step's operands are the problem's but its result is not
# their result; wrong_operands: a step does not use the problem's numbers (or the first step's true result);
# step_count: not exactly two steps; no_steps: none at all; no_problem: the problem text is not a toy problem.
STEP_VERDICTS = (RIGHT, "wrong_result", "wrong_operands", "step_count", "no_steps", "no_problem")


def _apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right


def problem_steps(problem: str) -> list[tuple[int, str, int, int]] | None:
    """The worked steps of a toy problem, [(a, op1, b, r), (r, op2, c, answer)], or None when `problem` is not one."""
    match = PROBLEM.search(problem[:MAX_CHARS]) if isinstance(problem, str) else None
    if match is None:
        return None
    a, op1, b, op2, c = int(match[1]), match[2], int(match[3]), match[4], int(match[5])
    first = _apply(a, op1, b)
    return [(a, op1, b, first), (first, op2, c, _apply(first, op2, c))]


def response_steps(response: str) -> list[tuple[int, str, int, int]]:
    """Every `x op y = z` of the response before its last `\\boxed{` (all of it without one), in order."""
    if not isinstance(response, str):
        return []
    text = response[:MAX_CHARS]
    box = text.rfind(BOX)
    text = text if box < 0 else text[:box]
    return [(int(m[1]), m[2], int(m[3]), -int(m[5]) if m[4] else int(m[5])) for m in STEP.finditer(text)]


def check_steps(problem: str, response: str) -> str:
    """One of STEP_VERDICTS for `response`'s worked steps on the toy `problem` (module docstring)."""
    expected = problem_steps(problem)
    if expected is None:
        return "no_problem"
    found = response_steps(response)
    if not found:
        return "no_steps"
    if len(found) != len(expected):
        return "step_count"
    for (x, op, y, z), (a, want_op, b, result) in zip(found, expected, strict=True):
        if (x, op, y) != (a, want_op, b):
            return "wrong_operands"
        if z != result:
            return "wrong_result"
    return RIGHT


def steps_right(problem: str, response: str) -> bool:
    """Whether the response reaches its answer through the problem's right steps."""
    return check_steps(problem, response) == RIGHT
