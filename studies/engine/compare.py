"""Does a rerun of a study confirm its claims? One verdict per claim: held, not held or not checked.

    python -m studies.engine.compare toy runs/rerun               # against the toy study's shipped claims
    python -m studies.engine.compare real_model runs/real_rerun   # against the real-model study's

The rerun (and `--shipped`) is a study's run directory (its claims are computed from the runs' logs, with the arms
and settings of its `study.json`) or a claims file written beside a report (`*_claims.json`). Each claim the shipped
study found firm (`holds` / `confirmed`, `fails` / `refuted`) is `held` when the rerun agrees in more than half of
its seeds, `not held` otherwise; other claims, and claims whose arms the rerun did not run, are `not checked`
(studies/engine/claims.py). Exit status 1 when a claim is not held or none could be checked. A claims file or
`study.json` that cannot be read (cut short, empty, a list, a claim without its verdict) stops the command with one
line naming the file and what is wrong with it.
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


# What `main` reads of each claim of a claims file (studies.engine.claims.evaluate writes them all).
CLAIM_FIELDS = ("key", "text", "verdict", "k", "n", "median")


def read_json(path: Path, what: str) -> object:
    """The parsed JSON of `path`; SystemExit naming the file when it cannot be read, is empty or does not parse
    (`what` says what the file should be, for the message)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SystemExit(f"{path}: cannot be read as {what} ({type(error).__name__}: {error})") from None
    if not text.strip():
        raise SystemExit(f"{path} is empty, not {what}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"{path}: not readable as {what}, cut short or damaged ({error})") from None


def json_kind(value: object) -> str:
    """What JSON calls the kind of a parsed value (`object`, `list`, `string`, ...), for messages."""
    kinds = ((dict, "object"), (list, "list"), (str, "string"), (bool, "boolean"), (int | float, "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def claims_file_problem(data: object) -> str | None:
    """What is wrong with the parsed contents of a `*_claims.json` file, in words, or None when it has the shape a
    comparison reads: an object with `study` (its `model.sha256`) and `claims`, a list of objects with CLAIM_FIELDS."""
    if not isinstance(data, dict):
        return f"it holds a JSON {json_kind(data)}, not an object with 'study' and 'claims'"
    missing = [key for key in ("study", "claims") if key not in data]
    if missing:
        return f"no {' or '.join(repr(key) for key in missing)} entry"
    model = data["study"].get("model") if isinstance(data["study"], dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("sha256"), str):
        return "its 'study' entry has no model.sha256"
    if not isinstance(data["claims"], list):
        return f"its 'claims' entry is a JSON {json_kind(data['claims'])}, not a list"
    for index, claim in enumerate(data["claims"]):
        absent = [name for name in CLAIM_FIELDS if name not in claim] if isinstance(claim, dict) else list(CLAIM_FIELDS)
        if absent:
            return f"claim {index} lacks {', '.join(absent)}"
    return None


def read_claims_file(path: Path) -> tuple[dict, list[dict]]:
    """The study description and the claims of a `*_claims.json` file; SystemExit naming the file and what is wrong
    with it (not JSON, cut short, a list, a claim without its verdict, ...)."""
    data = read_json(path, "a claims file (JSON)")
    problem = claims_file_problem(data)
    if problem is not None:
        raise SystemExit(f"{path} is not a study's claims file: {problem} (a report writes it as <report>_claims.json)")
    return data["study"], data["claims"]


def description_problem(description: object) -> str | None:
    """What is wrong with a parsed `study.json` for a comparison (it needs `methods`, `settings` and
    `model.sha256`), in words, or None."""
    if not isinstance(description, dict):
        return f"it holds a JSON {json_kind(description)}, not an object"
    missing = [key for key in ("methods", "settings", "model") if key not in description]
    if missing:
        return f"no {', '.join(repr(key) for key in missing)} entry"
    model, settings = description["model"], description["settings"]
    if not isinstance(model, dict) or not isinstance(model.get("sha256"), str):
        return "its 'model' entry has no sha256"
    if not isinstance(settings, dict) or not {"seeds", "temperatures"} <= set(settings):
        return "its 'settings' entry lacks seeds or temperatures"
    return None


def study_claims(study: Study, path: Path) -> tuple[dict, list[dict]]:
    """The description and evaluated claims of a run of `study`: its run directory, or a `*_claims.json` file."""
    if not path.exists():
        raise SystemExit(
            f"{path} does not exist (`python -m {study.module}` writes a study's claims beside its report)"
        )
    if path.is_file():
        return read_claims_file(path)
    if not (path / STUDY_FILE).is_file():
        raise SystemExit(f"{path} is neither a claims file nor a study run directory (no {STUDY_FILE})")
    description = read_json(path / STUDY_FILE, "a study description (JSON)")
    problem = description_problem(description)
    if problem is not None:
        raise SystemExit(f"{path / STUDY_FILE} is not a study description: {problem}")
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
