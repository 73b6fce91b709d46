"""The study engine (studies/engine/*.py): pre-registered decision rules and gates, seeds paired by number, the
real-model study's definition, the runs' commands and resuming a study after a kill (with a stand-in `erpo`). The
real-model study's report is rebuilt from its committed runs in tests/studies/test_committed_reports.py."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from studies.engine import runs as study_runs
from studies.engine.claims import Claim, MeanMargin, confirm, describe, evaluate
from studies.engine.definition import ALL_QUERIES, StudySettings
from studies.engine.runs import callback_config, fit_command, run_record, train_one
from studies.real_model.report import PILOT_FILE, clamp_note, pilot_section
from studies.real_model.study import CLAIMS, REAL_MODEL

REPO = Path(__file__).resolve().parents[2]
# Run from the repository root, where `python -m` finds the studies package.
STUDY = [sys.executable, "-m", "studies.real_model"]
COMPARE = [sys.executable, "-m", "studies.engine.compare", "real_model"]
BY_KEY = {claim.key: claim for claim in CLAIMS}


@pytest.mark.parametrize(
    ("differences", "verdict", "split"),
    [([4.0, 5.0], "confirmed", False), ([3.0, 3.0], "confirmed", False), ([1.0, 2.0], "inconclusive", False),
     ([-1.0, 1.5], "inconclusive", True), ([-3.0, 1.0], "refuted", True), ([-3.0, 2.5], "inconclusive", True),
     ([0.0, 0.0], "refuted", False), ([7.0, -0.5], "inconclusive", True)],
)  # fmt: skip
def test_the_pre_registered_rule(differences, verdict, split):
    # confirmed: positive in every seed, mean >= 3; refuted: mean <= 0 and no seed above +2; else inconclusive.
    rule = MeanMargin(confirm_mean=3.0, refute_mean=0.0, refute_seed=2.0)
    margins = np.array(differences)
    assert rule.verdict(margins) == verdict
    assert rule.extra(margins)["seeds_split"] is split
    assert rule.extra(margins)["mean_margin"] == pytest.approx(np.mean(differences))


def accuracy_table(**arms: dict) -> dict:
    """A per-seed table (accuracies in [0, 1]) of arms given as quantity -> values, seeds 0, 1, ... unless given."""
    return {arm: {"seed": list(range(len(next(iter(q.values()))))), **q} for arm, q in arms.items()}


def test_validity_gates_come_before_the_rule_and_accuracies_compare_in_points():
    grpo = {"T=1": [0.60, 0.70], "T=1.5": [0.40, 0.50], "gap": [0.05, 0.04]}
    erpo = {"T=1": [0.60, 0.70], "T=1.5": [0.45, 0.56], "gap": [0.01, 0.00]}
    claim = BY_KEY["accuracy.erpo_high_t"]
    result = evaluate(claim, accuracy_table(grpo=grpo, erpo=erpo), {})
    assert result["per_seed"] == pytest.approx([5.0, 6.0]) and result["verdict"] == "confirmed"
    assert [gate["passed"] for gate in result["gates"]] == [True, True]
    assert result["gates"][1]["per_seed"] == pytest.approx([-20.0, -20.0])  # T=1.5 − T=1, points
    assert result["mean_margin"] == pytest.approx(5.5) and result["rule"].startswith("confirmed if")

    too_good = {**grpo, "T=1": [0.60, 0.90]}  # grpo above 85% at T = 1.0 in seed 1: the study is not valid
    result = evaluate(claim, accuracy_table(grpo=too_good, erpo=erpo), {})
    assert result["verdict"] == "invalid" and [g["passed"] for g in result["gates"]] == [False, True]
    flat = {**grpo, "T=1.5": [0.55, 0.65]}  # T = 1.5 only 5 points below T = 1.0
    assert evaluate(claim, accuracy_table(grpo=flat, erpo=erpo), {})["verdict"] == "invalid"


def test_a_ratio_against_a_baseline_that_never_moved_is_undefined_not_a_verdict():
    # The quick study on some CPUs: grpo's responses all truncated, so it never left θ0 and its Query-KL is 0.
    claim = BY_KEY["query_kl.erpo"]
    still = {"Query-KL": [0.0], "T=1": [0.5]}
    result = evaluate(claim, accuracy_table(grpo=still, erpo={"Query-KL": [0.02], "T=1": [0.5]}), {})
    assert result["verdict"] == "undefined" and result["n"] == 0 and result["k"] == 0
    assert result["per_seed"] == [None] and result["undefined_seeds"] == [0] and result["median"] is None
    line = describe(result)
    assert line.startswith("- **undefined**: erpo's final Query-KL is below 1/10 of grpo's.")
    assert "seeds 0: grpo's value is 0 or missing there" in line

    # With one seed undefined and two defined, the two decide and the report names the one left out.
    table = accuracy_table(grpo={"Query-KL": [0.0, 1.0, 2.0]}, erpo={"Query-KL": [0.02, 0.05, 0.1]})
    result = evaluate(claim, table, {})
    assert (result["k"], result["n"], result["verdict"], result["undefined_seeds"]) == (2, 2, "holds", [0])
    assert "Left out as not a number: seeds 0 (grpo's value is 0" in describe(result)
    # A study where every seed is defined keeps its claims file's shape (no `undefined_seeds`).
    assert "undefined_seeds" not in evaluate(
        claim, accuracy_table(grpo={"Query-KL": [1.0]}, erpo={"Query-KL": [0.05]}), {}
    )


def test_the_gap_claim_is_untestable_unless_the_baseline_overfits_in_every_seed():
    grpo = {"T=1": [0.60, 0.70], "T=1.5": [0.40, 0.50], "gap": [0.08, 0.06]}
    erpo = {"T=1": [0.60, 0.70], "T=1.5": [0.45, 0.56], "gap": [0.02, 0.01]}
    claim = BY_KEY["gap.erpo"]
    result = evaluate(claim, accuracy_table(grpo=grpo, erpo=erpo), {})
    assert result["per_seed"] == pytest.approx([-6.0, -5.0]) and result["verdict"] == "confirmed"  # side `below`
    assert result["gates"][-1]["per_seed"] == pytest.approx([8.0, 6.0])
    shallow = {**grpo, "gap": [0.08, 0.02]}  # grpo's gap only 2 points in seed 1
    result = evaluate(claim, accuracy_table(grpo=shallow, erpo=erpo), {})
    assert result["verdict"] == "untestable" and result["gates"][-1]["passed"] is False
    assert confirm({"verdict": "untestable"}, {"k": 2, "n": 2}) == "not checked"
    assert confirm({"verdict": "confirmed"}, {"k": 2, "n": 3}) == "held"
    assert confirm({"verdict": "refuted"}, {"k": 2, "n": 3}) == "not held"


def test_claims_pair_seeds_by_number_when_a_third_seed_ran_for_some_arms_only():
    claim = Claim("acc", "erpo above grpo", "T=1.5", "erpo", "grpo", "difference", "above", 0.0, MeanMargin())
    table = {
        "grpo": {"seed": [0, 1], "T=1.5": [0.40, 0.50]},
        "erpo": {"seed": [0, 1, 2], "T=1.5": [0.45, 0.49, 0.90]},
    }
    result = evaluate(claim, table, {})
    assert result["per_seed"] == pytest.approx([5.0, -1.0]) and result["n"] == 2 and result["seeds_split"]
    table["grpo"] = {"seed": [0, 1, 2], "T=1.5": [0.40, 0.50, 0.80]}
    assert evaluate(claim, table, {})["per_seed"] == pytest.approx([5.0, -1.0, 10.0])


def test_the_report_names_a_baseline_whose_k3_query_kl_sits_at_the_clamp():
    table = {"grpo": {"Query-KL": np.array([10.0, 3.0])}, "erpo": {"Query-KL": np.array([0.9, 0.4])},
             "reinforce": {"Query-KL": np.array([12.0])}}  # fmt: skip
    kinds = {"grpo": "sequence_k3", "erpo": "sequence_k3", "reinforce": "sequence_k1"}
    note = clamp_note(table, kinds, clamp=10.0)
    assert "`grpo`" in note and "lower bound" in note
    assert "erpo" not in note and "reinforce" not in note  # below the clamp; k1 has no clamp
    assert clamp_note({"grpo": {"Query-KL": np.array([9.0])}}, {"grpo": "token_k3"}, clamp=10.0) == ""


def test_the_report_shows_the_pilot_from_its_file_or_points_to_the_plan(tmp_path):
    assert "studies/real_model/plan.md" in pilot_section(tmp_path) and "|" not in pilot_section(tmp_path)
    pilot = json.loads((REPO / "studies/real_model" / PILOT_FILE).read_text())
    shutil.copy(REPO / "studies/real_model" / PILOT_FILE, tmp_path / PILOT_FILE)
    text = pilot_section(tmp_path)
    for name, family in pilot["step1_and_2"]["families"].items():  # one row per candidate, its numbers to 0.1
        assert f"| `{name}` | {family['base_avg4_t0.6']:.1f} | {family['grpo_reward_last4']:.1f} |" in text
    confirm_rows = [line for line in text.splitlines() if line.endswith((" | no |", " | yes |"))]
    assert len(confirm_rows) == len(pilot["confirm"])


def test_real_model_study_definition():
    REAL_MODEL.check()
    assert list(REAL_MODEL.arms) == ["grpo", "erpo", "erpo_released", "erpo_released_matched"]
    assert REAL_MODEL.arms["erpo_released_matched"] == [
        "--model.algorithm", "erpo_released", "--model.query_kl_coef", "0", "--model.use_query_weights", "false",
    ]  # fmt: skip
    full = REAL_MODEL.full
    assert (full.seeds, full.temperatures, full.eval_k) == ((0, 1, 2), (0.6, 1.0, 1.5), 4)  # the plan's three seeds
    assert full.eval_problems >= 100 and full.train_sample_size == ALL_QUERIES
    assert REAL_MODEL.jobs == 1 and REAL_MODEL.base_config == "configs/study_smollm2.yaml"
    assert len({claim.key for claim in CLAIMS}) == len(CLAIMS)
    assert all(gate.fails_as == "invalid" for gate in BY_KEY["accuracy.erpo_high_t"].gates)


def test_a_run_command_carries_arm_seed_model_and_the_final_sweep():
    settings = StudySettings(steps=7, seeds=(1,), temperatures=(0.6, 1.5), eval_problems=100, eval_k=4,
                             train_sample_size=ALL_QUERIES)  # fmt: skip
    base = {"temperatures": [1.0], "seed": 3, "max_new_tokens": 16, "max_problems": 50,
            "benchmarks": [{"source": {"path": "test.jsonl", "label": "held_out"}, "k": 8}]}  # fmt: skip
    sweep = callback_config(base, settings, run_at_start=True)["trainer"]["callbacks"][0]["init_args"]
    assert sweep["run_at_start"] and sweep["every_n_steps"] == 8 and sweep["train_sample_size"] == ALL_QUERIES
    assert sweep["sweep"] == {"temperatures": [0.6, 1.5], "seed": 3, "max_new_tokens": 16, "benchmarks": [
        {"source": {"path": "test.jsonl", "label": "held_out", "limit": 100}, "k": 4}]}  # fmt: skip
    command = fit_command(REAL_MODEL, "erpo_released_matched", 1, Path("runs/x"), settings, "/models/smollm2", [])
    assert command[command.index("--config") + 1] == "configs/study_smollm2.yaml"
    assert command[command.index("--model.model_path") + 1] == "/models/smollm2"
    assert "--model.use_query_weights" in command and command[command.index("--data.seed") + 1] == "1"
    assert command[command.index("--trainer.max_steps") + 1] == "7"


FAKE_ERPO = """import sys
from pathlib import Path

