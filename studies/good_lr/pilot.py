"""The good-lr study's pilot (issue 68): how long must the runs be for grpo at 7e-5 to have passed its best?

Its rule was committed before it ran (studies/good_lr/good_lr_plan.md, "Pilot"). grpo and erpo at 7e-5 run
PILOT_STEPS steps with seeds PILOT_SEEDS (no main run uses them), swept as the core runs are. The learning rate is
constant after warm-up and the data order depends only on the seed, so the first H steps of these runs are the H-step
run: for each H of PILOT_LENGTHS, shortest first, grpo's drawdown at H is its best three-sweep mean of test-set Avg@4
at T = 1.0 over the sweeps from step 20 to H - 60, minus the mean of its last three sweeps up to H. STEPS is the
smallest H whose drawdown is at least GATE_DRAWDOWN points in both seeds; if none is, the longest. erpo's runs are
read only for their time.

    .venv/bin/python -m studies.good_lr.pilot   # runs under studies/good_lr/pilot_runs, writes pilot.json there
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from studies.engine.definition import ReportInputs
from studies.engine.report import benchmark_label
from studies.engine.run import REPO
from studies.engine.run import main as run_study_main
from studies.engine.trajectory import sweeps
from studies.good_lr.measures import FIRST_SWEEP, drawdown
from studies.good_lr.run import core_study
from studies.good_lr.study import PILOT_LENGTHS, WINDOW, compact_completions, settings

PILOT_SEEDS = (800, 801)
PILOT_STEPS = max(PILOT_LENGTHS)
GATE_DRAWDOWN = 2.0  # points below its best three-sweep mean that grpo must end, in both seeds
# Avg@4 values are multiples of 1/800: a drawdown that lands on the bound must not fall below it by rounding.
ROUNDING = 1e-9
OUT = Path("studies/good_lr/pilot_runs")


def choose_steps(drawdowns: dict[int, dict[int, float]]) -> int:
    """The smallest length whose drawdown is at least GATE_DRAWDOWN in every pilot seed, else the longest.

    Args:
        drawdowns: seed -> length -> grpo's drawdown there (points).
    """
    for length in PILOT_LENGTHS:
        if set(drawdowns) == set(PILOT_SEEDS) and all(
            by_length[length] >= GATE_DRAWDOWN - ROUNDING for by_length in drawdowns.values()
        ):
            return length
    return PILOT_LENGTHS[-1]


def decide(inputs: ReportInputs) -> dict:
    """The pilot's record: grpo's drawdown per seed and length, every run's minutes, and the chosen STEPS."""
    benchmark = benchmark_label(inputs.records)
    values: dict[int, dict[int, float]] = {}
    minutes = {}
    for record in inputs.records:
        minutes[f"{record.method} seed {record.seed}"] = record.seconds / 60
        compact_completions(record.log_dir, benchmark)
        if record.method == "grpo":
            series = sweeps(record)[f"val/avg@k/{benchmark}/T=1"]
            values[record.seed] = {length: drawdown(series, length) for length in PILOT_LENGTHS}
    return {"drawdown": values, "minutes": minutes, "chosen": {"steps": choose_steps(values)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="pilot run directory under the repository root")
    args = parser.parse_args(argv)
    rule = {"seeds": PILOT_SEEDS, "steps": PILOT_STEPS, "lengths": PILOT_LENGTHS, "drawdown": GATE_DRAWDOWN,
            "window": WINDOW, "first_sweep": FIRST_SWEEP}  # fmt: skip
    result: dict = {}

    def write_pilot(inputs: ReportInputs) -> list[dict]:
        result.update(decide(inputs))
        inputs.path.write_text(json.dumps({"rule": rule, **result}, indent=1) + "\n")
        return []

    study = replace(core_study(PILOT_STEPS, args.out), full=settings(PILOT_STEPS, PILOT_SEEDS),
                    write_report=write_pilot, report=args.out / "pilot.json")  # fmt: skip
    run_study_main(study, [])
    print(json.dumps({"rule": rule, **result}, indent=1))
    print(f"pilot written: {REPO / args.out / 'pilot.json'}")


if __name__ == "__main__":
    main()
