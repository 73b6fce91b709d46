"""CombinedReward (a weighted sum of rewards, each component logged) and ThinkFormatReward (the `erpo-paper`
template's format), issue 41: sums by hand, refusals with clear messages, the rollout's per-component metrics, the
format rules on hostile strings, and the docs' examples as written."""

import copy
import math
import time
from typing import get_args

import pytest
from helpers.docs import example
from helpers.policies import ParityReward, PolicyModule, fit_rollouts, query_loader

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.callbacks.completions import verdicts_of
from erpo_lightning.rewards import CombinedReward, MathReward, ThinkFormatReward, format_status
from erpo_lightning.rewards.think_format import FormatStatus
from erpo_lightning.rollout import HFEngine


def length(responses, golds):
    return [float(len(response)) for response in responses]


def matches(responses, golds):
    return [float(response == gold) for response, gold in zip(responses, golds, strict=True)]


def test_the_weighted_sum_and_each_components_mean_by_hand():
    reward = CombinedReward([length, matches], weights=[0.5, -2.0])
    assert reward.names == ["length", "matches"]
    # length 2, 1, 0 x 0.5; matches 1, 0, 1 x -2
    assert reward(["ab", "x", ""], ["ab", "y", ""]) == [1.0 - 2.0, 0.5, -2.0]
    assert reward(["abcd"], ["no"]) == [2.0]
    assert reward.components() == {"length": (2 + 1 + 0 + 4) / 4, "matches": 2 / 4}  # raw means over both calls
    assert reward.components() == {}  # reset: nothing graded since
    assert CombinedReward([length, matches])(["ab"], ["ab"]) == [3.0]  # weights default to 1


class Recorded:
    """A component with a keyword signature of its own, recording what it was given."""

    def __init__(self) -> None:
        self.given: list[dict] = []

    def __call__(self, responses, golds, difficulty, prompts=None):
        self.given.append({"difficulty": difficulty, "prompts": prompts})
        return [float(level) for level in difficulty]


def test_each_component_gets_the_inputs_its_own_signature_takes():
    recorded = Recorded()
    reward = CombinedReward([matches, recorded], weights=[1.0, 10.0], names=["exact", "hard"])
    inputs = {"prompts": ["P1", "P2"], "problems": ["p1", "p2"], "difficulty": [3, 5], "topic": ["a", "b"]}
    assert reward(["1", "2"], ["1", "0"], **inputs) == [31.0, 50.0]  # `matches` would raise on any keyword
    assert recorded.given == [{"difficulty": [3, 5], "prompts": ["P1", "P2"]}]
    with pytest.raises(ValueError, match=r"^CombinedReward component 'hard': the reward .*Recorded requires"):
        reward(["1"], ["1"], prompts=["P"])


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"rewards": []}, ValueError, "needs at least one reward"),
        ({"rewards": [length, matches], "weights": [1.0]}, ValueError, "2 rewards but 1 weights: give one per reward"),
        ({"rewards": [length], "names": ["a", "b"]}, ValueError, "1 rewards but 2 names"),
        ({"rewards": [length, matches], "weights": [1.0, math.nan]}, ValueError, r"weights\[1\] is nan: every weight"),
        ({"rewards": [length], "weights": [math.inf]}, ValueError, r"weights\[0\] is inf"),
        ({"rewards": [length], "weights": ["heavy"]}, ValueError, r"weights\[0\] is 'heavy'"),
        ({"rewards": [length], "weights": [True]}, ValueError, r"weights\[0\] is True"),
        ({"rewards": [MathReward(), MathReward()]}, ValueError, "components 0 and 1 are both named 'math_reward'"),
        ({"rewards": [length, matches], "names": ["x", "x"]}, ValueError, "components 0 and 1 are both named 'x'"),
        ({"rewards": [length], "names": ["my reward"]}, ValueError, "component 0 is named 'my reward': a name is"),
        ({"rewards": [length], "names": [""]}, ValueError, "component 0 is named ''"),
        ({"rewards": [lambda r, g: r]}, ValueError, r"component 0 is named '<lambda>'.*give `names:`"),
        ({"rewards": [length, 3.0], "names": ["a", "b"]}, TypeError, "component 'b': the reward builtins.float is a"),
        ({"rewards": [lambda r: r], "names": ["one"]}, TypeError, r"component 'one': .*first two arguments"),
    ],
)
def test_a_construction_that_cannot_work_is_refused_naming_the_problem(arguments, error, message):
    with pytest.raises(error, match=message):
        CombinedReward(**arguments)


