"""The long-horizon study (studies/long_horizon): the pilot's gate on hand-made trajectories, the trajectory values
its claims read (peak window, last three sweeps, area after step 400) against hand computation, and the study's
definition (regimes in the plan's order, arms `erpo fit` accepts, unseen seeds, the plan beside it)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from studies.engine.claims import BASE_ARM
from studies.engine.paired import MeanCheck, PairedInterval
from studies.engine.runs import run_slug
from studies.engine.trajectory import area_after, last_mean, peak
from studies.long_horizon import pilot
from studies.long_horizon.run import LONG_HORIZON, main
from studies.long_horizon.study import (
    CLAIMS,
    FULL,
    LOWER_LR_FACTOR,
    MAIN_SEEDS,
    PILOT_REGIMES,
    Regime,
    arms,
)

REPO = Path(__file__).resolve().parents[2]
STEPS = list(range(50, 1001, 50))  # the sweeps after the first step
EARLIER_SEEDS = set(range(8)) | {100, 101, 200, 201} | set(range(300, 316))  # earlier studies, their pilots, brake


def curve(values_by_step: dict[int, float], default: float) -> pd.Series:
    """A held-out trajectory (in [0, 1]) at every sweep step: `default` but where given."""
    return pd.Series([values_by_step.get(step, default) for step in STEPS], index=STEPS, dtype=float)


def test_the_peak_window_the_last_three_and_the_area_against_hand_computation():
    series = pd.Series([0.30, 0.40, 0.35, 0.50, 0.20], index=[0, 100, 200, 300, 400])
    assert peak(series, 3) == (100, pytest.approx((0.40 + 0.35 + 0.50) / 3))
    assert peak(series, 3, last=300) == (100, pytest.approx(1.25 / 3))
    assert peak(series, 3, first=300)[0] == -1  # fewer than three sweeps there
    assert last_mean(series, 3) == pytest.approx((0.35 + 0.50 + 0.20) / 3)
    # trapezoids over 200..400: (0.35 + 0.50) / 2 · 100 + (0.50 + 0.20) / 2 · 100 = 77.5, over 200 steps
    assert area_after(series, 200) == pytest.approx(77.5 / 200)
    assert area_after(pd.Series([0.3, 0.3], index=[0, 50]), 0) == pytest.approx(0.3)


def test_a_seed_that_learns_and_falls_at_high_temperature_passes():
    t15 = curve({300: 0.30, 350: 0.31, 400: 0.29, 900: 0.24, 950: 0.25, 1000: 0.26}, 0.27)  # best 30, last 25
    result = pilot.seed_gate({"T=1": curve({}, 0.40), "T=1.5": t15}, train_end=0.62, base_train=0.50)
    assert result["train_gain"] == pytest.approx(12.0) and result["drop"]["T=1"] == pytest.approx(0.0)
    assert result["best"]["T=1.5"] == pytest.approx(30.0) and result["last"]["T=1.5"] == pytest.approx(25.0)
    assert result["drop"]["T=1.5"] == pytest.approx(5.0) and result["passes"]


@pytest.mark.parametrize(
    ("case", "t1", "train_end", "passes"),
    [("a collapse: no learning", curve({400: 0.5, 450: 0.5, 500: 0.5}, 0.3), 0.5625, False),  # gain 6.25
     ("learns, never falls", curve({}, 0.40), 0.75, False),
     ("falls 3 points", curve({400: 0.43, 450: 0.43, 500: 0.43}, 0.40), 0.60, True),  # on both bounds
     ("falls 2.7 points", curve({400: 0.27734375, 450: 0.27734375, 500: 0.27734375}, 0.25), 0.625, False),
     ("its best is after step 850", curve({900: 0.55, 950: 0.30, 1000: 0.30}, 0.35), 0.625, False)],
)  # fmt: skip
def test_the_gate_on_hand_made_trajectories(case, t1, train_end, passes):
    assert pilot.seed_gate({"T=1": t1, "T=1.5": curve({}, 0.2)}, train_end, base_train=0.50)["passes"] is passes, case


def test_the_gate_needs_both_pilot_seeds():
    ok, bad = {"passes": True}, {"passes": False}
    assert pilot.regime_gate({400: ok, 401: ok}) and not pilot.regime_gate({400: ok, 401: bad})
    assert not pilot.regime_gate({400: ok})  # a seed that did not run does not pass


def test_a_pilot_that_passes_nowhere_writes_the_untestable_verdict(tmp_path):
    record = {"rule": {"seeds": [400, 401]}, "regimes": {"full_lr0.0001_s1000": {"passes": False}}, "chosen": None}
    pilot.write_untestable(record, tmp_path / "claims.json")
    written = json.loads((tmp_path / "claims.json").read_text())
    assert written["verdict"] == "untestable" and written["study"]["pilot"] == record and written["claims"] == []
    assert "untestable here" in written["text"]


def test_the_study_definition():
    LONG_HORIZON.check()
    assert [r.name for r in PILOT_REGIMES] == ["full_lr0.0001_s1000", "full_lr0.0002_s1000", "full_lr0.0003_s1000",
                                              "q32_lr0.0001_s1000"]  # the plan's order  # fmt: skip
    assert "limit" not in PILOT_REGIMES[0].flags()[1] and '"limit": 32' in PILOT_REGIMES[3].flags()[1]
    for regime in PILOT_REGIMES:
        assert "--model.learning_rate" not in regime.flags()  # the arms carry it: the lower-lr arm sets its own
        lowered = arms(regime)["grpo (lower lr)"]
        assert lowered[lowered.index("--model.learning_rate") + 1] == f"{LOWER_LR_FACTOR * regime.learning_rate:g}"
    assert list(arms(Regime(1e-4))) == ["grpo", "erpo", "erpo_released", "grpo (lower lr)"]
    assert FULL.steps == 1000 and FULL.sweep_every == 50 and FULL.steps // FULL.sweep_every >= 10
    assert FULL.temperatures == (1.0, 1.5) and FULL.train_sample_size == 200 and not FULL.save_completions
    assert len(MAIN_SEEDS) >= 8 and not set(MAIN_SEEDS) & (set(pilot.PILOT_SEEDS) | EARLIER_SEEDS)
    assert not set(pilot.PILOT_SEEDS) & EARLIER_SEEDS
    named = {arm for claim in CLAIMS for arm in (claim.method, claim.baseline)}
    assert named <= set(arms(Regime(1e-4))) and len({c.key for c in CLAIMS}) == len(CLAIMS) == 15
    for claim in CLAIMS:
        assert isinstance(claim.rule, PairedInterval) and claim.gates[0].key == "valid.grpo_learns"
        assert claim.gates[-1].quantity == "train T=1 at 400" and claim.gates[-1].minus_arm == claim.baseline
        assert isinstance(claim.gates[0], MeanCheck) and claim.gates[0].minus_arm == BASE_ARM
        if claim.key.startswith("degradation"):
            assert claim.side == "below" and claim.gates[1].key.startswith("testable.grpo_degrades")
    plan = (REPO / "studies/long_horizon/long_horizon_plan.md").read_text()
    assert "## Pilot" in plan and "## Plan" in plan and "untestable here" in plan
    assert "long_horizon" in LONG_HORIZON.report.name


def test_no_main_run_before_the_pilot_chose_a_regime(monkeypatch):
    """The guard the main runs had before the pilot's result (REGIME None); the committed REGIME is the pilot's."""
    from studies.long_horizon import study

    assert study.REGIME == study.PILOT_REGIMES[3]  # the pilot chose q32_lr0.0001_s1000 (long_horizon_plan.md)
    monkeypatch.setattr(study, "REGIME", None)
    with pytest.raises(SystemExit, match="no long-horizon regime is chosen"):
        main(["--report-only"])


@pytest.mark.slow
def test_every_arm_of_every_regime_parses_with_the_real_erpo_parser(tmp_path):
    """`erpo fit --print_config` on each arm's real command line in each pilot regime (nothing trained)."""
    script = """
import contextlib, io, json, sys
from pathlib import Path
import yaml
from erpo_lightning.cli.command import main
from studies.engine.runs import base_sweep, callback_config, fit_command
from studies.long_horizon.run import long_horizon_study
from studies.long_horizon.study import FULL, PILOT_REGIMES
out = Path(sys.argv[1])
results = {}
for regime in PILOT_REGIMES:
    study = long_horizon_study(regime, out)
    (out / "callbacks.yaml").write_text(yaml.safe_dump(callback_config(base_sweep(Path("."), study.base_config),
                                                                       FULL, True)))
    for arm in study.arms:
        args = fit_command(study, arm, 500, out, FULL, None, [])[1:]
        printed, code = io.StringIO(), 0
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            try:
                main([args[0], "--print_config", *args[1:]])
            except SystemExit as stop:
                code = stop.code or 0
        config = yaml.safe_load(printed.getvalue()) if code == 0 else None
        results[f"{regime.name} {arm}"] = {"code": code, "lr": config and config["model"]["learning_rate"],
                                           "train": config and config["data"]["train"]}
print(json.dumps(results))
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 16 and all(r["code"] == 0 for r in results.values())
    assert results["full_lr0.0002_s1000 grpo (lower lr)"]["lr"] == pytest.approx(1e-4)
    assert results["q32_lr0.0001_s1000 erpo"]["train"][0]["limit"] == 32


def test_every_main_run_is_committed_with_held_out_sweeps_at_ten_steps_or_more():
    """Issue 51's "done when": every run of the study records held-out accuracy (T = 1.0 and 1.5) at ≥ 10 steps,
    for every arm and every main seed, and the claims file holds a value per seed of each of them."""
    runs = REPO / "studies/long_horizon/runs"
    for arm in arms(Regime(1e-4)):
        for seed in MAIN_SEEDS:
            [metrics] = (runs / run_slug(arm) / f"seed{seed}").glob("erpo/version_*/metrics.csv")
            frame = pd.read_csv(metrics)
            for temperature in ("T=1", "T=1.5"):
                swept = frame.dropna(subset=[f"val/avg@k/toy_test/{temperature}"])["step"]
                assert swept.nunique() >= 10, (arm, seed, temperature)
    claims = json.loads((REPO / "studies/long_horizon/long_horizon_study_claims.json").read_text())["claims"]
    assert {claim["key"] for claim in claims} == {claim.key for claim in CLAIMS}
    assert all(claim["n"] == len(claim["per_seed"]) == len(MAIN_SEEDS) >= 8 for claim in claims)  # gated ones too
