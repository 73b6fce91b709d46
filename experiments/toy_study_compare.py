"""Does a rerun of the toy study confirm its claims? One verdict per claim: held, not held or not checked.

    python experiments/toy_study.py --out runs/rerun --report runs/rerun/toy_study.md
    python experiments/toy_study_compare.py runs/rerun                  # against docs/toy_study_claims.json

The rerun (and `--shipped`) is a study's run directory (its claims are computed from the runs' logs, with the
methods and settings of its `study.json`) or a claims file written beside a report (`*_claims.json`). Each claim of
the shipped study that `holds` (or `fails`) is `held` when the rerun agrees in more than half of its seeds, `not held`
otherwise; `mixed` claims, and claims whose methods the rerun did not run, are `not checked`
(experiments/toy_study_claims.py). Exit status 1 when a claim is not held or none could be checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_study import REPO, STUDY_FILE, StudySettings, load_runs  # noqa: E402
from toy_study_claims import confirm, evaluate_all  # noqa: E402
from toy_study_report import collect, estimators  # noqa: E402

SHIPPED_CLAIMS = REPO / "docs" / "toy_study_claims.json"


def study_claims(path: Path) -> tuple[dict, list[dict]]:
    """The study description and evaluated claims of a study: its run directory, or a `*_claims.json` file."""
    if not path.exists():
        raise SystemExit(f"{path} does not exist (experiments/toy_study.py writes a study's claims beside its report)")
    if path.is_file():
        data = json.loads(path.read_text())
        return data["study"], data["claims"]
    if not (path / STUDY_FILE).is_file():
        raise SystemExit(f"{path} is neither a claims file nor a study run directory (no {STUDY_FILE})")
    study = json.loads((path / STUDY_FILE).read_text())
    settings = StudySettings(**{key: tuple(v) if isinstance(v, list) else v for key, v in study["settings"].items()})
    records = load_runs(path, list(study["methods"]))
    return study, evaluate_all(collect(records, settings), estimators(records))


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rerun", type=Path, help="the rerun's run directory (e.g. runs/rerun) or its *_claims.json")
    parser.add_argument("--shipped", type=Path, default=SHIPPED_CLAIMS,
                        help="the study's claims file (default: the shipped one), or its run directory")  # fmt: skip
    args = parser.parse_args(argv)
    (study, shipped), (rerun_study, claims) = study_claims(args.shipped), study_claims(args.rerun)
    ours, theirs = study["model"]["sha256"], rerun_study["model"]["sha256"]
    print(f"model: the rerun's is {'the same as' if ours == theirs else 'NOT the same as'} the study's "
          f"(sha256 {theirs[:16]}, study {ours[:16]})")  # fmt: skip
    results = compare(shipped, claims)
    for check, claim, theirs in results:
        print(f"{check:<12} {claim['key']}: {claim['text']} | study: {summary(claim)} | rerun: {summary(theirs)}")
    counts = {check: sum(result[0] == check for result in results) for check in ("held", "not held", "not checked")}
    print(", ".join(f"{count} {check}" for check, count in counts.items()))
    sys.exit(1 if counts["not held"] or not counts["held"] else 0)


if __name__ == "__main__":
    main()
