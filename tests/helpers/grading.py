"""Test helper shared by the hostile-input grader tests: grade responses one at a time against a deadline."""

from __future__ import annotations

import time

from erpo_lightning.rewards import MathReward


def grade_one_by_one(reward: MathReward, responses: list[str], gold: str, deadline_s: float) -> float:
    """Grade each response alone against `gold`; assert each call returns a 0/1 score within `deadline_s` seconds.

    Returns the slowest call's wall time (s).
    """
    slowest = 0.0
    for response in responses:
        start = time.monotonic()
        scores = reward([response], [gold])
        elapsed = time.monotonic() - start
        slowest = max(slowest, elapsed)
        assert scores in ([0.0], [1.0])
        assert elapsed <= deadline_s, (elapsed, response[:200])
    return slowest
