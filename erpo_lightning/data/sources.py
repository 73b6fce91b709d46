"""Query sources: a built-in benchmark name, a Hugging Face Hub dataset (read with `datasets`), or a local file.

Every source becomes a list of `Query` (stable id, problem text, gold answer, and the values of the extra `columns`
it names, which the reward receives) after validation. A bad row (one that cannot be read: a JSON syntax error, bytes
that are not UTF-8; a missing, empty or non-text problem/answer; a text problem among conversations in one column, or
the reverse; a gold answer no response can ever match; a duplicate id; no value in a named column) is an error naming
the file, row (and line) and field, or, with `skip_invalid`, a skipped row counted in a printed summary. Nothing is
dropped silently; a source without rows is an error naming it.
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import datasets

from erpo_lightning.data.files import DataError, RawRow, Table, read_local_file
from erpo_lightning.data.rows import ProblemKinds, RowFields, check_columns, row_issue
from erpo_lightning.rewards.protocol import RESERVED_NAMES

LOCAL_FORMATS = (".csv", ".json", ".jsonl", ".parquet")  # `.json`: one JSON array, or JSON Lines
MAX_LISTED_ERRORS = 10
# Evaluation benchmarks shipped with the package (provenance and licenses: benchmarks/README.md).
BENCHMARK_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@dataclass
class SourceSpec:
    """Where to read queries from and how to map their fields. Give exactly one of `name`, `path`, `hub_id`.

    Attributes:
        name: a built-in benchmark (`REGISTRY`). Names with a packaged copy (`BENCHMARK_DIR`: math500, aime24,
            amc23, minerva_math, olympiadbench, gsm8k) read it, offline; `hub: true` reads the Hub copy instead,
            whose id and field map are the defaults that any field given here overrides (e.g. `split: train`).
        path: a local `.jsonl` / `.json` / `.parquet` / `.csv` file.
        hub_id: a Hugging Face Hub dataset id, with optional `config`, `split` (default "train") and `data_files`
            (a file inside the dataset repository).
        problem_field: the problem's column (default "problem"). A cell holding a list of {role, content} turns
            (a TRL-style `messages` or conversational `prompt` column) is a conversation, rendered with the
            tokenizer's chat template as given; its problem text (the reward's `problems`) is its last user turn.
        answer_field: the gold answer's column (default "answer"); None for data without golds, for rewards that
            take none (a reward that needs golds is refused on such data: `reward_needs_golds`).
        id_field: column holding a stable id; None uses "id" when the column exists, else a hash of the problem.
        answer_transform: "first" (take element 0 of a list answer) or "after_hash" (text after the last
            "####", GSM8K style); None keeps the answer as is.
        limit: read only the first `limit` rows.
        label: prefix of the query ids (default: the name, the file stem or the Hub id), so that two sources
            numbering their rows 0, 1, ... do not collide.
        hub: with `name`, read the registry's Hub dataset even when a packaged copy exists.
        columns: extra columns to carry with each query to the reward, which receives each by its name as a
            keyword argument, one value per response (e.g. `[difficulty, topic]`; docs/rewards.md). Names are
            Python identifiers other than responses, golds, prompts and problems; a row without a value (absent
            or null) in one is a bad row. Not part of the reference cache's fingerprint: they do not change the
            queries.
        weight: this source's share of the training stream when several are mixed (OpenRLHF's `prompt_data_probs`):
            each drawn query comes from source s with probability weight_s / sum of weights (`sampler.py`). Give
            every source of `data.train` a weight, or none.
    """

    name: str | None = None
    path: str | None = None
    hub_id: str | None = None
    config: str | None = None
    split: str | None = None
    data_files: str | None = None
    problem_field: str | None = None
    answer_field: str | None = "answer"
    id_field: str | None = None
    answer_transform: str | None = None
    limit: int | None = None
    label: str | None = None
    hub: bool = False
    columns: list[str] | None = None
    weight: float | None = None


@dataclass
class DatasetSource(SourceSpec):
    """A source held in memory (Python API only): a `datasets.Dataset`, with the field map of any source.

    `QueryDataModule(train=[dataset])` wraps a bare Dataset in one; give `DatasetSource(dataset=..., problem_field=...,
    label=...)` (or a dict with a `dataset` key) to map its fields. Its rows are named `<label> row N` in messages.
    """

    dataset: Any = None


# Hub ids and field maps checked against the datasets' cards. Names with a file in BENCHMARK_DIR read that file.
REGISTRY: dict[str, SourceSpec] = {
    "math500": SourceSpec(hub_id="HuggingFaceH4/MATH-500", split="test", id_field="unique_id"),
    "aime24": SourceSpec(hub_id="HuggingFaceH4/aime_2024", split="train", id_field="id"),
    "aime25": SourceSpec(hub_id="math-ai/aime25", split="test", id_field="id"),
    "amc23": SourceSpec(hub_id="math-ai/amc23", split="test", problem_field="question", id_field="id"),
    "minerva_math": SourceSpec(hub_id="math-ai/minervamath", split="test", problem_field="question"),
    "olympiadbench": SourceSpec(
        hub_id="Hothan/OlympiadBench",
        config="OE_TO_maths_en_COMP",
        split="train",
        problem_field="question",
        answer_field="final_answer",
        id_field="id",
        answer_transform="first",
    ),
    "gsm8k": SourceSpec(
        hub_id="openai/gsm8k", config="main", split="test", problem_field="question", answer_transform="after_hash"
    ),
    # MATH levels 3-5 as SimpleRL-Zoo ships it (8,523 problems): the ERPO paper's training set.
    "math_level3to5": SourceSpec(
        hub_id="hkust-nlp/SimpleRL-Zoo-Data",
        data_files="simplelr_qwen_level3to5/train.parquet",
        split="train",
        problem_field="question",
        answer_field="gt_answer",
    ),
}


@dataclass(frozen=True)
class Query:
    """One validated training query. `row` is 1-based within its source, for error messages; `columns` holds the
    values of the extra columns its source names (`SourceSpec.columns`), by name; `answer` is None for a source
    without golds (`answer_field: None`); `messages` holds the turns of a conversational row (None for a problem
    text), whose `problem` is then its last user turn."""

    query_id: str
    problem: str
    answer: str | None
    source: str
    row: int
    columns: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, str], ...] | None = None


def _given(spec: SourceSpec) -> dict[str, Any]:
    """The fields of `spec` set to something other than their default (`answer_field: None` included)."""
    return {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) != f.default}


def resolve_spec(spec: SourceSpec | dict | datasets.Dataset) -> SourceSpec:
    """Validate a source spec (a dict from YAML, or in Python a `datasets.Dataset`, are accepted) and fill in the
    registry defaults."""
    if isinstance(spec, datasets.Dataset):
        spec = DatasetSource(dataset=spec)
    if isinstance(spec, (list, tuple)):
        raise DataError(
            f"a source is a mapping (name / path / hub_id, and its field map), a SourceSpec or, in Python, a "
            f"datasets.Dataset; got a {type(spec).__name__} of {len(spec)} item(s): to train on rows held in memory, "
            "pass datasets.Dataset.from_list(rows)"
        )
    if isinstance(spec, dict):
        kind = DatasetSource if "dataset" in spec else SourceSpec
        unknown = set(spec) - {f.name for f in fields(kind)}
        if unknown:
            raise DataError(unknown_keys_message(sorted(unknown)))
        spec = kind(**spec)
    locations = [key for key in ("name", "path", "hub_id", "dataset") if getattr(spec, key, None) is not None]
    if len(locations) != 1:
        raise DataError(
            f"a source needs exactly one of name / path / hub_id (or, in Python, dataset), got {locations or 'none'}: "
            f"{spec}"
        )
    if isinstance(spec, DatasetSource) and not isinstance(spec.dataset, datasets.Dataset):
        raise DataError(
            f"dataset must be a datasets.Dataset (one split), got a {type(spec.dataset).__name__}; "
            "for a DatasetDict pick a split, e.g. dataset['train']"
        )
    if spec.hub and not spec.name:
        raise DataError(f"hub: true needs a registry name (name: ...); for another Hub dataset set hub_id: {spec}")
    if spec.name:
        if spec.name not in REGISTRY:
            raise DataError(f"unknown benchmark {spec.name!r}; built-in: {sorted(REGISTRY)}")
        packaged = BENCHMARK_DIR / f"{spec.name}.jsonl"
        hub_only = [key for key in ("config", "split", "data_files") if getattr(spec, key) is not None]
        if packaged.is_file() and not spec.hub:
            if hub_only:
                raise DataError(f"{hub_only} apply to the Hub copy of {spec.name!r}; add hub: true to read it")
            # The packaged files use the plain field names (id / problem / answer), already transformed.
            spec = replace(SourceSpec(path=str(packaged), label=spec.name), **{**_given(spec), "name": None})
        else:
            spec = replace(REGISTRY[spec.name], **{**_given(spec), "name": spec.name})
    if spec.answer_transform not in (None, "first", "after_hash"):
        raise DataError(f"answer_transform must be first, after_hash or null, got {spec.answer_transform!r}")
    check_column_names(spec.columns)
    if spec.weight is not None and not (isinstance(spec.weight, (int, float)) and 0 < spec.weight < float("inf")):
        raise DataError(f"weight of {describe(spec)} must be a positive number, got {spec.weight!r}")
    return spec


def check_column_names(columns: object) -> None:
    """DataError naming the first entry of a source's `columns` that a reward cannot receive as a keyword argument:
    not a list of strings, not a Python identifier, a reserved name (responses, golds, prompts, problems), or
    named twice."""
    if columns is None:
        return
    if not isinstance(columns, (list, tuple)):
        raise DataError(f"columns must be a list of column names, got {columns!r}")
    for index, name in enumerate(columns):
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise DataError(
                f"columns[{index}] is {name!r}: the reward receives each column as a keyword argument, so its name "
                "must be a Python identifier (letters, digits and '_', not starting with a digit)"
            )
        if name in RESERVED_NAMES:
            raise DataError(
                f"columns[{index}] is {name!r}, a name the reward already receives ({', '.join(RESERVED_NAMES)}); "
                "rename the column in the data"
            )
        if name in columns[:index]:
            raise DataError(f"columns names {name!r} twice")


def unknown_keys_message(keys: list[str]) -> str:
    """What a source with the misspelt `keys` is told: each key, the closest valid one, and every valid key."""
    valid = [f.name for f in fields(SourceSpec)]
    close = [match for key in keys for match in difflib.get_close_matches(key, valid, n=1)]
    hint = f" (did you mean {', '.join(repr(match) for match in close)}?)" if close else ""
    return f"unknown source keys {keys}{hint}; valid keys: {', '.join(valid)}"


_PARSER_UNKNOWN_KEY = re.compile(
    r"SourceSpec':\s+Option '(?P<key>[^']+)' is not accepted"
    r"|Group 'source' does not accept option '(?P<group_key>[^']+)'"
)


def parser_unknown_key_line(message: str) -> str | None:
    """The one-line error for a command-line parser message about a misspelt source key, or None for another message.

    jsonargparse reports a misspelt key of `data.train` or of a benchmark's `source` as the failure of every member of
    a union (a paragraph); this line names the setting, the key and the valid keys instead, e.g.
    `data.train: unknown source keys ['pth'] (did you mean 'path'?); valid keys: name, path, ...`.
    """
    found = _PARSER_UNKNOWN_KEY.search(message)
    if found is None:
        return None
    where = ".".join(re.findall(r'Parser key "([^"]+)"', message[: found.start()]))
    if found["group_key"] is not None:
        where += ".source"
    key = found["key"] or found["group_key"]
    return f"{where or 'source'}: {unknown_keys_message([key])}"


def describe(spec: SourceSpec) -> str:
    """Where a source lives, as error messages name it."""
    if isinstance(spec, DatasetSource):
        return f"in-memory dataset {spec.label or 'dataset'!r}"
    if spec.path:
        return spec.path
    parts = [spec.hub_id, spec.config, spec.data_files, f"split={spec.split or 'train'}"]
    return "hub:" + ":".join(part for part in parts if part)


def read_rows(spec: SourceSpec) -> Table:
    """The raw rows of a resolved source, each with its row (and line) number; Hub access only for Hub sources."""
    if spec.path:
        path = Path(spec.path)
        if path.suffix not in LOCAL_FORMATS:
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {list(LOCAL_FORMATS)}")
        return read_local_file(path, spec.limit)
    table = spec.dataset if isinstance(spec, DatasetSource) else _load_hub(spec)
    if spec.limit is not None:
        table = table.select(range(min(spec.limit, len(table))))
    return Table([RawRow(number, None, row) for number, row in enumerate(table, start=1)], table.column_names)


def _load_hub(spec: SourceSpec) -> datasets.Dataset:
    """A Hub dataset; without network access a DataError that says how to use a local copy instead."""
    try:
        return datasets.load_dataset(spec.hub_id, spec.config, split=spec.split or "train", data_files=spec.data_files)
    except (ConnectionError, OSError) as error:  # requests' and huggingface_hub's offline errors derive from these
        raise DataError(
            f"no network: cannot read {describe(spec)} ({type(error).__name__}: {str(error)[:200]}); "
            "download it on a machine with access and point `path:` at the file"
        ) from error


def load_queries(spec: SourceSpec | dict, skip_invalid: bool = False) -> tuple[list[Query], Counter]:
    """Read and validate one source.

    Returns:
        the valid queries in file order, and a Counter of skipped rows by reason (empty unless `skip_invalid`).
    Raises:
        DataError listing the bad rows (file, 1-based row and line, field, problem) when `skip_invalid` is False.
    """
    spec = resolve_spec(spec)
    where = describe(spec)
    table = read_rows(spec)
    if not table.rows:  # a file says so when it is read; an in-memory or Hub table, or `limit: 0`, here
        why = f"limit: {spec.limit}" if spec.limit is not None and spec.limit < 1 else "it has 0 rows"
        raise DataError(f"{where}: no rows to read ({why}); a source needs at least one row")
    declared = RowFields(
        problem=spec.problem_field,
        answer=spec.answer_field,
        id=spec.id_field,
        answer_transform=spec.answer_transform,
        carried=tuple(spec.columns or ()),
    )
    fields_ = check_columns(table.columns, declared, where)
    label = spec.label or spec.name or (Path(spec.path).stem if spec.path else spec.hub_id) or "dataset"

    queries: list[Query] = []
    problems: list[str] = []
    skipped: Counter = Counter()
    first_row_of: dict[str, int] = {}
    kinds = ProblemKinds.of(table.rows, fields_.problem)
    for row in table.rows:
        found, issue = row_issue(row, fields_, label, first_row_of, kinds)
        if issue is not None:
            field_name = f", field {issue[0]!r}" if issue[0] is not None else ""
            problems.append(f"{where} {row.position}{field_name}: {issue[2]}")
            skipped[issue[1]] += 1
            continue
        query_id, problem, answer, carried, messages = found
        first_row_of[query_id] = row.number
        queries.append(Query(query_id, problem, answer, where, row.number, carried, messages))

    if problems and not skip_invalid:
        listed = "\n  ".join(problems[:MAX_LISTED_ERRORS])
        more = f"\n  ... and {len(problems) - MAX_LISTED_ERRORS} more" if len(problems) > MAX_LISTED_ERRORS else ""
        raise DataError(
            f"{len(problems)} invalid row(s) in {where}:\n  {listed}{more}\n"
            "Fix the data, correct problem_field/answer_field/id_field, or set skip_invalid: true to skip such rows."
        )
    return queries, skipped
