"""A study's damaged runs (issue 43 item 11): a file of a finished run that cannot be read (a `metrics.csv` cut short,
a `run.json`, `sweep_summary.json` or `timing.json` that does not parse) is named with its run by the report
(`--report-only` too), and a normal rerun trains that run again instead of crashing.

The runs are copies of the real-model study's committed runs (studies/real_model/runs: real CSVLogger output); the
rerun's `erpo` is a stand-in whose "training" writes one of them, so no model is trained here.

The compare command (issue 54 item 4) reads the overfitting study's committed runs with the table its claims read (the
base model's row, retention), and names a damaged claims file (cut short, empty, a list, a claim without its verdict)
in one line.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from studies.engine import runs as study_runs
from studies.engine.compare import main as compare_main
from studies.engine.definition import StudySettings
from studies.engine.runs import load_runs, train_one
from studies.overfit.study import OVERFIT
from studies.real_model.study import REAL_MODEL

REPO = Path(__file__).resolve().parents[2]

RUNS = REPO / "studies/real_model/runs"
FINISHED_LOG = RUNS / "grpo/seed0/erpo/version_0"  # its final sweep is at step 40
STAND_IN_ERPO = f"""import shutil
import sys
from pathlib import Path

args = sys.argv[1:]
root = Path(args[args.index("--trainer.default_root_dir") + 1])
shutil.copytree({str(FINISHED_LOG)!r}, root / "erpo" / f"version_{{len(list(root.glob('erpo/version_*')))}}")
print("trained")
"""
METRICS, SUMMARY = "erpo/version_0/metrics.csv", "erpo/version_0/sweep_summary.json"


def half(text: str) -> str:
    return text[: len(text) // 2]


def without_last_lines(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[:-3])


# file in the run folder -> how it is damaged -> what the error says of it
DAMAGES = {
    "metrics cut mid-line": (METRICS, half, "cut short (its last line has no line end)"),
    "metrics cut at a line end": (METRICS, without_last_lines, "before the final sweep's step 40)"),
    "metrics emptied": (METRICS, lambda text: "", "cut short (empty)"),
    "sweep summary cut": (SUMMARY, half, "not readable as JSON"),
    "sweep summary emptied": (SUMMARY, lambda text: "", "not readable as JSON"),
    "timing cut": ("timing.json", half, "not readable as JSON"),
}


def damage(run_dir: Path, case: str) -> Path:
    """Damage one file of the run in `run_dir` as DAMAGES[case] says; the damaged file."""
    name, cut, _ = DAMAGES.get(case, ("run.json", half, None))
    path = run_dir / name
    path.write_text(cut(path.read_text()))
    return path


@pytest.mark.parametrize("case", [*DAMAGES, "run.json cut"])
def test_a_rerun_trains_a_damaged_run_again_and_says_why(tmp_path, monkeypatch, capsys, case):
    stand_in = tmp_path / "erpo"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_IN_ERPO}")
    stand_in.chmod(0o755)
    monkeypatch.setattr(study_runs, "ERPO", str(stand_in))
    base = {"benchmarks": [{"source": {"path": "test.jsonl", "label": "held_out"}, "k": 4}]}
    run_dir = tmp_path / "runs/study/grpo/seed0"

    def train() -> str:
        train_one(REAL_MODEL, "grpo", 0, tmp_path, Path("runs/study"), StudySettings(steps=40, seeds=(0,)), base,
                  None, [], False, 1)  # fmt: skip
        return capsys.readouterr().out

    train()
    damaged = damage(run_dir, case)
    line = train()
    why = DAMAGES.get(case, (None, None, "not readable as JSON"))[2]
    assert line.startswith(f"{'grpo':>16} seed 0: damaged, trained again: {damaged}: ") and why in line, line
    assert study_runs.damage(run_dir) is None and "trained" in (run_dir / "fit.log").read_text()
    assert [p.name for p in (run_dir / "erpo").iterdir()] == ["version_0"]
    assert "finished before, skipped" in train()


@pytest.fixture()
def study_out(tmp_path) -> Path:
    """A copy of the real-model study's committed runs."""
    out = tmp_path / "runs"
    shutil.copytree(RUNS, out)
    return out


