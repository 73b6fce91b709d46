"""The brake study's report: the per-seed table with the trajectory's quantities, the derived rows read off grpo's
trajectory, the claims with their gates, tables and a trajectory figure, and `brake_study_claims.json` beside it.

Quantities beyond the engine's final ones (studies.engine.report.collect), per run:
- `reward 10-49`: mean training reward over steps 10–49 (the early lag);
- `step at level`: first step whose 10-step running training reward reaches LEVEL; `T=1 at level`: held-out Avg@4
  at T = 1.0 at the first sweep at or after it;
- `T=1 peak`, `T=1.5 peak`: the highest mean of three consecutive sweeps from step 10 on;
- `wrong steps train T=1`, `wrong steps T=1`: at the final sweep, the share of correct answers (training queries,
  held-out problems; T = 1.0) whose worked steps are wrong (studies.engine.worked_steps);
- `log Policy-KL`: the log of the final Policy-KL (a mean over the last 10 steps).
Derived rows: `grpo (stopped)`, every grpo quantity at its sweep at the matched stop step; `grpo (peak)`, grpo's
peaks as its held-out values.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from studies.brake.study import (
    ARMS,
    CENTRAL,
    DERIVED_ARMS,
    EARLY_REWARD,
    EARLY_WINDOW,
    LEVEL,
    PEAK,
    ROLLING,
    STOPPED,
    Matched,
)
from studies.engine.claims import BASE_ARM, Claim, evaluate_all
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
from studies.engine.trajectory import (
    REWARD,
    at_or_after,
    first_reaching,
    peak,
    reward_curve,
    sweeps,
    value_at,
    window_mean,
    wrong_steps,
)

PILOT = Path("pilot_runs/pilot.json")  # relative to the report's folder
TRAIN = "train"
SWEPT = ("T=1", "T=1.5", "train T=1", "train T=1.5", "gap T=1")  # the sweep quantities a derived row reads at a step


@cache
def kept_wrong_steps(record: RunRecord) -> pd.DataFrame:
    """studies.engine.trajectory.wrong_steps, read once per run."""
    return wrong_steps(record)


def wrong_share(record: RunRecord, benchmark: str, step: int) -> float:
    """The share of correct answers at T = 1.0 through wrong steps on `benchmark` at the sweep at or before `step`."""
    frame = kept_wrong_steps(record)
    chosen = frame[(frame["benchmark"] == benchmark) & (frame["temperature"] == 1.0)]
    return value_at(pd.Series(chosen["share"].to_numpy(dtype=float), index=chosen["step"].to_numpy()), step)


def swept(frame: pd.DataFrame, benchmark: str) -> dict[str, pd.Series]:
    """The sweep quantities (SWEPT) of one run's trajectory, by step."""
    held, train = f"val/avg@k/{benchmark}", f"val/avg@k/{TRAIN}"
    return {"T=1": frame[f"{held}/T=1"], "T=1.5": frame[f"{held}/T=1.5"], "train T=1": frame[f"{train}/T=1"],
            "train T=1.5": frame[f"{train}/T=1.5"], "gap T=1": frame["train_eval_gap/T=1"]}  # fmt: skip


def run_quantities(record: RunRecord, benchmark: str, last: int, every: int) -> dict[str, float]:
    """The trajectory quantities of one run (module docstring); `last` is the final sweep's step, `every` the steps
    between sweeps (the peaks start at the first sweep after step 0)."""
    series = swept(sweeps(record), benchmark)
    reached = first_reaching(reward_curve(record, ROLLING), LEVEL)
    metrics = record.metrics()
    policy_kl = float(metrics["train/policy_kl"].tail(10).mean()) if "train/policy_kl" in metrics else float("nan")
    return {
        EARLY_REWARD: window_mean(metrics[REWARD], *EARLY_WINDOW),
        "step at level": float("nan") if reached is None else float(reached),
        "T=1 at level": at_or_after(series["T=1"], reached),
        "T=1 peak": peak(series["T=1"], 3, first=every)[1],
        "T=1.5 peak": peak(series["T=1.5"], 3, first=every)[1],
        "wrong steps train T=1": wrong_share(record, TRAIN, last),
        "wrong steps T=1": wrong_share(record, benchmark, last),
        "log Policy-KL": float(np.log(policy_kl)) if policy_kl > 0 else float("nan"),
    }


def derived_rows(records: list[RunRecord], benchmark: str, table: dict, matched: Matched) -> dict:
    """`grpo (stopped)` and `grpo (peak)` (module docstring), from grpo's runs in seed order."""
    grpo = sorted((r for r in records if r.method == "grpo"), key=lambda r: r.seed)
    stopped: dict[str, list] = {"seed": [r.seed for r in grpo]}
    for record in grpo:
        series = swept(sweeps(record), benchmark)
        for name in SWEPT:
            stopped.setdefault(name, []).append(value_at(series[name], matched.stop_step))
        for name, where in (("wrong steps train T=1", TRAIN), ("wrong steps T=1", benchmark)):
            stopped.setdefault(name, []).append(wrong_share(record, where, matched.stop_step))
    if grpo:
        stopped[EARLY_REWARD] = list(table["grpo"][EARLY_REWARD])
    best = {"seed": stopped["seed"]}
    if grpo:
        best.update({"T=1": list(table["grpo"]["T=1 peak"]), "T=1.5": list(table["grpo"]["T=1.5 peak"])})
    return {STOPPED: stopped, PEAK: best} if grpo else {}


