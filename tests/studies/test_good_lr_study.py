"""The good-lr study (studies/good_lr): the pilot's rule on hand-made trajectories, the committed validation set
(other problems than the test set's and the training file's), unseen seeds, arms `erpo fit` accepts, and the plan
committed beside it."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from studies.good_lr import measures, pilot, run, study

REPO = Path(__file__).resolve().parents[2]
EARLIER_SEEDS = set(range(8)) | {100, 101, 200, 201, 400, 401} | set(range(300, 316)) | set(range(500, 508))


def curve(values: list[float]) -> pd.Series:
    """Held-out Avg@4 by sweep step, a sweep every 20 steps from 0."""
    return pd.Series(values, index=[20 * i for i in range(len(values))], dtype=float)


def test_the_drawdown_is_the_best_window_minus_the_last_three_sweeps():
    # rises to 0.50 by steps 40-80, then falls to 0.40 over the last three sweeps before step 300
    values = [0.40, 0.45, 0.50, 0.50, 0.50, 0.48, 0.47, 0.46, 0.45, 0.44, 0.43, 0.42, 0.41, 0.40, 0.40, 0.40]
    series = curve(values + [0.39] * 10)  # 500 steps: 26 sweeps
    assert measures.drawdown(series, 300) == pytest.approx(100 * (0.50 - 0.40))
    # at 400 the last three are 0.39 and the best window may reach step 340 only: still the 0.50 plateau
    assert measures.drawdown(series, 400) == pytest.approx(100 * (0.50 - 0.39))
    assert measures.drawdown(curve([0.4] * 10), 300) != measures.drawdown(curve([0.4] * 10), 300)  # NaN: not reached


def test_the_pilot_chooses_the_shortest_length_that_passes_in_both_seeds():
    assert pilot.choose_steps({800: {300: 2.5, 400: 3.0, 500: 4.0}, 801: {300: 2.0, 400: 1.0, 500: 3.0}}) == 300
    assert pilot.choose_steps({800: {300: 1.9, 400: 3.0, 500: 4.0}, 801: {300: 5.0, 400: 2.1, 500: 3.0}}) == 400
    assert pilot.choose_steps({800: {300: 0.0, 400: 0.0, 500: 1.0}, 801: {300: 5.0, 400: 5.0, 500: 5.0}}) == 500
    assert pilot.choose_steps({800: {300: 9.0, 400: 9.0, 500: 9.0}}) == 500  # a seed missing: never chosen early


def test_the_validation_set_is_other_problems_of_the_shipped_test_file():
    test = [json.loads(line) for line in (REPO / study.TEST_FILE).read_text().splitlines()]
    validation = [json.loads(line) for line in (REPO / study.VALIDATION_FILE).read_text().splitlines()]
    train = {json.loads(line)["problem"] for line in (REPO / study.TRAIN_FILE).read_text().splitlines()}
    assert validation == test[200:400] and len(validation) == 200
    problems = {row["problem"] for row in validation}
    assert len(problems) == 200 and not problems & {row["problem"] for row in test[:200]} and not problems & train


def test_seeds_are_unseen_and_the_plan_is_committed_beside_the_study():
    assert not (set(study.CORE_SEEDS) | set(study.PORTABILITY_SEEDS) | set(pilot.PILOT_SEEDS)) & EARLIER_SEEDS
    assert not set(pilot.PILOT_SEEDS) & set(study.CORE_SEEDS) and len(study.CORE_SEEDS) == 16
    plan = (REPO / "studies/good_lr/good_lr_plan.md").read_text()
    assert "committed before any run" in plan and "810–825" in plan and "800, 801" in plan
    core = run.core_study(300)
    core.check()  # every arm is a preset `erpo fit` accepts
    assert core.full.validation == study.VALIDATION_FILE and core.full.sweep_every == 20
    assert {a[a.index("--model.learning_rate") + 1] for a in core.arms.values()} == {"7e-05"}


def test_no_main_run_before_the_pilot_set_the_length(monkeypatch):
    monkeypatch.setattr(study, "STEPS", None)
    with pytest.raises(SystemExit, match="run length is not set"):
        run.main([])


def test_the_seed_and_problem_interval_against_hand_computation():
    from studies.good_lr.measures import seed_problem_interval

    assert seed_problem_interval(np.full((16, 200), 3.0)) == pytest.approx([3.0, 3.0])  # nothing to resample
    # every seed alike, half the problems +4 and half 0 (sd 2): only the problem draw moves the mean, whose 95%
    # range is 2 ± 1.96 · 2 / sqrt(200) ≈ 2 ± 0.28 by the normal approximation
    differences = np.tile(np.repeat([4.0, 0.0], 100), (16, 1))
    low, high = seed_problem_interval(differences)
    assert low == pytest.approx(2 - 0.28, abs=0.05) and high == pytest.approx(2 + 0.28, abs=0.05)
    # every problem alike, seeds +1 or +3 (sd 1): only the seed draw moves it, 2 ± 1.96 · 1 / sqrt(16) ≈ 2 ± 0.49
    by_seed = np.repeat([[1.0], [3.0]], 8, axis=0) * np.ones((16, 200))
    low, high = seed_problem_interval(by_seed)
    assert low == pytest.approx(2 - 0.49, abs=0.1) and high == pytest.approx(2 + 0.49, abs=0.1)


def test_generality_reads_the_firm_verdicts_side():
    from studies.good_lr.measures import generality

    assert generality("confirmed", [2.5, 6.0], 2.0) == "general"
    assert generality("confirmed", [1.5, 6.0], 2.0) == "specific to these problems"
    assert generality("refuted", [-9.0, 1.0], 2.0) == "general"
    assert generality("refuted", [-9.0, 2.5], 2.0) == "specific to these problems"
    assert generality("inconclusive", [-9.0, 9.0], 2.0) == "-"


def test_the_drawdown_so_far_follows_the_trailing_window():
    from studies.good_lr.measures import drawdown_so_far

    held_out = curve([0.3, 0.4, 0.5, 0.6, 0.6, 0.3, 0.3, 0.3])  # steps 0..140
    # trailing means from step 60: (0.4+0.5+0.6)/3 = 0.5, 0.5667, 0.5, 0.4, 0.3
    assert drawdown_so_far(held_out).to_dict() == pytest.approx(
        {60: 0.0, 80: 0.0, 100: 100 * (0.5667 - 0.5), 120: 100 * (0.5667 - 0.4), 140: 100 * (0.5667 - 0.3)}, abs=0.01
    )


def test_leave_one_seed_out_errors_favour_the_signal_that_carries_the_drawdown():
    from studies.good_lr.measures import MonitorRun, leave_one_seed_out_errors

    generator = np.random.default_rng(1)
    runs = []
    for seed in range(6):
        steps = np.arange(60, 320, 20, dtype=float)
        query_kl = generator.normal(size=steps.size)
        frame = pd.DataFrame({"drawdown": 2.0 + 3.0 * query_kl, "query_kl": query_kl,
                              "policy_kl": generator.normal(size=steps.size),
                              "train": generator.normal(size=steps.size), "step": steps}, index=steps)  # fmt: skip
        runs.append(MonitorRun(seed, frame))
    errors = leave_one_seed_out_errors(runs)
    assert errors["query_kl"] == pytest.approx([0.0] * 6, abs=1e-9)  # drawdown is exactly linear in it
    assert all(min(errors[s][i] for s in ("policy_kl", "train", "step")) > 1.0 for i in range(6))


def pilot_inputs(tmp_path: Path):
    """The committed pilot runs as a report's inputs (written under `tmp_path`)."""
    from studies.engine.definition import ReportInputs
    from studies.engine.runs import load_runs

    records = load_runs(REPO / pilot.OUT, ["grpo", "erpo"], "good-lr pilot")
    assert len(records) == 2 * len(pilot.PILOT_SEEDS)
    settings = study.settings(pilot.PILOT_STEPS, pilot.PILOT_SEEDS)
    description = {"methods": study.CORE_ARMS}
    command = "python -m studies.good_lr.pilot"
    return ReportInputs(records, settings, tmp_path / "report.md", command, 0.0, 1, description, study.BASE_CONFIG)


