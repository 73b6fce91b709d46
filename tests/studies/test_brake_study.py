"""The brake study (studies/brake): its decision rule (PairedInterval) against hand computation, the curve guard, the
worked-steps checker on hand-made answers, the pilot's matching rules, and the study's definition (arms `erpo fit`
accepts, claims naming its arms, unseen seeds, the plan committed beside it)."""

import json
import math
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers.recomputed import assert_recomputes

from erpo_lightning.objectives.algorithms import ALGORITHMS, Algorithm, resolve_algorithm
from studies.brake import pilot
from studies.brake.run import BRAKE, main
from studies.brake.study import (
    ARMS,
    CENTRAL,
    CLAIMS,
    CORE_ARMS,
    CORE_SEEDS,
    DERIVED_ARMS,
    KL_MATCHED,
    LOWER_LR,
    MAY_WAIT_ARMS,
    MAY_WAIT_SEEDS,
    SETTINGS,
    VALIDITY,
)
from studies.engine.claims import BASE_ARM, Claim, evaluate
from studies.engine.claims import describe as describe_claim
from studies.engine.paired import MeanCheck, PairedInterval, t_interval, t_quantile
from studies.engine.worked_steps import check_steps, problem_steps, response_steps, steps_right

REPO = Path(__file__).resolve().parents[2]
T975 = {1: 12.7062, 6: 2.4469, 7: 2.3646, 15: 2.1314}  # Student t 0.975 quantiles, from a printed table
EARLIER_SEEDS = set(range(8)) | {100, 101}  # the toy, real-model and overfitting studies and their pilots


def hand_interval(values: list[float]) -> tuple[float, float]:
    """mean ± t(0.975, n − 1) · s / √n with the table's t."""
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    return mean - half, mean + half


def test_the_t_quantile_matches_the_printed_table():
    for df, value in T975.items():
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    assert t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-9)


def test_the_interval_is_the_t_interval_of_the_mean_margin():
    margins = [4.0, 5.0, 6.0, 5.0, 4.0, 6.0, 5.0, 5.0]  # mean 5, s = sqrt(4/7)
    low, high = hand_interval(margins)
    assert (low, high) == pytest.approx((5 - 2.3646 * math.sqrt(4 / 7) / math.sqrt(8), 5 + 0.6320), abs=1e-3)
    assert t_interval(np.array(margins)) == pytest.approx((low, high), abs=1e-4)
    rule = PairedInterval(effect=2.0)
    assert rule.verdict(np.array(margins)) == "confirmed"
    assert rule.extra(np.array(margins))["flips"] == 0


def test_one_seed_that_decides_the_verdict_leaves_it_inconclusive():
    margins = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    low, _ = hand_interval(margins)  # 4.5 − 2.3646 · √6 / √8 = 2.452: the full interval clears 2
    assert low == pytest.approx(2.452, abs=1e-3) and low > 2
    without_seven = hand_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0])  # mean 29/7, s = 2.410: low 1.914 < 2
    assert without_seven[0] == pytest.approx(1.914, abs=2e-3)
    rule = PairedInterval(effect=2.0)
    assert rule.side(np.array(margins)) == "above" and rule.verdict(np.array(margins)) == "inconclusive"
    flips = sum(hand_interval(margins[:i] + margins[i + 1 :])[0] <= 2 for i in range(8))
    assert rule.extra(np.array(margins))["flips"] == flips >= 1
    assert PairedInterval(effect=2.0, leave_one_out=False).verdict(np.array(margins)) == "confirmed"


@pytest.mark.parametrize(
    ("margins", "verdict"),
    [([-1.0, 0.0, 1.0, -2.0, 0.0, 1.0, -1.0, 0.0], "refuted"),  # every interval lies below 2: an effect ruled out
     ([9.0, -8.0, 10.0, -7.0, 8.0, -9.0, 12.0, 1.0], "inconclusive"),
     ([5.0, 6.0], "inconclusive"),  # too few seeds for any verdict
     ([], "n/a")],
)  # fmt: skip
def test_interval_verdicts(margins, verdict):
    assert PairedInterval(effect=2.0).verdict(np.array(margins)) == verdict


