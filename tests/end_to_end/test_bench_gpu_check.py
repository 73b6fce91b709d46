"""bench/gpu_check.sh in its CPU smoke mode: the path it runs on a lent GPU (bench_step.py under ModelParallelStrategy,
bench_memory.py, the summary) at the tiny size, so that the script fails here before it ever meets a GPU."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed  # FSDP2 over a gloo process group, in several processes: not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
ARMS = {"erpo", "erpo_shared_prompt", "grpo", "grpo_shared_prompt", "erpo_fused"}


def test_gpu_check_smoke_runs_the_sharded_step_bench_and_the_memory_bench(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["part"] for line in lines] == ["env", "bench_step", "bench_memory", "query_exactness", "summary"]
    assert all(line["rc"] == 0 for line in lines[:4]), lines[:4]

    # bench_step's own report: the algorithms each trained sharded (configure_model ran under the strategy's mesh).
    step = json.loads((tmp_path / "bench_step.json").read_text())
    assert step["config"]["strategy"] == "model_parallel" and step["config"]["size"] == "tiny"
    assert set(step["results"]) == ARMS
    for result in step["results"].values():
        assert result["sharded"] is True
        assert result["step_s_median"] > 0 and result["peak_mib"] > 0 and math.isfinite(result["query_kl_last"])
    assert set(step["ratios"]) == {
        "step_erpo_over_grpo", "peak_erpo_over_grpo", "step_erpo_shared_prompt_over_grpo",
        "step_erpo_shared_prompt_over_grpo_shared_prompt", "step_erpo_shared_prompt_over_erpo",
        "step_erpo_fused_over_erpo",
    }  # fmt: skip
    assert all(ratio > 0 for ratio in step["ratios"].values())

    summary = lines[-1]
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert summary["env"]["mode"] == "smoke" and summary["env"]["gpu"] is None
    assert summary["step"]["ratios"] == step["ratios"]
    assert summary["step"]["peak_mib"] == {name: result["peak_mib"] for name, result in step["results"].items()}
    assert set(summary["memory"]["results"]["float32"]) == {"old", "new", "fused"}
    for dtype in ("float32", "bfloat16"):  # the step's query scores are the cache's to the bit, on any CPU
        assert summary["query_exactness"][dtype]["step_vs_cache"] == {"max_abs_diff": 0.0, "bit_exact": True}
    assert summary["memory"]["results"]["float32"]["old"]["peak_over_old"] == 1.0
