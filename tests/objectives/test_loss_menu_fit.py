"""`erpo fit` with the loss menu's presets (issue 70): each trains the toy model a few steps with ratios that move
(`num_iterations: 2`), logging its own statistics, and `--print_config` shows the new loss fields."""

import csv
import math

import pytest
import yaml
from helpers.cli_runs import run_main
from helpers.fit_configs import csv_logger, fit_config, write_config

from erpo_lightning.cli.command import main

NEW_FIELDS = (
    "ratio_level", "sequence_clip_low", "sequence_clip_high", "policy_loss", "cispo_weight_cap", "entropy_coef",
    "entropy_target", "entropy_coef_delta", "entropy_coef_range", "entropy_top_fraction",
)  # fmt: skip


def test_print_config_shows_the_loss_menu_fields(capsys):
    flags = ["--model.algorithm", "cispo_erpo", "--model.entropy_coef", "0.01", "--model.entropy_top_fraction", "0.2"]
    assert run_main("fit", *flags, "--model.entropy_coef_range", "[0.0, 0.05]", "--print_config") == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert set(NEW_FIELDS) <= set(model)
    assert model["algorithm"] == "cispo_erpo" and model["entropy_coef"] == 0.01
    assert model["entropy_top_fraction"] == 0.2 and list(model["entropy_coef_range"]) == [0.0, 0.05]
    assert model["ratio_level"] is None  # unset: the preset's


# The preset, extra model settings, and the statistics its run must log.
RUNS = {
    "gspo": ({}, ["train/seq_ratio_dev"]),
    "gspo_erpo": (
        {"entropy_coef": 0.01, "entropy_target": 50.0, "entropy_top_fraction": 0.5},
        ["train/seq_ratio_dev", "train/entropy_coef", "train/entropy_target", "train/entropy_kept_frac"],
    ),
    "cispo": ({}, ["train/cispo_truncated_frac"]),
    "cispo_erpo": ({"entropy_coef": 0.01}, ["train/cispo_truncated_frac", "train/entropy_bonus"]),
}


@pytest.mark.slow  # one `erpo fit` (cache and 2 steps) each
@pytest.mark.parametrize("preset", list(RUNS))
def test_erpo_fit_trains_the_toy_model_with_each_new_preset(preset, tmp_path, tiny_model_path, benchmarks_dir):
    settings, logged = RUNS[preset]
    config = fit_config(
        tiny_model_path,
        [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 4}],
        tmp_path / "run",
        trainer={
            "logger": csv_logger(tmp_path / "run"),
            "enable_checkpointing": False,
            "log_every_n_steps": 1,
            "enable_model_summary": False,
        },  # fmt: skip
        model={"algorithm": preset, "learning_rate": 1e-3, "num_iterations": 2, **settings},
    )
    main(["fit", "--config", str(write_config(tmp_path / "fit.yaml", config))])  # in this process; returns on success
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert losses and all(math.isfinite(loss) for loss in losses)  # 2 optimizer steps: one rollout batch, used twice
    for name in logged:
        values = [float(row[name]) for row in rows if row.get(name)]
        assert values and all(math.isfinite(value) for value in values), name
