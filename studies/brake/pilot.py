"""The brake study's pilot (issue 50, item 3): the rules that match the controls to erpo, run before any main run.

Its rules were committed before it ran (studies/brake/brake_plan.md, "Pilot"). On seeds PILOT_SEEDS, which no main
run uses, with the study's settings (150 steps, a sweep every 10), it trains grpo, erpo, grpo at each learning rate
of LR_GRID and grpo_kl at each β of BETA_GRID (then of BETA_EXTENSION, one at a time, while the largest β tried still
leaves grpo_kl's Policy-KL above erpo's). It reads only training-side quantities, never a held-out value:
- the lower learning rate: the largest of LR_GRID whose mean training reward over steps 10–49 (mean over the pilot
  seeds) is at or below erpo's, a brake at least as strong as erpo's early lag (none: the smallest);
- grpo_kl's β: the one whose final Policy-KL (geometric mean over seeds of each run's mean over its last 10 steps)
  is nearest erpo's on a log scale (a tie: the smaller β);
- the early stop: the step erpo's 10-step running training reward first reaches LEVEL minus grpo's, per seed; their
  median, rounded to the sweep grid (10 steps, halves up), is the lag d, and grpo is read at step 150 − d (at least
  10; 150 when no seed has a lag: erpo or grpo never reached the level).

    .venv/bin/python -m studies.brake.pilot      # runs under studies/brake/pilot_runs, then pilot_runs/pilot.json

Write its `chosen` values into studies/brake/study.py (MATCHED) and the plan's "Pilot result" before any main run.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from studies.brake.run import BRAKE
from studies.brake.study import EARLY_WINDOW, LEVEL, ROLLING, STEPS, SWEEP_EVERY, arm
from studies.engine.definition import ReportInputs
from studies.engine.report import RunRecord
from studies.engine.run import REPO
from studies.engine.run import main as run_study_main
from studies.engine.trajectory import REWARD, first_reaching, reward_curve, window_mean

PILOT_SEEDS = (200, 201)
LR_GRID = (2e-4, 1.5e-4, 1e-4, 7e-5)
BETA_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)
BETA_EXTENSION = (1.0, 3.0)
OUT = Path("studies/brake/pilot_runs")


def lr_label(learning_rate: float) -> str:
    return f"grpo lr {learning_rate:g}"


def beta_label(beta: float) -> str:
    return f"grpo_kl beta {beta:g}"


def pilot_arms(betas: tuple[float, ...]) -> dict[str, list[str]]:
    """grpo, erpo, the learning-rate grid and grpo_kl at `betas`."""
    arms = {"grpo": arm("grpo"), "erpo": arm("erpo")}
    arms.update({lr_label(lr): arm("grpo", learning_rate=lr) for lr in LR_GRID})
    arms.update({beta_label(b): arm("grpo_kl", "--model.policy_kl_coef", f"{b:g}") for b in betas})
    return arms


def early_reward(records: list[RunRecord]) -> float:
    """The mean over runs of each run's mean training reward over EARLY_WINDOW."""
    return float(np.mean([window_mean(r.metrics()[REWARD], *EARLY_WINDOW) for r in records]))


def final_policy_kl(records: list[RunRecord]) -> float:
    """The geometric mean over runs of each run's mean Policy-KL over its last 10 steps."""
    finals = [float(r.metrics()["train/policy_kl"].tail(10).mean()) for r in records]
    return float(np.exp(np.mean(np.log(finals))))


def choose_low_lr(erpo_early: float, candidates: dict[float, float]) -> float:
    """The largest learning rate whose early reward is at or below erpo's; none such: the smallest."""
    braking = [lr for lr, reward in candidates.items() if reward <= erpo_early]
    return max(braking) if braking else min(candidates)


def choose_beta(erpo_kl: float, candidates: dict[float, float]) -> float:
    """The β whose final Policy-KL is nearest erpo's on a log scale; a tie goes to the smaller β."""
    return min(sorted(candidates), key=lambda beta: abs(math.log(candidates[beta]) - math.log(erpo_kl)))


