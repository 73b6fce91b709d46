"""A damaged or foreign reference score cache (`data/cache.py`, issue 18 item 6): another model's scores under the
manifest, a scores file without a fingerprint, with too few rows, truncated or with a flipped byte, a corrupt
manifest and a damaged partial chunk; each refused naming the file and the rebuild command (or recomputed), then
rebuilt equal; the cache files get the usual permissions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from erpo_lightning.data import (
    CacheCorruptError,
    LogprobBatching,
    QueryDataModule,
    ReferenceLogprobCache,
    build_or_load_cache,
    compute_reference_logprobs,
)
from erpo_lightning.data.cache import MANIFEST_FILE, SCORES_FILE
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model, save_tiny_model

REBUILD = "erpo cache --config <your config> --force true"
SOURCES = [{"path": str(BENCHMARK_DIR / "aime24.jsonl"), "limit": 6}]


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
