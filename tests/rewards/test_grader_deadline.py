"""No grading path without a deadline can hang on a hostile answer (issue 67): `backend: math_verify` with
`num_workers: 0`, which hung for ever on "The answer is 9^9^9^9", is refused naming both settings; with a worker the
same answer is a timeout; the in-process `erpo` backend, which every CPU example config uses, refuses such answers
before parsing and stays quick."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from erpo_lightning.rewards import MathReward

ROOT = Path(__file__).resolve().parents[2]
TOWERS = ["The answer is 9^9^9^9", "\\boxed{9^9^9^9}", "\\boxed{9^{9^{9^{9}}}}", "So $9^9^9^9$ it is."]


def test_math_verify_without_workers_is_refused_naming_both_settings():
    with pytest.raises(ValueError) as refused:
        MathReward(backend="math_verify", num_workers=0)
    message = str(refused.value)
    assert "MathReward(backend='math_verify', num_workers=0)" in message
    assert "without any deadline" in message and "9^9^9^9" in message
    assert "Set num_workers >= 1" in message and "backend: erpo" in message


def test_math_verify_with_a_worker_scores_the_tower_as_a_timeout():
    start = time.monotonic()
    with MathReward(backend="math_verify", num_workers=1, timeout_s=2.0) as reward:
        assert reward([TOWERS[0]], ["1"]) == [0.0]
        assert reward.counters()["timeouts"] == 1.0
        assert reward(["The answer is \\boxed{1}"], ["1"]) == [1.0]  # the replaced worker grades on
    assert time.monotonic() - start < 150  # worker boots (up to 120 s on a loaded machine) plus the 2 s deadline


def test_the_in_process_erpo_backend_grades_power_towers_quickly():
    """In a child process with a wall-clock bound, so that a regression fails instead of hanging the suite."""
    script = (
        "import time\n"
        "from erpo_lightning.rewards import MathReward\n"
        "reward = MathReward(num_workers=0)\n"
        f"for response in {TOWERS!r}:\n"
        "    start = time.monotonic()\n"
        "    assert reward([response], ['1']) == [0.0], response\n"
        "    assert time.monotonic() - start < 10, response\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_shipped_config_builds_its_math_reward():
    """The CPU example configs grade in-process (`num_workers: 0`) with the erpo backend: still accepted."""
    built = 0
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        reward = ((yaml.safe_load(path.read_text()) or {}).get("rollout") or {}).get("reward") or {}
        if isinstance(reward, dict) and str(reward.get("class_path", "")).endswith("MathReward"):
            MathReward(**(reward.get("init_args") or {}))
            built += 1
    assert built >= 3
