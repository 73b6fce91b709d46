"""The overfitting study's pilot (issue 39, item 1): does GRPO memorise in the regime, in every pilot seed?

Its rule was committed before it ran (studies/overfit/overfit_plan.md, "Pilot"): for each regime of PILOT_REGIMES in
order, grpo runs with the pilot seeds (PILOT_SEEDS, which no main run uses) and the study's final sweep; the regime
passes when, in every pilot seed, the held-out Avg@4 at T = 1.0 is at least GATE_DROP points below the base model's and
the train–eval gap at T = 1.0 (Avg@4 on every training query minus held-out Avg@4) is at least GATE_GAP points. The
first regime that passes is the study's; when none does, the study stops there. No other arm runs in the pilot.

    .venv/bin/python -m studies.overfit.pilot           # runs under studies/overfit/pilot_runs/<regime>, pilot.json

A regime's runs are the study engine's (studies/engine/run.py): finished ones are skipped on a rerun.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from studies.engine.definition import ReportInputs
from studies.engine.report import base_sweep, benchmark_label
from studies.engine.run import REPO
from studies.engine.run import main as run_study_main
from studies.overfit.study import ARMS, PILOT_REGIMES, Regime, overfit_study

PILOT_SEEDS = (100, 101)
GATE_DROP = 5.0  # points the held-out Avg@4 at T = 1.0 must fall below the base model's
GATE_GAP = 20.0  # points of train–eval gap at T = 1.0
OUT = Path("studies/overfit/pilot_runs")


def gate(inputs: ReportInputs) -> dict:
    """The pilot's gate on one regime's finished grpo runs: per seed, the held-out and training Avg@4 at T = 1.0,
    the drop below the base model and the gap (points), and whether every seed passes."""
    benchmark = benchmark_label(inputs.records)
    held_out, train = f"val/avg@k/{benchmark}/T=1", "val/avg@k/train/T=1"
    base = base_sweep(inputs.records)
    base_held_out = 100 * base[held_out]
    seeds = {}
    for record in inputs.records:
        after = record.sweep()["after"]
        accuracy, train_accuracy = 100 * after[held_out], 100 * after[train]
        drop, gap = base_held_out - accuracy, train_accuracy - accuracy
        seeds[record.seed] = {"held_out_t1": accuracy, "train_t1": train_accuracy, "drop_below_base": drop,
                              "gap": gap, "passes": drop >= GATE_DROP and gap >= GATE_GAP}  # fmt: skip
    passes = len(seeds) == len(PILOT_SEEDS) and all(seed["passes"] for seed in seeds.values())
    return {"base_held_out_t1": base_held_out, "base_train_t1": 100 * base[train], "seeds": seeds, "passes": passes}


def run_regime(regime: Regime, out: Path) -> dict:
    """Train (or skip, when finished) the regime's grpo pilot runs and return its gate."""
    result: dict = {}

    def write_gate(inputs: ReportInputs) -> list[dict]:
        result.update(gate(inputs))
        inputs.path.write_text(json.dumps({"regime": regime.__dict__, **result}, indent=1) + "\n")
        return []

    study = replace(overfit_study(regime, out / regime.name), arms={"grpo": ARMS["grpo"]}, default_arms=("grpo",),
                    write_report=write_gate, report=out / regime.name / "gate.json")  # fmt: skip
    run_study_main(study, ["--seeds", *map(str, PILOT_SEEDS)])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="pilot run directory under the repository root")
    args = parser.parse_args(argv)
    record: dict = {"rule": {"seeds": PILOT_SEEDS, "drop": GATE_DROP, "gap": GATE_GAP}, "regimes": {}, "chosen": None}
    for regime in PILOT_REGIMES:
        result = record["regimes"][regime.name] = run_regime(regime, args.out)
        print(f"{regime.name}: {'passes' if result['passes'] else 'fails'} the gate", flush=True)
        if result["passes"]:
            record["chosen"] = regime.name
            break
    (REPO / args.out / "pilot.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
