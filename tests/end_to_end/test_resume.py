"""Resuming from a mid-run checkpoint gives the same steps, metrics and weights as an uninterrupted run."""

import pytest
import torch
from helpers.resume_runs import resumed_equals_full_run, run

from erpo_lightning.toy.tiny_qwen2 import load_tiny_model


@pytest.mark.slow  # end-to-end: a fit, a stop and a resume
@pytest.mark.parametrize("rollout_seed", [0, None], ids=["seeded", "unseeded"])  # unseeded: the saved RNG state
def test_resume_mid_epoch_continues_identically(tiny_model_path, benchmarks_dir, tmp_path, rollout_seed):
    data_file = benchmarks_dir / "gsm8k.jsonl"
    full_weights = resumed_equals_full_run(tiny_model_path, data_file, tmp_path, rollout_seed=rollout_seed)
    initial = load_tiny_model(tiny_model_path).state_dict()
    assert any(not torch.allclose(full_weights[k], initial[k]) for k in initial)  # training did move the policy


def test_sampler_shares_global_batches_across_ranks_and_resumes():
    from erpo_lightning.data.sampler import QueryBatchSampler

    one_rank = list(QueryBatchSampler(10, 4, seed=3))
    ranks = [list(QueryBatchSampler(10, 2, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    assert [sorted(a + b) for a, b in zip(*ranks, strict=True)] == [
        sorted(batch) for batch in one_rank
    ]  # same global batches
    assert [a[:1] + b[:1] for a, b in zip(*ranks, strict=True)] == [
        batch[:2] for batch in one_rank
    ]  # strided across ranks
    sampler = QueryBatchSampler(10, 2, seed=3)
    sampler.load_state_dict({"epoch": 0, "batches_done": 3})
    sampler.set_epoch(0)
    assert list(sampler) == list(QueryBatchSampler(10, 2, seed=3))[3:]  # mid-epoch: the unseen batches
    sampler.load_state_dict({"epoch": 0, "batches_done": 5})
    sampler.set_epoch(1)  # an end-of-epoch checkpoint: the next epoch starts from its beginning
    assert len(list(sampler)) == 5


def test_resume_refuses_a_checkpoint_trained_with_other_reference_scores(tiny_model_path, benchmarks_dir, tmp_path):
    data_file = benchmarks_dir / "gsm8k.jsonl"
    run(tiny_model_path, data_file, tmp_path / "a", max_steps=1)
    checkpoint = torch.load(tmp_path / "a" / "ckpt" / "step=1.ckpt", weights_only=False)
    assert checkpoint["QueryDataModule"]["cache_digest"]
    checkpoint["QueryDataModule"]["cache_digest"] = "0" * 16  # as if trained on other data or weights
    torch.save(checkpoint, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="trained with reference scores 0000000000000000"):
        run(tiny_model_path, data_file, tmp_path / "a", max_steps=2, ckpt_path=tmp_path / "other.ckpt")
