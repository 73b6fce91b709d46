"""Sources, validation, prompt templates and the prompt-length policy, on the real offline benchmark files."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from erpo_lightning.data import (
    PRESETS,
    REGISTRY,
    DataError,
    SourceSpec,
    load_queries,
    prepare_queries,
    render_prompt,
    resolve_template,
    tokenize_prompts,
)
from erpo_lightning.data.sources import BENCHMARK_DIR, resolve_spec
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

ROWS = {"math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272, "olympiadbench": 675, "gsm8k": 1319}


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_registry_names_every_benchmark_and_the_training_set():
    for name in [*ROWS, "aime25", "math_level3to5"]:
        assert REGISTRY[name].hub_id, name
    gsm8k_train = resolve_spec({"name": "gsm8k", "split": "train", "hub": True})
    assert (gsm8k_train.hub_id, gsm8k_train.config, gsm8k_train.split) == ("openai/gsm8k", "main", "train")
    assert gsm8k_train.answer_transform == "after_hash"
    with pytest.raises(DataError, match="unknown benchmark 'math5000'"):
        resolve_spec({"name": "math5000"})
    with pytest.raises(DataError, match="exactly one of name / path / hub_id"):
        resolve_spec({"name": "gsm8k", "path": "x.jsonl"})
    with pytest.raises(DataError, match="unknown source keys"):
        resolve_spec({"path": "x.jsonl", "problem_feild": "q"})


@pytest.mark.parametrize("name", sorted(ROWS))
def test_real_benchmark_files_load_with_namespaced_ids(name):
    queries, skipped = load_queries({"path": str(BENCHMARK_DIR / f"{name}.jsonl")})
    assert len(queries) == ROWS[name] and not skipped
    assert all(q.query_id.startswith(f"{name}/") and q.problem.strip() and q.answer for q in queries)
    assert len({q.query_id for q in queries}) == len(queries)
    assert queries[0].row == 1 and queries[-1].row == ROWS[name]


def test_parquet_csv_and_json_array_give_the_same_queries(tmp_path):
    source = BENCHMARK_DIR / "aime24.jsonl"
    reference, _ = load_queries({"path": str(source)})
    table = datasets.load_dataset("json", data_files=str(source), split="train")
    table.to_parquet(str(tmp_path / "aime24.parquet"))
    table.to_csv(str(tmp_path / "aime24.csv"), index=False)
    (tmp_path / "aime24.json").write_text(json.dumps([json.loads(line) for line in source.read_text().splitlines()]))
    for suffix in ("parquet", "csv", "json"):
        loaded, _ = load_queries({"path": str(tmp_path / f"aime24.{suffix}")})
        assert [(q.query_id, q.problem, q.answer) for q in loaded] == [
            (q.query_id, q.problem, q.answer) for q in reference
        ], suffix


def test_field_map_transform_and_limit_on_gsm8k():
    # The file keeps GSM8K's worked solution, whose text after "####" is the gold answer.
    spec = SourceSpec(path=str(BENCHMARK_DIR / "gsm8k.jsonl"), answer_field="solution", answer_transform="after_hash")
    from_solution, _ = load_queries(spec)
    plain, _ = load_queries({"path": str(BENCHMARK_DIR / "gsm8k.jsonl"), "limit": 7})
    assert [q.answer for q in from_solution[:7]] == [q.answer for q in plain]
    assert len(plain) == 7


def test_content_hash_ids_are_stable_and_catch_duplicate_problems(tmp_path):
    rows = [{"question": "What is 1+1?", "gold": "2"}, {"question": "What is 2+2?", "gold": 4}]
    path = write_jsonl(tmp_path / "noid.jsonl", rows)
    spec = {"path": str(path), "problem_field": "question", "answer_field": "gold"}
    first, _ = load_queries(spec)
    again, _ = load_queries(spec)
    assert [q.query_id for q in first] == [q.query_id for q in again]
    assert first[1].answer == "4"  # numbers are gold answers written as text
    write_jsonl(path, [*rows, {"question": "What is 1+1?", "gold": "two"}])
    duplicate = r"line 3, row 3, field 'question': duplicate id .* \(same problem text as row 1\)"
    with pytest.raises(DataError, match=duplicate):
        load_queries(spec)


def test_bad_rows_are_errors_naming_file_row_and_field(tmp_path):
    rows = [
        {"id": 1, "problem": "fine", "answer": "1"},
        {"id": 2, "problem": "no answer"},
        {"id": 3, "problem": "   ", "answer": "3"},
        {"id": 4, "problem": ["not", "text"], "answer": "4"},
        {"id": 1, "problem": "same id as row 1", "answer": "5"},
        {"id": 6, "problem": "empty answer", "answer": ""},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    message = str(error.value)
    assert f"5 invalid row(s) in {path}" in message
    assert f"{path} line 2, row 2, field 'answer'" in message
    assert f"{path} line 3, row 3, field 'problem'" in message
    assert f"{path} line 4, row 4, field 'problem'" in message
    assert f"{path} line 5, row 5, field 'id': duplicate id 'bad/1' (same id as row 1)" in message
    assert f"{path} line 6, row 6, field 'answer'" in message
    assert "skip_invalid: true" in message

    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.row for q in queries] == [1]
    assert skipped == {"bad answer": 2, "bad problem": 2, "duplicate id": 1}


def test_missing_column_says_which_and_what_exists(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "x", "answer": "1"}])
    columns = r"its columns are \['question', 'answer'\]"
    with pytest.raises(DataError, match=r"no column 'problem' \(problem_field\); " + columns):
        load_queries({"path": str(path)})
    with pytest.raises(DataError, match=r"no column 'uid' \(id_field\)"):
        load_queries({"path": str(path), "problem_field": "question", "id_field": "uid"})


def test_presets_render_as_documented(tokenizer):
    problem = "What is $1+1$?"
    cot = render_prompt(PRESETS["qwen25-math-cot"], problem, tokenizer)
    assert cot == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n"
    )
    paper = render_prompt(PRESETS["erpo-paper"], problem, tokenizer)
    assert paper.startswith(f"<|im_start|>user\n{problem} You FIRST think") and "<think> </think> tags" in paper
    assert render_prompt(PRESETS["plain"], problem, tokenizer) == problem
    custom = resolve_template("qwen25-math-cot", use_chat_template=False, system_prompt="", suffix=" Answer:")
    assert render_prompt(custom, problem, tokenizer) == problem + " Answer:"
    [ids] = tokenize_prompts(custom, [problem], tokenizer)
    assert tokenizer.decode(ids) == problem + " Answer:" and len(ids) == len(problem + " Answer:")
    with pytest.raises(ValueError, match="unknown prompt template"):
        resolve_template("qwen3")
    tokenizer_without_template = build_byte_tokenizer()
    tokenizer_without_template.chat_template = None
    with pytest.raises(ValueError, match="use `template: plain`"):
        render_prompt(PRESETS["qwen25-math-cot"], problem, tokenizer_without_template)


def test_overlong_prompts_are_dropped_and_reported_or_refused(tokenizer):
    sources = [{"path": str(BENCHMARK_DIR / "amc23.jsonl")}]
    template = PRESETS["plain"]
    lengths = [len(q.problem.encode()) for q in load_queries(sources[0])[0]]  # byte tokenizer: 1 token per byte
    limit = sorted(lengths)[30]
    prepared = prepare_queries(sources, tokenizer, template, max_prompt_length=limit)
    expected_dropped = sum(length > limit for length in lengths)
    assert len(prepared.queries) == 40 - expected_dropped and prepared.dropped_overlong == expected_dropped
    assert all(len(ids) <= limit for ids in prepared.prompt_ids)
    assert f"dropped {expected_dropped} prompts longer than max_prompt_length={limit}" in prepared.summary(limit)
    listed = r"\n  .*amc23.jsonl row \d+ \(id 'amc23/\d+'\): \d+ tokens"
    with pytest.raises(DataError, match=rf"{expected_dropped} prompt\(s\) are longer .*" + listed):
        prepare_queries(sources, tokenizer, template, max_prompt_length=limit, overlong="error")


def test_same_label_twice_is_a_duplicate_unless_skipped(tokenizer):
    source = {"path": str(BENCHMARK_DIR / "aime24.jsonl")}
    with pytest.raises(DataError, match="duplicate id 'aime24/60', already used by .*aime24.jsonl row 1"):
        prepare_queries([source, source], tokenizer, PRESETS["plain"], 4096)
    prepared = prepare_queries([source, source], tokenizer, PRESETS["plain"], 4096, skip_invalid=True)
    assert len(prepared.queries) == 30 and prepared.skipped == {"duplicate id": 30}
    relabelled = prepare_queries([source, {**source, "label": "aime24-copy"}], tokenizer, PRESETS["plain"], 4096)
    assert len(relabelled.queries) == 60


def test_datamodule_without_training_sources_says_what_to_do(tiny_model_path):
    from erpo_lightning.data import QueryDataModule

    datamodule = QueryDataModule(str(tiny_model_path))  # fine for `erpo validate`, which needs no training data
    with pytest.raises(ValueError, match="data.train is empty"):
        datamodule.setup("fit")


SHIPPED = Path(__file__).resolve().parents[2] / "erpo_lightning" / "toy" / "shipped"


def test_a_source_with_limit_0_is_named():
    with pytest.raises(DataError, match=r"train.jsonl: no rows to read \(limit: 0\); a source needs at least one row"):
        load_queries({"path": str(SHIPPED / "train.jsonl"), "limit": 0})
