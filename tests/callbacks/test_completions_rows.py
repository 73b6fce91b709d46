"""What a completions.jsonl row tells a user debugging a run (issue 55): the advantage the update used and each reward
component's value, and whole groups (all G responses of a query) on request.

In-process fits of the shipped toy model (ERPOModule, HF engine, a CombinedReward of the real MathReward and a
length component), each restated by hand: the advantage from the logged group's rewards, the reward from its logged
components."""

import copy
import json
import statistics

import lightning.pytorch as pl
import pytest
import torch
from helpers.batches import make_rollout
from helpers.healthy_run import TRAIN_FILE

import erpo_lightning.modules.erpo_module as erpo_module
from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.callbacks.completions import SampledCompletions, pick_rows, verdicts_of
from erpo_lightning.data import QueryDataModule
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rewards import CombinedReward, MathReward
from erpo_lightning.rewards.combined import response_components
from erpo_lightning.rollout import HFEngine
from erpo_lightning.toy import SHIPPED_DIR

GROUP_SIZE = 4
WEIGHTS = {"math": 1.0, "length": 0.25, "position": 0.5}


def length(responses, golds):
    """A tenth of each response's length in characters: a component whose values differ within a group."""
    return [len(response) / 10 for response in responses]


def position(responses, golds):
    """A tenth of each response's place in the reward's call: values that differ within a group by construction, so
    every group has reward variance and its advantages are not all 0, whatever the model samples."""
    return [index / 10 for index in range(len(responses))]


def combined_reward() -> CombinedReward:
    rewards = [MathReward(num_workers=0), length, position]
    return CombinedReward(rewards, weights=list(WEIGHTS.values()), names=list(WEIGHTS))


def fit_toy(tmp_path, algorithm: str, steps: int = 2, **completions) -> list[dict]:
    """`steps` steps of ERPOModule (`algorithm`) on 4 toy queries, 2 per step x GROUP_SIZE responses, with completions
    every step; the rows of completions.jsonl."""
    data = QueryDataModule(
        str(SHIPPED_DIR), [{"path": str(TRAIN_FILE), "limit": 4}], template="plain", suffix="\n", max_prompt_length=64,
        batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    rollout = RolloutCallback(HFEngine(), combined_reward(), group_size=GROUP_SIZE, max_new_tokens=40, seed=0)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[rollout, SampledCompletions(every_n_steps=1, **completions)],
    )  # fmt: skip
    trainer.fit(ERPOModule(str(SHIPPED_DIR), algorithm=algorithm, learning_rate=1e-4), datamodule=data)
    return [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]


def hand_advantages(rewards: list[float], estimator: str) -> list[float]:
    """The estimator restated: grpo (r - mean) / (sample std + 1e-6), rloo r - mean of the others."""
    mean = statistics.fmean(rewards)
    if estimator == "grpo":
        return [(r - mean) / (statistics.stdev(rewards) + 1e-6) for r in rewards]
    return [r - (sum(rewards) - r) / (len(rewards) - 1) for r in rewards]


@pytest.mark.parametrize(
    ("algorithm", "estimator", "max_rows", "groups_logged"),
    [("grpo", "grpo", 8, 2), ("rloo", "rloo", 2, 1)],  # 2 rows < G: still one whole group
)
def test_whole_groups_carry_the_updates_advantages_and_the_reward_components(
    tmp_path, monkeypatch, algorithm, estimator, max_rows, groups_logged
):
    used = []  # the advantages each update used, as the module computed them
    computed_by_module = erpo_module.global_advantages

    def recording(*args, **kwargs):
        advantages = computed_by_module(*args, **kwargs)
        used.append(advantages.tolist())
        return advantages

    monkeypatch.setattr(erpo_module, "global_advantages", recording)
    rows = fit_toy(tmp_path, algorithm, whole_groups=True, max_rows=max_rows)
    per_step = GROUP_SIZE * groups_logged
    assert len(used) == 2, "ERPOModule.train_on no longer calls global_advantages: record what it calls now"
    assert len(rows) == 2 * per_step
    assert [row["step"] for row in rows] == [1] * per_step + [2] * per_step
    assert [row["group_index"] for row in rows[:per_step]] == sorted(list(range(groups_logged)) * GROUP_SIZE)
    for step in range(2):
        step_rows = rows[step * per_step : (step + 1) * per_step]
        assert [row["advantage"] for row in step_rows] == pytest.approx(used[step][:per_step], abs=1e-6)
        for start in range(0, per_step, GROUP_SIZE):
            group = step_rows[start : start + GROUP_SIZE]
            assert len({row["query_index"] for row in group}) == 1  # one query's G responses
            expected = hand_advantages([row["reward"] for row in group], estimator)
            assert [row["advantage"] for row in group] == pytest.approx(expected, abs=1e-5)
    for row in rows:
        components = row["reward_components"]
        assert set(components) == set(WEIGHTS)
        assert row["reward"] == pytest.approx(sum(WEIGHTS[name] * components[name] for name in WEIGHTS), abs=1e-6)
        assert components["math"] == (1.0 if row["correct"] else 0.0)  # MathReward's value is its verdict
        assert components["length"] == pytest.approx(len(row["response"]) / 10, abs=1e-6)  # as the reward saw it
    for start in range(0, len(rows), GROUP_SIZE):  # by construction every group's rewards differ, so the advantage
        group = rows[start : start + GROUP_SIZE]  # checks above compare non-zero values, never 0 == 0
        assert len({row["reward_components"]["position"] for row in group}) == GROUP_SIZE
        assert max(abs(row["advantage"]) for row in group) > 0.01


