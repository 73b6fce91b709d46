"""Rewards receive what they need (issue 41): prompts, problem texts and data columns by keyword, one entry per
response and aligned with the responses; the two-argument form unchanged; data columns named in a source and checked
when the data loads; a plain function named from YAML."""

import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.docs import example
from helpers.policies import ParityReward, PolicyModule, fit_rollouts
from jsonargparse import ArgumentParser

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data import DataError, QueryDataModule, load_queries, prepare_queries
from erpo_lightning.data.fingerprint import dataset_fingerprint, fingerprint_digest
from erpo_lightning.data.prepare import PromptFormat
from erpo_lightning.data.sources import resolve_spec
from erpo_lightning.data.templates import PRESETS, render_prompt, resolve_template, tokenize_prompts
from erpo_lightning.evaluation.sweep import Benchmark, Sweep, SweepConfig
from erpo_lightning.rewards import CombinedReward, RewardSignature
from erpo_lightning.rewards.combined import check_reward_inputs
from erpo_lightning.rewards.protocol import score_responses
from erpo_lightning.rollout import HFEngine, RolloutSampler, SamplingSettings
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model

PROBLEMS = ["Compute 1 + 2.", "What is 7 - 3?", "Say ½ of 10, in words: «five»."]


class Recorder:
    """Records the keyword inputs of every call; pays `len(prompt)` so that the values show which prompt each
    response was scored with."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, responses, golds, prompts):
        self.calls.append({"responses": list(responses), "golds": list(golds), "prompts": list(prompts)})
        return [float(len(prompt)) for prompt in prompts]


class TakesEverything:
    """Takes every input (`**inputs`) and records the golds and inputs of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict]] = []

    def __call__(self, responses, golds, **inputs):
        self.calls.append((list(golds), inputs))
        return [0.0] * len(responses)


def two_lists(responses, golds):
    return [float(response == gold) for response, gold in zip(responses, golds, strict=True)]


def needs_difficulty(responses, golds, difficulty):
    return [float(level) for level in difficulty]


def sampler_on_tiny_model(path: Path, reward) -> RolloutSampler:
    sampler = RolloutSampler(HFEngine(), reward, SamplingSettings(max_new_tokens=4), build_byte_tokenizer())
    sampler.setup(load_tiny_model(path))
    return sampler


def test_a_reward_taking_prompts_gets_the_prompts_of_its_responses_in_order(tiny_model_path):
    tokenizer = build_byte_tokenizer()
    template = PRESETS["erpo-paper"]  # chat template and instruction suffix: special tokens and non-ASCII problems
    texts = [render_prompt(template, problem, tokenizer) for problem in PROBLEMS]
    reward = Recorder()
    sampler = sampler_on_tiny_model(tiny_model_path, reward)
    graded = sampler.sample_and_grade(tokenize_prompts(template, PROBLEMS, tokenizer), ["3", "4", "5"], 2, 1.0, 0)
    assert len(reward.calls) == 1
    call = reward.calls[0]
    assert call["prompts"] == [texts[0], texts[0], texts[1], texts[1], texts[2], texts[2]]
    assert call["golds"] == ["3", "3", "4", "4", "5", "5"] and call["responses"] == graded.texts
    assert graded.rewards.tolist() == [[float(len(text))] * 2 for text in texts]


def test_the_two_argument_reward_gets_only_the_lists_and_a_catch_all_reward_gets_every_input(tiny_model_path):
    prompts = tokenize_prompts(PRESETS["plain"], PROBLEMS, build_byte_tokenizer())
    for reward in (ParityReward(), two_lists):  # would raise on any keyword argument
        graded = sampler_on_tiny_model(tiny_model_path, reward).sample_and_grade(
            prompts, ["parity"] * 3, 2, 1.0, 0, problems=PROBLEMS, data_columns={"level": [1, 2, 3]}
        )
        assert graded.rewards.tolist() == [reward(graded.texts[2 * b : 2 * b + 2], ["parity"] * 2) for b in range(3)]
    everything = TakesEverything()
    sampler = sampler_on_tiny_model(tiny_model_path, everything)
    sampler.sample_and_grade(prompts, ["1"] * 3, 2, 1.0, 0, problems=PROBLEMS, data_columns={"level": [1, 2, 3]})
    (_, inputs), *more = everything.calls
    assert sorted(inputs) == ["level", "problems", "prompts"] and not more
    assert inputs["problems"] == [p for p in PROBLEMS for _ in range(2)]
    assert inputs["level"] == [1, 1, 2, 2, 3, 3]
    assert inputs["prompts"] == [p for p in PROBLEMS for _ in range(2)]  # plain template: the text itself


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def numbered_rows(count: int) -> list[dict]:
    """Row i: problem "Compute i + 1." (answer i + 1), difficulty i % 3 + 1, topic "odd"/"even"."""
    return [
        {"id": i, "problem": f"Compute {i} + 1.", "answer": str(i + 1), "difficulty": i % 3 + 1,
         "topic": "odd" if i % 2 else "even"}
        for i in range(count)
    ]  # fmt: skip