def returning(values):
    def component(responses, golds):
        return values

    return component


@pytest.mark.parametrize(
    ("value", "shown"),
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (None, "None"), ("1.0x", "'1.0x'"), ([1], r"\[1\]")],
)
def test_a_component_value_that_is_not_a_finite_number_is_refused_naming_component_and_row(value, shown):
    reward = CombinedReward([length, returning([0.0, value, 1.0])], names=["length", "shaky"])
    with pytest.raises(ValueError, match=rf"component 'shaky' returned {shown} for row 1 \(response 'second'\): "
                                         "every component must return a finite number"):  # fmt: skip
        reward(["first", "second", "third"], ["", "", ""])


@pytest.mark.parametrize("value", ["1.0", b"1", "0"])
def test_a_component_that_returns_text_is_refused_even_when_it_reads_as_a_number(value):
    """Issue 54: `float("1.0")` would read it; a component that returns text has a bug, named with its row."""
    reward = CombinedReward([length, returning([0.5, value])], names=["length", "texty"])
    expected = rf"component 'texty' returned {value!r} for row 1 \(response 'b'\): every component must return a finite"
    with pytest.raises(ValueError, match=expected + " number for every response, not text$"):
        reward(["a", "b"], ["", ""])


def test_a_wrong_count_a_non_list_and_an_overflowing_sum_are_refused_naming_them():
    responses, golds = ["a", "b"], ["", ""]
    with pytest.raises(ValueError, match=r"^CombinedReward component 'short': the reward .* returned 1 values for 2"):
        CombinedReward([returning([1.0])], names=["short"])(responses, golds)
    with pytest.raises(ValueError, match=r"^CombinedReward component 'scalar': .* returned a float, not a list of 2"):
        CombinedReward([returning(1.0)], names=["scalar"])(responses, golds)
    big = CombinedReward([returning([1.0, 1.0]), returning([1.0, 1.0])], weights=[1e308, 1e308], names=["a", "b"])
    with pytest.raises(ValueError, match="the weighted sum of row 0 is inf .* overflows"):
        big(responses, golds)


class Closable:
    def __init__(self) -> None:
        self.closed = 0

    def __call__(self, responses, golds):
        return [0.5] * len(responses)

    def close(self) -> None:
        self.closed += 1


def test_counters_verdicts_settings_close_and_copies_cover_every_component():
    closable = Closable()
    reward = CombinedReward([MathReward(num_workers=0), ThinkFormatReward(), closable], names=["math", "format", "c"])
    reward(["<think>ok</think> \\boxed{2}", "2"], ["2", "3"])
    counters = reward.counters()
    assert counters["math_items"] == 2 and counters["math_correct"] == 1
    assert counters["format_items"] == 2 and counters["format_well_formed"] == 1 and counters["format_no_think"] == 1
    assert not any(key.startswith("c_") for key in counters)  # a component without counters adds none
    described = reward.describe()
    assert [(c["name"], c["weight"], c["class"].rsplit(".", 1)[1]) for c in described["components"]] == [
        ("math", 1.0, "MathReward"), ("format", 1.0, "ThinkFormatReward"), ("c", 1.0, "Closable"),
    ]  # fmt: skip
    assert described["components"][0]["preset"] == "strict"  # MathReward's own settings
    assert [verdict.correct for verdict in reward.grade(["\\boxed{2}", "3"], ["2", "2"])] == [True, False]
    assert verdicts_of(reward, ["\\boxed{2}"], ["2"])[0]["correct"] is True  # completions.jsonl's `correct`
    no_verdict = {"correct": None, "grader_status": None, "conventions": None}
    assert verdicts_of(CombinedReward([length]), ["a"], ["b"]) == [no_verdict]  # no component grades answers
    reward(["x"], ["y"])
    clone = copy.deepcopy(reward)
    assert clone.components() == {} and reward.components() != {}  # a copy reports only what it grades
    with reward:
        pass
    assert closable.closed == 1