def test_one_response_per_query_first_unless_whole_groups():
    """By default the first response of each query comes first; whole groups keep a query's G rows together, as many
    whole groups as max_rows holds and never fewer than one."""
    batch = make_rollout([[1], [2], [3]], [[4]] * 6, [0.0] * 6, 1.0)  # 3 queries x G = 2
    assert pick_rows(batch, 4) == [0, 2, 4, 1]
    assert pick_rows(batch, 4, whole_groups=True) == [0, 1, 2, 3]
    assert pick_rows(batch, 5, whole_groups=True) == [0, 1, 2, 3]
    assert pick_rows(batch, 1, whole_groups=True) == [0, 1]
    assert pick_rows(batch, 100, whole_groups=True) == list(range(6))


def test_components_are_recorded_from_the_one_grading_call():
    """A CombinedReward keeps each component's raw values of its latest call (nothing graded again to log them); a
    single reward is its own one component; a copy starts with no record."""
    calls = []

    def counted(responses, golds):
        calls.append(len(responses))
        return [2.0] * len(responses)

    reward = CombinedReward([MathReward(num_workers=0), counted], weights=[1.0, -0.5], names=["math", "count"])
    totals = reward(["\\boxed{4}", "5"], ["4", "4"])
    assert totals == [0.0, -1.0] and calls == [2]
    assert response_components(reward, totals) == {"math": [1.0, 0.0], "count": [2.0, 2.0]}
    assert calls == [2]  # read from the record, not graded again
    assert response_components(reward, [0.0]) is None  # a record of another call is not passed off as this one's
    assert response_components(copy.deepcopy(reward), totals) is None  # a copy (a worker's) has graded nothing
    assert response_components(counted, [2.0, 2.0]) == {"counted": [2.0, 2.0]}


def test_reward_components_follow_the_rows_they_belong_to():
    batch = make_rollout([[1], [2]], [[4], [5], [6], [7]], [0.0, 1.0, 2.0, 3.0], 1.0)
    batch.reward_components = {"math": torch.tensor([0.0, 1.0, 2.0, 3.0])}
    picked = batch.select_rows(torch.tensor([3, 1])).to("cpu")
    assert picked.reward_components["math"].tolist() == [3.0, 1.0] == picked.rewards.tolist()


def test_a_grade_that_fails_leaves_the_verdicts_empty_and_says_so_once(capsys):
    class BrokenGrade:
        def __call__(self, responses, golds):
            return [0.0] * len(responses)

        def grade(self, responses, golds):
            raise RuntimeError("grader down")

    callback = SampledCompletions()
    for _ in range(2):
        verdicts = callback._verdicts(BrokenGrade(), ["1"], ["1"], None)
        assert verdicts == [{"correct": None, "grader_status": None, "conventions": None}]
    assert capsys.readouterr().err.count("grader down") == 1


@pytest.mark.parametrize("combined", [False, True])
def test_the_log_grades_again_without_counting_twice(combined):
    """The rollout's grader counters count each response once: the completions log's second grading of the same
    pairs (`verdicts_of`) leaves them as they were, for MathReward alone and inside a CombinedReward."""
    math = MathReward(num_workers=0)
    reward = CombinedReward([math], names=["math"]) if combined else math
    responses, golds = ["\\boxed{4}", "no answer here", "\\boxed{5}"], ["4", "4", "4"]
    reward(responses, golds)  # what the rollout pays
    verdicts = verdicts_of(reward, responses, golds)
    assert [v["correct"] for v in verdicts] == [True, False, False]
    counters = reward.counters()
    prefix = "math_" if combined else ""
    assert counters[f"{prefix}items"] == 3 and counters[f"{prefix}correct"] == 1
    assert counters[f"{prefix}extraction_failures"] == 1
    reward(responses, golds)
    assert reward.counters()[f"{prefix}items"] == 3  # counted again outside the log: the counters still count
