"""The good-lr study's report: the per-seed table, the core and monitor claims with their gates, each accuracy
claim's interval over seeds and test problems together, every arm's trajectories on the test set, the validation set
and the training queries, and `good_lr_study_claims.json` beside it, all from the runs' logs.

Quantities per run (accuracies in [0, 1]; good_lr_plan.md names each):
- `T=1 end`, `T=1.5 end`: test-set Avg@4, the mean of the last three sweeps;
- `T=1 selected`: test-set Avg@4 at T = 1.0 at the sweep (step ≥ 20) with the highest validation-set Avg@4 at
  T = 1.0, the earliest on a tie; `selected step` that sweep's step;
- `train T=1 end`: training-query Avg@4 at T = 1.0, the mean of the last three sweeps;
- `drawdown T=1`: points between the best three-sweep test-set mean at T = 1.0 (steps 20 to the end − 60) and the
  last three sweeps' (studies.good_lr.measures.drawdown).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from studies.engine.claims import BASE_ARM, evaluate_all
from studies.engine.claims import describe as describe_claim
from studies.engine.definition import ReportInputs, StudySettings
from studies.engine.figures import CurvePanel, curve_figure
from studies.engine.report import (
    COMMON_COLUMN,
    VALIDATION,
    RunRecord,
    arms_line,
    base_sweep,
    benchmark_label,
    estimators,
    markdown_table,
    mean_std,
    per_seed_table,
    seeds_line,
    sweep_column,
    write_claims,
)
from studies.engine.trajectory import by_sweep, last_mean, sweeps, value_at
from studies.good_lr.measures import (
    SIGNALS,
    SIMPLER,
    drawdown,
    generality,
    leave_one_seed_out_errors,
    monitor_run,
    seed_problem_interval,
)
from studies.good_lr.study import (
    BEATS,
    CORE_CLAIMS,
    MONITOR_ERROR,
    QUERY_KL_SIGNAL,
    SIMPLER_SIGNAL,
    SWEEP_EVERY,
    WINDOW,
    compact_completions,
)

PILOT = Path("pilot_runs/pilot.json")  # relative to the report's folder
TRAIN = "train"
# The accuracy claims' quantities -> (temperature, how the sweeps are chosen) for the bootstrap over problems.
PER_PROBLEM = {"T=1 end": (1.0, "end"), "T=1.5 end": (1.5, "end"), "T=1 selected": (1.0, "selected")}


def selected_step(frame: pd.DataFrame) -> int:
    """The sweep step (after step 0, the base model's) with the highest validation-set Avg@4 at T = 1.0; the
    earliest on a tie."""
    validation = frame[sweep_column(VALIDATION, 1.0)].loc[1:]
    return int(validation.idxmax())


def run_quantities(record: RunRecord, benchmark: str, steps: int) -> dict[str, float]:
    """The quantities of one run (module docstring)."""
    frame = sweeps(record)
    test = frame[sweep_column(benchmark, 1.0)]
    chosen = selected_step(frame)
    return {
        "T=1 end": last_mean(test, WINDOW),
        "T=1.5 end": last_mean(frame[sweep_column(benchmark, 1.5)], WINDOW),
        "T=1 selected": value_at(test, chosen),
        "selected step": float(chosen),
        "train T=1 end": last_mean(frame[sweep_column(TRAIN, 1.0)], WINDOW),
        "drawdown T=1": drawdown(test, steps),
    }


def problem_values(record: RunRecord, benchmark: str, quantity: str) -> np.ndarray:
    """Each test problem's share of correct samples behind `quantity` of the run, from its per-problem counts (the
    mean over the last three sweeps for an `end` quantity, the selected sweep's for `T=1 selected`); by problem
    index."""
    temperature, which = PER_PROBLEM[quantity]
    counts = pd.read_csv(compact_completions(record.log_dir, benchmark))
    counts = counts[np.isclose(counts["temperature"], temperature)]
    swept = sorted(counts["step"].unique())
    if which == "end" and len(swept) < WINDOW:  # as last_mean: no end window without three sweeps
        return np.full(counts["index"].nunique(), np.nan)
    steps = swept[-WINDOW:] if which == "end" else [selected_step(sweeps(record))]
    chosen = counts[counts["step"].isin(steps)]
    shares = (chosen["correct"] / chosen["k"]).groupby(chosen["index"]).mean()
    return shares.sort_index().to_numpy()


def monitor_rows(records: list[RunRecord], benchmark: str) -> tuple[dict, dict[str, list[float]]]:
    """The monitor claim's derived rows (QUERY_KL_SIGNAL, SIMPLER_SIGNAL: per grpo seed, the leave-one-seed-out mean
    absolute error) and every signal's errors by seed order."""
    grpo = sorted((r for r in records if r.method == "grpo"), key=lambda r: r.seed)
    if len(grpo) < 2:
        return {}, {}
    runs = []
    for record in grpo:
        frame = sweeps(record)
        metrics = record.metrics().rename(columns={COMMON_COLUMN: "query_kl", "train/policy_kl": "policy_kl"})
        test, train = frame[sweep_column(benchmark, 1.0)], frame[sweep_column(TRAIN, 1.0)]
        runs.append(monitor_run(record.seed, test, train, metrics, SWEEP_EVERY))
    if any(run.frame.empty for run in runs):  # runs too short for a drawdown (a quick run): no monitor rows
        return {}, {}
    errors = leave_one_seed_out_errors(runs)
    seeds = [record.seed for record in grpo]
    simpler = [min(errors[signal][i] for signal in SIMPLER) for i in range(len(seeds))]
    rows = {QUERY_KL_SIGNAL: {"seed": seeds, MONITOR_ERROR: errors["query_kl"]},
            SIMPLER_SIGNAL: {"seed": seeds, MONITOR_ERROR: simpler}}  # fmt: skip
    return rows, errors


