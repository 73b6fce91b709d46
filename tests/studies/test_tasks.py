"""The seeded arithmetic tasks (studies/tasks/arithmetic.py) and the real-model study's shipped task."""

import json
from pathlib import Path

import pytest

from erpo_lightning.rewards import verify_answer
from studies.tasks.arithmetic import FAMILIES, all_problems, evaluate, make_splits, verify_task, write_task

SHIPPED = Path(__file__).resolve().parents[2] / "studies" / "tasks" / "shipped" / "study_arith"


def test_left_to_right_evaluation_by_hand():
    assert evaluate([47, "+", 8, "-", 3]) == [47, 55, 52]
    assert evaluate([9, "-", 9, "+", 0, "-", 0]) == [9, 0, 0, 0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_problem_reads_as_its_answer_and_never_goes_negative(family):
    rows = all_problems(family)
    assert len({row["id"] for row in rows}) == len(rows) == len({row["problem"] for row in rows})
    for row in rows[:: max(1, len(rows) // 200)]:
        terms = row["problem"].removeprefix("Compute ").removesuffix(".").split()
        numbers = [int(t) if t not in "+-" else t for t in terms]
        partial = evaluate(numbers)
        assert min(partial) >= 0 and str(partial[-1]) == row["answer"]
        assert verify_answer(f"The answer is {row['answer']}.", row["answer"])


def test_splits_are_disjoint_seeded_and_sized():
    train, test = make_splits("two_digit_plus_single_digits", 64, 200, seed=0)
    assert len(train) == 64 and len(test) == 200
    assert not {r["problem"] for r in train} & {r["problem"] for r in test}
    assert make_splits("two_digit_plus_single_digits", 64, 200, seed=0) == (train, test)
    assert make_splits("two_digit_plus_single_digits", 64, 200, seed=1) != (train, test)
    with pytest.raises(ValueError, match="two_digit_plus_two_digit has 8100 problems"):
        make_splits("two_digit_plus_two_digit", 8000, 200, seed=0)
    with pytest.raises(ValueError, match="unknown arithmetic family 'sums'"):
        all_problems("sums")


def test_the_shipped_study_task_is_what_the_generator_makes(tmp_path):
    manifest = verify_task(SHIPPED)
    assert (manifest["num_train"], manifest["num_test"]) == (64, 200)
    written = write_task(manifest["family"], 64, 200, manifest["seed"], tmp_path)
    assert written == manifest
    (tmp_path / "test.jsonl").write_text((tmp_path / "test.jsonl").read_text().replace('"answer": "', '"answer": "1'))
    with pytest.raises(ValueError, match="test.jsonl differs from its manifest"):
        verify_task(tmp_path)
    assert json.loads((SHIPPED / "train.jsonl").read_text().splitlines()[0])["id"].startswith(manifest["family"])