SEEDS5 = [0, 1, 2, 3, 4]
LAG = MeanCheck("guard.early", "lags", "reward 10-49", minus_arm="grpo", low=-2.0)
BEATS_GRPO = Claim(
    "c", "erpo beats grpo", "T=1", "erpo", "grpo", "difference", "above", 0.0, PairedInterval(2.0), (LAG,)
)


def lagging_table(erpo_held_out: list[float]) -> dict:
    """erpo's training reward over steps 10-49 lags grpo's by 5.2 points (mean); erpo's held-out values as given."""
    return {"erpo": {"seed": SEEDS5, "T=1": erpo_held_out, "reward 10-49": [0.56, 0.58, 0.57, 0.57, 0.56]},
            "grpo": {"seed": SEEDS5, "T=1": [0.25, 0.24, 0.26, 0.25, 0.24],
                     "reward 10-49": [0.62, 0.63, 0.62, 0.62, 0.61]}}  # fmt: skip


def test_the_curve_guard_confounds_a_method_that_lags_its_baseline_early():
    seeds, lag, claim = SEEDS5, LAG, BEATS_GRPO
    table = lagging_table([0.32, 0.30, 0.31, 0.33, 0.31])
    result = lag.check(table, seeds, "erpo")
    assert result["per_seed"] == pytest.approx([-6.0, -5.0, -5.0, -5.0, -5.0]) and result["mean"] == pytest.approx(-5.2)
    evaluated = evaluate(claim, table, {})
    assert evaluated["per_seed"] == pytest.approx([7.0, 6.0, 5.0, 8.0, 7.0]) and evaluated["verdict"] == "confounded"
    table["grpo"]["reward 10-49"] = [0.57, 0.58, 0.58, 0.57, 0.56]  # a control that lags as much: the guard passes
    assert evaluate(claim, table, {})["verdict"] == "confirmed"


def test_a_failed_learning_guard_leaves_a_refutation_standing_but_a_failed_gate_does_not():
    """The guard discounts wins (issue 68): the same lagging method, now losing by 7 points in every seed, is
    `refuted` by the rule with the guard recorded beside the verdict; a failed testability gate still decides."""
    table, claim = lagging_table([0.18, 0.17, 0.18, 0.19, 0.17]), BEATS_GRPO
    evaluated = evaluate(claim, table, {})
    assert evaluated["per_seed"] == pytest.approx([-7.0, -7.0, -8.0, -6.0, -7.0])
    assert evaluated["verdict"] == "refuted" and evaluated["guard_failed"] == "guard.early"
    assert not evaluated["gates"][0]["passed"]
    assert "`guard.early` failed, which discounts only a win" in describe_claim(evaluated)
    testable = MeanCheck("testable.grpo_learns", "learns", "T=1", arm="grpo", low=50.0, fails_as="untestable")
    gated = evaluate(replace(claim, gates=(LAG, testable)), table, {})
    assert gated["verdict"] == "untestable" and "guard_failed" not in gated