def test_the_committed_pilot_recomputes_to_its_decision_and_sets_the_length(tmp_path):
    """pilot.json is what `decide` makes of the committed pilot runs, and STEPS is its choice."""
    from helpers.recomputed import assert_recomputes

    committed = json.loads((REPO / pilot.OUT / "pilot.json").read_text())
    recomputed = json.loads(json.dumps(pilot.decide(pilot_inputs(tmp_path))))  # the JSON round trip pilot.json took
    assert recomputed["chosen"] == committed["chosen"] and study.STEPS == committed["chosen"]["steps"]
    assert_recomputes(recomputed["drawdown"], committed["drawdown"])
    assert set(committed["drawdown"]) == {str(seed) for seed in pilot.PILOT_SEEDS}


def test_the_core_report_writes_from_real_runs(tmp_path):
    """The core report's whole path on the pilot's runs (validation sweeps, per-problem counts, the monitor's rows):
    every claim gets a verdict word and every accuracy claim its seed-and-problem interval."""
    from studies.good_lr.report import good_lr_report

    results = good_lr_report(pilot_inputs(tmp_path))
    assert [result["key"] for result in results] == [claim.key for claim in study.CORE_CLAIMS]
    accuracy = [result for result in results if result["quantity"] != study.MONITOR_ERROR]
    assert all(len(result.get("seed_problem_interval", [])) == 2 for result in accuracy if result["verdict"] != "n/a")
    text = (tmp_path / "report.md").read_text()
    assert "## Beyond these 200 problems" in text and "Validation set, Avg@4 at T = 1.0" in text
    assert (tmp_path / "report_claims.json").is_file() and (tmp_path / "report_trajectories.png").is_file()
