"""The good-lr core study as the engine runs it: its `Study` (the arms, settings and claims of
studies/good_lr/study.py, bound to the report of studies/good_lr/report.py) and its command, `python -m
studies.good_lr`."""

from __future__ import annotations

from pathlib import Path

from studies.engine.definition import Study
from studies.engine.run import main_after_pilot
from studies.good_lr import study
from studies.good_lr.report import good_lr_report
from studies.toy.study import shipped_model


def core_study(steps: int, out: Path = Path("studies/good_lr/runs")) -> Study:
    """The core study with runs of `steps` steps, its runs under `out`."""
    return Study(
        name="good-lr-study",
        module="studies.good_lr",
        base_config=study.BASE_CONFIG,
        arms=study.CORE_ARMS,
        default_arms=tuple(study.CORE_ARMS),
        full=study.settings(steps, study.CORE_SEEDS),
        quick=study.QUICK,
        claims=study.CORE_CLAIMS,
        out=out,
        quick_out=Path("runs/good_lr_quick"),
        report=Path("studies/good_lr/good_lr_study.md"),
        model_identity=shipped_model,
        write_report=good_lr_report,  # written once the runs have finished, before any verdict is read
        fit_flags=study.regime_flags(),
        derived_arms=(study.QUERY_KL_SIGNAL, study.SIMPLER_SIGNAL),
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m studies.good_lr`: refused (but for --quick and --help) until the pilot has set STEPS."""
    main_after_pilot(
        core_study(study.STEPS or study.PILOT_LENGTHS[0]),
        study.STEPS is not None,
        "the good-lr study's run length is not set: run `python -m studies.good_lr.pilot` first and commit its "
        "result (good_lr_plan.md, 'Pilot'); until then only --quick runs",
        argv,
    )
