"""bench/gpu_check.sh in its CPU smoke mode: the path it runs on a lent GPU (the one-GPU recipe's own step through
bench/recipe_check.py, bench_step.py under ModelParallelStrategy, bench_memory.py, the exactness check, the summary)
at tiny sizes, so that the script fails here before it ever meets a GPU; with its before/after mode against the
package of a commit before 81cc15a, which had no data/cache_build.py (bench_step finds each name where that commit
keeps it)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.distributed  # FSDP2 over a gloo process group, in several processes: not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "one_gpu_qwen2.5_math_1.5b.yaml"
BEFORE_CACHE_BUILD = "76c6337"  # the parent of 81cc15a, which moved the cache's load-or-build to data/cache_build.py
FILES = {"env.json", "recipe.json", "bench_step.json", "bench_memory.json", "query_exactness.json", "summary.json",
         "logs.txt"}  # fmt: skip


@pytest.fixture()
def baseline(tmp_path) -> Path:
    """The package as it was at BEFORE_CACHE_BUILD, in a folder of its own (`git archive`)."""
    if subprocess.run(["git", "cat-file", "-e", BEFORE_CACHE_BUILD], cwd=REPO).returncode != 0:
        pytest.skip(f"no commit {BEFORE_CACHE_BUILD} in this clone (shallow?)")
    archive = subprocess.run(
        ["git", "archive", BEFORE_CACHE_BUILD, "erpo_lightning"], cwd=REPO, capture_output=True, check=True
    )
    folder = tmp_path / "baseline"
    folder.mkdir()
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    assert not (folder / "erpo_lightning/data/cache_build.py").exists()
    return folder


def test_gpu_check_smoke_runs_the_recipe_step_and_the_benches_against_an_old_baseline(tmp_path, baseline):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable,
           "GPU_CHECK_BASELINE": str(baseline)}  # fmt: skip
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    parts = ["env", "recipe", "bench_step", "bench_memory", "query_exactness"]
    assert [line["part"] for line in lines] == [*parts, "summary"]
    assert all(line["rc"] == 0 for line in lines[:-1]), lines[:-1]
    assert {path.name for path in out.iterdir()} == FILES  # the device tool brings back 8 files at most
    assert [line for line in (out / "logs.txt").read_text().splitlines() if line.startswith("=====")] == [
        f"===== {part} =====" for part in parts
    ]

    # The recipe's own settings (read from the config as it is), on the tiny model, two steps each timed by phase,
    # with the engine-trainer gap from the step's forward.
    recipe = json.loads((out / "recipe.json").read_text())
    settings = yaml.safe_load(RECIPE.read_text())["model"]
    assert {key: value for key, value in recipe["model_settings"].items() if key != "model_path"} == {
        key: value for key, value in settings.items() if key != "model_path"
    }
    assert recipe["engine"] == "HFEngine" and recipe["sizes"]["max_new_tokens"] == 8 and len(recipe["steps"]) == 2
    for step in recipe["steps"]:
        assert step["wall_s"] > 0 and step["forward_s"] > 0 and step["backward_s"] > 0 and step["generation_s"] > 0
        assert 0 <= step["logprob_abs_diff"] < 0.1  # the HF engine samples from the policy itself

    # bench_step's own report: this code's arms and the old commit's erpo, each trained sharded (configure_model ran
    # under the strategy's mesh).
    step = json.loads((out / "bench_step.json").read_text())
    assert step["config"]["strategy"] == "model_parallel" and step["config"]["size"] == "tiny"
    assert set(step["results"]) == {"erpo", "erpo_shared_prompt", "erpo@baseline"}
    for result in step["results"].values():
        assert result["sharded"] is True
        assert result["step_s_median"] > 0 and result["peak_mib"] > 0 and math.isfinite(result["query_kl_last"])
    assert {"step_erpo_over_baseline", "step_erpo_shared_prompt_over_erpo", "step_erpo_shared_prompt_over_erpo@baseline"
            } <= set(step["ratios"])  # fmt: skip
    assert all(ratio > 0 for ratio in step["ratios"].values())

    summary = lines[-1]
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["env"]["mode"] == "smoke" and summary["env"]["gpu"] is None
    assert summary["recipe"]["step_s"] == [step["wall_s"] for step in recipe["steps"]]
    assert summary["step"]["ratios"] == step["ratios"]
    assert summary["step"]["peak_mib"] == {name: result["peak_mib"] for name, result in step["results"].items()}
    assert set(summary["memory"]["results"]["float32"]) == {"old", "new", "fused"}
    for dtype in ("float32", "bfloat16"):  # the step's query scores are the cache's to the bit, on any CPU
        assert summary["query_exactness"][dtype]["step_vs_cache"] == {"max_abs_diff": 0.0, "bit_exact": True}
    assert summary["memory"]["results"]["float32"]["old"]["peak_over_old"] == 1.0
