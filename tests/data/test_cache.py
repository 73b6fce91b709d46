"""The reference score cache on the tiny model and real benchmark queries: values, sharding, resume, fingerprint,
and the batches `QueryDataModule` streams."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from erpo_lightning.data import (
    CacheMismatchError,
    LogprobBatching,
    QueryDataModule,
    ReferenceLogprobCache,
    assemble,
    compute_logprob_shard,
    compute_reference_logprobs,
)
from erpo_lightning.data.reference_logprobs import plan_batches, plan_chunks
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.objectives import split_prompt_response
from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.rollout.batch import QueryBatch
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model, save_tiny_model

SOURCES = [
    {"path": str(BENCHMARK_DIR / "gsm8k.jsonl"), "limit": 12},
    {"path": str(BENCHMARK_DIR / "math500.jsonl"), "limit": 12},
]
SMALL_BATCHES = LogprobBatching(max_tokens=2048, max_batch_size=4, chunk_size=5, layout=QueryScoringLayout(2, 16))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def other_tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_other") / "model", seed=1)


@pytest.fixture(scope="session")
def model(tiny_dir):
    return load_tiny_model(tiny_dir)


def make_datamodule(model_dir: Path, cache_dir: Path, **overrides) -> QueryDataModule:
    settings = {"train": SOURCES, "max_prompt_length": 1000, "batch_size": 4, "cache_dir": str(cache_dir)}
    settings.update(overrides)
    return QueryDataModule(str(model_dir), **settings)


@pytest.fixture(scope="module")
def prompts(tiny_dir) -> list[list[int]]:
    datamodule = make_datamodule(tiny_dir, tiny_dir / "unused")
    return datamodule.prepare_queries().prompt_ids


def direct_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1 from one unpadded forward (no helper shared with the cache)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def test_batches_are_length_sorted_and_within_budget(prompts):
    lengths = [len(ids) for ids in prompts]
    chunks = plan_chunks(lengths, SMALL_BATCHES.chunk_size)
    order = [i for chunk in chunks for i in chunk]
    assert sorted(order) == list(range(len(prompts)))
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    for chunk in chunks:  # the vLLM engine's batches
        for batch in plan_batches(chunk, lengths, SMALL_BATCHES):
            assert len(batch) <= 4 and len(batch) * max(lengths[i] for i in batch) <= 2048
        layout = SMALL_BATCHES.layout  # a transformers model's blocks: one padded width each, at most `rows`
        blocks = layout.blocks([lengths[i] for i in chunk])
        assert sorted(p for block in blocks for p in block) == list(range(len(chunk)))
        for block in blocks:
            assert len(block) <= layout.rows and len({layout.width(lengths[chunk[p]]) for p in block}) == 1


def test_cache_equals_a_direct_forward(model, prompts):
    cache = compute_reference_logprobs(model, prompts, settings=SMALL_BATCHES, progress=False)
    assert len(cache) == len(prompts) == 24
    for q, ids in enumerate(prompts):
        expected = direct_logprobs(model, ids)
        row = cache.row(q)
        assert row.numel() == len(ids) and row[0] == 0.0
        torch.testing.assert_close(row[1:], expected, atol=1e-5, rtol=0)
        assert cache.num_tokens[q] == len(ids) - 1
        torch.testing.assert_close(cache.nll[q], -expected.double().sum().float(), atol=1e-3, rtol=1e-6)


def test_padded_lines_up_with_the_trainers_left_padded_prompts(model, prompts):
    cache = compute_reference_logprobs(model, prompts, settings=SMALL_BATCHES, progress=False)
    index = torch.tensor([3, 17, 0, 11])
    width = max(len(prompts[i]) for i in index) + 2
    input_ids = torch.zeros(len(index), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, i in enumerate(index.tolist()):
        input_ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
        mask[row, width - len(prompts[i]) :] = 1
    with torch.no_grad():
        trainer_view = sequence_logprobs(model, input_ids, mask)
    query_logprobs, query_mask, _, _ = split_prompt_response(trainer_view, mask, width)
    padded = cache.padded(index, width)
    assert padded.shape == (4, width)
    torch.testing.assert_close(padded * query_mask, query_logprobs * query_mask, atol=1e-5, rtol=0)
    assert (padded[query_mask == 0] == 0).all()
    with pytest.raises(ValueError, match="narrower than the longest prompt"):
        cache.padded(index, width - 3)


def test_two_ranks_merged_equal_one_rank(model, prompts):
    single = compute_reference_logprobs(model, prompts, settings=SMALL_BATCHES, progress=False)
    shards = [compute_logprob_shard(model, prompts, rank, 2, settings=SMALL_BATCHES, progress=False) for rank in (0, 1)]
    assert 0 < shards[0]["query_index"].numel() < len(prompts)
    merged = assemble(shards, len(prompts))
    for name in ("logprobs", "offsets", "nll", "num_tokens"):
        assert torch.equal(getattr(merged, name), getattr(single, name)), name

    # The same through the gather hook, as rank 0 of 2 sees it.
    as_rank0 = compute_reference_logprobs(
        model, prompts, 0, 2, gather=lambda own: [own, shards[1]], settings=SMALL_BATCHES, progress=False
    )
    assert torch.equal(as_rank0.logprobs, single.logprobs)
    with pytest.raises(RuntimeError, match="not each of the 24 queries once"):
        assemble(shards[:1], len(prompts))


class Interrupting(torch.nn.Module):
    """Wraps a model; counts forwards and raises KeyboardInterrupt on forward number `fail_at` (1-based)."""

    def __init__(self, model, fail_at: int | None = None):
        super().__init__()
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def forward(self, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return self.model(**kwargs)


def test_interrupted_then_resumed_equals_uninterrupted(model, prompts, tmp_path):
    uninterrupted = compute_reference_logprobs(model, prompts, settings=SMALL_BATCHES, progress=False)
    lengths = [len(ids) for ids in prompts]
    blocks = SMALL_BATCHES.layout.blocks
    batches_per_chunk = [len(blocks([lengths[i] for i in c])) for c in plan_chunks(lengths, 5)]
    assert len(batches_per_chunk) == 5

    first_run = Interrupting(model, fail_at=sum(batches_per_chunk[:2]) + 1)  # dies in the first batch of chunk 3
    with pytest.raises(KeyboardInterrupt):
        compute_reference_logprobs(first_run, prompts, chunk_dir=tmp_path, settings=SMALL_BATCHES, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk_000000.safetensors", "chunk_000001.safetensors"]

    second_run = Interrupting(model)
    resumed = compute_reference_logprobs(
        second_run, prompts, chunk_dir=tmp_path, settings=SMALL_BATCHES, progress=False
    )
    assert second_run.calls == sum(batches_per_chunk[2:])  # finished chunks were read back, not recomputed
    for name in ("logprobs", "offsets", "nll", "num_tokens"):
        assert torch.equal(getattr(resumed, name), getattr(uninterrupted, name)), name


def test_datamodule_writes_safe_files_and_reloads_without_a_forward(tiny_dir, tmp_path, monkeypatch):
    datamodule = make_datamodule(tiny_dir, tmp_path / "cache")
    datamodule.setup("fit")
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert files == ["manifest.json", "scores.safetensors"]  # partial chunks removed, nothing pickled
    first = datamodule.cache

    from erpo_lightning.data import cache_build

    monkeypatch.setattr(cache_build, "load_reference_model", lambda *a, **k: pytest.fail("recomputed"))
    reloaded = make_datamodule(tiny_dir, tmp_path / "cache")
    reloaded.setup("fit")
    assert torch.equal(reloaded.cache.logprobs, first.logprobs) and torch.equal(reloaded.cache.nll, first.nll)


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ("weights", "weights_hash", "the model weights differ"),
        ("template", "template", "the prompt template differs"),
        ("data", "dataset_fingerprint", "the training queries differ"),
    ],
)
def test_a_mismatched_cache_is_refused_with_the_differing_field(
    tiny_dir, other_tiny_dir, tmp_path, change, field, reason
):
    make_datamodule(tiny_dir, tmp_path).setup("fit")
    variants = {
        "weights": lambda: make_datamodule(other_tiny_dir, tmp_path),
        "template": lambda: make_datamodule(tiny_dir, tmp_path, template="erpo-paper"),
        "data": lambda: make_datamodule(tiny_dir, tmp_path, train=[{**SOURCES[0], "limit": 11}, SOURCES[1]]),
    }
    other = variants[change]()
    with pytest.raises(CacheMismatchError) as error:
        other.setup("fit")
    message = str(error.value)
    assert f"in {tmp_path} does not belong to this run ({reason}" in message
    assert f"\n  {field}: cache has " in message
    assert message.count("cache has") == (2 if change != "weights" else 1)  # data/template also change the tokens
    assert "erpo cache --config <your config> --force true" in message
    # Forcing rebuilds it for the new run.
    rebuilt = other.build_or_load_cache(force=True)
    assert len(rebuilt) == len(other.data.queries)
    other.build_or_load_cache()  # and the rebuilt cache now loads for it


def test_training_batches_carry_query_rows_prompts_and_answers(tiny_dir, tmp_path):
    datamodule = make_datamodule(tiny_dir, tmp_path)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    batches = list(loader)
    assert len(batches) == 6 and all(isinstance(b, QueryBatch) and b.rollout is None for b in batches)
    seen = torch.cat([b.query_index for b in batches])
    assert sorted(seen.tolist()) == list(range(24)) and seen.tolist() != list(range(24))  # shuffled, all of them
    batch = batches[0]
    for position, q in enumerate(batch.query_index.tolist()):
        assert batch.answers[position] == datamodule.data.queries[q].answer
        assert batch.prompt_ids[position] == datamodule.data.prompt_ids[q]
    assert torch.equal(torch.cat([b.query_index for b in datamodule.train_dataloader()]), seen)  # seeded


def set_up_for(datamodule: QueryDataModule, module: ERPOModule) -> QueryDataModule:
    """`datamodule.setup("fit")` as a Trainer fitting `module` runs it (constructing the module loads nothing)."""
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    datamodule.trainer = trainer
    datamodule.setup("fit")
    return datamodule


@pytest.mark.parametrize(
    ("algorithm", "overrides", "clip"),
    [("erpo", {}, (0.0, 2.0)), ("grpo", {}, (0.0, 2.0)), ("erpo", {"query_weight_clip": (0.9, 1.05)}, (0.9, 1.05))],
)
def test_training_batches_carry_the_dataset_static_weights_made_once(
    tiny_dir, tmp_path, monkeypatch, algorithm, overrides, clip
):
    """Under the paper's rule (reference NLL over its training-set mean, clipped), every QueryBatch carries w(q),
    made once at setup from the cache and the module's algorithm; grpo logs it without applying it, so carries it
    too. Restated here: clip(mean(nll) / nll)."""
    calls = []
    table = Algorithm.query_weight_table
    monkeypatch.setattr(Algorithm, "query_weight_table", lambda self, *a: calls.append(1) or table(self, *a))
    module = ERPOModule(str(tiny_dir), algorithm=algorithm, **overrides)
    datamodule = set_up_for(make_datamodule(tiny_dir, tmp_path), module)
    nll = datamodule.cache.nll.tolist()
    mean = sum(nll) / len(nll)
    batches = list(datamodule.train_dataloader())
    assert calls == [1]  # once, at setup; not per batch
    for batch in batches:
        s = [nll[q] for q in batch.query_index.tolist()]
        assert batch.reference_nll.tolist() == s
        expected = [min(max(mean / x, clip[0]), clip[1]) for x in s]
        assert batch.query_weights.tolist() == pytest.approx(expected, rel=1e-6)
    weights = torch.cat([batch.query_weights for batch in batches])
    assert weights.min() < 1 < weights.max()  # the queries' weights differ


def test_per_step_weights_are_not_precomputed_and_follow_the_fitted_module(tiny_dir, tmp_path):
    """Weights that depend on the step (the current policy's, or s̄ over the step's queries) are left to the module,
    with each query's reference NLL carried; a second fit of the same datamodule follows its own module's rule."""
    datamodule = set_up_for(make_datamodule(tiny_dir, tmp_path), ERPOModule(str(tiny_dir)))
    assert next(iter(datamodule.train_dataloader())).query_weights is not None
    for overrides in ({"algorithm": "erpo_released"}, {"query_weight_norm": "batch"}):
        set_up_for(datamodule, ERPOModule(str(tiny_dir), **overrides))
        batch = next(iter(datamodule.train_dataloader()))
        assert batch.query_weights is None
        assert torch.equal(batch.reference_nll, datamodule.cache.nll[batch.query_index])


def test_cache_roundtrip_keeps_every_tensor(tmp_path):
    rows = [torch.tensor([9.0, -1.0, -2.0]), torch.tensor([5.0]), torch.tensor([0.0, -0.5])]
    cache = ReferenceLogprobCache.from_rows(rows)
    assert cache.logprobs.tolist() == [0.0, -1.0, -2.0, 0.0, 0.0, -0.5]
    assert cache.nll.tolist() == [3.0, 0.0, 0.5] and cache.num_tokens.tolist() == [2, 0, 1]
    cache.save(tmp_path / "c.safetensors")
    loaded = ReferenceLogprobCache.load(tmp_path / "c.safetensors")
    assert all(torch.equal(getattr(loaded, n), getattr(cache, n)) for n in ("logprobs", "offsets", "nll", "num_tokens"))
    assert loaded.padded(torch.tensor([1, 0]), 4).tolist() == [[0, 0, 0, 0], [0, 0, -1, -2]]


@pytest.mark.vllm
def test_vllm_prompt_logprobs_agree_with_the_transformers_path(tiny_dir, model, prompts):
    pytest.importorskip("vllm")
    from erpo_lightning.data.reference_logprobs_vllm import build_vllm_engine

    subset = prompts[:6]
    threads = torch.get_num_threads()
    llm = build_vllm_engine(str(tiny_dir), max_model_len=1024)
    assert torch.get_num_threads() == threads
    from_vllm = compute_reference_logprobs(llm, subset, settings=SMALL_BATCHES, progress=False)
    from_transformers = compute_reference_logprobs(model, subset, settings=SMALL_BATCHES, progress=False)
    assert torch.equal(from_vllm.offsets, from_transformers.offsets)
    torch.testing.assert_close(from_vllm.logprobs, from_transformers.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(from_vllm.nll, from_transformers.nll, atol=1e-3, rtol=0)


def test_file_hashes_are_remembered_but_never_stale(tmp_path, monkeypatch):
    from erpo_lightning.common import file_hashes
    from erpo_lightning.data import fingerprint

    monkeypatch.setattr(file_hashes, "HASH_MEMO", tmp_path / "memo.json")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 64)
    first = fingerprint.weights_hash(tmp_path)
    assert fingerprint.weights_hash(tmp_path) == first and (tmp_path / "memo.json").is_file()
    weights.write_bytes(b"b" * 64)  # same size, new content (and a new mtime)
    assert fingerprint.weights_hash(tmp_path) != first
