"""Turn configured sources into the training set: validated queries, their prompt token ids, and a summary.

Everything left out is counted and reported (invalid rows with `skip_invalid`, prompts over `max_prompt_length`
with `overlong: drop`); with the strict settings it is an error that names the file, row and field instead.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

from erpo_lightning.data.sources import DataError, Query, SourceSpec, describe, load_queries, resolve_spec
from erpo_lightning.data.templates import PromptTemplate, tokenize_queries

Overlong = Literal["drop", "error"]
# A source losing more than this share of its valid rows to `max_prompt_length` is warned about, not only counted.
OVERLONG_WARN_SHARE = 0.25


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are rendered and bounded: a template, the longest prompt in tokens, and the tokenizer.

    The training data's (`QueryDataModule.prompt_format()`) is also what the temperature sweep renders its benchmarks
    with, so that eval prompts look like training prompts.

    Attributes:
        template: the prompt preset, resolved.
        max_prompt_length: longest prompt in tokens (template included).
        tokenizer: renders the prompts; None = the rollout sampler's (loaded when it is set up).
    """

    template: PromptTemplate
    max_prompt_length: int
    tokenizer: PreTrainedTokenizerBase | None = None


@dataclass
class PreparedQueries:
    """The training set. `queries[i]` and `prompt_ids[i]` are row i of the dataset and of the reference cache;
    `columns` names the extra data columns every query carries (`SourceSpec.columns`, the same for every source);
    `source_index[i]` is the position in `data.train` of query i's source, `source_names` describes each source, and
    `source_weights` are the sources' mixing weights (None when none is given)."""

    queries: list[Query]
    prompt_ids: list[list[int]]
    per_source: dict[str, int] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    dropped_overlong: int = 0
    longest_dropped: int = 0
    columns: tuple[str, ...] = ()
    source_index: list[int] = field(default_factory=list)
    source_weights: list[float] | None = None
    source_names: list[str] = field(default_factory=list)

    def problems(self, rows: Sequence[int]) -> list[str]:
        """The problem texts of dataset rows `rows`, in order."""
        return [self.queries[i].problem for i in rows]

    def data_columns(self, rows: Sequence[int]) -> dict[str, list] | None:
        """Each carried column's values at dataset rows `rows` (name -> one value per row); None without columns."""
        if not self.columns:
            return None
        return {name: [self.queries[i].columns[name] for i in rows] for name in self.columns}

    def summary(self, max_prompt_length: int) -> str:
        """One line saying what was loaded and what was left out, and why."""
        sources = ", ".join(f"{name}: {count}" for name, count in self.per_source.items())
        line = f"{len(self.queries)} training queries ({sources})"
        if self.skipped:
            reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items()))
            line += f"; skipped {sum(self.skipped.values())} invalid rows ({reasons})"
        if self.dropped_overlong:
            line += (
                f"; dropped {self.dropped_overlong} prompts longer than max_prompt_length={max_prompt_length} tokens "
                f"(longest {self.longest_dropped})"
            )
        return line


def _drop_cross_source_duplicates(queries: list[Query], skip_invalid: bool, skipped: Counter) -> list[Query]:
    """Ids are unique within a source (checked on load); two sources with the same label can still collide."""
    first: dict[str, Query] = {}
    kept = []
    for query in queries:
        if query.query_id in first:
            earlier = first[query.query_id]
            if not skip_invalid:
                raise DataError(
                    f"{query.source} row {query.row}: duplicate id {query.query_id!r}, already used by "
                    f"{earlier.source} row {earlier.row}. Give the sources distinct `label`s, "
                    "or set skip_invalid: true."
                )
            skipped["duplicate id"] += 1
            continue
        first[query.query_id] = query
        kept.append(query)
    return kept


