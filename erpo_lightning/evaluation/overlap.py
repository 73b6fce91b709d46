"""Held-out overlap: the problems a sweep benchmark shares with the training set.

A benchmark that is the training file, or holds some of its problems, measures memory rather than generalisation, and
nothing in its accuracy says so. `overlap_warnings` compares problem texts (invisible characters removed, whitespace
runs collapsed) and says, per benchmark, how many of its problems the training set holds and in which files;
`TemperatureSweepCallback.setup` prints them before training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from erpo_lightning.data.sources import DataError, Query, describe, load_queries
from erpo_lightning.evaluation.sweep import SweepConfig, benchmark_source
from erpo_lightning.rewards.normalize import strip_invisible


def problem_key(problem: str) -> str:
    """The text two copies of one problem share: invisible characters removed, whitespace runs collapsed."""
    return " ".join(strip_invisible(problem).split())


def overlap_warnings(config: SweepConfig, training: Sequence[Query]) -> list[str]:
    """One line per benchmark of `config` that shares problems with `training` (the prepared training queries).

    A benchmark that cannot be read is left out: the sweep reports it, naming it, when it runs.
    """
    files_of: dict[str, set[str]] = {}
    for query in training:
        files_of.setdefault(problem_key(query.problem), set()).add(query.source)
    training_files = {_where(query.source) for query in training}
    lines = []
    for benchmark in config.benchmarks:
        try:
            label, spec = benchmark_source(benchmark, config)
            problems, _ = load_queries(spec, skip_invalid=True)
        except DataError:
            continue
        shared = [files_of[key] for key in map(problem_key, (q.problem for q in problems)) if key in files_of]
        if not shared:
            continue
        source = describe(spec)
        same = " (it is a training file)" if _where(source) in training_files else ""
        counts = Counter(file for files in shared for file in files)
        where = ", ".join(f"{count} in {file}" for file, count in sorted(counts.items()))
        lines.append(
            f"sweep benchmark {label!r} ({source}){same} shares {len(shared)} of its {len(problems)} problems with "
            f"the training set ({where}): its accuracy on them is not held-out"
        )
    return lines


def _where(source: str) -> str:
    """A source as `describe` names it, a local file by its resolved path (so that two spellings of it compare)."""
    return source if source.startswith("hub:") else str(Path(source).resolve())
