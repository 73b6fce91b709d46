"""The toy study: its claims' arithmetic (paired per seed, verdicts, the rerun rule), and a smoke test of
studies/toy/study.py in quick mode whose report, claims file, compare command and rerun are checked on real
runs. The study engine's own tests (rules, gates, the real-model study) are in tests/studies/test_study_engine.py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.quickstart import copy_quickstart_inputs

from erpo_lightning.objectives.algorithms import ALGORITHMS
from erpo_lightning.toy import verify_shipped
from studies.engine.claims import Claim, KOfN, confirm, evaluate
from studies.engine.compare import main as compare_main
from studies.engine.definition import check_arms
from studies.toy.study import CLAIMS, METHODS, TOY
from studies.toy.study import main as toy_main

REPO = Path(__file__).resolve().parents[2]
# Run from the repository root, where `python -m` finds the studies package.
STUDY = [sys.executable, "-m", "studies.toy"]
QUICK_METHODS = ["grpo", "erpo", "erpo_released"]  # two Query-KL estimators, so the common one is exercised
QUICK_ARGS = [
    "--quick", "--methods", *QUICK_METHODS, "--steps", "2", "--eval-problems", "4", "--train-sample-size", "4",
    "--fit-args=--data.batch_size 4 --rollout.group_size 4 --rollout.max_new_tokens 16",
]  # fmt: skip


def test_every_method_is_a_preset_and_every_claim_names_study_methods():
    assert all(flags[flags.index("--model.algorithm") + 1] in ALGORITHMS for flags in METHODS.values())
    check_arms(METHODS)
    TOY.check()
    with pytest.raises(SystemExit, match="'typo'.*'grpp'"):
        check_arms({"typo": ["--model.algorithm", "grpp"]})
    assert {claim.method for claim in CLAIMS} | {claim.baseline for claim in CLAIMS} <= set(METHODS)
    assert len({claim.key for claim in CLAIMS}) == len(CLAIMS)


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [(5, 5, "holds"), (4, 5, "holds"), (3, 5, "mixed"), (2, 5, "mixed"), (1, 5, "fails"), (0, 5, "fails"),
     (3, 3, "holds"), (2, 3, "mixed"), (1, 3, "mixed"), (0, 3, "fails"), (1, 1, "holds"), (0, 1, "fails"),
     (0, 0, "n/a")],
)  # fmt: skip
def test_verdict_thresholds(k, n, expected):
    # holds: k >= ceil(0.8 n); fails: k <= floor(0.2 n); by hand for n = 5: 4, 1; n = 3: 3, 0; n = 1: 1, 0.
    margins = np.array([1.0] * k + [-1.0] * (n - k))  # k seeds on the claimed side of the bound
    assert KOfN().verdict(margins) == expected


def test_claims_are_paired_within_each_seed():
    seeds = [0, 1, 2, 3, 4]
    table = {
        "erpo": {"seed": seeds, "Query-KL": [0.01, 0.5, 0.02, 0.001, 0.03], "T>1.0": [0.20, 0.18, 0.25, 0.10, 0.30]},
        "grpo": {"seed": seeds, "Query-KL": [1.0, 1.0, 0.1, 2.0, 0.2], "T>1.0": [0.19, 0.18, 0.20, 0.12, 0.25]},
    }
    kl = Claim("kl", "erpo below grpo / 10", "Query-KL", "erpo", "grpo", "ratio", "below", 0.1)
    result = evaluate(kl, table, {"erpo": "sequence_k3", "grpo": "sequence_k3"})
    # ratios seed by seed: 0.01, 0.5, 0.2, 0.0005, 0.15 -> below 0.1 in seeds 0 and 3 only.
    assert result["per_seed"] == pytest.approx([0.01, 0.5, 0.2, 0.0005, 0.15])
    assert (result["k"], result["n"], result["verdict"]) == (2, 5, "mixed")
    assert result["median"] == pytest.approx(0.15) and result["column"] == "Query-KL"
    accuracy = Claim("acc", "erpo above grpo", "T>1.0", "erpo", "grpo", "difference", "above", 0.0)
    result = evaluate(accuracy, table, {})
    # points: +1, 0, +5, -2, +5 -> above 0 (strictly) in 3 of 5.
    assert result["per_seed"] == pytest.approx([1.0, 0.0, 5.0, -2.0, 5.0])
    assert (result["k"], result["verdict"], result["median"]) == (3, "mixed", pytest.approx(1.0))
    assert evaluate(replace_method(kl, "erpo_released"), table, {})["verdict"] == "n/a"  # a method not run


def replace_method(claim: Claim, method: str) -> Claim:
    return Claim(claim.key, claim.text, claim.quantity, method, claim.baseline, claim.paired, claim.side, claim.bound)


def test_query_kl_claims_fall_back_to_the_common_estimator_across_estimators():
    table = {
        "erpo_released": {"seed": [0], "Query-KL": [5.0], "Query-KL (common)": [0.01]},
        "grpo": {"seed": [0], "Query-KL": [1.0], "Query-KL (common)": [0.5]},
    }
    claim = Claim("kl", "released below grpo / 10", "Query-KL", "erpo_released", "grpo", "ratio", "below", 0.1)
    result = evaluate(claim, table, {"erpo_released": "token_k3", "grpo": "sequence_k3"})
    assert result["column"] == "Query-KL (common)" and result["per_seed"] == pytest.approx([0.02])
    assert result["verdict"] == "holds"


def test_a_rerun_confirms_a_firm_claim_in_a_majority_of_its_seeds():
    def shipped(found: str) -> dict:
        return {"verdict": found}

    def rerun(k: int, n: int) -> dict:
        return {"k": k, "n": n}

    assert confirm(shipped("holds"), rerun(2, 3)) == "held"
    assert confirm(shipped("holds"), rerun(1, 2)) == "not held"  # half is not a majority
    assert confirm(shipped("holds"), rerun(0, 1)) == "not held"
    assert confirm(shipped("fails"), rerun(1, 3)) == "held"
    assert confirm(shipped("fails"), rerun(3, 5)) == "not held"
    assert confirm(shipped("mixed"), rerun(5, 5)) == "not checked"
    assert confirm(shipped("holds"), None) == "not checked" == confirm(shipped("holds"), rerun(0, 0))


def set_logged(out: Path, method: str, column: str, value: float) -> None:
    """Overwrite one logged training metric of a method's seed-0 run (every step) in its metrics.csv."""
    [metrics_csv] = (out / method / "seed0").glob("erpo/version_*/metrics.csv")
    frame = pd.read_csv(metrics_csv)
    frame.loc[frame[column].notna(), column] = value
    frame.to_csv(metrics_csv, index=False)