def good_lr_table(records: list[RunRecord], settings: StudySettings) -> tuple[dict, dict[str, list[float]]]:
    """(the per-seed table the claims read, with the base model's and the monitor's derived rows; every monitor
    signal's errors)."""
    benchmark = benchmark_label(records)
    base = base_sweep(records)
    table = per_seed_table(
        records, settings.temperatures, benchmark, base,
        lambda record: run_quantities(record, benchmark, settings.steps),
    )  # fmt: skip
    table[BASE_ARM]["train T=1 end"] = [base[sweep_column(TRAIN, 1.0)]] * len(table[BASE_ARM]["seed"])
    derived, errors = monitor_rows(records, benchmark)
    table.update(derived)
    return table, errors


def intervals(records: list[RunRecord], benchmark: str, results: list[dict]) -> list[list[str]]:
    """Per accuracy claim: its verdict, the seed interval, the seed-and-problem interval and whether the verdict is
    general (measures.generality)."""
    rows = []
    for result in results:
        if result["quantity"] not in PER_PROBLEM or result["verdict"] in ("n/a", "undefined"):
            continue
        by_seed = {
            arm: {r.seed: r for r in records if r.method == arm} for arm in (result["method"], result["baseline"])
        }
        seeds = sorted(by_seed[result["method"]].keys() & by_seed[result["baseline"]].keys())
        differences = np.stack([
            100 * (problem_values(by_seed[result["method"]][s], benchmark, result["quantity"])
                   - problem_values(by_seed[result["baseline"]][s], benchmark, result["quantity"]))
            for s in seeds
        ])  # fmt: skip
        low, high = seed_problem_interval(differences)
        seed_interval = result.get("t_interval") or [float("nan")] * 2
        result["seed_problem_interval"] = [low, high]
        result["generality"] = generality(result["verdict"], [low, high], BEATS.effect)
        rows.append([f"`{result['key']}`", result["verdict"], f"[{seed_interval[0]:.1f}, {seed_interval[1]:.1f}]",
                     f"[{low:.1f}, {high:.1f}]", result["generality"]])  # fmt: skip
    return rows


def pilot_section(folder: Path) -> str:
    """The pilot's drawdowns per seed and length, and the length it chose (`pilot_runs/pilot.json`)."""
    path = folder / PILOT
    if not path.is_file():
        return f"No pilot record beside this report (`{PILOT}`)."
    pilot = json.loads(path.read_text())
    rows = [[seed, *(f"{value:.1f}" for value in by_length.values())] for seed, by_length in pilot["drawdown"].items()]
    lengths = next(iter(pilot["drawdown"].values())).keys()
    table = markdown_table(["grpo seed", *(f"drawdown at {length}" for length in lengths)], rows)
    return f'Chosen length: {pilot["chosen"]["steps"]} steps (points; the rule in good_lr_plan.md, "Pilot").\n\n{table}'


QUANTITIES = {"T=1 end": 100, "T=1.5 end": 100, "T=1 selected": 100, "selected step": 1, "train T=1 end": 100,
              "drawdown T=1": 1}  # fmt: skip


