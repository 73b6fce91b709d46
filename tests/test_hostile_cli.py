"""Hostile settings, paths and kills against `erpo`: each fails early, in one line, naming the field (issue 18).

Most cases call `erpo_lightning.cli.main` in this process (the console script's own entry point, a second each);
the subprocess tests run the installed `erpo` as a user does.
"""

import pytest

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.rollout import HFEngine


@pytest.mark.parametrize(("name", "bad", "good"), [("top_p", 0.0, 1.0), ("top_p", 1.5, 0.5), ("top_k", -1, 0),
                                                   ("max_new_tokens", 0, 1)])  # fmt: skip
def test_the_rollout_and_the_sweep_check_a_sampling_setting_by_one_rule(name, bad, good):
    """top_p, top_k and max_new_tokens are checked by one entry of `rollout.engine.SAMPLING_RULES` in both owners:
    the same values pass, and a refused one is refused with the same range (the sweep's max_new_tokens may also
    be null: the RolloutCallback's)."""
    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    RolloutCallback(HFEngine(), reward, **{name: good})
    SweepConfig(**{name: good})
    with pytest.raises(ValueError) as rollout:
        RolloutCallback(HFEngine(), reward, **{name: bad})
    with pytest.raises(ValueError) as sweep:
        SweepConfig(**{name: bad})
    allowed = str(rollout.value).removeprefix(f"rollout.{name} must be ").removesuffix(f", got {bad!r}")
    assert str(rollout.value) == f"rollout.{name} must be {allowed}, got {bad!r}"
    null = " (or null)" if name == "max_new_tokens" else ""
    assert str(sweep.value) == f"sweep.{name} must be {allowed}{null}, got {bad!r}"
