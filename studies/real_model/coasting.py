"""How much query log-likelihood each run lost on updates whose gradient was exactly 0 (AdamW coasting).

    python -m studies.real_model.coasting studies/real_model/runs/grpo/seed0 studies/real_model/runs/grpo/seed1

`train/query_loglik_change` at step t is ℓθ(q) − ℓθ0(q) (nats per query, summed over its tokens) of the weights
step t trained from, so the update of step t moved it by the next step's value minus this one's. An update whose
`train/grad_norm` is 0 (no group with reward variance, no Query-KL or Policy-KL pull) moved the policy only through
the optimizer's momentum and weight decay. The last step's update is not observed. Prints one line per run: the
zero-gradient steps, and the change between the first and last logged steps split into those two kinds of update.
"""

import argparse
import csv
import itertools
from pathlib import Path

from studies.real_model.table import one_file


def coasting_split(metrics_csv: Path) -> dict[str, float]:
    """{'steps', 'zero_grad_steps', 'change', 'change_on_zero_grad', 'change_on_signal'} of one run's metrics.csv."""
    rows: dict[int, tuple[float, float]] = {}
    with metrics_csv.open() as handle:
        for row in csv.DictReader(handle):
            if row.get("train/grad_norm") and row.get("train/query_loglik_change"):
                rows[int(row["step"])] = (float(row["train/grad_norm"]), float(row["train/query_loglik_change"]))
    steps = sorted(rows)
    on_zero = on_signal = 0.0
    for step, following in itertools.pairwise(steps):
        moved = rows[following][1] - rows[step][1]
        if rows[step][0] == 0.0:
            on_zero += moved
        else:
            on_signal += moved
    return {
        "steps": len(steps),
        "zero_grad_steps": sum(rows[step][0] == 0.0 for step in steps[:-1]),
        "change": rows[steps[-1]][1] - rows[steps[0]][1],
        "change_on_zero_grad": on_zero,
        "change_on_signal": on_signal,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, each holding one metrics.csv")
    for run in parser.parse_args().runs:
        split = coasting_split(one_file(run, "metrics.csv"))
        print(
            f"{run}: {split['zero_grad_steps']} of {split['steps'] - 1} observed updates had gradient norm 0; "
            f"query log-likelihood change {split['change']:+.2f} nats, of which {split['change_on_zero_grad']:+.2f} "
            f"on those updates and {split['change_on_signal']:+.2f} on the others"
        )


if __name__ == "__main__":
    main()
