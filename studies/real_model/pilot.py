"""The real-model study's task pilot: which seeded arithmetic family (studies.tasks.arithmetic) leaves
SmolLM2-135M-Instruct room both ways. Its rule was fixed before it ran (studies/real_model/plan.md, "Pilot"):

1. For each family in FAMILIES order (easiest first, by guess), the base model's held-out Avg@4 at T = 0.6 on 100
   test problems, through `erpo validate` with the study's prompt (configs/study_smollm2.yaml).
2. The first family whose base Avg@4 lies in [5, 40]% is taken, and a short `grpo` run on its 64 training queries
   (PILOT_STEPS steps of 8 queries x 8 rollouts) must end with a training reward in [15, 60]% (mean of the last
   4 steps). If it does not, the next family in range is tried.

Amendment (2026-12-02, after step 1 and before any grpo or main run; the plan says why): no family reached 5% base
accuracy, so `--by-reward` runs step 2 on every family in FAMILIES order, whatever its base accuracy, and takes the
first whose grpo reward lands in [15, 60]%.

Amendment 2 (2026-12-02, after step 2 and before any main run; the plan says why): no family reached 15% in 16
steps, the reward of each taking off only around steps 13-16. `--confirm FAMILY` runs the study's own grpo run
(configs/study_smollm2.yaml: 40 steps, final sweep of 100 held-out problems and the 64 training queries at T = 0.6 /
1.0 / 1.5) with seed CONFIRM_SEED, which no main run uses, and reports the plan's validity gate on it.

Amendment 3 (2026-12-02, during the four_single_digits confirmation run, before its result): `--learning-rate`
sets the confirmation run's learning rate (one run at 3e-5, by the plan's rule).

Everything goes under --out: each family's task files, its sweep's results.csv, the grpo run's metrics.csv, and
pilot.json with the numbers and the choice.

    .venv/bin/python -m studies.real_model.pilot --model "$(.venv/bin/python -m erpo_lightning.real_model)"
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from studies.tasks.arithmetic import write_task

REPO = Path(__file__).resolve().parents[2]
ERPO = str(Path(sys.executable).with_name("erpo"))
CONFIG = REPO / "configs" / "study_smollm2.yaml"
FAMILIES = ("two_digit_plus_single_digits", "four_single_digits", "two_digit_plus_two_digit")
BASE_RANGE = (5.0, 40.0)  # base Avg@4 at T = 0.6, percent
REWARD_RANGE = (15.0, 60.0)  # grpo's training reward at the end of the pilot run, percent
PILOT_STEPS = 16  # two epochs of the 64 training queries
TASK = {"num_train": 64, "num_test": 200, "seed": 0}
CONFIRM_SEED = 100  # the main runs use seeds 0, 1 (and 2)


def run(command: list[str], log: Path) -> None:
    """Run `command`, output to `log`; a failure stops the pilot naming the log."""
    with log.open("w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        sys.exit(f"pilot step failed (exit {done.returncode}); see {log}")


def task_flags(task: Path, model: str, cache: Path) -> list[str]:
    return [
        "--model.model_path", model,
        "--data.train", json.dumps([{"path": str(task / "train.jsonl"), "label": "train"}]),
        "--data.cache_dir", str(cache),
    ]  # fmt: skip


def base_accuracy(task: Path, model: str, out: Path) -> float:
    """Held-out Avg@4 (%) of the base model at T = 0.6 on the first 100 test problems."""
    sweep = {
        "sweep": {
            "benchmarks": [{"source": {"path": str(task / "test.jsonl"), "label": "test"}, "k": 4}],
            "temperatures": [0.6],
            "max_problems": 100,
            "seed": 0,
            "output_dir": str(out / "base_sweep"),
        }
    }
    results = out / "base_sweep" / "results.csv"
    if not results.is_file():  # a rerun (the amended rule) reads step 1's sweep back
        (out / "sweep.yaml").write_text(yaml.safe_dump(sweep))
        command = [ERPO, "validate", "--config", str(CONFIG), *task_flags(task, model, out / "cache"),
                   "--config", str(out / "sweep.yaml")]  # fmt: skip
        run(command, out / "validate.log")
    with results.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["benchmark"] == "test" and r["temperature"] == "0.6"]
    return 100 * float(rows[0]["avg@k"])


def grpo_reward(task: Path, model: str, out: Path) -> list[float]:
    """Training reward (%) per step of a PILOT_STEPS-step grpo run without sweeps."""
    command = [
        ERPO, "fit", "--config", str(CONFIG), *task_flags(task, model, out / "cache"),
        "--model.algorithm", "grpo", "--trainer.max_steps", str(PILOT_STEPS), "--trainer.callbacks", "null",
        "--trainer.default_root_dir", str(out / "grpo"), "--trainer.logger.init_args.save_dir", str(out / "grpo"),
    ]  # fmt: skip
    run(command, out / "grpo.log")
    metrics = next((out / "grpo").rglob("metrics.csv"))
    with metrics.open() as handle:
        return [100 * float(r["rollout/reward_mean"]) for r in csv.DictReader(handle) if r.get("rollout/reward_mean")]


def confirm(family: str, model: str, out: Path, learning_rate: float | None = None) -> dict:
    """The study's grpo run on `family` with seed CONFIRM_SEED (at `learning_rate`, or the config's), and the
    validity gate on its final sweep."""
    out.mkdir(parents=True, exist_ok=True)
    task = out / "task"
    write_task(family, TASK["num_train"], TASK["num_test"], TASK["seed"], task)
    seed = str(CONFIRM_SEED)
    rate = ["--model.learning_rate", str(learning_rate)] if learning_rate is not None else []
    command = [
        ERPO, "fit", "--config", str(CONFIG), *task_flags(task, model, out / "cache"), "--model.algorithm", "grpo",
        "--seed_everything", seed, "--rollout.seed", seed, "--data.seed", seed, *rate,
        "--trainer.default_root_dir", str(out / "grpo"), "--trainer.logger.init_args.save_dir", str(out / "grpo"),
        "--trainer.callbacks.init_args.sweep.benchmarks",
        json.dumps([{"source": {"path": str(task / "test.jsonl"), "label": "study_test"}, "k": 4}]),
    ]  # fmt: skip
    run(command, out / "grpo_confirm.log")
    after = json.loads(next((out / "grpo").rglob("sweep_summary.json")).read_text())["after"]
    accuracy = {t: 100 * after[f"val/avg@k/study_test/T={t}"] for t in ("0.6", "1", "1.5")}
    result = {
        "family": family,
        "seed": CONFIRM_SEED,
        "learning_rate": learning_rate,
        "held_out_avg4": accuracy,
        "train_eval_gap": 100 * after.get("train_eval_gap", float("nan")),
        "valid": 40 <= accuracy["1"] <= 85 and accuracy["1.5"] <= accuracy["1"] - 10,
    }
    (out / "confirm.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="SmolLM2-135M-Instruct directory (erpo_lightning.real_model)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "real_model_pilot")
    parser.add_argument("--by-reward", action="store_true", help="the amended rule: skip the base-accuracy filter")
    parser.add_argument("--confirm", choices=FAMILIES, help="amendment 2: the study's grpo run on this family")
    parser.add_argument("--learning-rate", type=float, help="amendment 3: the confirmation run's learning rate")
    args = parser.parse_args(argv)
    if args.confirm:
        name = f"confirm_{args.confirm}" + (f"_lr{args.learning_rate:g}" if args.learning_rate is not None else "")
        print(json.dumps(confirm(args.confirm, args.model, args.out / name, args.learning_rate), indent=1))
        return
    rule = {"base_range": None if args.by_reward else BASE_RANGE, "reward_range": REWARD_RANGE, "steps": PILOT_STEPS}
    record: dict = {"rule": rule,
                    "task": TASK, "families": {}, "chosen": None}  # fmt: skip
    started = time.time()
    for family in FAMILIES:
        out = args.out / family
        task = out / "task"
        write_task(family, TASK["num_train"], TASK["num_test"], TASK["seed"], task)
        entry = record["families"][family] = {"base_avg4_t0.6": base_accuracy(task, args.model, out)}
        print(f"{family}: base Avg@4 at T=0.6 {entry['base_avg4_t0.6']:.1f}%", flush=True)
        in_range = BASE_RANGE[0] <= entry["base_avg4_t0.6"] <= BASE_RANGE[1]
        if record["chosen"] or not (in_range or args.by_reward):
            continue
        rewards = grpo_reward(task, args.model, out)
        entry["grpo_reward_per_step"] = rewards
        entry["grpo_reward_last4"] = sum(rewards[-4:]) / len(rewards[-4:])
        print(f"{family}: grpo reward over the last 4 of {PILOT_STEPS} steps {entry['grpo_reward_last4']:.1f}%")
        if REWARD_RANGE[0] <= entry["grpo_reward_last4"] <= REWARD_RANGE[1]:
            record["chosen"] = family
    record["minutes"] = (time.time() - started) / 60
    (args.out / "pilot.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