@pytest.mark.filterwarnings("ignore:every response of this run's first step")
def test_the_rollout_callback_logs_each_component_as_its_own_metric(tiny_model_path):
    def level(responses, golds, level):  # the data column `level` of query_loader: the query's index
        return [float(value) for value in level]

    reward = CombinedReward([ParityReward(), level], weights=[1.0, 0.5], names=["parity", "level"])
    module = PolicyModule(str(tiny_model_path))
    callback = RolloutCallback(HFEngine(), reward, group_size=4, max_new_tokens=8, seed=0)
    trainer = fit_rollouts(module, callback, 2, train_dataloaders=query_loader(["parity"] * 4, batch_size=2))
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    last = module.batches[-1]  # queries 2 and 3, four responses each
    assert last.query_index.tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    parity = last.rewards - 0.5 * last.query_index.float()
    assert set(parity.tolist()) <= {0.0, 1.0}  # the sum is the parity reward plus half the level, row by row
    assert metrics["rollout/reward/level"] == 2.5  # raw mean of the step's levels 2, 2, 2, 2, 3, 3, 3, 3
    assert metrics["rollout/reward/parity"] == pytest.approx(parity.mean().item())
    assert metrics["rollout/reward_mean"] == pytest.approx(last.rewards.mean().item())
    assert metrics["rollout/grader_parity_timeouts"] == 0.0  # the components' counters, by component


FORMAT_CASES = [
    ("<think>2 + 2 = 4</think> The answer is \\boxed{4}.", "well_formed"),
    ("\n  <think>\n2 + 2 = 4\n</think>\n\\boxed{4}\n", "well_formed"),  # whitespace around is fine
    ("<think>x² + y² = 25, 答案是 5 🙂</think> \\boxed{5}", "well_formed"),
    ("<think>a</think> \\boxed{1} then \\boxed{\\frac{1}{2}}", "well_formed"),  # the last box counts
    ("The answer is \\boxed{4}.", "no_think"),
    ("<THINK>2 + 2 = 4</THINK> \\boxed{4}", "no_think"),  # tags are exact, lower case
    ("<think>a</think> <think>b</think> \\boxed{4}", "several_tags"),
    ("<think>a <think>b</think></think> \\boxed{4}", "several_tags"),
    ("<think>a</think> \\boxed{4} </think>", "several_tags"),
    ("<think>2 + 2 = 4, \\boxed{4}", "unpaired"),
    ("2 + 2 = 4</think> \\boxed{4}", "unpaired"),
    ("Sure! <think>2 + 2 = 4</think> \\boxed{4}", "text_before_think"),
    ("</think> \\boxed{4} <think>", "text_before_think"),
    ("<think> \u200b\n</think> \\boxed{4}", "empty_thought"),  # a zero-width space is no thought
    ("<think>2 + 2 = 4</think>", "no_answer"),
    ("<think>2 + 2 = 4</think> \n\ufeff", "no_answer"),
    ("<think>2 + 2 = 4</think> 4", "no_boxed_answer"),
    ("<think>\\boxed{4}</think> so 4", "no_boxed_answer"),  # a box inside the thought is not the answer
    ("<think>2 + 2 = 4</think> \\boxed{4", "no_boxed_answer"),  # unterminated
    ("<think>2 + 2 = 4</think> \\boxed{ }", "no_boxed_answer"),  # empty
    ("<think>2 + 2 = 4</think> \\boxed{\\boxed{}}", "no_boxed_answer"),  # issue 54: a box that shows nothing
    ("<think>2 + 2 = 4</think> \\boxed{\\text{ }}", "no_boxed_answer"),
    ("<think>2 + 2 = 4</think> \\boxed{\\quad}", "no_boxed_answer"),
    ("<think>2 + 2 = 4</think> \\boxed{$ $}", "no_boxed_answer"),
    ("<think>2 + 2 = 4</think> \\boxed{{}}", "no_boxed_answer"),
    ("<think>2 + 2 = 4</think> \\boxed{4} and \\boxed{", "no_boxed_answer"),  # the last box is unterminated
    (b"<think>ok</think> \\boxed{1}", "well_formed"),  # bytes are decoded
    (b"<think>\xff\xfe</think> \\boxed{1}", "well_formed"),  # undecodable bytes are replaced, not fatal
    (None, "not_text"),
    (42, "not_text"),
]


@pytest.mark.parametrize(("response", "status"), FORMAT_CASES)
def test_the_think_format_follows_its_documented_rules(response, status):
    assert format_status(response) == status
    assert ThinkFormatReward()([response], ["4"]) == [float(status == "well_formed")]