def test_the_committed_runs_read_whole(study_out):
    assert len(load_runs(study_out, list(REAL_MODEL.arms), REAL_MODEL.name)) == 12


@pytest.mark.parametrize("case", DAMAGES)
def test_the_report_names_a_damaged_run_and_its_file(study_out, case):
    damaged = damage(study_out / "erpo/seed1", case)
    with pytest.raises(SystemExit) as stopped:
        load_runs(study_out, list(REAL_MODEL.arms), REAL_MODEL.name)
    message = str(stopped.value)
    assert message.startswith(f"erpo seed1 is damaged: {damaged}: ") and DAMAGES[case][2] in message, message
    assert message.endswith("a rerun of the study without --report-only trains it again")


def test_report_only_on_a_damaged_run_is_one_line_not_a_traceback(study_out):
    damaged = damage(study_out / "grpo/seed2", "metrics cut mid-line")
    command = [sys.executable, "-m", "studies.real_model", "--report-only",
               "--workdir", str(study_out.parent), "--out", "runs", "--report", "runs/report.md"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"grpo seed2 is damaged: {damaged}: cut short")


# ------------------------------------------------------ issue 54 item 4: the compare command on runs and claims files
def compared(capsys, study, *argv: str) -> tuple[int, str]:
    """`python -m studies.engine.compare <study> ARGV` in this process: (its exit status, what it printed)."""
    with pytest.raises(SystemExit) as stopped:
        compare_main(study, list(argv))
    return stopped.value.code, capsys.readouterr().out


def test_compare_on_the_overfit_study_runs_agrees_with_its_shipped_claims(capsys):
    """The committed runs (read in place: nothing is written) give every claim the shipped result, the retention
    claims included, whose gate reads the base model's row."""
    code, out = compared(capsys, OVERFIT, str(REPO / "studies/overfit/runs"))
    lines = [line for line in out.splitlines() if " | study: " in line]
    assert len(lines) == len(OVERFIT.claims) and any(" retention.erpo: " in line for line in lines), out
    for line in lines:
        study, rerun = line.split(" | study: ")[1].split(" | rerun: ")
        assert study == rerun, line
    assert code == 0 and "0 not held" in out, out


# a claims file's damage -> what the error says of it
CLAIMS_DAMAGES = {
    "cut short": (half, "not readable as a claims file (JSON), cut short or damaged"),
    "emptied": (lambda text: "", "is empty, not a claims file"),
    "a list": (lambda text: json.dumps(json.loads(text)["claims"]), "it holds a JSON list, not an object"),
    "no claims": (lambda text: json.dumps({"study": json.loads(text)["study"]}), "no 'claims' entry"),
    "a claim without its verdict": (
        lambda text: json.dumps({**json.loads(text), "claims": [{"key": "gap.erpo", "k": 1, "n": 2}]}),
        "claim 0 lacks text, verdict, median",
    ),
}


@pytest.mark.parametrize("case", CLAIMS_DAMAGES)
@pytest.mark.parametrize("role", ["rerun", "shipped"])
def test_a_damaged_claims_file_is_one_line_naming_it(tmp_path, capsys, case, role):
    intact = REPO / "studies/overfit/overfit_study_claims.json"
    damaged = tmp_path / "overfit_study_claims.json"
    cut, why = CLAIMS_DAMAGES[case]
    damaged.write_text(cut(intact.read_text()))
    argv = [str(damaged), "--shipped", str(intact)] if role == "rerun" else [str(intact), "--shipped", str(damaged)]
    with pytest.raises(SystemExit) as stopped:
        compare_main(OVERFIT, argv)
    message = str(stopped.value.code)
    assert message.startswith(str(damaged)) and why in message and "\n" not in message, message
