"""The table of docs/real_model.md from finished runs of configs/smollm2_arith.yaml, one per seed.

    python -m studies.real_model.table runs/smollm2_arith/seed0 runs/smollm2_arith/seed1

Each run directory holds the CSV log (metrics.csv) and sweep_summary.json that the config writes; `<run>.log` beside
it, when present, holds `/usr/bin/time -v` output (wall time, peak RSS). Prints a markdown table: held-out Avg@k
before and after training by temperature, the training reward of the first and last 5 steps, the final Query-KL
(the trained sequence_k3 estimate and the token_k3 yardstick), wall time and peak RSS.
"""

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

TEMPERATURES = ("0.6", "1")
EDGE_STEPS = 5  # steps averaged at each end of training for the reward columns


def one_file(run: Path, name: str) -> Path:
    found = sorted(run.rglob(name))
    if len(found) != 1:
        sys.exit(f"{run}: expected one {name}, found {len(found)} (did the run finish?)")
    return found[0]


def time_log(run: Path) -> dict[str, str]:
    """Wall time and peak RSS from `/usr/bin/time -v` output in `<run>.log`; blanks when there is none."""
    log = run.with_name(run.name + ".log")
    text = log.read_text(errors="replace") if log.is_file() else ""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {
        "wall": wall.group(1) if wall else "",
        "peak_rss": f"{int(rss.group(1)) / 2**20:.1f} GiB" if rss else "",
    }


def run_row(run: Path) -> dict:
    summary = json.loads(one_file(run, "sweep_summary.json").read_text())
    rows = list(csv.DictReader(one_file(run, "metrics.csv").open()))
    steps = [row for row in rows if row.get("rollout/reward_mean")]
    rewards = [float(row["rollout/reward_mean"]) for row in steps]
    last_step = [row for row in rows if row.get("train/query_kl")][-1]
    out = {"run": run.name, "steps": len(steps), **time_log(run)}
    for temperature in TEMPERATURES:
        key = f"val/avg@k/toy_test/T={temperature}"
        out[f"before_{temperature}"] = 100 * summary["before"][key]
        out[f"after_{temperature}"] = 100 * summary["after"][key]
    out["reward_first"] = 100 * statistics.mean(rewards[:EDGE_STEPS])
    out["reward_last"] = 100 * statistics.mean(rewards[-EDGE_STEPS:])
    out["query_kl"] = float(last_step["train/query_kl"])
    out["query_kl_token_k3"] = float(last_step["train/query_kl_token_k3"])
    return out


def markdown(rows: list[dict]) -> str:
    head = ["run", "steps"]
    for temperature in TEMPERATURES:
        head += [f"Avg@4 T={temperature} before", "after", "change"]
    head += ["train reward, first 5 steps", "last 5 steps", "final Query-KL", "token_k3", "wall", "peak RSS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["run"], str(row["steps"])]
        for temperature in TEMPERATURES:
            before, after = row[f"before_{temperature}"], row[f"after_{temperature}"]
            cells += [f"{before:.1f}%", f"{after:.1f}%", f"{after - before:+.1f} pts"]
        cells += [f"{row['reward_first']:.1f}%", f"{row['reward_last']:.1f}%"]
        cells += [f"{row['query_kl']:.3g}", f"{row['query_kl_token_k3']:.3g}", row["wall"], row["peak_rss"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (trainer.default_root_dir of each seed)")
    args = parser.parse_args()
    print(markdown([run_row(run) for run in args.runs]))


if __name__ == "__main__":
    main()
