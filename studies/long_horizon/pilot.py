"""The long-horizon study's pilot (issue 51, item 1): does GRPO learn and then fall from its best, in both seeds?

Its gate was committed before it ran (studies/long_horizon/long_horizon_plan.md, "Pilot"). For each regime of
PILOT_REGIMES in order, grpo runs 1,000 steps with seeds PILOT_SEEDS (no main run uses them), a sweep every 50 steps
(the first run also sweeps the base model at step 0). A seed passes when
- it learns: Avg@4 at T = 1.0 on the fixed sample of training queries at the last sweep is at least GATE_LEARN points
  above the base model's, and
- it falls from its best: at T = 1.0 or at T = 1.5, the mean of its last three held-out sweeps is at least GATE_DROP
  points below its highest mean of three consecutive sweeps over steps 50–850.
The first regime whose seeds both pass is the study's; when none passes, `long_horizon_study_claims.json` records
the gate and the verdict `untestable`, and no ERPO arm runs.

    .venv/bin/python -m studies.long_horizon.pilot   # runs under studies/long_horizon/pilot_runs/<regime>
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from studies.engine.definition import ReportInputs
from studies.engine.report import base_sweep, benchmark_label
from studies.engine.run import REPO
from studies.engine.run import main as run_study_main
from studies.engine.trajectory import last_mean, peak, sweeps
from studies.long_horizon.run import long_horizon_study
from studies.long_horizon.study import PEAK_RANGE, PILOT_REGIMES, WINDOW, Regime, arms

PILOT_SEEDS = (400, 401)
GATE_LEARN = 10.0  # points the training queries must end above the base model
GATE_DROP = 3.0  # points held-out accuracy must fall from its best three-sweep mean
# Avg@4 values are multiples of 1/800 or so: a difference that lands on a bound must not fall below it by rounding.
ROUNDING = 1e-9
OUT = Path("studies/long_horizon/pilot_runs")
CLAIMS = Path("studies/long_horizon/long_horizon_study_claims.json")
UNTESTABLE = ("GRPO does not degrade after learning over 1,000 steps on the toy task in any regime the pilot tried; "
              "the long-horizon claim is untestable here")  # fmt: skip


def seed_gate(held_out: dict[str, pd.Series], train_end: float, base_train: float) -> dict:
    """One pilot seed's gate.

    Args:
        held_out: temperature column (`T=1`, `T=1.5`) -> held-out Avg@4 in [0, 1] by sweep step.
        train_end: training-query Avg@4 at T = 1.0 at the last sweep, in [0, 1].
        base_train: the base model's, in [0, 1].
    Returns:
        the gain on the training queries and, per temperature, the best three-sweep mean over PEAK_RANGE, the last
        three sweeps' mean and the drop between them (points), and whether the seed passes.
    """
    gain = 100 * (train_end - base_train)
    best, last, drop = {}, {}, {}
    for temperature, series in held_out.items():
        best[temperature] = 100 * peak(series, WINDOW, *PEAK_RANGE)[1]
        last[temperature] = 100 * last_mean(series, WINDOW)
        drop[temperature] = best[temperature] - last[temperature]
    falls = any(math.isfinite(d) and d >= GATE_DROP - ROUNDING for d in drop.values())
    learns = gain >= GATE_LEARN - ROUNDING
    return {"train_gain": gain, "best": best, "last": last, "drop": drop, "passes": bool(learns and falls)}


def regime_gate(per_seed: dict[int, dict]) -> bool:
    """Whether every pilot seed ran and passes."""
    return set(per_seed) == set(PILOT_SEEDS) and all(seed["passes"] for seed in per_seed.values())


def gate(inputs: ReportInputs) -> dict:
    """The gate on one regime's finished grpo runs (seed_gate per seed, regime_gate)."""
    benchmark = benchmark_label(inputs.records)
    base_train = base_sweep(inputs.records)["val/avg@k/train/T=1"]
    seeds = {}
    for record in inputs.records:
        frame = sweeps(record)
        held_out = {t: frame[f"val/avg@k/{benchmark}/{t}"] for t in ("T=1", "T=1.5")}
        seeds[record.seed] = seed_gate(held_out, float(frame["val/avg@k/train/T=1"].iloc[-1]), base_train)
    return {"base_train_t1": 100 * base_train, "seeds": seeds, "passes": regime_gate(seeds)}


def run_regime(regime: Regime, out: Path) -> dict:
    """Train (or skip, when finished) one regime's grpo pilot runs and return its gate."""
    result: dict = {}

    def write_gate(inputs: ReportInputs) -> list[dict]:
        result.update(gate(inputs))
        inputs.path.write_text(json.dumps({"regime": regime.__dict__, **result}, indent=1) + "\n")
        return []

    study = replace(long_horizon_study(regime, out / regime.name), arms={"grpo": arms(regime)["grpo"]},
                    default_arms=("grpo",), claims=(), write_report=write_gate,
                    report=out / regime.name / "gate.json")  # fmt: skip
    run_study_main(study, ["--seeds", *map(str, PILOT_SEEDS)])
    return result


def write_untestable(record: dict, path: Path) -> None:
    """The claims file of a study whose pilot passed in no regime: the gate's values and the verdict."""
    path.write_text(json.dumps({"study": {"pilot": record}, "verdict": "untestable", "text": UNTESTABLE,
                                "claims": []}, indent=1) + "\n")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="pilot run directory under the repository root")
    args = parser.parse_args(argv)
    rule = {"seeds": PILOT_SEEDS, "learn": GATE_LEARN, "drop": GATE_DROP, "window": WINDOW, "peak_range": PEAK_RANGE}
    record: dict = {"rule": rule, "regimes": {}, "chosen": None}
    for regime in PILOT_REGIMES:
        result = record["regimes"][regime.name] = run_regime(regime, args.out)
        print(f"{regime.name}: {'passes' if result['passes'] else 'fails'} the gate", flush=True)
        if result["passes"]:
            record["chosen"] = regime.name
            break
    (REPO / args.out / "pilot.json").write_text(json.dumps(record, indent=1) + "\n")
    if record["chosen"] is None:
        write_untestable(record, REPO / CLAIMS)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
