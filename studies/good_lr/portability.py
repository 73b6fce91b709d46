"""The good-lr study's portability part (issue 68; good_lr_plan.md, "Portability"): in the regime where grpo
memorises, do ERPO's terms help DAPO (its rollout side on) and RLOO?

The brake study's regime at its larger learning rate (3e-4): the shipped toy model, the first 32 training queries,
150 steps, float32, exact scoring, sweeps every 10 steps on the test set and the training queries at T = 0.6, 1.0 and
1.5. Arms `dapo` and `dapo_erpo` with DAPO's rollout side (the brake study's DAPO_ROLLOUT), `rloo` and `rloo_erpo`;
seeds 810-817. Each `<method>_erpo` is paired with `<method>` at T = 0.6 (`low_t`), 1.0 (`final`) and 1.5
(`high_t`), by the core's interval rule, once the baseline memorises (its test-set accuracy ends below the base
model's in every seed) and with the core's learning guard. No full run starts before every core run has finished.

    python -m studies.good_lr.portability                # the 32 runs, after the core's
    python -m studies.good_lr.portability --report-only  # the report from the finished runs
    python -m studies.good_lr.portability --quick        # smoke test: every arm, 1 seed, 4 steps
"""

from __future__ import annotations

import sys
from pathlib import Path

from studies.brake.study import ARMS as BRAKE_ARMS
from studies.engine.claims import BASE_ARM, Claim, Gate, evaluate_all
from studies.engine.claims import describe as describe_claim
from studies.engine.definition import ALL_QUERIES, ReportInputs, Study, StudySettings
from studies.engine.figures import CurvePanel, curve_figure
from studies.engine.paired import ROUNDING, MeanCheck
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
    sweep_column,
    write_claims,
)
from studies.engine.run import REPO
from studies.engine.run import main as run_study_main
from studies.engine.runs import is_finished, run_slug
from studies.engine.trajectory import by_sweep, last_mean, sweeps
from studies.good_lr.study import (
    BASE_CONFIG,
    BEATS,
    CORE_ARMS,
    CORE_SEEDS,
    PORTABILITY_SEEDS,
    WINDOW,
    regime_flags,
)
from studies.toy.study import shipped_model

STEPS = 150
SWEEP_EVERY = 10
TEMPERATURES = (0.6, 1.0, 1.5)
BASELINES = ("dapo", "rloo")  # each paired with `<baseline>_erpo`
# The brake study's arms, at its learning rate (3e-4, where grpo memorises), DAPO's rollout side on for both DAPO arms.
ARMS: dict[str, list[str]] = {label: BRAKE_ARMS[label] for label in ("dapo", "dapo_erpo", "rloo", "rloo_erpo")}
CORE_RUNS = Path("studies/good_lr/runs")
TRAIN = "train"
# Each claim's key prefix -> its temperature; the quantity is test-set Avg@4 there, the mean of the last three sweeps.
CLAIM_TEMPERATURES = {"low_t": 0.6, "final": 1.0, "high_t": 1.5}
FULL = StudySettings(steps=STEPS, seeds=PORTABILITY_SEEDS, temperatures=TEMPERATURES, eval_problems=200, eval_k=4,
                     train_sample_size=ALL_QUERIES, sweep_every=SWEEP_EVERY)  # fmt: skip
QUICK = StudySettings(steps=4, seeds=PORTABILITY_SEEDS[:1], temperatures=TEMPERATURES, eval_problems=16, eval_k=2,
                      train_sample_size=ALL_QUERIES, sweep_every=2)  # fmt: skip


def end(temperature: float) -> str:
    """The per-seed quantity of test-set Avg@4 at `temperature`, the mean of a run's last three sweeps."""
    return f"T={temperature:g} end"


def memorises(baseline: str) -> Gate:
    """`testable.<baseline>_memorises`: the baseline's test-set Avg@4 at T = 1.0 ends below the base model's, in
    every seed (a tie is not below: the bound sits a rounding error under zero)."""
    return Gate(f"testable.{baseline}_memorises", f"{baseline}'s test-set Avg@4 at T = 1.0 over its last three sweeps "
                "ends below the base model's, in every seed", baseline, end(1.0), high=-ROUNDING,
                fails_as="untestable", minus_arm=BASE_ARM)  # fmt: skip


def learns(baseline: str) -> MeanCheck:
    """The core's learning guard against `baseline`: the method's training-query Avg@4 at T = 1.0 ends at most 3
    points below the baseline's (mean over seeds); a failed guard discounts only a win."""
    return MeanCheck(f"guard.{baseline}_erpo_learns", f"{baseline}_erpo's training-query Avg@4 at T = 1.0 over its "
                     f"last three sweeps is at most 3 points below {baseline}'s (mean over seeds)", "train T=1 end",
                     minus_arm=baseline, low=-3.0)  # fmt: skip


CLAIMS: tuple[Claim, ...] = tuple(
    Claim(f"{key}.{baseline}_erpo_vs_{baseline}", f"{baseline}_erpo's test-set Avg@4 at T = {temperature:g} over its "
          f"last three sweeps is above {baseline}'s", end(temperature), f"{baseline}_erpo", baseline, "difference",
          "above", 0.0, BEATS, (memorises(baseline), learns(baseline)))
    for baseline in BASELINES
    for key, temperature in CLAIM_TEMPERATURES.items()
)  # fmt: skip


