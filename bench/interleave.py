"""Interleaved runs for the benches: every side once per round, in an order reversed every other round, so that a
change in the machine's load (shared CPUs) hits all sides alike. Ratios are then taken within one run."""

import importlib
import json
import os
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
