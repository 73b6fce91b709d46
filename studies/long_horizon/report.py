"""The long-horizon study's report: the per-seed table of trajectory quantities, the claims with their gates, the
held-out trajectory per arm and a figure, all from the runs' logs, and `long_horizon_study_claims.json` beside it.

Quantities per run, beyond the engine's final ones (studies.engine.report.collect); accuracies in [0, 1]:
- `T=1 drop`, `T=1.5 drop`: the highest mean of three consecutive sweeps over steps 50–850 minus the mean of the
  last three sweeps (positive: the run fell from its best);
- `T=1 end`, `T=1.5 end`: the mean of the last three sweeps;
- `T=1 area`, `T=1.5 area`: the mean height of the held-out curve over steps 400–1000 (trapezoid rule);
- `train T=1 at 400`: training-query Avg@4 at T = 1.0 at the step-400 sweep (the learning guard's).

Beside them, as the plan requires whatever the verdicts: each run's best window (its first step, mean and drop) and
every arm's held-out and training-query trajectories, mean and spread at every sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from studies.engine.claims import Claim, evaluate_all
from studies.engine.claims import describe as describe_claim
from studies.engine.definition import ReportInputs, StudySettings
from studies.engine.figures import CurvePanel, curve_figure
from studies.engine.report import (
    RunRecord,
    arms_line,
    base_sweep,
    benchmark_label,
    estimators,
    markdown_table,
    mean_std,
    per_seed_table,
    seeds_line,
    write_claims,
)
from studies.engine.trajectory import area_after, by_sweep, last_mean, peak, reward_curve, sweeps, value_at
from studies.long_horizon.study import GUARD_STEP, PEAK_RANGE, WINDOW

PILOT = Path("pilot_runs/pilot.json")  # relative to the report's folder
TRAIN = "train"


def held_out(frame: pd.DataFrame, benchmark: str, temperature: str) -> pd.Series:
    """One held-out accuracy column of a run's trajectory (`T=1`, `T=1.5`), by step."""
    return frame[f"val/avg@k/{benchmark}/{temperature}"]


QUERY_KL = "train/query_kl_token_k3"  # logged for every arm, whatever it optimises
QUERY_KL_TAIL = 50  # logged steps averaged at the end of a run


def query_kl_rows(records: list[RunRecord]) -> list[list[str]]:
    """Per arm, the token-k3 Query-KL (descriptive, no claim): the mean over a run's last QUERY_KL_TAIL logged steps,
    then mean ± std over seeds, beside its largest value in the run (mean over seeds)."""
    by_arm: dict[str, dict[str, list[float]]] = {}
    for record in records:
        values = record.metrics()[QUERY_KL].dropna()
        arm = by_arm.setdefault(record.method, {"end": [], "max": []})
        arm["end"].append(float(values.iloc[-QUERY_KL_TAIL:].mean()))
        arm["max"].append(float(values.max()))
    return [[arm, mean_std(v["end"]), mean_std(v["max"])]
            for arm, v in by_arm.items()]  # fmt: skip


def run_quantities(record: RunRecord, benchmark: str) -> dict[str, float]:
    """The trajectory quantities of one run (module docstring)."""
    frame = sweeps(record)
    values = {}
    for temperature in ("T=1", "T=1.5"):
        series = held_out(frame, benchmark, temperature)
        values[f"{temperature} drop"] = peak(series, WINDOW, *PEAK_RANGE)[1] - last_mean(series, WINDOW)
        values[f"{temperature} end"] = last_mean(series, WINDOW)
        values[f"{temperature} area"] = area_after(series, GUARD_STEP)
    values[f"train T=1 at {GUARD_STEP}"] = value_at(frame[f"val/avg@k/{TRAIN}/T=1"], GUARD_STEP)
    return values


def long_horizon_table(records: list[RunRecord], settings: StudySettings) -> dict:
    """The per-seed table the claims read: the engine's final values, the trajectory quantities, the base row."""
    benchmark = benchmark_label(records)
    return per_seed_table(
        records, settings.temperatures, benchmark, base_sweep(records), lambda record: run_quantities(record, benchmark)
    )


def pilot_section(folder: Path) -> str:
    """The pilot's gate per regime and seed (`pilot_runs/pilot.json` beside the report), or a line saying there is
    none (a quick run's report)."""
    path = folder / PILOT
    if not path.is_file():
        return f"No pilot record beside this report (`{PILOT}`)."
    pilot = json.loads(path.read_text())
    rows = [[f"`{name}`", seed, f"{v['train_gain']:.1f}", f"{v['drop']['T=1']:.1f}", f"{v['drop']['T=1.5']:.1f}",
             "passes" if v["passes"] else "fails"]
            for name, regime in pilot["regimes"].items() for seed, v in regime["seeds"].items()]  # fmt: skip
    table = markdown_table(["regime", "seed", "training gain", "drop T=1", "drop T=1.5", "gate"], rows)
    return f'Chosen regime: `{pilot["chosen"]}` (points; the gate in long_horizon_plan.md, "Pilot").\n\n{table}'