def portability_table(records: list[RunRecord], settings: StudySettings) -> dict:
    """The per-seed table the claims read: the engine's final values plus each run's last-three-sweep means at every
    temperature (`T=... end`) and on the training queries at T = 1.0 (`train T=1 end`), with the base model's row
    (its one sweep for every `end` quantity)."""
    benchmark = benchmark_label(records)

    def ends(record: RunRecord) -> dict[str, float]:
        frame = sweeps(record)
        values = {end(t): last_mean(frame[sweep_column(benchmark, t)], WINDOW) for t in settings.temperatures}
        return {**values, "train T=1 end": last_mean(frame[sweep_column(TRAIN, 1.0)], WINDOW)}

    base = base_sweep(records)
    table = per_seed_table(records, settings.temperatures, benchmark, base, ends)
    seeds = len(table[BASE_ARM]["seed"])
    for temperature in settings.temperatures:
        table[BASE_ARM][end(temperature)] = [base[sweep_column(benchmark, temperature)]] * seeds
    table[BASE_ARM]["train T=1 end"] = [base[sweep_column(TRAIN, 1.0)]] * seeds
    return table


def portability_report(inputs: ReportInputs) -> list[dict]:
    """Write the report (markdown), its figure and `<stem>_claims.json` beside it; return the evaluated claims."""
    records, settings, path, study = inputs.records, inputs.settings, inputs.path, inputs.description
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = benchmark_label(records)
    table = portability_table(records, settings)
    results = evaluate_all(table, estimators(records), CLAIMS)
    claims_path = write_claims(path, study, results)
    figure = path.with_name(path.stem + "_trajectories.png")
    panels = [CurvePanel(lambda r, t=t: sweeps(r)[sweep_column(benchmark, t)] * 100, f"test set, T = {t:g}", "%")
              for t in settings.temperatures]  # fmt: skip
    panels.append(CurvePanel(lambda r: sweeps(r)[sweep_column(TRAIN, 1.0)] * 100, "training queries, T = 1.0", "%"))
    curve_figure(records, figure, tuple(panels))
    quantities = [*(end(t) for t in settings.temperatures), "train T=1 end"]
    rows = [[label] + [mean_std(values.get(q, []), scale=100) for q in quantities] for label, values in table.items()]
    curves = "\n\n".join(
        f"## Test set, Avg@{settings.eval_k} at T = {t:g} (%, every sweep)\n\n"
        + by_sweep(records, lambda r, t=t: sweeps(r)[sweep_column(benchmark, t)])
        for t in settings.temperatures
    )
    path.write_text(f"""# The good-lr study, portability: do ERPO's terms help DAPO and RLOO where grpo memorises?

Generated by `studies/good_lr/portability.py`; every number is read from the runs' logs. The plan, with every claim
and rule, was committed before any run: [good_lr_plan.md](good_lr_plan.md) ("Portability"). Command:

```bash
{inputs.command}
```

Setup: the brake study's regime at its larger learning rate (the shipped toy model, the first 32 training queries,
16 × 8 rollouts a step, lr 3e-4, {settings.steps} steps, float32, exact Query-KL scoring), DAPO's rollout side on for
both DAPO arms, seeds {seeds_line(records)}. A sweep every {settings.sweep_every} steps: Avg@{settings.eval_k} on the
first {settings.eval_problems} test problems and on every training query, at T =
{", ".join(f"{t:g}" for t in settings.temperatures)}. Study wall time {inputs.minutes:.1f} min. Arms:
{arms_line(study["methods"])}.

## Claims, paired per seed

The core's rule: the 95% t interval of the mean margin against a 2-point minimum effect, on all seeds and on every
subset leaving one seed out. Gates first: `untestable` when the baseline's test-set accuracy at T = 1.0 does not end
below the base model's in every seed; `confounded` when the ERPO arm would win but learned more than 3 points less on
its training queries (a failed guard discounts only a win). Claims file: `{claims_path.name}`.

{chr(10).join(describe_claim(claim) for claim in results)}

## Per arm (mean ± std over seeds, points; last three sweeps)

{markdown_table(["arm", *quantities], rows)}

{curves}

## Training queries, Avg@{settings.eval_k} at T = 1.0 (%, every sweep)

{by_sweep(records, lambda r: sweeps(r)[sweep_column(TRAIN, 1.0)])}

## Figure

![test and training accuracy over training]({figure.name})
""")
    return results


def unfinished_core_runs(workdir: Path) -> list[str]:
    """The core runs (arm and seed) not yet finished under `workdir`: the plan's order puts all of them first."""
    return [f"{label} seed {seed}" for label in CORE_ARMS for seed in CORE_SEEDS
            if not is_finished(workdir / CORE_RUNS / run_slug(label) / f"seed{seed}")]  # fmt: skip


def portability_study(out: Path = Path("studies/good_lr/portability_runs")) -> Study:
    """The portability study, its runs under `out`."""
    return Study(
        name="good-lr portability study",
        module="studies.good_lr.portability",
        base_config=BASE_CONFIG,
        arms=ARMS,
        default_arms=tuple(ARMS),
        full=FULL,
        quick=QUICK,
        claims=CLAIMS,
        out=out,
        quick_out=Path("runs/good_lr_portability_quick"),
        report=Path("studies/good_lr/good_lr_portability.md"),
        model_identity=shipped_model,
        write_report=portability_report,
        fit_flags=regime_flags(),
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    training = not {"--quick", "--report-only", "-h", "--help"} & set(args)
    waiting = unfinished_core_runs(REPO) if training else []
    if waiting:
        raise SystemExit(
            f"the portability runs wait for the core's (good_lr_plan.md, 'Order and waiting'): {len(waiting)} core "
            f"runs not finished, first {waiting[0]}; run `python -m studies.good_lr` first"
        )
    run_study_main(portability_study(), argv)


if __name__ == "__main__":
    main()