def good_lr_report(inputs: ReportInputs) -> list[dict]:
    """Write the report (markdown), its figure and `<stem>_claims.json` beside it; return the evaluated claims."""
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = benchmark_label(records)
    table, errors = good_lr_table(records, settings)
    results = evaluate_all(table, estimators(records), CORE_CLAIMS)
    interval_rows = intervals(records, benchmark, results)  # adds each accuracy claim's intervals to its result
    claims_path = write_claims(path, study, results)
    figure = path.with_name(path.stem + "_trajectories.png")
    curve_figure(records, figure, (
        CurvePanel(lambda r: sweeps(r)[sweep_column(benchmark, 1.0)] * 100, "test set, T = 1.0", "%"),
        CurvePanel(lambda r: sweeps(r)[sweep_column(VALIDATION, 1.0)] * 100, "validation set, T = 1.0", "%"),
        CurvePanel(lambda r: sweeps(r)[sweep_column(benchmark, 1.5)] * 100, "test set, T = 1.5", "%"),
        CurvePanel(lambda r: sweeps(r)[sweep_column(TRAIN, 1.0)] * 100, "training queries, T = 1.0", "%"),
    ))  # fmt: skip
    rows = [[arm] + [mean_std(values.get(q, []), scale=s) for q, s in QUANTITIES.items()]
            for arm, values in table.items() if arm not in (QUERY_KL_SIGNAL, SIMPLER_SIGNAL)]  # fmt: skip
    signal_rows = [[signal, mean_std(values)] for signal, values in errors.items()]
    text = f"""# The good-learning-rate study: does ERPO add anything once the learning rate is small?

Generated by `studies/good_lr/report.py`; every number is read from the runs' logs. The plan, with every claim and
rule, was committed before any run: [good_lr_plan.md](good_lr_plan.md). Command:

```bash
{inputs.command}
```

Setup: the brake study's regime at its smaller learning rate for both arms (the shipped toy model, the first 32
training queries, 16 × 8 rollouts a step, lr 7e-5, {settings.steps} steps, float32, exact Query-KL scoring), seeds
{seeds_line(records)}. A sweep every {settings.sweep_every} steps: Avg@{settings.eval_k} on the first
{settings.eval_problems} test problems, on the validation set (`{settings.validation}`) and on every training query, at
T = {", ".join(f"{t:g}" for t in settings.temperatures)}. Study wall time {inputs.minutes:.1f} min. Arms:
{arms_line(study["methods"])}.

## Pilot

{pilot_section(path.parent)}

## Claims, paired per seed

The plan's rule: the 95% t interval of the mean margin against a minimum effect (2 points of accuracy; 0.5 points
of drawdown error for the monitor claim), on all seeds and on every subset leaving one seed out. Gates first: `invalid`
when grpo did not learn, `untestable` when grpo did not end 2 points below its best (the final-window and monitor
claims), `confounded` when erpo would win but learned more than 3 points less on its training queries (a failed guard
discounts only a win). Claims file: `{claims_path.name}`.

{chr(10).join(describe_claim(claim) for claim in results)}

## Beyond these 200 problems

Each accuracy claim's 95% interval of the mean margin (points) over seeds alone (the rule's) and over seeds and test
problems drawn together (2,000 resamples, generator seed 0); a firm verdict is `general` when the second interval
also lies on its side of 2 points.

{markdown_table(["claim", "verdict", "seeds", "seeds and problems", "generality"], interval_rows)}

## The monitor: leave-one-seed-out error per signal (grpo runs; points of drawdown, mean ± std over seeds)

Signals: {", ".join(SIGNALS)} (KLs as log(KL + 1e-6), averaged over the {SWEEP_EVERY} logged steps before a sweep).

{markdown_table(["signal", "mean absolute error"], signal_rows)}

## Per arm (mean ± std over seeds; points, steps)

{markdown_table(["arm", *QUANTITIES], rows)}

## Test set, Avg@4 at T = 1.0 (%, every sweep)

{by_sweep(records, lambda r: sweeps(r)[sweep_column(benchmark, 1.0)])}

## Validation set, Avg@4 at T = 1.0 (%, every sweep)

{by_sweep(records, lambda r: sweeps(r)[sweep_column(VALIDATION, 1.0)])}

## Test set, Avg@4 at T = 1.5 (%, every sweep)

{by_sweep(records, lambda r: sweeps(r)[sweep_column(benchmark, 1.5)])}

## Training queries, Avg@4 at T = 1.0 (%, every sweep)

{by_sweep(records, lambda r: sweeps(r)[sweep_column(TRAIN, 1.0)])}

## Figure

![test, validation and training accuracy over training]({figure.name})
"""
    path.write_text(text)
    return results
