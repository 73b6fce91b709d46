"""Data as users have it (issue 55 item 3): conversational rows rendered with the chat template, sources without
golds for rewards that take none, an in-memory `datasets.Dataset`, and weighted mixing of sources; each checked on
real files and trained for two steps in one parametrized fit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest
from helpers.docs import example
from helpers.policies import PolicyModule, fit_rollouts

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data import DataError, QueryDataModule, load_queries, prepare_queries
from erpo_lightning.data.fingerprint import dataset_fingerprint
from erpo_lightning.data.prepare import check_golds
from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.data.sources import DatasetSource
from erpo_lightning.data.templates import resolve_template
from erpo_lightning.rewards import CombinedReward
from erpo_lightning.rollout import HFEngine
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def chat(problem: str, system: str | None = None) -> list[dict]:
    turns = [{"role": "system", "content": system}] if system else []
    return [*turns, {"role": "user", "content": problem}]


def short_answer(responses, golds):
    """A format-only reward: pays a response shorter than 3 characters; it takes no gold."""
    return [float(len(text) < 3) for text in responses]


short_answer.uses_golds = False


def exact(responses, golds):
    return [float(text == gold) for text, gold in zip(responses, golds, strict=True)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


# -- conversations ------------------------------------------------------------------------------------------------


def test_a_messages_column_is_rendered_with_the_chat_template_as_given(tmp_path, tokenizer):
    rows = [{"messages": chat("Compute 1 + 2.", "Be brief."), "answer": "3"}, {"messages": chat("7 - 3?"), "answer": 4}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    prepared = prepare_queries(
        [{"path": str(path), "problem_field": "messages"}], tokenizer, resolve_template("plain"), 256
    )
    expected = [
        tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True) for row in rows
    ]
    assert [tokenizer.decode(ids) for ids in prepared.prompt_ids] == expected
    assert [q.problem for q in prepared.queries] == ["Compute 1 + 2.", "7 - 3?"]  # the reward's problems
    assert prepared.queries[0].messages[0] == {"role": "system", "content": "Be brief."}


def test_the_fingerprint_covers_the_conversation_not_only_its_last_turn(tmp_path):
    first = write_jsonl(tmp_path / "a.parquet.jsonl", [{"id": 1, "prompt": chat("2 + 2?", "Be brief."), "answer": "4"}])
    second = write_jsonl(tmp_path / "b.jsonl", [{"id": 1, "prompt": chat("2 + 2?", "Be slow."), "answer": "4"}])
    one, _ = load_queries({"path": str(first), "problem_field": "prompt", "label": "x"})
    two, _ = load_queries({"path": str(second), "problem_field": "prompt", "label": "x"})
    assert one[0].problem == two[0].problem and one[0].query_id == two[0].query_id
    assert dataset_fingerprint(one) != dataset_fingerprint(two)


def test_a_conversational_parquet_file_is_read(tmp_path, tokenizer):
    path = tmp_path / "chat.parquet"
    datasets.Dataset.from_list([{"prompt": chat("Say 5."), "solution": "5"}]).to_parquet(str(path))
    prepared = prepare_queries(
        [{"path": str(path), "problem_field": "prompt", "answer_field": "solution"}], tokenizer,
        resolve_template("plain"), 256,
    )  # fmt: skip
    assert prepared.queries[0].messages == ({"role": "user", "content": "Say 5."},)


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        ([], "the conversation has no turns"),
        (["hello"], r"turn 1 is 'hello', not a \{role, content\} mapping"),
        ([{"role": "robot", "content": "hi"}], "turn 1 has role 'robot'"),
        ([{"role": "user", "content": 5}], "turn 1 has content 5, not text"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "the last turn is the assistant's"),
    ],
)
def test_a_malformed_turn_is_a_bad_row_naming_file_row_and_field(tmp_path, turns, reason):
    path = write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": chat("fine"), "answer": "1"}, {"messages": turns, "answer": "2"}]
    )
    with pytest.raises(DataError, match=rf"chat.jsonl line 2, row 2, field 'messages': {reason}"):
        load_queries({"path": str(path), "problem_field": "messages"})


def test_a_conversation_without_a_chat_template_is_refused_naming_the_row(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat("Say 1."), "answer": "1"}])
    bare = build_byte_tokenizer()
    bare.chat_template = None
    with pytest.raises(DataError, match=r"chat.jsonl row 1: the row is a conversation .* has no chat template"):
        prepare_queries([{"path": str(path), "problem_field": "messages"}], bare, resolve_template("plain"), 256)


# -- no golds -----------------------------------------------------------------------------------------------------


def test_a_source_without_golds_loads_and_a_reward_that_needs_golds_is_refused(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "open.jsonl", [{"problem": "Write a haiku."}, {"problem": "Say hi."}])
    prepared = prepare_queries([{"path": str(path), "answer_field": None}], tokenizer, resolve_template("plain"), 256)
    assert [q.answer for q in prepared.queries] == [None, None]
    check_golds(prepared, short_answer)  # takes no gold: fine
    with pytest.raises(DataError, match=r"the reward test_data_formats.exact grades against gold answers, but the "
                                        r"source .*open.jsonl has none \(answer_field: null\)"):  # fmt: skip
        check_golds(prepared, exact)
    with pytest.raises(DataError, match=r"component 'exact' \(test_data_formats.exact\) grades against gold"):
        check_golds(prepared, CombinedReward([short_answer, exact], names=["short", "exact"]))
    check_golds(prepared, CombinedReward([short_answer], names=["short"]))


def test_answer_field_null_on_a_packaged_benchmark_drops_its_golds():
    queries, _ = load_queries({"name": "aime24", "answer_field": None, "limit": 2})
    assert [q.answer for q in queries] == [None, None]
    queries, _ = load_queries({"name": "olympiadbench", "hub": False, "limit": 1})
    assert queries[0].answer  # an untouched answer_field keeps the registry's


# -- in-memory datasets and weights -------------------------------------------------------------------------------


def test_an_in_memory_dataset_is_a_source_named_in_its_errors(tokenizer):
    table = datasets.Dataset.from_list([{"question": "Add 2 and 2.", "gold": "4"}, {"question": "", "gold": "1"}])
    with pytest.raises(DataError, match=r"in-memory dataset 'mine' row 2, field 'question': problem is ''"):
        load_queries(DatasetSource(dataset=table, problem_field="question", answer_field="gold", label="mine"))
    queries, _ = load_queries({"dataset": table.select([0]), "problem_field": "question", "answer_field": "gold"})
    assert (queries[0].problem, queries[0].answer) == ("Add 2 and 2.", "4")
    with pytest.raises(DataError, match="dataset must be a datasets.Dataset"):
        load_queries({"dataset": datasets.DatasetDict({"train": table})})


def test_weights_are_given_to_every_source_or_none(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", [{"problem": "A?", "answer": "1"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"problem": "B?", "answer": "2"}])
    template = resolve_template("plain")
    with pytest.raises(DataError, match=r"the source .*b.jsonl has no weight, but another source"):
        prepare_queries([{"path": str(a), "weight": 2}, {"path": str(b)}], tokenizer, template, 64)
    with pytest.raises(DataError, match=r"weight of .*a.jsonl must be a positive number, got 0"):
        prepare_queries([{"path": str(a), "weight": 0}, {"path": str(b), "weight": 1}], tokenizer, template, 64)
    prepared = prepare_queries([{"path": str(a), "weight": 3}, {"path": str(b), "weight": 1}], tokenizer, template, 64)
    assert prepared.source_index == [0, 1] and prepared.source_weights == [3.0, 1.0]


def test_weighted_streams_follow_the_weights_and_are_reproducible():
    sources = [0] * 2 + [1] * 18  # a small source weighted 3:1 against a large one
    sampler = QueryBatchSampler(20, 4, seed=5, sources=sources, weights=[3.0, 1.0])
    drawn = Counter(sources[i] for epoch in range(50) for i in sampler.order(epoch).tolist())
    assert abs(drawn[0] / 1000 - 0.75) < 0.04
    again = QueryBatchSampler(20, 4, seed=5, sources=sources, weights=[3.0, 1.0])
    assert again.order(3).tolist() == sampler.order(3).tolist()
    first = sampler.order(0).tolist()
    small = [i for i in first if i < 2]
    assert all(set(small[k : k + 2]) == {0, 1} for k in range(0, len(small) - 1, 2))  # cycles through its queries


def test_a_weighted_stream_resumes_identically_and_refuses_other_weights():
    sources = [0] * 3 + [1] * 9
    whole = QueryBatchSampler(12, 2, seed=1, sources=sources, weights=[1.0, 1.0])
    batches = list(whole) + [whole.refill()]
    first = QueryBatchSampler(12, 2, seed=1, sources=sources, weights=[1.0, 1.0])
    head = [batch for _, batch in zip(range(2), first, strict=False)]
    state = first.state_dict(2)
    resumed = QueryBatchSampler(12, 2, seed=1, sources=sources, weights=[1.0, 1.0])
    resumed.load_state_dict(state)
    assert head + list(resumed) + [resumed.refill()] == batches
    other = QueryBatchSampler(12, 2, seed=1, sources=sources, weights=[2.0, 1.0])
    with pytest.raises(ValueError, match=r"mixed its sources with weights \[1.0, 1.0\], this run's are \[2.0, 1.0\]"):
        other.load_state_dict(state)


def test_the_saved_hyperparameters_describe_an_in_memory_dataset_instead_of_holding_it(tiny_model_path):
    table = datasets.Dataset.from_list([{"problem": "Say 1.", "answer": "1"}])
    data = QueryDataModule(str(tiny_model_path), [table], template="plain")
    assert data.hparams["train"][0].startswith("in-memory datasets.Dataset (1 rows")
    assert data.sources[0] is table


# -- each trains ----------------------------------------------------------------------------------------------------


def training_sources(case: str, tmp_path: Path) -> list:
    """The `data.train` of each case, on real files (or a table in memory)."""
    rows = [{"problem": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(4)]
    if case == "messages":
        chats = [{"messages": chat(row["problem"], "Be brief."), "answer": row["answer"]} for row in rows]
        return [{"path": str(write_jsonl(tmp_path / "chat.jsonl", chats)), "problem_field": "messages"}]
    if case == "no_gold":
        return [{"path": str(write_jsonl(tmp_path / "open.jsonl", [{"problem": r["problem"]} for r in rows])),
                 "answer_field": None}]  # fmt: skip
    if case == "in_memory":
        return [datasets.Dataset.from_list(rows)]
    first = write_jsonl(tmp_path / "a.jsonl", rows[:2])
    second = tmp_path / "b.parquet"
    datasets.Dataset.from_list(rows[2:]).to_parquet(str(second))
    return [{"path": str(first), "weight": 3.0}, {"path": str(second), "weight": 1.0}]


@pytest.mark.slow  # four 2-step fits: end to end, so out of the `make test-fast` loop
@pytest.mark.parametrize("case", ["messages", "no_gold", "in_memory", "weighted"])
def test_each_data_format_trains(case, tiny_model_path, tmp_path):
    data = QueryDataModule(
        str(tiny_model_path), training_sources(case, tmp_path), template="plain", max_prompt_length=128,
        batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    reward = short_answer if case == "no_gold" else exact
    module = PolicyModule(str(tiny_model_path))
    fit_rollouts(
        module, RolloutCallback(HFEngine(), reward, group_size=2, max_new_tokens=4, seed=0), 2, datamodule=data
    )
    assert len(module.batches) == 2 and all(batch.rewards.numel() == 4 for batch in module.batches)
    if case == "messages":
        assert all(data.data.queries[i].messages for i in range(4))
    if case == "weighted":
        assert data.batch_sampler.weights == [3.0, 1.0]


def test_a_fit_with_no_golds_and_a_reward_that_needs_them_stops_before_the_cache_is_built(tiny_model_path, tmp_path):
    data = QueryDataModule(str(tiny_model_path), training_sources("no_gold", tmp_path), template="plain",
                           max_prompt_length=128, batch_size=2, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    callback = RolloutCallback(HFEngine(), exact, group_size=2, max_new_tokens=4, seed=0)
    with pytest.raises(DataError, match=r"test_data_formats.exact grades against gold answers, but the source"):
        fit_rollouts(PolicyModule(str(tiny_model_path)), callback, 1, datamodule=data)
    assert not (tmp_path / "cache" / "manifest.json").exists()


def test_the_data_formats_example_of_docs_data_md_runs(capsys):
    exec(compile(example("data.md", "formats"), "docs/data.md", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("8 [1.0, 3.0]")
