"""The toy task: two-step arithmetic on single digits, with worked solutions ending in `\\boxed{}`.

A problem reads "Compute 7 + 8 - 5." and its worked solution "7 + 8 = 15. 15 - 5 = 10. \\boxed{10}". Operands are
0..9, operations `+` or `-`, evaluated left to right, and no partial result is negative. There are 2,605 such
problems; prompts are at most 19 characters (with the suffix) and solutions at most 35.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection

from erpo_lightning.data.templates import PromptTemplate, resolve_template

# Appended to every problem by the "plain" template: the solution starts on its own line.
TOY_TEMPLATE_SUFFIX = "\n"


def toy_template() -> PromptTemplate:
    """The prompt template the toy model is pre-trained on; the quickstart config must render the same."""
    return resolve_template("plain", suffix=TOY_TEMPLATE_SUFFIX)


def _apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right


def _all_problems() -> list[dict]:
    """Every problem, in a fixed order, as `{"id", "problem", "answer", "solution"}` rows."""
    rows = []
    for a, op1, b, op2, c in itertools.product(range(10), "+-", range(10), "+-", range(10)):
        first = _apply(a, op1, b)
        answer = _apply(first, op2, c)
        if first < 0 or answer < 0:
            continue
        rows.append(
            {
                "id": f"arith-{a}{op1}{b}{op2}{c}",
                "problem": f"Compute {a} {op1} {b} {op2} {c}.",
                "answer": str(answer),
                "solution": f"{a} {op1} {b} = {first}. {first} {op2} {c} = {answer}. \\boxed{{{answer}}}",
            }
        )
    return rows


NUM_PROBLEMS = len(_all_problems())


def make_problems(n: int, seed: int, *, exclude: Collection[str] = ()) -> list[dict]:
    """`n` distinct problems in a random order, the same for the same `seed`.

    Args:
        n: how many problems; at most NUM_PROBLEMS minus the excluded ones.
        seed: seeds a private `random.Random`; global RNG state is untouched.
        exclude: problem texts never to return (e.g. a held-out split).
    Returns:
        rows `{"id", "problem", "answer", "solution"}`: the id is derived from the problem (stable across splits),
        the answer is the integer result as a string, the solution the worked text without the eos token.
    """
    excluded = set(exclude)
    rows = [row for row in _all_problems() if row["problem"] not in excluded]
    if n > len(rows):
        raise ValueError(f"asked for {n} problems but only {len(rows)} exist outside the excluded ones")
    random.Random(seed).shuffle(rows)
    return rows[:n]
