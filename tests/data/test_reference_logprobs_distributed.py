"""The reference cache computed by 2 processes (gloo, as Lightning's strategies run them) equals 1 process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from erpo_lightning.data import QueryDataModule
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model

pytestmark = pytest.mark.distributed  # several processes over gloo: `make test-fast` leaves them out

SOURCES = [{"path": str(BENCHMARK_DIR / "minerva_math.jsonl"), "limit": 10}]


def make_datamodule(model_dir: Path, cache_dir: Path) -> QueryDataModule:
    return QueryDataModule(
        str(model_dir), train=SOURCES, max_prompt_length=1000, cache_dir=str(cache_dir), cache_chunk_size=3
    )


def worker(rank: int, model_dir: Path, cache_dir: Path, out_dir: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'rendezvous'}", rank=rank, world_size=2)
    strategy = SimpleNamespace(world_size=2, global_rank=rank, root_device=torch.device("cpu"))
    computed = make_datamodule(model_dir, cache_dir).build_or_load_cache(strategy=strategy)
    dist.barrier()  # rank 0 has written the cache: now every rank must load it
    loaded = make_datamodule(model_dir, cache_dir).build_or_load_cache(strategy=strategy)
    save_file({"computed": computed.logprobs, "loaded": loaded.logprobs}, str(out_dir / f"rank{rank}.safetensors"))
    dist.destroy_process_group()


def test_two_processes_compute_the_same_cache_as_one(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    single = make_datamodule(model_dir, tmp_path / "single").build_or_load_cache()
    mp.spawn(worker, args=(model_dir, tmp_path / "shared", tmp_path), nprocs=2, join=True)
    for rank in (0, 1):
        result = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        torch.testing.assert_close(result["computed"], single.logprobs, atol=1e-6, rtol=0)
        assert torch.equal(result["loaded"], result["computed"])
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["manifest.json", "scores.safetensors"]