def best_window_rows(records: list[RunRecord], benchmark: str) -> list[list[str]]:
    """Per run: at T = 1.0 and 1.5, the first step of its best window (the highest mean of three consecutive held-out
    sweeps over steps 50-850), that mean and the drop from it to the last three sweeps (points)."""
    order = list(dict.fromkeys(r.method for r in records))
    rows = []
    for record in sorted(records, key=lambda r: (order.index(r.method), r.seed)):
        row, frame = [record.method, str(record.seed)], sweeps(record)
        for temperature in ("T=1", "T=1.5"):
            series = held_out(frame, benchmark, temperature)
            step, best = peak(series, WINDOW, *PEAK_RANGE)
            row += [str(step), f"{100 * best:.1f}", f"{100 * (best - last_mean(series, WINDOW)):.1f}"]
        rows.append(row)
    return rows


QUANTITIES = ("T=1 drop", "T=1.5 drop", "T=1 end", "T=1.5 end", "T=1 area", "T=1.5 area", f"train T=1 at {GUARD_STEP}",
              "train T=1")  # fmt: skip


def long_horizon_report(inputs: ReportInputs, claims: tuple[Claim, ...], regime: str) -> list[dict]:
    """Write the report (markdown), its trajectory figure and `<stem>_claims.json` beside it; the evaluated claims."""
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = benchmark_label(records)
    table = long_horizon_table(records, settings)
    results = evaluate_all(table, estimators(records), claims)
    claims_path = write_claims(path, study, results)
    figure = path.with_name(path.stem + "_trajectories.png")
    curve_figure(records, figure, (
        CurvePanel(lambda r: held_out(sweeps(r), benchmark, "T=1") * 100, "held-out Avg@4 at T = 1.0", "%"),
        CurvePanel(lambda r: held_out(sweeps(r), benchmark, "T=1.5") * 100, "held-out Avg@4 at T = 1.5", "%"),
        CurvePanel(lambda r: sweeps(r)[f"val/avg@k/{TRAIN}/T=1"] * 100, "training queries, T = 1.0", "%"),
        CurvePanel(lambda r: reward_curve(r), "training reward", "10-step running mean"),
    ))  # fmt: skip
    rows = [[arm] + [mean_std(values.get(q, []), scale=100) for q in QUANTITIES] for arm, values in table.items()]
    windows = ["arm", "seed", *(f"{t} {q}" for t in ("T=1", "T=1.5") for q in ("best from", "best", "drop"))]
    text = f"""# The long-horizon study: does GRPO degrade after learning, and ERPO less?

Generated by `studies/long_horizon/report.py`; every number is read from the runs' logs. The plan, with the pilot's
gate and every claim and rule, was committed before the runs: [long_horizon_plan.md](long_horizon_plan.md). Command:

```bash
{inputs.command}
```

Setup: the quickstart's toy model and batches (16 queries × 8 rollouts), {regime}, {settings.steps} steps, seeds
{seeds_line(records)}. A sweep every {settings.sweep_every} steps: Avg@{settings.eval_k} on the first
{settings.eval_problems} held-out problems and on a fixed sample of {settings.train_sample_size} training queries,
at T = {", ".join(f"{t:g}" for t in settings.temperatures)}. Study wall time {inputs.minutes:.1f} min. Arms:
{arms_line(study["methods"])}.

## Pilot

{pilot_section(path.parent)}

## Claims, paired per seed

The verdict rule is the plan's: the 95% t interval of the mean margin against a 2-point minimum effect, on all seeds
and on every subset leaving one seed out. Gates first: `invalid` when grpo did not learn (training queries at least
10 points above the base model, mean over seeds), `untestable` for a degradation claim when grpo did not fall 3
points from its best, `confounded` when the method's training-query accuracy at step {GUARD_STEP} is more than 3
points below its baseline's. Claims file: `{claims_path.name}`.

{chr(10).join(describe_claim(claim) for claim in results)}

## Per arm (points, mean ± std over seeds)

{markdown_table(["arm", *QUANTITIES], rows)}

## Query-KL (token k3, descriptive)

Logged every step for every arm, whatever it optimises; the mean over each run's last {QUERY_KL_TAIL} logged steps and
the run's largest value (mean ± std over seeds).

{markdown_table(["arm", "Query-KL, end", "Query-KL, largest"], query_kl_rows(records))}

## Each run's best window (points)

The first step of the highest mean of three consecutive held-out sweeps over steps 50–850, that mean, and the drop
from it to the mean of the last three sweeps (steps 900–1,000).

{markdown_table(windows, best_window_rows(records, benchmark))}

## Held-out Avg@4 at T = 1.5 over training (%, mean ± std over seeds, every sweep)

{by_sweep(records, lambda r: held_out(sweeps(r), benchmark, "T=1.5"))}

## Held-out Avg@4 at T = 1.0 over training (%, mean ± std over seeds, every sweep)

{by_sweep(records, lambda r: held_out(sweeps(r), benchmark, "T=1"))}

## Training-query Avg@4 at T = 1.0 over training (%, mean ± std over seeds, every sweep)

{by_sweep(records, lambda r: sweeps(r)[f"val/avg@k/{TRAIN}/T=1"])}

## Figure

![held-out and training accuracy over training, and the training reward]({figure.name})
"""
    path.write_text(text)
    return results