class DataRecorder:
    """Takes problems and two data columns; pays the difficulty, so the trained rows show which query's it was."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, responses, golds, problems, difficulty, topic):
        self.calls.append((list(golds), list(problems), list(difficulty), list(topic)))
        return [float(level) for level in difficulty]


def test_problems_and_carried_columns_arrive_aligned_with_responses_through_a_fit(tiny_model_path, tmp_path):
    rows = numbered_rows(6)
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    data = QueryDataModule(
        str(tiny_model_path), [{"path": str(path), "columns": ["difficulty", "topic"]}], template="plain",
        max_prompt_length=64, batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    reward = DataRecorder()
    module = PolicyModule(str(tiny_model_path))
    callback = RolloutCallback(HFEngine(), reward, group_size=3, max_new_tokens=4, seed=0)
    fit_rollouts(module, callback, 2, datamodule=data)
    assert len(reward.calls) == 2
    for golds, problems, difficulty, topic in reward.calls:
        assert len(golds) == len(problems) == len(difficulty) == len(topic) == 6  # 2 queries x 3 responses
        for i, gold in enumerate(golds):
            row = rows[int(gold) - 1]  # golds are distinct: each names its row
            assert (problems[i], difficulty[i], topic[i]) == (row["problem"], row["difficulty"], row["topic"])
        assert golds[0] == golds[1] == golds[2] and golds[3] == golds[4] == golds[5]
    for batch in module.batches:  # each trained row carries its own query's reward
        assert batch.rewards.tolist() == [float(rows[q]["difficulty"]) for q in batch.query_index.tolist()]


def test_the_sweep_offers_each_benchmarks_problems_and_the_columns_it_carries(tiny_model_path, tmp_path):
    hard = write_jsonl(tmp_path / "hard.jsonl", numbered_rows(3))
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"problem": f"Say {word}.", "answer": word} for word in "xy"])
    benchmarks = [Benchmark({"path": str(hard), "columns": ["difficulty"]}, 2), Benchmark({"path": str(plain)}, 2)]
    config = SweepConfig(benchmarks, temperatures=[1.0], max_new_tokens=4, batch_size=3, progress=False)
    reward = TakesEverything()
    sweep = Sweep(config, sampler_on_tiny_model(tiny_model_path, reward), PromptFormat(resolve_template("plain"), 64))
    sweep.run(load_tiny_model(tiny_model_path))
    (hard_golds, hard_inputs), (plain_golds, plain_inputs) = reward.calls  # chunks of 3 problems: hard, then plain
    assert hard_golds == ["1", "1", "2", "2", "3", "3"] and plain_golds == ["x", "x", "y", "y"]
    assert hard_inputs["problems"] == [f"Compute {i} + 1." for i in (0, 0, 1, 1, 2, 2)]
    assert hard_inputs["difficulty"] == [1, 1, 2, 2, 3, 3]
    assert sorted(plain_inputs) == ["problems", "prompts"]  # the plain benchmark carries no difficulty
    assert plain_inputs["problems"] == ["Say x.", "Say x.", "Say y.", "Say y."]


def test_a_required_input_that_is_not_offered_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"needs_difficulty requires difficulty, which this rollout does not give "
                                         r"\(it gives problems, prompts\).*`columns:`"):  # fmt: skip
        check_reward_inputs(needs_difficulty, columns=())
    check_reward_inputs(needs_difficulty, columns=("difficulty",))
    combined = CombinedReward([two_lists, needs_difficulty], names=["exact", "hard"])
    with pytest.raises(ValueError, match=r"^CombinedReward component 'hard': the reward .*needs_difficulty requires"):
        check_reward_inputs(combined, columns=("topic",))
    with pytest.raises(ValueError, match="requires difficulty"):
        score_responses(needs_difficulty, ["a"], ["b"], {"problems": ["p"]})
    assert score_responses(needs_difficulty, ["a"], ["b"], {"difficulty": [4], "problems": ["p"]}) == [4.0]


def test_a_fit_whose_reward_needs_a_column_the_data_does_not_carry_stops_before_any_rollout(tiny_model_path, tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", numbered_rows(4))
    data = QueryDataModule(str(tiny_model_path), [{"path": str(path), "columns": ["topic"]}], template="plain",
                           max_prompt_length=64, batch_size=2, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    reward = DataRecorder()
    callback = RolloutCallback(HFEngine(), reward, group_size=2, max_new_tokens=4, seed=0)
    with pytest.raises(ValueError, match=r"DataRecorder requires difficulty, which this rollout does not give"):
        fit_rollouts(PolicyModule(str(tiny_model_path)), callback, 1, datamodule=data)
    assert reward.calls == []


def late_lists(responses, golds, *, prompts=None, difficulty):
    return [0.0] * len(responses)


class CalledLikeTRL:
    def __call__(self, prompts, completions, **kwargs):  # the two lists arrive by position whatever their names
        return [float("prompts" in kwargs)] * len(prompts)


@pytest.mark.parametrize(
    ("reward", "names", "required", "selected"),
    [
        (two_lists, set(), set(), set()),
        (needs_difficulty, {"difficulty"}, {"difficulty"}, {"difficulty"}),
        (late_lists, {"prompts", "difficulty"}, {"difficulty"}, {"prompts", "difficulty"}),
        (TakesEverything(), set(), set(), {"prompts", "problems", "difficulty"}),
        (Recorder(), {"prompts"}, {"prompts"}, {"prompts"}),
        (CalledLikeTRL(), set(), set(), {"problems", "difficulty"}),
    ],
    ids=["two_lists", "positional_or_keyword", "keyword_only", "kwargs", "method", "lists_named_like_inputs"],
)
def test_the_signature_says_which_offered_inputs_a_reward_gets(reward, names, required, selected):
    signature = RewardSignature.of(reward)
    assert (signature.names, signature.required) == (names, required)
    offered = {"prompts": ["p"], "problems": ["q"], "difficulty": [3]}
    assert set(signature.select(offered)) == selected
    if isinstance(reward, CalledLikeTRL):  # its first list is named `prompts`: not passed a second time
        assert score_responses(reward, ["r"], ["g"], offered, signature) == [0.0]


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("my_rewards.score", "is a str, not a callable"),
        (lambda responses: [1.0], r"must take the two lists \(responses, golds\) as its first two arguments; its "
                                   r"parameters are \(responses\)"),
    ],
    ids=["not_callable", "one_argument"],
)  # fmt: skip
def test_a_reward_that_cannot_take_the_two_lists_is_refused_when_the_sampler_is_built(reward, message):
    with pytest.raises(TypeError, match=message):
        RolloutSampler(HFEngine(), reward)


def test_columns_are_carried_and_a_row_without_a_value_names_file_row_and_column(tmp_path):
    rows = numbered_rows(4)
    del rows[1]["difficulty"]
    rows[2]["topic"] = None
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    spec = {"path": str(path), "columns": ["difficulty", "topic"]}
    with pytest.raises(DataError) as error:
        load_queries(spec)
    message = str(error.value)
    assert f"2 invalid row(s) in {path}" in message
    assert f"{path} line 2, row 2, field 'difficulty': no value in column 'difficulty'" in message
    assert f"{path} line 3, row 3, field 'topic': no value in column 'topic'" in message
    queries, skipped = load_queries(spec, skip_invalid=True)
    assert skipped == {"missing column": 2}
    assert [q.columns for q in queries] == [{"difficulty": 1, "topic": "even"}, {"difficulty": 1, "topic": "odd"}]
    csv_path = tmp_path / "q.csv"
    csv_path.write_text("problem,answer,difficulty\nCompute 1 + 1.,2,easy\nCompute 2 + 2.,4\n")
    with pytest.raises(DataError, match=r"q\.csv line 3, row 2, field 'difficulty': no value in column"):
        load_queries({"path": str(csv_path), "columns": ["difficulty"]})
    with pytest.raises(DataError, match=r"no column 'level' \(named in columns\); its columns are \['id', 'problem'"):
        load_queries({"path": str(path), "columns": ["level"]})


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["prompts"], r"columns\[0\] is 'prompts', a name the reward already receives"),
        (["topic", "golds"], r"columns\[1\] is 'golds', a name the reward already receives"),
        (["2nd_try"], r"columns\[0\] is '2nd_try': .* must be a Python identifier"),
        (["has space"], r"columns\[0\] is 'has space'"),
        (["class"], r"columns\[0\] is 'class'"),
        (["topic", "topic"], "columns names 'topic' twice"),
        ("topic", "columns must be a list of column names"),
    ],
)
def test_column_names_a_reward_cannot_take_by_keyword_are_refused_before_reading(columns, message):
    with pytest.raises(DataError, match=message):
        resolve_spec({"path": "not/read.jsonl", "columns": columns})


def test_every_source_of_a_training_set_names_the_same_columns(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", numbered_rows(2))
    second = write_jsonl(tmp_path / "b.jsonl", numbered_rows(2))
    sources = [{"path": str(first), "columns": ["difficulty"]}, {"path": str(second), "label": "b"}]
    with pytest.raises(DataError, match=r"a\.jsonl and .*b\.jsonl carry different columns \(\['difficulty'\] and \[\]"):
        prepare_queries(sources, build_byte_tokenizer(), PRESETS["plain"], 64)
    sources[1]["columns"] = ["difficulty"]
    data = prepare_queries(sources, build_byte_tokenizer(), PRESETS["plain"], 64)
    assert data.columns == ("difficulty",)
    assert data.data_columns([3, 0]) == {"difficulty": [2, 1]} and data.problems([3]) == ["Compute 1 + 1."]


def test_carried_columns_leave_the_reference_cache_fingerprint_unchanged(tiny_model_path, tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", numbered_rows(4))
    manifests = {}
    for columns in (None, ["difficulty", "topic"]):
        data = QueryDataModule(str(tiny_model_path), [{"path": str(path), "columns": columns}], template="plain")
        manifests[str(columns)] = (data.cache_manifest(), dataset_fingerprint(data.prepare_queries().queries))
    (plain, plain_data), (carrying, carrying_data) = manifests.values()
    assert fingerprint_digest(plain) == fingerprint_digest(carrying) and plain_data == carrying_data


def rollout_parser() -> ArgumentParser:
    """The `rollout:` group as `erpo` parses it (`RolloutCallback`'s arguments)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(RolloutCallback, "rollout")
    return parser


def test_docs_custom_reward_example_and_its_yaml_in_the_configuration_page(monkeypatch):
    my_rewards = types.ModuleType("my_rewards")  # docs/rewards.md's my_rewards.py, importable by its name
    exec(
        compile(example("rewards.md", "reward-keywords"), "docs/rewards.md:reward-keywords", "exec"),
        my_rewards.__dict__,
    )
    monkeypatch.setitem(sys.modules, "my_rewards", my_rewards)
    assert my_rewards.harder_pays_more(["\\boxed{3}", "\\boxed{4}"], ["3", "3"], difficulty=[5, 1]) == [2.0, 0.0]
    assert my_rewards.no_echo(["Compute 1 + 2. 3", "3"], ["3", "3"], problems=["Compute 1 + 2."] * 2) == [0, 1]
    config = yaml.safe_load(example("configuration.md", "reward-yaml", "yaml"))
    assert [resolve_spec(source).columns for source in config["data"]["train"]] == [["difficulty"]]
    rollout = {"rollout": {**config["rollout"], "engine": {"class_path": "erpo_lightning.rollout.HFEngine"}}}
    parser = rollout_parser()
    callback = parser.instantiate(parser.parse_object(rollout)).rollout
    reward = callback.sampler.reward
    assert isinstance(reward, CombinedReward) and reward.names == ["math", "format"]
    assert reward.rewards[0] is my_rewards.harder_pays_more  # the plain function, named by its import path
    responses = ["<think>1 + 2 = 3</think> \\boxed{3}", "\\boxed{3}", "<think>no</think> \\boxed{4}"]
    inputs = {"difficulty": [5, 0, 5], "prompts": ["Compute 1 + 2.\n"] * 3, "problems": ["Compute 1 + 2."] * 3}
    values = score_responses(reward, responses, ["3"] * 3, inputs, callback.sampler.reward_signature)
    assert values == pytest.approx([2.0 + 0.1, 1.0, 0.1])
    with pytest.raises(ValueError, match="component 'math'.*requires difficulty"):
        check_reward_inputs(reward, columns=())
    dumped = yaml.safe_load(parser.dump(parser.parse_object(rollout)))
    assert dumped["rollout"]["reward"]["init_args"]["rewards"][0] == "my_rewards.harder_pays_more"


def reward_needing_a_topic(responses, golds, topic):
    """A reward that cannot score without a `topic` column."""
    return [float(t == "arithmetic") for t in topic]


def test_erpo_fit_refuses_a_reward_needing_a_column_no_source_carries_before_the_cache(
    tiny_model_path, benchmarks_dir, tmp_path, capsys
):
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--rollout.reward",
                             f"{__name__}.reward_needing_a_topic")  # fmt: skip
    assert "topic" in line and "reward_needing_a_topic" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # no reference cache built