def carried_columns(specs: Sequence[SourceSpec]) -> tuple[str, ...]:
    """The extra columns the training set carries: those every source names (`columns`), in the first's order.

    Raises:
        DataError naming two sources that name different columns: every query must carry the same ones, since the
        reward receives one value of each per response.
    """
    first = tuple(specs[0].columns or ())
    for spec in specs[1:]:
        if set(spec.columns or ()) != set(first):
            raise DataError(
                f"the sources {describe(specs[0])} and {describe(spec)} carry different columns "
                f"({list(first)} and {list(spec.columns or ())}): every source of a training set must name the same "
                "columns, since the reward receives one value of each for every response"
            )
    return first


def mixing_weights(specs: Sequence[SourceSpec]) -> list[float] | None:
    """The sources' mixing weights (`SourceSpec.weight`), or None when no source has one.

    Raises:
        DataError naming a source without a weight when another has one: a weight is a share of the stream, so every
        source needs one.
    """
    given = [spec.weight for spec in specs]
    if all(weight is None for weight in given):
        return None
    for spec, weight in zip(specs, given, strict=True):
        if weight is None:
            raise DataError(
                f"the source {describe(spec)} has no weight, but another source of data.train has one: give every "
                "source a weight (its share of the training stream), or none"
            )
    return [float(weight) for weight in given]


def reward_needs_golds(reward: object) -> str | None:
    """The name of the reward that grades against gold answers: `reward` itself, or for a `CombinedReward` its first
    such component (`CombinedReward component 'exact' (module.function)`); None when it takes no gold. A reward
    takes none when it declares `uses_golds = False`, as format-only and judge rewards do."""
    from erpo_lightning.rewards.combined import CombinedReward
    from erpo_lightning.rewards.protocol import reward_name

    if isinstance(reward, CombinedReward):
        for name, component in zip(reward.names, reward.rewards, strict=True):
            if reward_needs_golds(component) is not None:
                return f"CombinedReward component {name!r} ({reward_name(component)})"
        return None
    return reward_name(reward) if getattr(reward, "uses_golds", True) else None


def check_golds(data: PreparedQueries, reward: object) -> None:
    """DataError when the training set has queries without a gold answer (`answer_field: null`) and `reward` needs
    golds (`reward_needs_golds`), naming the reward and the first such source."""
    missing = next((query for query in data.queries if query.answer is None), None)
    needing = None if missing is None or reward is None else reward_needs_golds(reward)
    if needing is None:
        return
    raise DataError(
        f"the reward {needing} grades against gold answers, but the source {missing.source} has none "
        "(answer_field: null): set its answer_field to the gold column, or use a reward that takes no gold (one "
        "that declares uses_golds = False, e.g. a format-only or judge reward)"
    )


def warn_overlong_sources(
    queries: Sequence[Query],
    prompt_ids: Sequence[Sequence[int]],
    too_long: Sequence[int],
    positions: Sequence[int],
    specs: Sequence[SourceSpec],
    max_prompt_length: int,
) -> None:
    """Warn, once per source, when prompts over `max_prompt_length` take more than `OVERLONG_WARN_SHARE` of the
    source's valid rows: one info line is easy to miss when half a dataset is left out (a chat template can double a
    prompt's length).

    Args:
        queries, prompt_ids: the valid queries of every source and their prompt token ids, in order.
        too_long: indices into `queries` of the prompts over the limit.
        positions: the position in `specs` (`data.train`) of each query's source.
    """
    loaded = Counter(positions)
    dropped = Counter(positions[i] for i in too_long)
    for position, count in sorted(dropped.items()):
        if count <= OVERLONG_WARN_SHARE * loaded[position]:
            continue
        longest = max(len(prompt_ids[i]) for i in too_long if positions[i] == position)
        warnings.warn(
            f"data.train[{position}] ({describe(specs[position])}) lost {count} of its {loaded[position]} rows "
            f"({count / loaded[position]:.0%}, more than {OVERLONG_WARN_SHARE:.0%}) to prompts longer than "
            f"data.max_prompt_length={max_prompt_length} tokens (longest {longest}, template included): raise "
            "data.max_prompt_length (the model's context must hold it plus rollout.max_new_tokens), shorten the "
            "prompts, or set data.overlong: error to list them",
            stacklevel=3,
        )


