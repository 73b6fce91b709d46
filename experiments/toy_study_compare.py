"""Does a rerun of the toy study reproduce it? Compares two run directories number by number.

    python experiments/toy_study.py --out runs/toy_study_rerun --report runs/toy_study_rerun/toy_study.md
    python experiments/toy_study_compare.py runs/toy_study runs/toy_study_rerun

For every method and every number of the report's tables (final Query-KL, Policy-KL, entropy, train reward, Avg@k per
temperature and the T ≤ 1.0 / T > 1.0 means, the train-vs-eval gap) it prints both means over seeds, their
difference and the seed spread (the larger of the two standard deviations) as JSON. Exit status 1 when a difference
exceeds the seed spread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_study import FULL, METHODS, latest_log_dir, run_slug  # noqa: E402
from toy_study_report import RunRecord, collect, seed_std  # noqa: E402


def load_runs(out: Path) -> list[RunRecord]:
    """Every finished (method, seed) run under a study's run directory (`<out>/<method slug>/seed<k>`)."""
    records = []
    for method in METHODS:
        for seed_dir in sorted((out / run_slug(method)).glob("seed*")):
            records.append(RunRecord(method, int(seed_dir.name[4:]), latest_log_dir(seed_dir), 0.0))
    if not records:
        raise SystemExit(f"no toy-study runs under {out}")
    return records


def compare(first: Path, second: Path) -> dict[str, dict[str, dict[str, float]]]:
    """method -> quantity -> {first, second, difference, seed_std} (means over seeds)."""
    tables = [collect(load_runs(out), FULL) for out in (first, second)]
    result: dict[str, dict[str, dict[str, float]]] = {}
    for method, quantities in tables[0].items():
        for name, values in quantities.items():
            if name == "minutes":
                continue
            a, b = np.asarray(values, dtype=float), np.asarray(tables[1][method][name], dtype=float)
            spread = max(float(seed_std(a)), float(seed_std(b)))
            result.setdefault(method, {})[name] = {
                "first": float(a.mean()), "second": float(b.mean()),
                "difference": float(b.mean() - a.mean()), "seed_std": float(spread),
            }  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="run directory of the study (e.g. runs/toy_study)")
    parser.add_argument("second", type=Path, help="run directory of the rerun")
    args = parser.parse_args()
    result = compare(args.first, args.second)
    outside = [f"{method}/{name}" for method, quantities in result.items() for name, q in quantities.items()
               if abs(q["difference"]) > q["seed_std"]]  # fmt: skip
    print(json.dumps({"quantities": result, "outside_seed_spread": outside}, indent=1))
    sys.exit(1 if outside else 0)


if __name__ == "__main__":
    main()