args = sys.argv[1:]
root = Path(args[args.index("--trainer.default_root_dir") + 1])
log_dir = root / "erpo" / f"version_{len(list(root.glob('erpo/version_*')))}"
log_dir.mkdir(parents=True)
(log_dir / "sweep_summary.json").write_text("{}")
print("trained")
"""


def test_finished_runs_are_skipped_and_an_unfinished_or_changed_one_is_trained_again(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "erpo"
    fake.write_text(f"#!{sys.executable}\n{FAKE_ERPO}")
    fake.chmod(0o755)
    monkeypatch.setattr(study_runs, "ERPO", str(fake))
    settings = StudySettings(steps=2, seeds=(0,))
    base = {"benchmarks": [{"source": {"path": "test.jsonl", "label": "held_out"}, "k": 4}]}
    out, run_dir = Path("runs/study"), tmp_path / "runs/study/grpo/seed0"

    def train(settings: StudySettings = settings, first: bool = True) -> None:
        train_one(REAL_MODEL, "grpo", 0, tmp_path, out, settings, base, None, [], first, 1)

    train()
    assert (run_dir / "erpo/version_0/sweep_summary.json").is_file() and "trained" in (run_dir / "fit.log").read_text()
    timing = json.loads((run_dir / "timing.json").read_text())
    assert timing["started"] < timing["ended"] and 0 < timing["seconds"] < 60
    assert timing["commit"] == "unknown (not a git checkout)"  # tmp_path is no checkout
    for path in run_dir.rglob("*"):  # a git clone sets every file's time: the record's seconds do not move
        os.utime(path, (0, 0))
    assert run_record("grpo", 0, run_dir).seconds == timing["seconds"]
    capsys.readouterr()
    train(first=False)  # finished with the same command (first of the study or not): skipped
    assert "finished before, skipped" in capsys.readouterr().out and not (run_dir / "erpo/version_1").exists()
    train(StudySettings(steps=3, seeds=(0,)))  # another command: cleared and trained again
    assert [p.name for p in (run_dir / "erpo").iterdir()] == ["version_0"]
    (run_dir / "erpo/version_0/sweep_summary.json").unlink()  # killed before its final sweep
    (run_dir / "stale").write_text("")
    train(StudySettings(steps=3, seeds=(0,)))
    assert not (run_dir / "stale").exists() and (run_dir / "erpo/version_0/sweep_summary.json").is_file()
