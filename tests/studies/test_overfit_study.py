"""The overfitting study (studies/overfit): its decision rule (SignTest) against hand computation, the learning
guard and the base-model gates, the pilot's gate recomputed from its committed runs, and every arm's command. The
report is rebuilt from the committed runs in tests/studies/test_committed_reports.py."""

import json
from dataclasses import replace
from math import comb
from pathlib import Path

import numpy as np
import pytest
from helpers.recomputed import assert_recomputes

from studies.engine.claims import BASE_ARM, Claim, Gate, LearningGuard, SignTest, describe, evaluate
from studies.engine.report import add_retention, with_base_model
from studies.engine.runs import fit_command, load_runs
from studies.overfit.pilot import PILOT_SEEDS, gate
from studies.overfit.study import ARMS, CLAIMS, OVERFIT, REGIME

REPO = Path(__file__).resolve().parents[2]
PILOT = REPO / "studies" / "overfit" / "pilot_runs"


def test_the_sign_test_p_value_is_the_binomial_tail():
    rule = SignTest(effect=3.0)
    for k in range(9):
        margins = np.array([1.0] * k + [-1.0] * (8 - k))
        assert rule.sign_test_p(margins) == pytest.approx(sum(comb(8, i) for i in range(k, 9)) / 256)
    assert rule.sign_test_p(np.array([1.0] * 7 + [-1.0])) == pytest.approx(9 / 256)  # ≈ 0.035: 7 of 8 decide
    assert rule.sign_test_p(np.array([1.0] * 6 + [-1.0] * 2)) == pytest.approx(37 / 256)  # ≈ 0.145: 6 do not
    assert rule.sign_test_p(np.array([0.0] * 8)) == 1.0  # a margin of exactly 0 is not on the claimed side


@pytest.mark.parametrize(
    ("margins", "verdict"),
    [([5.0] * 7 + [-1.0], "confirmed"),          # 7 of 8 positive, mean 4.25 >= 3
     ([2.0] * 7 + [-1.0], "refuted"),            # 7 of 8, but every resampled mean < 3: too small to count
     ([5.0] * 6 + [-1.0] * 2, "inconclusive"),   # mean 3.5 but p = 0.145
     ([-4.0, -2.0, -6.0, -3.0, -5.0, -1.0, -2.0, -3.0], "refuted"),
     ([9.0, -8.0, 10.0, -7.0, 8.0, -9.0, 12.0, 1.0], "inconclusive"),
     ([], "n/a")],
)  # fmt: skip
def test_sign_test_verdicts(margins, verdict):
    rule = SignTest(effect=3.0)
    assert rule.verdict(np.array(margins)) == verdict


def test_the_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    margins = np.array([9.0, -8.0, 10.0, -7.0, 8.0, -9.0, 12.0, 1.0])
    rule = SignTest(effect=3.0)
    low, high = rule.interval(margins)
    assert (low, high) == rule.interval(margins)  # generator seed 0: the claims file recomputes exactly
    assert low < margins.mean() < high
    assert low >= margins.min() and high <= margins.max()
    extra = rule.extra(margins)
    assert extra["seeds_split"] and extra["mean_margin"] == pytest.approx(2.0) and extra["interval"] == [low, high]


def table_with_base(**arms: dict) -> dict:
    """A per-seed table of arms (quantity -> values for seeds 0..n-1) with the base model's row from one sweep."""
    seeds = list(range(len(next(iter(next(iter(arms.values())).values())))))
    table = {arm: {"seed": seeds, **values} for arm, values in arms.items()}
    base = {"val/avg@k/test/T=1": 0.40, "val/avg@k/test/T=1.5": 0.30, "val/avg@k/train/T=1": 0.40,
            "val/avg@k/train/T=1.5": 0.30, "val/avg@k/test/T<=1.0": 0.40, "val/avg@k/test/T>1.0": 0.30}  # fmt: skip
    table = with_base_model(table, base, (1.0, 1.5), "test")
    add_retention(table, "T=1.5", "T=1")
    return table


def test_the_base_model_row_pairs_with_every_seed_and_carries_retention():
    table = table_with_base(grpo={"T=1": [0.2, 0.25], "T=1.5": [0.05, 0.1], "train T=1": [0.8, 0.9]})
    assert list(table) == [BASE_ARM, "grpo"]
    assert table[BASE_ARM]["seed"] == [0, 1] and table[BASE_ARM]["T=1"] == [0.40, 0.40]
    assert table[BASE_ARM]["retention"] == pytest.approx([0.75, 0.75])
    assert table["grpo"]["retention"] == pytest.approx([0.25, 0.4])
    drop = Gate("g", "grpo's retention falls 5 points below the base's", "grpo", "retention", high=-5.0,
                minus_arm=BASE_ARM)  # fmt: skip
    result = drop.check(table, [0, 1], "erpo")
    assert result["per_seed"] == pytest.approx([-50.0, -35.0]) and result["passed"]