@pytest.mark.parametrize(
    ("problem", "response", "verdict"),
    [("Compute 6 + 2 + 0.", "6 + 2 = 8. 8 + 0 = 8. \\boxed{8}", "right"),
     ("Compute 6 + 2 + 0.", "6 + 2 = 6. 6 + 0 = 8. \\boxed{8}", "wrong_result"),  # issue 50's examples
     ("Compute 2 + 5 + 2.", "2 + 5 = 6. 6 + 2 = 9. \\boxed{9}", "wrong_result"),
     ("Compute 3 + 4 - 3.", "4 + 4 = 7. 7 - 3 = 4. \\boxed{4}", "wrong_operands"),
     ("Compute 6 - 0 + 2.", "6 - 0 = 6. 6 + 1 = 8. \\boxed{8}", "wrong_operands"),
     ("Compute 7 + 8 - 5.", "7+8=15. 15-5=10. \\boxed{10}", "right"),  # spacing does not matter
     ("Compute 9 - 9 + 2.", "9 - 9 = 01. 110 = 0. \\boxed{2}", "step_count"),
     ("Compute 9 - 9 + 2.", "\\boxed{2}", "no_steps"),
     ("Compute 1 + 1 + 1.", "1 + 1 = 2. 2 + 1 = 3. 3 + 0 = 3. \\boxed{3}", "step_count"),
     ("Compute 1 + 1 + 1.", "1 + 1 = 2. 2 + 1 = 3. \\boxed{3} 5 + 5 = 1", "right"),  # after the box: not a step
     ("What is 2 + 2?", "2 + 2 = 4. \\boxed{4}", "no_problem")],
)  # fmt: skip
def test_worked_steps_on_hand_made_answers(problem, response, verdict):
    assert check_steps(problem, response) == verdict
    assert steps_right(problem, response) == (verdict == "right")


def test_the_checker_reads_hostile_text_without_raising():
    assert problem_steps("Compute 7 + 8 - 5.") == [(7, "+", 8, 15), (15, "-", 5, 10)]
    assert response_steps("3 - 5 = -2. \\boxed{-2}") == [(3, "-", 5, -2)]
    for text in ("9" * 5000 + " + 1 = 2", "1 + 1 = " + "2" * 5000, "\\boxed{" * 1000, "=" * 100_000, "", "\x00+\x00"):
        assert check_steps("Compute 1 + 1 + 0.", text) in ("no_steps", "step_count", "wrong_operands")
    assert check_steps(None, "1 + 1 = 2") == "no_problem" and check_steps("Compute 1 + 1 + 0.", None) == "no_steps"


def test_the_pilot_matching_rules_on_hand_values():
    rewards = {2e-4: 0.61, 1.5e-4: 0.58, 1e-4: 0.55, 7e-5: 0.51}
    assert pilot.choose_low_lr(0.585, rewards) == 1.5e-4  # the largest whose early reward is at or below erpo's
    assert pilot.choose_low_lr(0.40, rewards) == 7e-5  # none brakes as much: the smallest
    kls = {0.003: 0.16, 0.01: 0.12, 0.03: 0.085, 0.1: 0.04}
    assert pilot.choose_beta(0.09, kls) == 0.03  # |ln 0.085 − ln 0.09| is the smallest
    assert pilot.choose_beta(math.sqrt(0.16 * 0.12), {0.003: 0.16, 0.01: 0.12}) == 0.003  # a tie: the smaller β
    assert pilot.needs_larger_beta(0.09, {0.003: 0.16, 0.01: 0.12}) and not pilot.needs_larger_beta(0.09, kls)
    assert pilot.stop_step([15, 21]) == 130  # median lag 18 -> 20 steps on the sweep grid
    assert pilot.stop_step([14, None]) == 140 and pilot.stop_step([5, 5]) == 140  # halves round up
    assert pilot.stop_step([None, None]) == 150 and pilot.stop_step([-10, -4]) == 150  # no lag: the full run
    assert pilot.stop_step([400, 400]) == 10  # never earlier than the first sweep


