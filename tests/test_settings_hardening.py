"""Issue 67, settings: a rollout-correction band that cannot hold ρ = 1 is refused, a saturated one warned about, and
the parser's and settings check's errors name what the user wrote.

The refusals run `erpo_lightning.cli.main` in this process on a 2-step config of the shipped toy model and fail in
the settings check, before the datamodule or the model is built (`helpers.cli_runs.fails_in_one_line`).
"""

import math
from pathlib import Path

import pytest
import torch
from helpers.cli_runs import fails_in_one_line, tiny_config

from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.step_metrics import (
    SATURATED_STEPS,
    SaturatedCorrection,
    build_train_metrics,
    compute_and_reset,
    update_rollout_correction_metrics,
)
from erpo_lightning.objectives import rollout_correction_weights
from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.toy import SHIPPED_DIR

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CAP_MEANING = "it is the upper bound on the engine/trainer probability ratio"


@pytest.fixture()
def config(tmp_path):
    return str(tiny_config(tmp_path, SHIPPED_DIR, SHIPPED_DIR / "train.jsonl"))


# ----------------------------------------------------------------------------------- item 1: a cap below 1 refused
@pytest.mark.parametrize("mode", ["tis", "mis"])
@pytest.mark.parametrize("cap", ["0.5", "0.9"])
def test_a_cap_below_one_is_refused_by_the_cli(capsys, config, mode, cap):
    line = fails_in_one_line(
        capsys, "fit", "--config", config, "--model.rollout_correction", mode, "--model.rollout_correction_cap", cap
    )
    assert line.startswith(f"erpo: error: model.rollout_correction_cap must be >= 1 (.inf: no upper end), got {cap}")
    assert CAP_MEANING in line and "verl's rollout_is_threshold" in line and "rollout_correction_floor" in line


def test_a_cap_below_one_is_refused_by_the_constructors():
    with pytest.raises(ValueError, match="model.rollout_correction_cap must be >= 1") as refused:
        ERPOModule(model_path=str(SHIPPED_DIR), rollout_correction="mis", rollout_correction_cap=0.5)
    assert CAP_MEANING in str(refused.value)
    with pytest.raises(ValueError, match="model.rollout_correction_cap must be >= 1"):
        Algorithm(rollout_correction="tis", rollout_correction_cap=0.999)
    # The bounds themselves are allowed: 1 keeps every ratio of agreeing engine and trainer, inf has no upper end.
    assert Algorithm(rollout_correction="mis", rollout_correction_cap=1.0).rollout_correction_cap == 1.0
    assert Algorithm(rollout_correction="tis", rollout_correction_cap=math.inf, rollout_correction_floor=1.0)


def test_a_floor_above_one_is_refused(capsys, config):
    line = fails_in_one_line(
        capsys, "fit", "--config", config, "--model.rollout_correction", "mis",
        "--model.rollout_correction_cap", "4", "--model.rollout_correction_floor", "1.5",
    )  # fmt: skip
    assert line == (
        "erpo: error: model.rollout_correction_floor must be >= 0 and below rollout_correction_cap (4), at most 1 "
        "(ρ = 1, engine and trainer agreeing, must lie in the band), or null, got 1.5"
    )


# ------------------------------------------------------------------------- item 1: a saturated band warned, once
def _capped_frac(settings: Algorithm, gap: float) -> torch.Tensor:
    """`train/rollout_is_capped_frac` of one step whose engine log-probs sit `gap` nats below the trainer's on every
    token (ρ = e^gap), computed by the module's own metric code."""
    metrics = build_train_metrics()
    trainer = -torch.rand(4, 5, generator=torch.Generator().manual_seed(0)) - 0.1
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    _, ratio, outside = rollout_correction_weights(
        trainer, trainer - gap, mask, settings.rollout_correction, settings.rollout_correction_level,
        settings.rollout_correction_cap, settings.rollout_correction_floor,
    )  # fmt: skip
    update_rollout_correction_metrics(metrics, ratio, outside, mask)
    return compute_and_reset(metrics)["train/rollout_is_capped_frac"]


def test_every_token_outside_the_band_for_three_steps_warns_once():
    settings = Algorithm(rollout_correction="mis", rollout_correction_cap=2.0)
    watch = SaturatedCorrection(settings)
    inside, outside = _capped_frac(settings, 0.1), _capped_frac(settings, 1.0)  # ρ = 1.105, 2.718
    assert float(inside) == 0.0 and float(outside) == 1.0
    # Two saturated steps, one healthy one (the count restarts), then SATURATED_STEPS saturated ones: one warning.
    said = [watch.update(frac) for frac in (outside, outside, inside, *[outside] * (SATURATED_STEPS + 3))]
    warnings = [(step, text) for step, text in enumerate(said) if text is not None]
    assert [step for step, _ in warnings] == [2 + SATURATED_STEPS]
    text = warnings[0][1]
    assert text.startswith(f"train/rollout_is_capped_frac has been 1.0 for {SATURATED_STEPS} steps in a row")
    assert "the band [0, 2] of model.rollout_correction 'mis'" in text
    assert "policy-gradient terms are all zeroed" in text and "model.rollout_correction_cap" in text
    # No correction logged (None) or a step without the metric (NaN) is not saturation.
    quiet = SaturatedCorrection(settings)
    assert [quiet.update(value) for value in (None, float("nan"), None, outside, outside)] == [None] * 5