def brake_table(records: list[RunRecord], settings: StudySettings, matched: Matched) -> tuple[dict, dict, str]:
    """(the per-seed table with the base model's and the derived rows, the base model's sweep, the benchmark)."""
    benchmark = benchmark_label(records)
    every = settings.sweep_every or settings.steps
    base = base_sweep(records)
    table = per_seed_table(
        records, settings.temperatures, benchmark, base,
        lambda record: run_quantities(record, benchmark, record.sweep()["last_step"], every),
    )  # fmt: skip
    first = next(r for r in records if r.sweep()["first_step"] == 0)
    table[BASE_ARM]["wrong steps train T=1"] = [wrong_share(first, TRAIN, 0)] * len(table[BASE_ARM]["seed"])
    table[BASE_ARM]["wrong steps T=1"] = [wrong_share(first, benchmark, 0)] * len(table[BASE_ARM]["seed"])
    table.update(derived_rows(records, benchmark, table, matched))
    return table, base, benchmark


def pilot_section(folder: Path) -> str:
    """The pilot's choices and the training-side values behind them (`pilot_runs/pilot.json` beside the report), or
    a line saying there is none (a quick run's report)."""
    path = folder / PILOT
    if not path.is_file():
        return f"No pilot record beside this report (`{PILOT}`): a quick run uses the study's stand-in values."
    pilot = json.loads(path.read_text())
    values, chosen = pilot["values"], pilot["chosen"]
    lrs = ", ".join(f"{lr}: {100 * v:.1f}" for lr, v in values["early_reward_by_lr"].items())
    betas = ", ".join(f"{b}: {v:.3g}" for b, v in values["policy_kl_by_beta"].items())
    return (
        f"Seeds {', '.join(map(str, pilot['rule']['seeds']))}, training-side quantities only. Mean training reward "
        f"over steps 10–49 (%): erpo {100 * values['erpo_early_reward']:.1f}, grpo "
        f"{100 * values['grpo_early_reward']:.1f}, grpo by learning rate {lrs}: lower learning rate "
        f"**{chosen['low_lr']:g}**. Final Policy-KL: erpo {values['erpo_policy_kl']:.3g}, grpo "
        f"{values['grpo_policy_kl']:.3g}, grpo_kl by β {betas}: β **{chosen['kl_beta']:g}**. Steps erpo lags grpo to "
        f"a running reward of {pilot['rule']['level']:g}, by seed: {values['lags']}: early stop at step "
        f"**{chosen['stop_step']}**."
    )


def trajectory_rows(records: list[RunRecord], benchmark: str, column: str, steps: list[int]) -> list[list[str]]:
    """Per arm, the mean ± std over seeds of one sweep quantity (points) at each of `steps`."""
    rows = []
    for arm in dict.fromkeys(r.method for r in records):
        runs = [swept(sweeps(r), benchmark)[column] for r in records if r.method == arm]
        rows.append([arm] + [mean_std([value_at(s, step) for s in runs], scale=100) for step in steps])
    return rows


QUANTITIES = {"held-out T=1": ("T=1", 100), "held-out T=1.5": ("T=1.5", 100), "training T=1": ("train T=1", 100),
              "reward 10–49": (EARLY_REWARD, 100), "step at level": ("step at level", 1.0),
              "T=1 at level": ("T=1 at level", 100), "T=1 peak": ("T=1 peak", 100),
              "wrong steps (training)": ("wrong steps train T=1", 100),
              "wrong steps (held-out)": ("wrong steps T=1", 100)}  # fmt: skip


def not_run_line(records: list[RunRecord]) -> str:
    """` Not run: ...` naming the plan's arms with no finished run and the plan's reason, or nothing."""
    ran = {record.method for record in records}
    missing = [arm for arm in ARMS if arm not in ran]
    if not missing:
        return ""
    named = ", ".join(f"`{arm}`" for arm in missing)
    return (
        f" Not run: {named}. They are may-wait arms, left out for CPU time by the plan's rule (brake_plan.md, "
        '"Seeds": in the table\'s order, each with all 8 seeds or not at all); their claims read `n/a`.'
    )


