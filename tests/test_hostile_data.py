"""Hostile data files and caches (issue 18, items 3 and 6): each case of the probe that once crashed or passed
silently, now an error naming the file, row, line and field (or a counted skip), or a refused/rebuilt cache."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from erpo_lightning.data import (
    CacheCorruptError,
    DataError,
    LogprobBatching,
    QueryDataModule,
    ReferenceLogprobCache,
    build_or_load_cache,
    compute_reference_logprobs,
    load_queries,
)
from erpo_lightning.data.cache import MANIFEST_FILE, SCORES_FILE
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.rewards import MathReward
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model, save_tiny_model

REBUILD = "erpo cache --config <your config> --force true"
SOURCES = [{"path": str(BENCHMARK_DIR / "aime24.jsonl"), "limit": 6}]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def good(problem: str, answer: str = "1") -> bytes:
    return json.dumps({"problem": problem, "answer": answer}).encode()


# ---------------------------------------------------------------------------------------------------- data files


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("empty.jsonl", b"", "the file is empty"),
        ("blank.jsonl", b"\n  \n\n", "the file is empty"),
        ("empty.json", b"[]", "no records"),
        ("header.csv", b"problem,answer\n", "only a header"),
    ],
)
def test_a_file_without_rows_is_an_error_naming_it(tmp_path, name, content, why):
    path = tmp_path / name
    path.write_bytes(content)
    for skip_invalid in (False, True):
        with pytest.raises(DataError) as error:
            load_queries({"path": str(path)}, skip_invalid=skip_invalid)
        assert str(error.value) == f"{path}: no rows to read ({why}); a source needs at least one row"


def test_a_byte_that_is_not_utf8_names_file_row_line_and_field_and_can_be_skipped(tmp_path):
    path = write_lines(tmp_path / "enc.jsonl", [good("a"), b"", b'{"problem": "b\xff", "answer": "2"}', good("c")])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 3, row 2, field 'problem': byte 0xff is not UTF-8" in str(error.value)
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["a", "c"] and skipped == {"bad encoding": 1}
    assert [q.row for q in queries] == [1, 3]

    csv_path = tmp_path / "enc.csv"
    csv_path.write_bytes(b'problem,answer\nfine,1\n"two\nlines",2\nbad,\xe9\n')
    with pytest.raises(DataError, match=rf"{csv_path} line 5, row 3, field 'answer': byte 0xe9 is not UTF-8"):
        load_queries({"path": str(csv_path)})
    queries, skipped = load_queries({"path": str(csv_path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["fine", "two\nlines"] and skipped == {"bad encoding": 1}


def test_a_json_syntax_error_names_file_row_line_and_column(tmp_path):
    deep = b'{"problem": ' + b"[" * 100_000 + b"]" * 100_000 + b', "answer": "1"}'
    lines = [good("a"), b'{"problem": "b", "answer": 2,, }', b"[1, 2]", deep]
    path = write_lines(tmp_path / "broken.jsonl", lines)
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    message = str(error.value)
    assert message.startswith(f"3 invalid row(s) in {path}:")
    assert f"{path} line 2, row 2: JSON syntax error: Expecting property name enclosed in double quotes at " in message
    assert f"{path} line 3, row 3: a JSON list [1, 2], not an object" in message
    assert f"{path} line 4, row 4: values nested too deeply" in message
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.problem for q in queries] == ["a"] and skipped == {"bad JSON": 3}

    array = tmp_path / "broken.json"
    array.write_text('[\n  {"problem": "a", "answer": "1"},\n  {"problem": "b" "answer": "2"}\n]')
    with pytest.raises(DataError, match=rf"^{array} line 3, column 19: JSON syntax error: Expecting ','"):
        load_queries({"path": str(array)}, skip_invalid=True)  # the array as a whole does not parse


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("\\boxed{", "the '{' at character 7 is never closed"),
        ("\\frac{1}{2", "the '{' at character 9 is never closed"),
        ("3}", "the '}' at character 2 closes no '{'"),
        ("\\boxed{ }", "its \\boxed{} is empty"),
    ],
)
def test_a_gold_answer_that_can_never_match_is_a_row_error(tmp_path, answer, why):
    path = write_lines(tmp_path / "golds.jsonl", [good("fine", "\\{1, 2\\}"), good("bad", answer), good("x", "{3}")])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 2, row 2, field 'answer': answer {answer!r} can never be matched: {why}" in str(error.value)
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.answer for q in queries] == ["\\{1, 2\\}", "{3}"] and skipped == {"unmatchable answer": 1}


NOTHING = "it shows nothing (only invisible characters, math delimiters or empty markup)"


@pytest.mark.parametrize(
    "answer", ["\u200b", "\ufeff", "\u200f \u200e", "\\text{}", "$$", "\\(\\)", "\\boxed{\\text{ }}"]
)
def test_a_gold_that_shows_nothing_is_a_row_error(tmp_path, answer):
    """Issue 30 item 9: such a gold passed validation, and no answer could ever match it."""
    path = write_lines(tmp_path / "golds.jsonl", [good("fine", "2"), good("bad", answer)])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    assert f"{path} line 2, row 2, field 'answer': answer {answer!r} can never be matched: {NOTHING}" in str(
        error.value
    )
    queries, skipped = load_queries({"path": str(path)}, skip_invalid=True)
    assert [q.answer for q in queries] == ["2"] and skipped == {"unmatchable answer": 1}


@pytest.mark.parametrize("problem", ["\u200b", "\ufeff\u200d", " \u2060\u202e "])
def test_a_problem_of_invisible_characters_only_is_a_row_error(tmp_path, problem):
    path = write_lines(tmp_path / "problems.jsonl", [good("fine"), good(problem)])
    with pytest.raises(DataError) as error:
        load_queries({"path": str(path)})
    expected = (
        f"{path} line 2, row 2, field 'problem': problem is {problem!r} (empty, only invisible characters, or not text)"
    )
    assert expected in str(error.value)


def test_a_gold_with_invisible_characters_around_its_answer_can_be_matched(tmp_path):
    golds = ["\ufeff12", "1\u200b2", "\u200f\\frac{1}{2}\u200e", "x\u2060+1"]
    path = write_lines(tmp_path / "golds.jsonl", [good(f"p{i}", gold) for i, gold in enumerate(golds)])
    queries, _ = load_queries({"path": str(path)})
    answers = ["12", "12", "0.5", "1 + x"]
    with MathReward(num_workers=0) as reward:
        assert reward([f"\\boxed{{{a}}}" for a in answers], [q.answer for q in queries]) == [1.0] * 4


# ---------------------------------------------------------------------------------------------------- the cache


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("other") / "model", seed=1)


def make_datamodule(model_path: Path, cache_dir: Path, **overrides) -> QueryDataModule:
    settings = {"train": SOURCES, "template": "plain", "max_prompt_length": 2000, "cache_dir": str(cache_dir)}
    return QueryDataModule(str(model_path), **{**settings, **overrides})


@pytest.fixture()
def built(tiny_model_path, tmp_path) -> tuple[Path, QueryDataModule]:
    """A complete cache of the tiny model in tmp_path/cache, and the datamodule that built it."""
    datamodule = make_datamodule(tiny_model_path, tmp_path / "cache")
    datamodule.setup("fit")
    return tmp_path / "cache", datamodule


def same_scores(a: ReferenceLogprobCache, b: ReferenceLogprobCache) -> bool:
    return all(torch.equal(getattr(a, name), getattr(b, name)) for name in ("logprobs", "offsets", "nll", "num_tokens"))


def refused_then_rebuilt(model_path: Path, directory: Path, expected: ReferenceLogprobCache, reason: str) -> None:
    """`fit` (setup) refuses the damaged cache naming the file and the rebuild command; `erpo cache` rebuilds it."""
    with pytest.raises(CacheCorruptError) as error:
        make_datamodule(model_path, directory).setup("fit")
    message = str(error.value)
    assert "\n" not in message and reason in message and REBUILD in message, message
    assert message.startswith(f"{directory / SCORES_FILE}: ") or message.startswith(f"{directory / MANIFEST_FILE}: ")
    rebuilt = build_or_load_cache(make_datamodule(model_path, directory))
    assert same_scores(rebuilt, expected)
    reloaded = make_datamodule(model_path, directory)
    reloaded.setup("fit")
    assert same_scores(reloaded.cache, expected)


def test_another_models_scores_under_this_manifest_are_refused_and_rebuilt(
    tiny_model_path, other_model_path, built, tmp_path
):
    directory, scores = built[0], built[1].cache
    make_datamodule(other_model_path, tmp_path / "other").setup("fit")
    shutil.copyfile(tmp_path / "other" / SCORES_FILE, directory / SCORES_FILE)
    refused_then_rebuilt(tiny_model_path, directory, scores, "a scores file from another cache?")


def test_a_scores_file_without_a_fingerprint_is_recomputed_by_fit(tiny_model_path, other_model_path, built, tmp_path):
    """Caches written before scores carried their manifest's fingerprint (here: another model's scores, as an old
    version wrote them, with no header metadata) cannot be trusted: `fit` recomputes them, saying why."""
    directory, scores = built[0], built[1].cache
    other = make_datamodule(other_model_path, tmp_path / "other")
    other.setup("fit")
    tensors = {name: getattr(other.cache, name) for name in ("logprobs", "offsets", "nll", "num_tokens")}
    save_file(tensors, str(directory / SCORES_FILE))
    datamodule = make_datamodule(tiny_model_path, directory)
    datamodule.setup("fit")
    assert same_scores(datamodule.cache, scores) and not same_scores(other.cache, scores)


def test_a_scores_file_with_too_few_rows_is_refused_before_training(tiny_model_path, built):
    directory, scores = built[0], built[1].cache
    short = ReferenceLogprobCache.from_rows([scores.row(q) for q in range(3)])
    short.save(directory / SCORES_FILE, {"fingerprint": built[1].cache_digest})  # the right fingerprint, 3 rows
    reason = f"it holds scores of 3 queries, this run has {len(scores)}"
    refused_then_rebuilt(tiny_model_path, directory, scores, reason)


def test_a_truncated_scores_file_is_refused_and_rebuilt(tiny_model_path, built):
    directory, scores = built[0], built[1].cache
    data = (directory / SCORES_FILE).read_bytes()
    (directory / SCORES_FILE).write_bytes(data[: len(data) // 2])
    refused_then_rebuilt(tiny_model_path, directory, scores, "unreadable (SafetensorError: ")


def test_a_corrupt_manifest_is_refused_and_rebuilt(tiny_model_path, built):
    directory, scores = built[0], built[1].cache
    (directory / MANIFEST_FILE).write_text('{"weights_hash": "3f')
    refused_then_rebuilt(tiny_model_path, directory, scores, "unreadable (JSONDecodeError: ")


def test_cache_files_get_the_usual_permissions(built):
    directory = built[0]
    umask = os.umask(0)
    os.umask(umask)
    for name in (SCORES_FILE, MANIFEST_FILE):
        assert (directory / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_a_weight_file_rewritten_in_place_with_the_same_size_and_mtime_is_hashed_again(tmp_path, monkeypatch):
    from erpo_lightning.common import file_hashes
    from erpo_lightning.data import fingerprint

    monkeypatch.setattr(file_hashes, "HASH_MEMO", tmp_path / "memo.json")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    stat = weights.stat()
    first = fingerprint.weights_hash(tmp_path)
    weights.write_bytes(b"a" * 2048 + b"b" * 2048)  # same size, new content, then the old mtime restored
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    second = fingerprint.weights_hash(tmp_path)
    assert second != first
    assert second == fingerprint.hash_files([weights]) and len(json.loads((tmp_path / "memo.json").read_text())) == 1


def test_a_damaged_partial_chunk_is_recomputed_not_fatal(tiny_model_path, tmp_path):
    """An interrupted `erpo cache` resumes from its finished chunks; one that was damaged since is scored again."""
    prompts = make_datamodule(tiny_model_path, tmp_path / "unused").prepare_queries().prompt_ids
    model = load_tiny_model(tiny_model_path)
    settings = LogprobBatching(max_tokens=4096, max_batch_size=2, chunk_size=2)
    first = compute_reference_logprobs(model, prompts, chunk_dir=tmp_path / "chunks", settings=settings, progress=False)
    chunk = tmp_path / "chunks" / "chunk_000001.safetensors"
    chunk.write_bytes(chunk.read_bytes()[:100])
    again = compute_reference_logprobs(model, prompts, chunk_dir=tmp_path / "chunks", settings=settings, progress=False)
    assert same_scores(again, first) and chunk.stat().st_size > 100  # scored and written again


def test_a_flipped_byte_inside_the_scores_is_refused_and_rebuilt(tiny_model_path, built):
    """One byte of the tensors' data changed (the file still parses, its header and row count still agree): the
    sha256 written with the scores no longer matches, so fit refuses the file and `erpo cache` rebuilds it."""
    directory, scores = built[0], built[1].cache
    path = directory / SCORES_FILE
    data = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    position = header_end + (len(data) - header_end) // 2  # inside the tensors' bytes, past the JSON header
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    refused_then_rebuilt(tiny_model_path, directory, scores, "differ from the sha256 written with them")