def test_the_study_definition():
    BRAKE.check()
    known = {f.name for f in fields(Algorithm)} | {"learning_rate", "gradient_clip_norm"}
    for label, flags in ARMS.items():
        algorithm = flags[flags.index("--model.algorithm") + 1]
        assert algorithm in ALGORITHMS and "--model.learning_rate" in flags, label
        pairs = dict(zip(flags[::2], flags[1::2], strict=True))
        overrides = {flag[len("--model.") :]: value for flag, value in pairs.items() if flag.startswith("--model.")}
        assert all(flag.startswith(("--model.", "--rollout.")) for flag in pairs), label
        assert set(overrides) - {"algorithm"} <= known, label
        loss = {k: yaml.safe_load(v) for k, v in overrides.items() if k in {f.name for f in fields(Algorithm)}}
        resolve_algorithm(algorithm, **{k: v for k, v in loss.items() if k != "algorithm"})
    assert set(CORE_ARMS) | set(MAY_WAIT_ARMS) == set(ARMS) and not set(CORE_ARMS) & set(MAY_WAIT_ARMS)
    assert ARMS[LOWER_LR][ARMS[LOWER_LR].index("--model.learning_rate") + 1] == f"{SETTINGS.low_lr:g}"
    assert f"{SETTINGS.kl_beta:g}" in ARMS[KL_MATCHED]
    assert "--model.learning_rate" not in BRAKE.fit_flags and '"limit": 32' in " ".join(BRAKE.fit_flags)
    named = {arm for claim in CLAIMS for arm in (claim.method, claim.baseline)}
    assert named <= set(ARMS) | set(DERIVED_ARMS) | {BASE_ARM} and set(CENTRAL) <= {c.key for c in CLAIMS}
    assert len({claim.key for claim in CLAIMS}) == len(CLAIMS)
    assert all(claim.gates[0] is VALIDITY and isinstance(claim.rule, PairedInterval) for claim in CLAIMS)
    assert len(CORE_SEEDS) >= 8 and len(MAY_WAIT_SEEDS) >= 8 and set(MAY_WAIT_SEEDS) <= set(CORE_SEEDS)
    assert not (set(CORE_SEEDS) | set(pilot.PILOT_SEEDS)) & EARLIER_SEEDS and not set(CORE_SEEDS) & set(
        pilot.PILOT_SEEDS
    )
    full = BRAKE.full
    assert full.steps == 150 and full.steps // full.sweep_every >= 10 and full.save_completions
    assert full.temperatures == (1.0, 1.5) and (full.eval_problems, full.eval_k) == (200, 4)
    plan = (REPO / "studies/brake/brake_plan.md").read_text()
    assert "## Pilot" in plan and "## Plan" in plan and "brake" in BRAKE.report.name


def test_a_main_run_waits_for_the_pilot(monkeypatch):
    from studies.brake import study

    assert study.MATCHED is not None and SETTINGS is study.MATCHED  # the pilot fixed them (brake_plan.md)
    chosen = json.loads((REPO / "studies/brake/pilot_runs/pilot.json").read_text())["chosen"]
    assert study.MATCHED == study.Matched(**chosen)  # written from the committed pilot's choices, unedited
    monkeypatch.setattr(study, "MATCHED", None)  # before the pilot, a main run is refused
    with pytest.raises(SystemExit, match="not fixed yet"):
        main(["--report-only"])


