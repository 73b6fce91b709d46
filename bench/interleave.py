"""Interleaved runs for the benches: every side once per round, in an order reversed every other round, so that a
change in the machine's load (shared CPUs) hits all sides alike. Ratios are then taken within one run."""

import importlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence


def alternating(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, name) for `rounds` rounds of every name: in order in even rounds, reversed in odd ones."""
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else list(reversed(names)):
            yield round_index, name


def run_workers(
    script: str, workers: dict[str, list[str]], rounds: int, sources: dict[str, str] | None = None
) -> dict[str, list[dict]]:
    """Run `python script <this command's arguments> <flags>` for each worker's flags, each in a fresh process (so
    its peak memory is its own), interleaved over `rounds`. `sources`: worker -> a source tree (a checkout or
    worktree of another commit) whose `erpo_lightning` that worker imports instead of this one's (its PYTHONPATH),
    so "before against after" is one interleaved run. Returns, per worker, the JSON object each run printed on its
    last line of output; exits naming the worker and its stderr tail when one fails."""
    results: dict[str, list[dict]] = {name: [] for name in workers}
    for _, name in alternating(list(workers), rounds):
        command = [sys.executable, script, *sys.argv[1:], *workers[name]]
        source = (sources or {}).get(name)
        env = None if source is None else {**os.environ, "PYTHONPATH": source}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            sys.exit(f"worker {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def spread(rounds: list[list[float]]) -> dict:
    """One side's timed steps (s) and their spread: `step_s` per round (one list per run, in round order), and
    `step_s_median`, `step_s_min`, `step_s_max` and `step_s_iqr` ([first quartile, third quartile], inclusive
    method) over all of its steps."""
    steps = [t for run in rounds for t in run]
    quartiles = statistics.quantiles(steps, n=4, method="inclusive") if len(steps) > 1 else steps * 3
    return {
        "step_s": rounds,
        "step_s_median": statistics.median(steps),
        "step_s_min": min(steps),
        "step_s_iqr": [quartiles[0], quartiles[2]],
        "step_s_max": max(steps),
    }


def round_ratios(summary: dict[str, dict], pairs: dict[str, tuple[str, str]]) -> dict[str, list[float]]:
    """Each ratio of `pairs` (name -> (numerator side, denominator side), both `spread`s in `summary`) taken within
    each round alone: the median of the numerator's steps in that round over the denominator's, one value per round.
    The sides of a round ran back to back, so these values' spread is how much the ratio moves with the machine's
    load; a ratio whose rounds straddle 1 does not tell the sides apart. Pairs with a side missing are left out."""
    return {
        name: [
            statistics.median(top) / statistics.median(bottom)
            for top, bottom in zip(summary[numerator]["step_s"], summary[denominator]["step_s"], strict=True)
        ]
        for name, (numerator, denominator) in pairs.items()
        if numerator in summary and denominator in summary
    }


def import_first(*paths: str):
    """The object at the first of `paths` (dotted, "package.module.name") that exists: a worker run with an older
    tree's package (`sources` above) finds a name where that tree keeps it (modules moved between commits). Raises
    ImportError naming every path tried when none exists."""
    tried = []
    for path in paths:
        module, _, name = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as error:
            if error.name is None or not (module == error.name or module.startswith(f"{error.name}.")):
                raise  # the module exists but one of its own imports is missing: not a moved name
            tried.append(f"{path} (no module {error.name})")
        except AttributeError:
            tried.append(f"{path} (no {name} in {module})")
    raise ImportError("none of these exists in the erpo_lightning on PYTHONPATH: " + "; ".join(tried))
