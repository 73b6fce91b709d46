"""Does a rerun of a study confirm its claims? One verdict per claim: held, not held or not checked.

    python -m studies.engine.compare toy runs/rerun               # against the toy study's shipped claims
    python -m studies.engine.compare real_model runs/real_rerun   # against the real-model study's

The rerun (and `--shipped`) is a study's run directory (its claims are computed from the runs' logs, with the arms
and settings of its `study.json`) or a claims file written beside a report (`*_claims.json`). Each claim the shipped
study found firm (`holds` / `confirmed`, `fails` / `refuted`) is `held` when the rerun agrees in more than half of
its seeds, `not held` otherwise; other claims, and claims whose arms the rerun did not run, are `not checked`
(studies/engine/claims.py). Exit status 1 when a claim is not held or none could be checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from studies.engine.claims import confirm, evaluate_all
from studies.engine.definition import Study, StudySettings
from studies.engine.report import benchmark_label, collect, estimators
from studies.engine.run import REPO, STUDY_FILE
from studies.engine.runs import load_runs


def shipped_claims(study: Study) -> Path:
    """The claims file the study's full report writes (beside it, in the repository)."""
    return REPO / study.report.with_name(study.report.stem + "_claims.json")


def study_claims(study: Study, path: Path) -> tuple[dict, list[dict]]:
    """The description and evaluated claims of a run of `study`: its run directory, or a `*_claims.json` file."""
    if not path.exists():
        raise SystemExit(
            f"{path} does not exist (`python -m {study.module}` writes a study's claims beside its report)"
        )
    if path.is_file():
        data = json.loads(path.read_text())
        return data["study"], data["claims"]
    if not (path / STUDY_FILE).is_file():
        raise SystemExit(f"{path} is neither a claims file nor a study run directory (no {STUDY_FILE})")
    description = json.loads((path / STUDY_FILE).read_text())
    records = load_runs(path, list(description["methods"]), study.name)
    if study.table is not None:  # a study whose claims read its trajectories or derived rows
        settings = description["settings"]
        table = study.table(records, StudySettings(**{**settings, "seeds": tuple(settings["seeds"]),
                                                      "temperatures": tuple(settings["temperatures"])}))  # fmt: skip
    else:
        table = collect(records, description["settings"]["temperatures"], benchmark_label(records))
    return description, evaluate_all(table, estimators(records), study.claims)


def compare(shipped: list[dict], rerun: list[dict]) -> list[tuple[str, dict, dict | None]]:
    """(check, shipped claim, the rerun's claim or None) per shipped claim, matched by key."""
    by_key = {claim["key"]: claim for claim in rerun}
    return [(confirm(claim, by_key.get(claim["key"])), claim, by_key.get(claim["key"])) for claim in shipped]


def summary(claim: dict | None) -> str:
    """`verdict k/n (median m)` of one study's result on a claim."""
    if claim is None:
        return "absent"
    median = "" if claim["median"] is None else f", median {claim['median']:.3g}"
    return f"{claim['verdict']} {claim['k']}/{claim['n']} seeds{median}"


def main(study: Study, argv: list[str] | None = None) -> None:
    """Compare a rerun of `study` with its shipped claims (or `--shipped`), as the module docstring says."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rerun", type=Path, help="the rerun's run directory (e.g. runs/rerun) or its *_claims.json")
    parser.add_argument("--shipped", type=Path, default=shipped_claims(study),
                        help="the study's claims file (default: the shipped one), or its run directory")  # fmt: skip
    args = parser.parse_args(argv)
    (described, shipped), (rerun_described, claims) = study_claims(study, args.shipped), study_claims(study, args.rerun)
    ours, theirs = described["model"]["sha256"], rerun_described["model"]["sha256"]
    print(f"model: the rerun's is {'the same as' if ours == theirs else 'NOT the same as'} the study's "
          f"(sha256 {theirs[:16]}, study {ours[:16]})")  # fmt: skip
    results = compare(shipped, claims)
    for check, claim, theirs in results:
        print(f"{check:<12} {claim['key']}: {claim['text']} | study: {summary(claim)} | rerun: {summary(theirs)}")
    counts = {check: sum(result[0] == check for result in results) for check in ("held", "not held", "not checked")}
    print(", ".join(f"{count} {check}" for check, count in counts.items()))
    sys.exit(1 if counts["not held"] or not counts["held"] else 0)


if __name__ == "__main__":
    from studies.registry import STUDIES

    if len(sys.argv) < 2 or sys.argv[1] not in STUDIES:
        sys.exit(f"usage: python -m studies.engine.compare {{{','.join(STUDIES)}}} <rerun> [--shipped PATH]")
    main(STUDIES[sys.argv[1]], sys.argv[2:])