def test_the_learning_guard_confounds_an_arm_that_learned_less_than_half_of_grpos_gain():
    grpo = {"T=1": [0.20, 0.22], "T=1.5": [0.1, 0.1], "train T=1": [0.90, 0.80], "gap T=1": [0.70, 0.58]}
    lazy = {"T=1": [0.40, 0.41], "T=1.5": [0.3, 0.3], "train T=1": [0.55, 0.60], "gap T=1": [0.15, 0.19]}
    # grpo gains 50 and 40 points on the training queries, erpo 15 and 20: a share of 17.5 / 45
    table = table_with_base(grpo=grpo, erpo=lazy)
    guard = LearningGuard("guard", "learns", "grpo")
    result = guard.check(table, [0, 1], "erpo")
    assert result["per_seed"] == pytest.approx([15.0, 20.0]) and result["reference_gain"] == pytest.approx(45.0)
    assert result["share"] == pytest.approx(17.5 / 45.0) and not result["passed"]
    claim = Claim("gap", "erpo's gap is smaller", "gap T=1", "erpo", "grpo", "difference", "below", 0.0,
                  SignTest(effect=3.0, alpha=0.25), (guard,))  # fmt: skip
    evaluated = evaluate(claim, table, {})
    assert evaluated["per_seed"] == pytest.approx([-55.0, -39.0])  # the rule alone counts this a win (p = 1/4)...
    assert evaluated["verdict"] == "confounded"  # ...but it learned too little for the gap to mean anything
    assert evaluate(replace(claim, rule=SignTest(effect=3.0)), table, {})["verdict"] == "inconclusive"  # not a win
    assert "mean gain 0.39 of grpo's" in describe(evaluated) and "FAILED" in describe(evaluated)
    learner = {**lazy, "train T=1": [0.70, 0.65]}  # gains 30, 25: share 27.5/45 >= 0.5
    assert LearningGuard("guard", "learns", "grpo").check(table_with_base(grpo=grpo, erpo=learner), [0, 1],
                                                          "erpo")["passed"]  # fmt: skip


def test_claims_name_arms_of_the_study_or_the_base_model_and_keys_are_unique():
    OVERFIT.check()
    named = {arm for claim in CLAIMS for arm in (claim.method, claim.baseline)}
    assert named <= set(ARMS) | {BASE_ARM} and BASE_ARM in named
    assert len({claim.key for claim in CLAIMS}) == len(CLAIMS)
    assert OVERFIT.full.seeds == tuple(range(8)) and OVERFIT.full.steps == REGIME.steps
    assert not set(PILOT_SEEDS) & set(OVERFIT.full.seeds)  # the pilot's seeds are not the study's
    for claim in CLAIMS:  # accuracy, gap and retention claims carry the validity gate and the learning guard
        if claim.quantity in ("T=1", "gap T=1", "retention"):
            assert claim.gates[0].key == "valid.grpo_overfits" and isinstance(claim.gates[-1], LearningGuard)


def test_the_pilot_gate_recomputes_from_its_committed_runs():
    pilot = json.loads((PILOT / "pilot.json").read_text())
    regime = pilot["chosen"]
    records = load_runs(PILOT / regime, ["grpo"], "pilot")
    inputs = type("Inputs", (), {"records": records})()
    recomputed = json.loads(json.dumps(gate(inputs)))  # the JSON round trip pilot.json took (int seeds -> strings)
    assert recomputed["passes"] == pilot["regimes"][regime]["passes"]  # the decision, exactly
    assert_recomputes(recomputed, pilot["regimes"][regime])
    assert regime == REGIME.name and pilot["regimes"][regime]["passes"]


def test_every_arms_command_carries_the_regime_and_its_own_flags():
    """What each arm's `erpo fit` command is (the runs' run.json record it): the study's config, the regime's
    32-query training set and learning rate, the arm's flags, Policy-KL monitored. (Every arm's flags parse as `erpo
    fit` flags: OVERFIT.check() above; the report from the committed runs: tests/studies/test_committed_reports.py.)"""
    for arm, flags in ARMS.items():
        command = fit_command(OVERFIT, arm, 3, Path("runs/x"), OVERFIT.full, None, [])
        assert command[command.index("--config") + 1] == "configs/quickstart.yaml"
        joined = " ".join(command)
        assert " ".join(flags) in joined and '"limit": 32' in joined and "--model.learning_rate 0.0003" in joined
        assert "--model.monitor_policy_kl true" in joined and command[command.index("--data.seed") + 1] == "3"
    skip = fit_command(OVERFIT, "grpo (skip zero-signal)", 0, Path("runs/x"), OVERFIT.full, None, [])
    assert "--model.skip_zero_signal_steps" in skip