def compared(capsys, *argv: str) -> tuple[int, str]:
    """`python -m studies.toy.compare ARGV` in this process: (its exit status, what it printed)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        compare_main(TOY, list(argv))
    return exited.value.code, capsys.readouterr().out


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory) -> Path:
    """One quick study (3 methods, 1 seed, 2 steps) run by the real script in a copy of the inputs; its run dir."""
    workdir = tmp_path_factory.mktemp("study")
    copy_quickstart_inputs(workdir)
    result = subprocess.run([*STUDY, *QUICK_ARGS, "--workdir", str(workdir)], capture_output=True, text=True, cwd=REPO,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return workdir / "runs" / "toy_study_quick"


@pytest.mark.slow
def test_quick_toy_study_writes_report_figures_and_claims(quick_study):
    out = quick_study
    report = (out / "toy_study.md").read_text()
    for figure in ("toy_study_curves.png", "toy_study_evaluation.png"):
        assert (out / figure).stat().st_size > 10_000 and f"]({figure})" in report
    sections = report.split("\n## ")
    kl_section = next(s for s in sections if s.startswith("Final training"))
    kl_table = [line for line in kl_section.splitlines() if line.startswith("|")]
    accuracy_table = next(s for s in sections if s.startswith("Held-out accuracy")).splitlines()
    for method in QUICK_METHODS:  # one row per method in each table (the accuracy table also has the base row)
        assert sum(line.startswith(f"| {method} |") for line in kl_table) == 1, method
        assert sum(line.startswith(f"| {method} |") for line in accuracy_table) == 1, method
    assert "| base |" in "\n".join(accuracy_table)
    assert not any("n/a" in line for line in kl_table)  # both Query-KLs, Policy-KL and entropy logged for all
    assert any(line.startswith("| erpo | `sequence_k3` |") for line in kl_table)
    assert any(line.startswith("| erpo_released | `token_k3` |") for line in kl_table)

    study = json.loads((out / "study.json").read_text())
    claims = json.loads((out / "toy_study_claims.json").read_text())
    assert claims["study"] == study and list(study["methods"]) == QUICK_METHODS
    assert study["model"]["sha256"] == verify_shipped()["sha256"]
    by_key = {claim["key"]: claim for claim in claims["claims"]}
    assert list(by_key) == [claim.key for claim in CLAIMS]
    ran = [c for c in CLAIMS if {c.method, c.baseline} <= set(QUICK_METHODS)]
    for claim in ran:  # a ratio against an arm that never left θ0 in its 2 steps (CPU-dependent) is undefined
        result = by_key[claim.key]
        expected = ("holds", "fails") if result["n"] == 1 else ("undefined",)
        assert len(result["per_seed"]) == 1 and result["verdict"] in expected, result
    assert all(by_key[c.key]["verdict"] == "n/a" for c in CLAIMS if c not in ran)
    assert by_key["query_kl.erpo_released"]["column"] == "Query-KL (common)"
    assert by_key["query_kl.erpo"]["column"] == "Query-KL"
    assert all(f"): {c.text}." in report or f"**n/a**: {c.text}" in report or f"**undefined**: {c.text}" in report
               for c in CLAIMS)  # fmt: skip


@pytest.mark.slow
def test_compare_confirms_a_study_with_itself_and_flags_a_claim_a_rerun_breaks(quick_study, tmp_path, capsys):
    out = quick_study
    claims = json.loads((out / "toy_study_claims.json").read_text())["claims"]
    checked = sum(claim["verdict"] in ("holds", "fails") for claim in claims)
    code, same = compared(capsys, str(out), "--shipped", str(out / "toy_study_claims.json"))
    assert code == 0, same
    assert "model: the rerun's is the same as the study's" in same
    assert f"{checked} held, 0 not held, {len(CLAIMS) - checked} not checked" in same

    # A study where erpo's Query-KL is 1/1000 of grpo's, and a rerun where it is half of it: that claim is not held.
    study_dir, rerun_dir = tmp_path / "study", tmp_path / "rerun"
    for directory, erpo_kl in ((study_dir, 0.001), (rerun_dir, 0.5)):
        shutil.copytree(out, directory)
        set_logged(directory, "grpo", "train/query_kl", 1.0)
        set_logged(directory, "erpo", "train/query_kl", erpo_kl)
    code, changed = compared(capsys, str(rerun_dir), "--shipped", str(study_dir))
    assert code == 1, changed
    lines = changed.splitlines()
    assert any(line.startswith("not held     query_kl.erpo:") for line in lines), changed
    assert sum(line.startswith("not held") for line in lines) == 1, changed


@pytest.mark.slow
def test_report_only_rewrites_the_same_claims_from_the_runs_and_trains_nothing(quick_study, tmp_path, capsys):
    workdir = quick_study.parents[1]
    claims_file = quick_study / "toy_study_claims.json"
    before = json.loads(claims_file.read_text())["claims"]
    logs = sorted(quick_study.glob("*/seed*/fit.log"))
    mtimes = [log.stat().st_mtime for log in logs]
    claims_file.unlink()
    toy_main(["--quick", "--workdir", str(workdir), "--methods", *QUICK_METHODS, "--report-only"])
    assert f"report rewritten from {len(QUICK_METHODS)} runs" in capsys.readouterr().out
    assert json.loads(claims_file.read_text())["claims"] == before
    assert [log.stat().st_mtime for log in logs] == mtimes  # no run was retrained

    copy_quickstart_inputs(tmp_path)
    with pytest.raises(SystemExit) as empty:
        toy_main(["--quick", "--workdir", str(tmp_path), "--report-only"])
    assert "no toy-study runs under" in str(empty.value.code)


@pytest.mark.slow
def test_a_rerun_skips_finished_runs_and_trains_an_unfinished_one_again(quick_study, tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(quick_study.parents[1], workdir)
    out = workdir / quick_study.relative_to(quick_study.parents[1])
    [summary] = (out / "erpo" / "seed0").glob("erpo/version_*/sweep_summary.json")
    summary.unlink()  # erpo's run was killed before its final sweep
    logs = {method: out / method / "seed0" / "fit.log" for method in QUICK_METHODS}
    mtimes = {method: log.stat().st_mtime for method, log in logs.items()}
    result = subprocess.run([*STUDY, *QUICK_ARGS, "--workdir", str(workdir)], capture_output=True, text=True, cwd=REPO,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert result.stdout.count("finished before, skipped") == 2, result.stdout
    assert [m for m in QUICK_METHODS if logs[m].stat().st_mtime != mtimes[m]] == ["erpo"]
    assert list((out / "erpo" / "seed0").glob("erpo/version_*")) == [summary.parent]  # cleared, then trained again
    assert summary.is_file() and json.loads((out / "toy_study_claims.json").read_text())["claims"]
