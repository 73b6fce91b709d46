"""The real-model, overfitting, brake and long-horizon studies' reports, rebuilt with `--report-only` from their
committed runs: the claims file equals the committed one and the report the committed report, but for the command
that wrote it (issue 53: the toy study is the one study `make test` trains end to end, tests/studies/test_toy_study.py;
these four are checked on the runs they were written from, with their definitions checked in test_study_engine.py,
test_overfit_study.py, test_brake_study.py and test_long_horizon_study.py)."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.quickstart import copy_quickstart_inputs
from helpers.recomputed import assert_recomputes, assert_same_report, same_up_to_printed_rounding

from studies.brake import run as brake
from studies.engine.claims import BASE_ARM
from studies.engine.compare import main as compare_main
from studies.long_horizon import run as long_horizon
from studies.overfit import study as overfit
from studies.real_model import study as real_model

REPO = Path(__file__).resolve().parents[2]

# study module -> (its folder, its report's file name, the files beside the report that the report reads, its figures)
STUDIES = {
    "real_model": (
        real_model, "studies/real_model", "real_model_study", ["real_model_pilot.json"], ["curves", "evaluation"]
    ),
    "overfit": (overfit, "studies/overfit", "overfit_study", ["pilot_runs"], ["curves", "evaluation"]),
    "brake": (brake, "studies/brake", "brake_study", ["pilot_runs"], ["trajectories"]),
    "long_horizon": (long_horizon, "studies/long_horizon", "long_horizon_study", ["pilot_runs"], ["trajectories"]),
}  # fmt: skip


def rebuilt(name: str, workdir: Path) -> tuple[Path, Path]:
    """Copy study `name`'s committed runs (with the pilot files its report quotes, and the quickstart's inputs) under
    `workdir` and rewrite its report there with `--report-only`, in this process; (the rebuilt report's folder, the
    committed one's)."""
    module, folder, _, beside, _ = STUDIES[name]
    committed, copy = REPO / folder, workdir / folder
    copy_quickstart_inputs(workdir)  # the configs and the shipped toy model, which the overfitting study names
    shutil.copytree(committed / "runs", copy / "runs")
    for entry in beside:
        source = committed / entry
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy / entry)
    module.main(["--report-only", "--workdir", str(workdir)])
    return copy, committed


def without_command(report: str) -> list[str]:
    """The report's lines but the one quoting the command that wrote it (it names the work directory)."""
    return [line for line in report.splitlines() if "--report-only" not in line]


@pytest.mark.parametrize("name", list(STUDIES))
def test_report_only_rewrites_the_committed_claims_and_report(name, tmp_path, capsys):
    copy, committed = rebuilt(name, tmp_path)
    assert "report rewritten from" in capsys.readouterr().out
    report = STUDIES[name][2]
    claims = json.loads((copy / f"{report}_claims.json").read_text())
    assert_recomputes(claims["claims"], json.loads((committed / f"{report}_claims.json").read_text())["claims"])
    assert_same_report(without_command((copy / f"{report}.md").read_text()),
                       without_command((committed / f"{report}.md").read_text()))  # fmt: skip
    for figure in STUDIES[name][4]:
        assert (copy / f"{report}_{figure}.png").stat().st_size > 10_000


def test_the_rebuilt_reports_name_every_arm_of_their_study(tmp_path):
    copy, _ = rebuilt("overfit", tmp_path)
    report = (copy / "overfit_study.md").read_text()
    assert all(f"| {arm} |" in report for arm in overfit.ARMS) and f"| {BASE_ARM} |" in report


def test_the_real_model_report_has_every_section_and_compares_with_its_own_claims(tmp_path, capsys):
    copy, committed = rebuilt("real_model", tmp_path)
    report = (copy / "real_model_study.md").read_text()
    for section in ("## Held-out accuracy", "## Training-query accuracy", "## Final training metrics", "## Per run"):
        assert section in report
    for arm in real_model.REAL_MODEL.arms:
        assert report.count(f"\n| {arm} | ") >= 5, arm  # held-out, training, gap, final metrics, per run
    claims = json.loads((copy / "real_model_study_claims.json").read_text())
    assert claims["study"] == json.loads((copy / "runs" / "study.json").read_text())
    assert [c["key"] for c in claims["claims"]] == [c.key for c in real_model.CLAIMS]
    capsys.readouterr()
    with pytest.raises(SystemExit) as compared:
        compare_main(
            real_model.REAL_MODEL, [str(copy / "runs"), "--shipped", str(committed / "real_model_study_claims.json")]
        )
    out = capsys.readouterr().out
    assert "model: the rerun's is the same as the study's" in out and " 0 not held" in out, out
    checked = [line for line in out.splitlines() if " | study: " in line]
    assert len(checked) == len(real_model.CLAIMS) and all(
        same_up_to_printed_rounding(line.split(" | rerun: ")[1], line.split(" | study: ")[1].split(" | rerun: ")[0])
        for line in checked
    ), out  # every claim recomputes to the study's own verdict and values
    assert compared.value.code == 1  # none of its claims is firm enough to count as held (the command says so)


def test_the_comparison_forgives_a_last_bit_and_nothing_more():
    """The issue-67 case passes (0.1955186551112235 against 0.19551865511122346); a verdict, a key, a float off by
    1e-9 and a printed number off by two units in its last digit do not."""
    committed = {"values": {"0.003": 0.19551865511122346, "n": 16}, "verdict": "refuted"}
    assert_recomputes({"values": {"0.003": 0.1955186551112235, "n": 16}, "verdict": "refuted"}, committed)
    for wrong in ({"values": {"0.003": 0.1955186551112235 + 1e-9, "n": 16}, "verdict": "refuted"},
                  {"values": {"0.003": 0.1955186551112235, "n": 16}, "verdict": "confounded"},
                  {"values": {"0.003": 0.1955186551112235, "m": 16}, "verdict": "refuted"}):  # fmt: skip
        with pytest.raises(AssertionError):
            assert_recomputes(wrong, committed)
    assert same_up_to_printed_rounding("mean 12.35, seeds 500-507", "mean 12.34, seeds 500-507")
    assert not same_up_to_printed_rounding("mean 12.36, seeds 500-507", "mean 12.34, seeds 500-507")
    assert not same_up_to_printed_rounding("**refuted** 12.34", "**confounded** 12.34")