def best_window_line(table: dict) -> str:
    """Descriptive, not a claim (issue 68): erpo's best held-out window at T = 1.0 minus grpo's, seed by seed, which is
    what a user who keeps each run's best checkpoint compares."""
    if not {"erpo", "grpo"} <= table.keys():
        return "Best windows: erpo or grpo not run."
    by_seed = {arm: dict(zip(table[arm]["seed"], table[arm]["T=1 peak"], strict=True)) for arm in ("erpo", "grpo")}
    seeds = sorted(by_seed["erpo"].keys() & by_seed["grpo"].keys())
    gaps = [100 * (by_seed["erpo"][seed] - by_seed["grpo"][seed]) for seed in seeds]
    return (
        f"Best windows (descriptive, no claim or rule): erpo's best three-sweep held-out mean at T = 1.0 minus grpo's, "
        f"per seed: {' / '.join(f'{gap:.3g}' for gap in gaps)}; mean {sum(gaps) / len(gaps):.1f} points, erpo higher "
        f"in {sum(gap > 0 for gap in gaps)} of {len(gaps)} seeds."
    )


def guard_note(results: list[dict]) -> str:
    """What the engine's guard fix (issue 68) changed in this report, claim by claim: the runs did not change."""
    kept = [f"`{r['key']}` **{r['verdict']}**" for r in results if r.get("guard_failed")]
    return (
        "A failed learning guard discounts only a win. Until 2026-12-07 the engine applied it to every verdict, which "
        "turned refutations into `confounded`; the report was rebuilt from the same runs after the fix (issue 68). "
        "Claims whose guard failed and whose rule verdict now stands: " + ("; ".join(kept) if kept else "none") + "."
    )


def brake_report(inputs: ReportInputs, claims: tuple[Claim, ...], matched: Matched) -> list[dict]:
    """Write the report (markdown), its trajectory figure and `<stem>_claims.json` beside it; the evaluated claims."""
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    table, base, benchmark = brake_table(records, settings, matched)
    results = evaluate_all(table, estimators(records), claims)
    claims_path = write_claims(path, {**study, "matched": matched.__dict__}, results)
    figure = path.with_name(path.stem + "_trajectories.png")
    held = f"val/avg@k/{benchmark}"
    curve_figure(records, figure, (
        CurvePanel(lambda r: sweeps(r)[f"{held}/T=1"] * 100, "held-out Avg@4 at T = 1.0", "%"),
        CurvePanel(lambda r: sweeps(r)[f"{held}/T=1.5"] * 100, "held-out Avg@4 at T = 1.5", "%"),
        CurvePanel(lambda r: sweeps(r)[f"val/avg@k/{TRAIN}/T=1"] * 100, "training queries, T = 1.0", "%"),
        CurvePanel(lambda r: reward_curve(r, ROLLING), "training reward", f"{ROLLING}-step running mean"),
    ))  # fmt: skip
    rows = [[arm] + [mean_std(values.get(q, []), scale=s) for q, s in QUANTITIES.values()]
            for arm, values in table.items()]  # fmt: skip
    every = settings.sweep_every or settings.steps
    steps = sorted({0, *range(every, settings.steps + 1, 2 * every), settings.steps})
    central = [r for r in results if r["key"] in CENTRAL]
    text = f"""# The brake study: is ERPO more than a brake?

Generated by `studies/brake/report.py`; every number is read from the runs' logs. The plan, with every claim and
rule, was committed before the main runs: [brake_plan.md](brake_plan.md). Command:

```bash
{inputs.command}
```

Setup: the overfitting study's regime (the shipped toy model, the first 32 training queries, 16 × 8 rollouts a step,
{settings.steps} steps, float32, exact Query-KL scoring), seeds {seeds_line(records)}. A sweep every
{settings.sweep_every} steps: Avg@{settings.eval_k} on the first {settings.eval_problems} held-out problems and on
every training query at T = {", ".join(f"{t:g}" for t in settings.temperatures)}, the responses kept for the
worked-steps measure. Matched controls (from the pilot): lower learning rate {matched.low_lr:g}, grpo_kl β
{matched.kl_beta:g}, early stop at step {matched.stop_step}. Derived rows (never trained): {", ".join(DERIVED_ARMS)}.
Study wall time {inputs.minutes:.1f} min. Arms: {arms_line(study["methods"])}.{not_run_line(records)}

## Pilot

{pilot_section(path.parent)}

## Claims, paired per seed

Each claim pairs an arm with its baseline within a seed; the verdict is the plan's: the 95% t interval of the mean
margin against a 2-point minimum effect, on all seeds and on every subset leaving one seed out. Gates first:
`invalid` (grpo did not overfit), `untestable` (a control not matched, a baseline that did not overfit, grpo not
memorising), `confounded` (the method learned less than half of grpo's gain, lagged its baseline early, or learned
less than the early-stopped grpo). Claims file: `{claims_path.name}`.

{guard_note(results)}

Central claims: {"; ".join(f"`{r['key']}` **{r['verdict']}**" for r in central)}.

{chr(10).join(describe_claim(claim) for claim in results)}

## Per arm (mean ± std over seeds; points, steps)

{markdown_table(["arm", *QUANTITIES], rows)}

{best_window_line(table)}

## Held-out Avg@4 at T = 1.0 over training (%, by step)

{markdown_table(["arm", *map(str, steps)], trajectory_rows(records, benchmark, "T=1", steps))}

## Figure

![held-out and training accuracy over training, and the training reward]({figure.name})
"""
    path.write_text(text)
    return results
