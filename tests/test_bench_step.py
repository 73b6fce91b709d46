"""bench/bench_step.py: each arm's step-time spread and each ratio round by round beside the medians
(bench/interleave.py's `spread` and `round_ratios`); and its before/after mode (`--baseline-source`) against a tree
of a commit before 81cc15a, which kept `load_reference_model` in data/datamodule.py (no data/cache_build.py) and
QueryScoringLayout in data/query_scoring.py: the worker finds each name where that tree has it (`import_first`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import interleave  # bench/ is a folder of scripts: a namespace package from the repository root

REPO = Path(__file__).resolve().parents[1]
BEFORE_CACHE_BUILD = "76c6337"  # the parent of 81cc15a, which moved the cache's load-or-build to data/cache_build.py
SMOKE = ["--size", "tiny", "--steps", "1", "--rounds", "1", "--threads", "1", "--queries", "2", "--group-size", "2",
         "--prompt-len", "8", "--response-len", "8"]  # fmt: skip


def test_each_arm_reports_its_steps_per_round_and_their_spread():
    spread = interleave.spread([[4.0, 1.0], [2.0, 3.0]])
    assert spread == {
        "step_s": [[4.0, 1.0], [2.0, 3.0]], "step_s_median": 2.5, "step_s_min": 1.0, "step_s_iqr": [1.75, 3.25],
        "step_s_max": 4.0,
    }  # fmt: skip
    assert interleave.spread([[2.0]])["step_s_iqr"] == [2.0, 2.0]


def test_each_step_ratio_is_also_taken_round_by_round():
    summary = {
        "erpo": interleave.spread([[2.0, 4.0], [6.0, 6.0]]),
        "grpo": interleave.spread([[3.0, 3.0], [4.0, 4.0]]),
        "erpo@baseline": interleave.spread([[1.0], [2.0]]),
    }
    pairs = {"erpo_over_grpo": ("erpo", "grpo"), "erpo_over_baseline": ("erpo", "erpo@baseline"), "x": ("erpo", "gone")}
    assert interleave.round_ratios(summary, pairs) == {"erpo_over_grpo": [1.0, 1.5], "erpo_over_baseline": [3.0, 3.0]}
    assert summary["erpo"]["step_s_median"] / summary["grpo"]["step_s_median"] == 5.0 / 3.5  # not a round's ratio


def test_import_first_takes_the_first_path_that_exists_and_names_every_path_tried():
    first = interleave.import_first
    assert first("erpo_lightning.gone.Thing", "json.loads", "json.dumps") is json.loads
    with pytest.raises(ImportError) as raised:
        first("erpo_lightning.gone.Thing", "json.nothing")
    assert "erpo_lightning.gone.Thing (no module erpo_lightning.gone)" in str(raised.value)
    assert "json.nothing (no nothing in json)" in str(raised.value)


@pytest.mark.slow  # three processes that import torch and Lightning: about 40 s on 2 loaded cores
def test_bench_step_runs_against_a_tree_without_data_cache_build(tmp_path):
    if subprocess.run(["git", "cat-file", "-e", BEFORE_CACHE_BUILD], cwd=REPO).returncode != 0:
        pytest.skip(f"no commit {BEFORE_CACHE_BUILD} in this clone (shallow?)")
    archive = subprocess.run(
        ["git", "archive", BEFORE_CACHE_BUILD, "erpo_lightning"], cwd=REPO, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", tmp_path], input=archive.stdout, check=True)
    assert not (tmp_path / "erpo_lightning/data/cache_build.py").exists()

    command = [sys.executable, "bench/bench_step.py", *SMOKE, "--arms", "grpo", "--baseline-source", str(tmp_path)]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert set(report["results"]) == {"grpo", "grpo@baseline"}
    assert (
        report["ratios"]["step_grpo_over_baseline"] > 0 and len(report["ratio_rounds"]["step_grpo_over_baseline"]) == 1
    )