@pytest.mark.slow
def test_every_arm_parses_with_the_real_erpo_parser(tmp_path):
    """`erpo fit --print_config` on each arm's real command line (nothing trained): the CLI accepts every flag."""
    script = """
import contextlib, io, json, sys
from pathlib import Path
import yaml
from erpo_lightning.cli.command import main
from studies.brake.run import BRAKE
from studies.engine.runs import base_sweep, callback_config, fit_command
out = Path(sys.argv[1])
(out / "callbacks.yaml").write_text(yaml.safe_dump(callback_config(base_sweep(Path("."), BRAKE.base_config),
                                                                   BRAKE.full, True)))
results = {}
for arm in BRAKE.arms:
    args = fit_command(BRAKE, arm, 300, out, BRAKE.full, None, [])[1:]
    printed, code = io.StringIO(), 0
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([args[0], "--print_config", *args[1:]])
        except SystemExit as stop:
            code = stop.code or 0
    results[arm] = {"code": code, "config": yaml.safe_load(printed.getvalue()) if code == 0 else None}
print(json.dumps(results))
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert {arm: r["code"] for arm, r in results.items()} == dict.fromkeys(ARMS, 0)
    model = {arm: r["config"]["model"] for arm, r in results.items()}
    assert model["erpo (no clip)"]["gradient_clip_norm"] is None and model["erpo"]["gradient_clip_norm"] == 1.0
    assert model[LOWER_LR]["learning_rate"] == SETTINGS.low_lr and model["erpo"]["learning_rate"] == 3e-4
    assert (
        model[KL_MATCHED]["policy_kl_coef"] == SETTINGS.kl_beta
        and model["erpo (no w(q))"]["use_query_weights"] is False
    )
    rollout = {arm: r["config"]["rollout"] for arm, r in results.items()}
    assert rollout["dapo"]["dynamic_sampling"] and rollout["dapo_erpo"]["overlong_buffer"] == 12
    assert not rollout["grpo"]["dynamic_sampling"] and rollout["rloo"]["overlong_buffer"] == 0
    sweep = results["grpo"]["config"]["trainer"]["callbacks"][0]["init_args"]
    assert sweep["every_n_steps"] == 10 and sweep["save_completions"] is True


class FakeRun:
    """A finished pilot run as `decide` reads it: its arm, seed and per-step training metrics."""

    def __init__(self, method: str, seed: int, reward: list[float], policy_kl: float):
        self.method, self.seed = method, seed
        self.frame = pd.DataFrame({"rollout/reward_mean": reward, "train/policy_kl": [policy_kl] * len(reward)})

    def metrics(self) -> pd.DataFrame:
        return self.frame


def ramp(start: int, steps: int = 150) -> list[float]:
    """A training reward that is 0.5 until `start`, then 0.9: its 10-step running mean reaches 0.70 at start + 4."""
    return [0.5 if step < start else 0.9 for step in range(steps)]


def test_the_pilot_decides_from_its_runs_training_side_only():
    runs = []
    for seed in pilot.PILOT_SEEDS:
        runs += [FakeRun("grpo", seed, ramp(30), 0.16), FakeRun("erpo", seed, ramp(45 + seed - 200), 0.09)]
        runs += [FakeRun(pilot.lr_label(lr), seed, ramp(30 + int(lr_shift)), 0.1)
                 for lr, lr_shift in zip(pilot.LR_GRID, (5, 12, 25, 40), strict=True)]  # fmt: skip
        runs += [FakeRun(pilot.beta_label(b), seed, ramp(30), kl)
                 for b, kl in zip(pilot.BETA_GRID, (0.15, 0.12, 0.095, 0.05, 0.02), strict=True)]  # fmt: skip
    result = pilot.decide(runs)
    values, chosen = result["values"], result["chosen"]
    assert values["lags"] == [15, 16] and chosen["stop_step"] == 130  # median 15.5 -> 20 on the sweep grid
    # steps 10-49 at 0.5 until the ramp, then 0.9: erpo (35 + 5, 36 + 4 steps) 0.55 and 0.54; the lr arms (ramps at
    # 35, 42, 55, 70) 0.65, 0.58, 0.5, 0.5: the largest at or below erpo's 0.545 is 1e-4
    assert values["erpo_early_reward"] == pytest.approx(0.545)
    assert values["early_reward_by_lr"] == pytest.approx({"0.0002": 0.65, "0.00015": 0.58, "0.0001": 0.5, "7e-05": 0.5})
    assert chosen["low_lr"] == 1e-4
    assert chosen["kl_beta"] == 0.03 and not values["larger_beta_needed"]


def test_the_committed_pilot_recomputes_to_its_decision():
    """pilot.json (the choices in MATCHED) is what `decide` makes of the committed pilot runs, value for value."""
    from studies.engine.runs import load_runs

    committed = json.loads((REPO / "studies/brake/pilot_runs/pilot.json").read_text())
    arms = list(pilot.pilot_arms(tuple(committed["rule"]["betas_run"])))
    records = load_runs(REPO / "studies/brake/pilot_runs", arms, "brake-pilot")
    assert len(records) == 2 * len(arms) == 22
    recomputed = json.loads(json.dumps(pilot.decide(records)))  # the JSON round trip pilot.json took
    assert recomputed["chosen"] == committed["chosen"]  # the decisions, exactly
    assert_recomputes(recomputed["values"], committed["values"])  # the means, to a last-bit difference
