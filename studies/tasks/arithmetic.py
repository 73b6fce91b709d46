"""Seeded arithmetic tasks harder than the toy's, for studies on small real models
(studies/real_model/real_model_study.md).

A family is a problem shape; `make_splits` draws a train and a test split of distinct problems from it with a seed,
and `write_task` writes them as JSONL (`{"id", "problem", "answer"}` rows, the format `data.train` and a sweep's
benchmarks read) with a manifest naming the family, the seed, the sizes and each file's sha256. Problems read like
the toy's ("Compute 47 + 8 - 3."): evaluated left to right, integer answers.

    python -m studies.tasks.arithmetic two_digit_plus_two_digit --train 64 --test 200 --seed 0 --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

Family = Literal["four_single_digits", "two_digit_plus_single_digits", "two_digit_plus_two_digit"]
MANIFEST = "manifest.json"


def _four_single_digits() -> Iterator[list[int | str]]:
    """a ± b ± c ± d with single digits; every partial result is >= 0."""
    for a, op1, b, op2, c, op3, d in itertools.product(range(10), "+-", range(10), "+-", range(10), "+-", range(10)):
        yield [a, op1, b, op2, c, op3, d]


def _two_digit_plus_single_digits() -> Iterator[list[int | str]]:
    """ab + c - d: a two-digit number, then a single digit added and one subtracted."""
    for ab, c, d in itertools.product(range(10, 100), range(1, 10), range(1, 10)):
        yield [ab, "+", c, "-", d]


def _two_digit_plus_two_digit() -> Iterator[list[int | str]]:
    """ab + cd with two two-digit numbers."""
    for ab, cd in itertools.product(range(10, 100), range(10, 100)):
        yield [ab, "+", cd]


FAMILIES: dict[str, Callable[[], Iterator[list[int | str]]]] = {
    "four_single_digits": _four_single_digits,
    "two_digit_plus_single_digits": _two_digit_plus_single_digits,
    "two_digit_plus_two_digit": _two_digit_plus_two_digit,
}


def evaluate(terms: list[int | str]) -> list[int]:
    """The partial results of `terms` ([n, op, n, op, n, ...]) evaluated left to right; the last is the answer."""
    partial = [int(terms[0])]
    for op, number in zip(terms[1::2], terms[2::2], strict=True):
        partial.append(partial[-1] + number if op == "+" else partial[-1] - number)
    return partial


def all_problems(family: str) -> list[dict]:
    """Every problem of `family` with no negative partial result, in a fixed order, as `{"id", "problem",
    "answer"}` rows (the id is derived from the problem, so it is stable across splits and seeds)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown arithmetic family {family!r}; choose one of: {', '.join(FAMILIES)}")
    rows = []
    for terms in FAMILIES[family]():
        partial = evaluate(terms)
        if min(partial) < 0:
            continue
        text = " ".join(map(str, terms))
        rows.append(
            {"id": f"{family}-{text.replace(' ', '')}", "problem": f"Compute {text}.", "answer": str(partial[-1])}
        )
    return rows


def make_splits(family: str, num_train: int, num_test: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test): disjoint random draws of `num_train` and `num_test` problems of `family`, fixed by `seed`."""
    rows = all_problems(family)
    if num_train < 1 or num_test < 1 or num_train + num_test > len(rows):
        raise ValueError(
            f"{family} has {len(rows)} problems: num_train ({num_train}) and num_test ({num_test}) must be >= 1 and "
            "add up to at most that"
        )
    random.Random(seed).shuffle(rows)
    return rows[:num_train], rows[num_train : num_train + num_test]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_task(family: str, num_train: int, num_test: int, seed: int, out: Path) -> dict:
    """Write `train.jsonl`, `test.jsonl` and the manifest (returned) of one task into the directory `out`."""
    train, test = make_splits(family, num_train, num_test, seed)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        files[name] = _sha256(out / name)
    manifest = {"family": family, "seed": seed, "num_train": num_train, "num_test": num_test, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_task(directory: Path) -> dict:
    """The manifest of a written task, after checking that its files are the ones it names and that the generator
    still makes them (ValueError naming the file otherwise)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    for name, digest in manifest["files"].items():
        if _sha256(directory / name) != digest:
            raise ValueError(f"{directory / name} differs from its manifest's sha256")
    train, test = make_splits(manifest["family"], manifest["num_train"], manifest["num_test"], manifest["seed"])
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        if (directory / name).read_text() != "".join(json.dumps(row) + "\n" for row in rows):
            raise ValueError(f"{directory / name} is not what the generator makes from its manifest")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=list(FAMILIES))
    parser.add_argument("--train", type=int, required=True, help="training problems")
    parser.add_argument("--test", type=int, required=True, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="directory for train.jsonl, test.jsonl, manifest.json")
    args = parser.parse_args(argv)
    print(json.dumps(write_task(args.family, args.train, args.test, args.seed, args.out), indent=1))


if __name__ == "__main__":
    main()
