"""The long-horizon study as the engine runs it: its `Study` in a regime (the arms, settings and claims of
studies/long_horizon/study.py, bound to the report of studies/long_horizon/report.py) and its command, `python -m
studies.long_horizon`."""

from __future__ import annotations

from pathlib import Path

from studies.engine.definition import ReportInputs, Study, StudySettings
from studies.engine.report import RunRecord
from studies.engine.run import main_after_pilot
from studies.long_horizon import study
from studies.long_horizon.report import long_horizon_report
from studies.long_horizon.report import long_horizon_table as table
from studies.toy.study import shipped_model


def write_long_horizon_report(inputs: ReportInputs) -> list[dict]:
    """The long-horizon study's report (studies.long_horizon.report) on its claims."""
    return long_horizon_report(inputs, study.CLAIMS, (study.REGIME or study.PILOT_REGIMES[0]).describe())


def long_horizon_table(records: list[RunRecord], settings: StudySettings) -> dict:
    """The per-seed table the claims read (studies.long_horizon.report.long_horizon_table), for the compare command."""
    return table(records, settings)


def long_horizon_study(regime: study.Regime, out: Path) -> Study:
    """The study in `regime`, its runs under `out` (each pilot regime has its own)."""
    return Study(
        name="long-horizon-study",
        module="studies.long_horizon",
        base_config=study.BASE_CONFIG,
        arms=study.arms(regime),
        default_arms=tuple(study.arms(regime)),
        full=study.FULL,
        quick=study.QUICK,
        claims=study.CLAIMS,
        out=out,
        quick_out=Path("runs/long_horizon_quick"),
        report=Path("studies/long_horizon/long_horizon_study.md"),
        model_identity=shipped_model,
        write_report=write_long_horizon_report,
        fit_flags=regime.flags(),
        table=long_horizon_table,
    )


LONG_HORIZON = long_horizon_study(study.REGIME or study.PILOT_REGIMES[0], Path("studies/long_horizon/runs"))


def main(argv: list[str] | None = None) -> None:
    """`python -m studies.long_horizon`: refused (but for --quick and --help) until the pilot has chosen REGIME."""
    main_after_pilot(
        LONG_HORIZON,
        study.REGIME is not None,
        "no long-horizon regime is chosen: run `python -m studies.long_horizon.pilot` first; the main runs start "
        "only if a regime passes its gate (long_horizon_plan.md, 'Pilot')",
        argv,
    )
