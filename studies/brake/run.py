"""The brake study as the engine runs it: its `Study` (the arms, settings and claims of studies/brake/study.py, bound
to the report of studies/brake/report.py) and its command, `python -m studies.brake`."""

from __future__ import annotations

from pathlib import Path

from studies.brake import study
from studies.brake.report import brake_report, brake_table
from studies.engine.definition import ReportInputs, Study, StudySettings
from studies.engine.report import RunRecord
from studies.engine.run import main_after_pilot
from studies.toy.study import shipped_model


def write_brake_report(inputs: ReportInputs) -> list[dict]:
    """The brake study's report (studies.brake.report) on its claims."""
    return brake_report(inputs, study.CLAIMS, study.SETTINGS)


def brake_claims_table(records: list[RunRecord], settings: StudySettings) -> dict:
    """The per-seed table the claims read (studies.brake.report.brake_table), for the compare command."""
    return brake_table(records, settings, study.SETTINGS)[0]


BRAKE = Study(
    name="brake-study",
    module="studies.brake",
    base_config=study.BASE_CONFIG,
    arms=study.ARMS,
    default_arms=tuple(study.ARMS),  # a report reads every arm; the plan's commands name the arms and seeds they run
    full=study.FULL,
    quick=study.QUICK,
    claims=study.CLAIMS,
    out=Path("studies/brake/runs"),
    quick_out=Path("runs/brake_study_quick"),
    report=Path("studies/brake/brake_study.md"),
    model_identity=shipped_model,
    write_report=write_brake_report,
    fit_flags=study.regime_flags(),
    derived_arms=study.DERIVED_ARMS,
    table=brake_claims_table,
)


def main(argv: list[str] | None = None) -> None:
    """`python -m studies.brake`: refused (but for --quick and --help) until the pilot has fixed MATCHED."""
    main_after_pilot(
        BRAKE,
        study.MATCHED is not None,
        "the brake study's matched controls are not fixed yet: run `python -m studies.brake.pilot` "
        "and write its choices into MATCHED (brake_plan.md, 'Pilot result') before any main run",
        argv,
    )