def prepare_queries(
    sources: Sequence[SourceSpec | dict],
    tokenizer: PreTrainedTokenizerBase,
    template: PromptTemplate,
    max_prompt_length: int,
    overlong: Overlong = "drop",
    skip_invalid: bool = False,
) -> PreparedQueries:
    """Load every source, validate, render and tokenize prompts, and apply the prompt-length policy."""
    if overlong not in ("drop", "error"):
        raise ValueError(f"overlong must be 'drop' or 'error', got {overlong!r}")
    if not sources:
        raise DataError("no training sources configured (data.train is empty)")
    specs = [resolve_spec(spec) for spec in sources]  # every source's settings are checked before any is read
    for position, spec in enumerate(specs):
        dataset = getattr(spec, "dataset", None)
        if dataset is not None and dataset.num_rows == 0:  # unlabelled, it would be named only "dataset"
            raise DataError(
                f"data.train[{position}], the {describe(spec)} (a datasets.Dataset with columns "
                f"{dataset.column_names}), has no rows: a source needs at least one row"
            )
    columns = carried_columns(specs)
    weights = mixing_weights(specs)
    queries: list[Query] = []
    per_source: dict[str, int] = {}
    skipped: Counter = Counter()
    origin: dict[int, int] = {}  # id(query) -> position of its source in `specs`
    for position, spec in enumerate(specs):
        loaded, source_skipped = load_queries(spec, skip_invalid)
        queries.extend(loaded)
        origin.update((id(query), position) for query in loaded)
        skipped.update(source_skipped)
        if loaded:
            per_source[loaded[0].source] = per_source.get(loaded[0].source, 0) + len(loaded)
    queries = _drop_cross_source_duplicates(queries, skip_invalid, skipped)
    prompt_ids = tokenize_queries(template, queries, tokenizer)

    too_long = [i for i, ids in enumerate(prompt_ids) if len(ids) > max_prompt_length]
    if too_long and overlong == "error":
        listed = "\n  ".join(
            f"{queries[i].source} row {queries[i].row} (id {queries[i].query_id!r}): {len(prompt_ids[i])} tokens"
            for i in too_long[:10]
        )
        raise DataError(
            f"{len(too_long)} prompt(s) are longer than max_prompt_length={max_prompt_length} tokens "
            f"(template {template.name!r} included):\n  {listed}\n"
            "Raise max_prompt_length, or set overlong: drop to leave them out (they are counted and reported)."
        )
    warn_overlong_sources(
        queries, prompt_ids, too_long, [origin[id(query)] for query in queries], specs, max_prompt_length
    )
    keep = set(range(len(queries))) - set(too_long)
    kept = [q for i, q in enumerate(queries) if i in keep]
    prepared = PreparedQueries(
        queries=kept,
        prompt_ids=[ids for i, ids in enumerate(prompt_ids) if i in keep],
        per_source=per_source,
        skipped=skipped,
        dropped_overlong=len(too_long),
        longest_dropped=max((len(prompt_ids[i]) for i in too_long), default=0),
        columns=columns,
        source_index=[origin[id(query)] for query in kept],
        source_weights=weights,
        source_names=[describe(spec) for spec in specs],
    )
    if not prepared.queries:
        raise DataError(f"no training queries left: {prepared.summary(max_prompt_length)}")
    if weights is not None:
        for position, name in enumerate(prepared.source_names):
            if position not in prepared.source_index:
                raise DataError(
                    f"the source {name} has weight {weights[position]} but no training query left "
                    f"({prepared.summary(max_prompt_length)}): remove it from data.train or fix its rows"
                )
    return prepared