def test_answers_without_a_box_pass_when_the_box_is_not_required():
    reward = ThinkFormatReward(require_boxed=False)
    responses = ["<think>2 + 2</think> 4", "<think>2 + 2</think> ", "4", "<think>2 + 2</think> \\boxed{}"]
    assert reward(responses, ["4"] * 4) == [1.0, 0.0, 0.0, 0.0]  # an empty box shows nothing (issue 54)


def test_a_prompt_that_opens_the_think_block_counts_as_the_responses_opening_tag():
    reward = ThinkFormatReward()
    responses = ["2 + 2 = 4</think> \\boxed{4}", "<think>2 + 2 = 4</think> \\boxed{4}"]
    opened = "<|im_start|>assistant\n<think>\n"
    assert reward(responses, ["4", "4"], prompts=[opened, opened]) == [1.0, 0.0]  # the second opens a second block
    assert reward(responses, ["4", "4"], prompts=["<|im_start|>assistant\n"] * 2) == [0.0, 1.0]
    assert reward.counters()["several_tags"] == 1
    with pytest.raises(ValueError, match="1 prompts for 2 responses"):
        reward(responses, ["4", "4"], prompts=[opened])


def hostile_responses() -> list[object]:
    """Strings built to break a tag scanner: deep nesting, floods of tags, huge inputs, broken unicode."""
    return [
        "<think>" * 10_000 + "x" + "</think>" * 10_000,  # 150,000 characters: read
        "</think>" * 20_000,
        "<think>" + "a" * 190_000 + "</think> \\boxed{1}",  # just under the bound: read in full
        "<think>" + "{" * 100_000 + "</think> \\boxed{" + "{" * 50_000,
        "<think>a</think> " + "\\boxed{" * 20_000 + "1" + "}" * 20_000,
        "x" * 10_000_000,  # 10 MB: refused unread
        "<think>\ud800\udfff lone surrogates</think> \\boxed{\udc80}",
        "<think>\x00\x01\x02</think> \\boxed{\x00}",
        "<thi\u200bnk>zero-width inside a tag</thi\u200bnk> \\boxed{1}",
        "<think>\u202eright-to-left\u202c</think> \\boxed{١٢}",
        "<" * 100_000 + "think>" + ">" * 100_000,
        "\\" * 150_000 + "<think>a</think>\\boxed{1}",
        b"\xff" * 1_000_000,
        "",
    ]


def test_hostile_responses_never_raise_and_each_scores_quickly():
    reward = ThinkFormatReward()
    statuses = set(get_args(FormatStatus))
    for response in hostile_responses():
        start = time.monotonic()
        status = format_status(response)
        assert reward([response], [""]) in ([0.0], [1.0])
        assert status in statuses
        assert time.monotonic() - start < 2.0, repr(response[:60])
    expected = ["several_tags", "several_tags", "well_formed", "no_boxed_answer", "well_formed", "too_long"]
    assert [format_status(r) for r in hostile_responses()[:6]] == expected
    assert format_status("<think>x</think> \\boxed{1}", max_response_chars=10) == "too_long"


def test_docs_examples_of_the_combined_and_think_format_rewards_run_as_written():
    for name in ("combined-reward", "think-format"):
        exec(compile(example("rewards.md", name), f"docs/rewards.md:{name}", "exec"), {})


def test_completions_grade_a_restating_answer_as_the_training_reward_paid_it():
    """completions.jsonl's `correct` comes from `grade` given the rows' problems, as the rollout's reward is: an
    answer that restates its problem's arithmetic is not `correct` there while the reward paid it 0."""
    reward = MathReward()
    restating, problem = "\\boxed{\\frac{38}{2}}", "Compute 38/2."
    assert reward([restating], ["19"], problems=[problem]) == [0.0]
    assert verdicts_of(reward, [restating], ["19"], [problem])[0]["correct"] is False
    assert verdicts_of(reward, [restating], ["19"])[0]["correct"] is True  # no problem text: paid by its value

    def grade_without_problems(responses, golds):  # a user's grade() that takes no problems still works
        return reward.grade(responses, golds)

    holder = type("Custom", (), {"grade": staticmethod(grade_without_problems)})()
    assert verdicts_of(holder, [restating], ["19"], [problem])[0]["correct"] is True