def needs_larger_beta(erpo_kl: float, candidates: dict[float, float]) -> bool:
    """Whether the largest β tried still leaves grpo_kl's Policy-KL above erpo's."""
    return candidates[max(candidates)] > erpo_kl


def stop_step(lags: list[int | None], steps: int = STEPS, grid: int = SWEEP_EVERY) -> int:
    """The early-stopped grpo's step: `steps` minus the median lag rounded to the sweep grid (halves up), at least
    one grid step; `steps` when no seed has a lag."""
    known = [lag for lag in lags if lag is not None]
    if not known:
        return steps
    lag = max(0.0, float(np.median(known)))
    return min(steps, max(grid, steps - grid * math.floor(lag / grid + 0.5)))


def crossing(record: RunRecord) -> int | None:
    """The first step whose ROLLING-step running training reward reaches LEVEL."""
    return first_reaching(reward_curve(record, ROLLING), LEVEL)


def decide(records: list[RunRecord]) -> dict:
    """The pilot's values and choices (module docstring) from its finished runs."""
    by_arm: dict[str, list[RunRecord]] = {}
    for record in sorted(records, key=lambda r: r.seed):
        by_arm.setdefault(record.method, []).append(record)
    erpo_early, erpo_kl = early_reward(by_arm["erpo"]), final_policy_kl(by_arm["erpo"])
    lrs = {lr: early_reward(by_arm[lr_label(lr)]) for lr in LR_GRID if lr_label(lr) in by_arm}
    betas = {b: final_policy_kl(by_arm[beta_label(b)]) for b in (*BETA_GRID, *BETA_EXTENSION)
             if beta_label(b) in by_arm}  # fmt: skip
    crossings = {name: {r.seed: crossing(r) for r in by_arm[name]} for name in ("grpo", "erpo")}
    lags = [None if e is None or g is None else e - g
            for g, e in zip(crossings["grpo"].values(), crossings["erpo"].values(), strict=True)]  # fmt: skip
    chosen = {"low_lr": choose_low_lr(erpo_early, lrs), "kl_beta": choose_beta(erpo_kl, betas),
              "stop_step": stop_step(lags)}  # fmt: skip
    values = {"erpo_early_reward": erpo_early, "grpo_early_reward": early_reward(by_arm["grpo"]),
              "erpo_policy_kl": erpo_kl, "grpo_policy_kl": final_policy_kl(by_arm["grpo"]),
              "early_reward_by_lr": {f"{lr:g}": v for lr, v in lrs.items()},
              "policy_kl_by_beta": {f"{b:g}": v for b, v in betas.items()}, "crossings": crossings,
              "lags": lags, "larger_beta_needed": needs_larger_beta(erpo_kl, betas)}  # fmt: skip
    return {"values": values, "chosen": chosen}


def run_pilot(betas: tuple[float, ...], out: Path) -> dict:
    """Train (or skip, when finished) the pilot's runs with grpo_kl at `betas` and return its decision."""
    result: dict = {}

    def write_decision(inputs: ReportInputs) -> list[dict]:
        result.update(decide(inputs.records))
        return []

    arms = pilot_arms(betas)
    study = replace(BRAKE, name="brake-pilot", arms=arms, default_arms=tuple(arms), claims=(), derived_arms=(),
                    out=out, report=out / "pilot.json", write_report=write_decision)  # fmt: skip
    run_study_main(study, ["--seeds", *map(str, PILOT_SEEDS)])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="pilot run directory under the repository root")
    args = parser.parse_args(argv)
    betas = BETA_GRID
    result = run_pilot(betas, args.out)
    for extension in BETA_EXTENSION:
        if not result["values"]["larger_beta_needed"]:
            break
        betas = (*betas, extension)
        result = run_pilot(betas, args.out)
    rule = {"seeds": PILOT_SEEDS, "lr_grid": LR_GRID, "beta_grid": BETA_GRID, "beta_extension": BETA_EXTENSION,
            "betas_run": betas, "level": LEVEL, "rolling": ROLLING, "early_window": EARLY_WINDOW}  # fmt: skip
    record = {"rule": rule, **result}
    (REPO / args.out / "pilot.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
