"""The grader from a plain script without a ``__main__`` guard, and from ``python -c``.

Verifier workers are started as ``python -m erpo_lightning.rewards.worker``: they must never import the caller's
main module (which, without a guard, would start grading again inside every worker).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# 100 pairs; every 4th needs the symbolic step (a worker), every 3rd is wrong. Printed: number correct, workers used.
GRADE_100 = textwrap.dedent(
    """
    from erpo_lightning.rewards import MathReward, verify_answer
    golds, responses = [], []
    for n in range(100):
        golds.append(f"{n}" if n % 4 else f"{n}+x")
        answer = n + (n % 3 == 0)
        responses.append(f"So \\\\boxed{{{answer}}}" if n % 4 else f"So \\\\boxed{{x+{answer}}}")
    reward = MathReward(num_workers=2, timeout_s=10.0)
    scores = reward(responses, golds)
    counters = reward.counters()
    reward.close()
    print(int(sum(scores)), int(counters["symbolic"]), verify_answer("\\\\boxed{\\\\sqrt{8}}", "2\\\\sqrt{2}"))
    """
)
EXPECTED_CORRECT = sum(1 for n in range(100) if n % 3 != 0)


def _run(args: list[str], cwd: Path) -> str:
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.slow
def test_script_without_main_guard_grades_100_pairs(tmp_path):
    script = tmp_path / "grade.py"
    script.write_text(GRADE_100)
    assert _run([str(script)], tmp_path) == f"{EXPECTED_CORRECT} 25 True"


@pytest.mark.slow
def test_python_c_grades_100_pairs(tmp_path):
    assert _run(["-c", GRADE_100], tmp_path) == f"{EXPECTED_CORRECT} 25 True"
