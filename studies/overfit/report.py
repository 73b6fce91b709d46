"""The overfitting study's report: the pilot, the claims with their gates and learning guard, tables and figures, all
from the runs' own logs (studies.engine pieces), and `overfit_study_claims.json` beside it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from studies.engine.claims import BASE_ARM, Claim, evaluate_all
from studies.engine.claims import describe as describe_claim
from studies.engine.definition import ReportInputs, StudySettings
from studies.engine.figures import CurvePanel, curve_figure, evaluation_figure, logged
from studies.engine.report import (
    COMMON_COLUMN,
    FINAL_WINDOW,
    RunRecord,
    add_retention,
    arms_line,
    base_sweep,
    benchmark_label,
    estimators,
    markdown_table,
    mean_std,
    median_range,
    per_seed_table,
    per_seed_values,
    seeds_line,
    write_claims,
)

PILOT = Path("pilot_runs/pilot.json")  # relative to the report's folder
CURVES = (
    CurvePanel(logged(COMMON_COLUMN), "Query-KL (token_k3) on the training batch", "token_k3 (running mean, symlog)",
               symlog=True),
    CurvePanel(logged("train/query_loglik_change"), "query log-likelihood change ℓθ(q) − ℓθ0(q)", "nats per query"),
    CurvePanel(logged("rollout/reward_mean"), "mean reward of the rollouts", "reward (running mean)"),
)  # fmt: skip


def zero_signal_steps(record: RunRecord) -> tuple[int, int]:
    """(steps whose gradient norm was exactly 0, optimizer steps skipped for it) of one run."""
    frame = record.logged
    zero = int((frame["train/grad_norm"] == 0).sum()) if "train/grad_norm" in frame else 0
    skips = frame["train/zero_signal_skips"].max() if "train/zero_signal_skips" in frame else np.nan
    return zero, 0 if np.isnan(skips) else int(skips)


def pilot_section(folder: Path) -> str:
    """The pilot's gate per regime and seed (`pilot_runs/pilot.json` in the report's folder), or a line saying that
    there is none there (a quick run's report)."""
    path = folder / PILOT
    if not path.is_file():
        return f"No pilot record beside this report (`{PILOT}`)."
    pilot = json.loads(path.read_text())
    rows = []
    for name, regime in pilot["regimes"].items():
        for seed, values in regime["seeds"].items():
            rows.append([f"`{name}`", seed, f"{regime['base_held_out_t1']:.1f}", f"{values['held_out_t1']:.1f}",
                         f"{values['train_t1']:.1f}", f"{values['drop_below_base']:.1f}", f"{values['gap']:.1f}",
                         "passes" if values["passes"] else "fails"])  # fmt: skip
    rule = pilot["rule"]
    table = markdown_table(["regime", "seed", "base held-out", "held-out", "training", "drop below base", "gap",
                            "gate"], rows)  # fmt: skip
    return (
        f"grpo only, seeds {', '.join(map(str, rule['seeds']))}, Avg@4 at T = 1.0 (%). Gate, in every seed: held-out "
        f"at least {rule['drop']:g} points below the base model and a train–eval gap of at least {rule['gap']:g} "
        f"points. Chosen regime: `{pilot['chosen']}`.\n\n{table}"
    )


def overfit_table(records: list[RunRecord], settings: StudySettings) -> dict:
    """The per-seed table the study's claims read: collect's final values, the base model's row (BASE_ARM, from the
    first run's sweep at step 0) and every row's `retention` (held-out T = 1.5 over T = 1.0). The report and
    `python -m studies.engine.compare overfit` both read this one table."""
    benchmark = benchmark_label(records)
    table = per_seed_table(records, settings.temperatures, benchmark, base_sweep(records))
    add_retention(table, "T=1.5", "T=1")
    return table


def overfit_report(inputs: ReportInputs, claims: tuple[Claim, ...], regime: str) -> list[dict]:
    """Write the report (markdown), its two PNG figures and `<stem>_claims.json` beside it; `regime` says in words
    what the runs trained on (studies.overfit.study.Regime.describe).

    Returns:
        the evaluated claims (studies.engine.claims.evaluate).
    """
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = benchmark_label(records)
    base = base_sweep(records)
    table = overfit_table(records, settings)
    runs = {arm: values for arm, values in table.items() if arm != BASE_ARM}  # the trained arms, retention included
    results = evaluate_all(table, estimators(records), claims)
    claims_path = write_claims(path, study, results)
    curves, evaluation = path.with_name(path.stem + "_curves.png"), path.with_name(path.stem + "_evaluation.png")
    curve_figure(records, curves, CURVES)
    evaluation_figure(runs, base, settings.temperatures, benchmark, evaluation)
    base_row = table[BASE_ARM]
    accuracy_rows = [[BASE_ARM] + [f"{100 * base_row[q][0]:.1f}" for q in ("T=1", "T=1.5", "train T=1")]
                     + ["", f"{100 * base_row['retention'][0]:.1f}", ""]]  # fmt: skip
    for arm, values in runs.items():
        gain = 100 * (np.asarray(values["train T=1"]) - base_row["train T=1"][0])
        accuracy_rows.append([arm] + [mean_std(values[q], scale=100) for q in ("T=1", "T=1.5", "train T=1", "gap T=1",
                                                                                "retention")]
                             + [mean_std(gain, scale=1.0, digits=3)])  # fmt: skip
    signal = {arm: [zero_signal_steps(r) for r in records if r.method == arm] for arm in runs}
    kl_rows = [[arm, median_range(v["Query-KL (common)"]), mean_std(v["query loglik change"]),
                median_range(v["Policy-KL"]), mean_std(v["train reward"]), mean_std([z for z, _ in signal[arm]]),
                mean_std([s for _, s in signal[arm]]), mean_std(v["minutes"])]
               for arm, v in runs.items()]  # fmt: skip
    per_seed = {"T=1": 100, "retention": 100, "gap T=1": 100, "Query-KL (common)": 1.0, "query loglik change": 1.0}
    seed_rows = [[arm] + [per_seed_values(v[q], scale) for q, scale in per_seed.items()] for arm, v in runs.items()]
    model = study["model"]
    text = f"""# The overfitting study: does ERPO stop GRPO memorising its training queries?

Generated by `studies/overfit/report.py`; every number below is read from the runs' logs. The plan, with every claim
and decision rule, was committed before the main runs: [overfit_plan.md](overfit_plan.md). Command:

```bash
{inputs.command}
```

Setup: the shipped toy model and task (`configs/quickstart.yaml`: 0.28M-parameter Qwen2, single-digit two-step
arithmetic, HF engine, 16 queries × 8 rollouts a step; `erpo_lightning/toy/shipped`, sha256 `{model["sha256"]}`) in
the pilot's regime: {regime}, {settings.steps} RL steps per run, seeds {
        seeds_line(records)
    } (`seed_everything`, `rollout.seed`, `data.seed`), in float32 with exact Query-KL scoring (the
default). After the last step one sweep: Avg@{settings.eval_k} on the first {settings.eval_problems} held-out test
problems and on every training query, at T = {", ".join(f"{t:g}" for t in settings.temperatures)}. Study wall time:
{inputs.minutes:.1f} min, {inputs.jobs} run(s) at a time, on 2 CPU cores. Arms: {arms_line(study["methods"])}.

## Pilot

{pilot_section(path.parent)}

## Claims, paired per seed

Seed s of every arm starts from the same model, data order and rollout seeds, so each claim compares an arm with its
baseline within each seed. The base model's row is its one sweep, repeated for every seed. Verdicts as the plan
fixed them: accuracies, gaps and retention by a one-sided sign test over the seeds with a 3-point minimum effect
(`confirmed`, `refuted`: the bootstrap interval rules the effect out, `inconclusive`); Query-KL ratios by k of n
(`holds` in ≥ 80% of seeds, `fails` in ≤ 20%, else `mixed`). Gates come first: `invalid` when grpo did not end below
the base model, `untestable` when the baseline's gap or grpo's retention drop is missing, `confounded` when the arm
gained less than half of grpo's gain on the training queries. Compare a rerun with
`python -m studies.engine.compare overfit <rerun directory>` (against `{claims_path.name}`).

{chr(10).join(describe_claim(claim) for claim in results)}

## Accuracy, gap and retention (Avg@{settings.eval_k}, %)

Mean ± std over seeds. Gap: training minus held-out at T = 1.0 (points); retention: T = 1.5 over T = 1.0 (%); gain:
training accuracy at T = 1.0 minus the base model's (points), the learning guard's quantity.

{
        markdown_table(
            ["arm", "held-out T=1", "held-out T=1.5", "training T=1", "gap T=1", "retention", "gain"], accuracy_rows
        )
    }

## Query-KL, the queries' likelihood, and zero-signal steps

Mean over the last {FINAL_WINDOW} steps of each run. Query-KL is token_k3 for every arm (median [min, max] over seeds);
the log-likelihood change is ℓθ(q) − ℓθ0(q) per query, nats (negative: the queries became less likely). Zero-signal
steps: steps whose gradient norm was exactly 0 (every group's rewards equal, no Query-KL gradient); skipped: of those,
the optimizer steps `grpo (skip zero-signal)` did not take (AdamW's momentum moves the others).

{
        markdown_table(
            [
                "arm",
                "Query-KL (token_k3)",
                "loglik change",
                "Policy-KL",
                "train reward",
                "zero-signal steps",
                "skipped",
                "run time (min)",
            ],
            kl_rows,
        )
    }

## Per seed

Seeds {seeds_line(records)} in order (accuracies, retention and gap in points; Query-KL and log-likelihood as is).

{markdown_table(["arm", *per_seed], seed_rows)}

## Figures

![token_k3, log-likelihood change and reward over training]({curves.name})

![Accuracy by temperature and train-vs-eval gap]({evaluation.name})
"""
    path.write_text(text)
    return results
