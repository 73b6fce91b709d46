"""bench/bench_step.py's report: each arm's step-time spread and each ratio round by round beside the medians
(bench/interleave.py's `spread` and `round_ratios`); and `import_first`, through which its worker finds each package
name where a `--baseline-source` tree of an older commit keeps it (tests/end_to_end/test_bench_gpu_check.py runs
bench_step against the package of a commit before 81cc15a)."""

import json

import pytest

from bench import interleave  # bench/ is a folder of scripts: a namespace package from the repository root


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
