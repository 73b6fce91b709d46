"""Query sources: a built-in benchmark name, a Hugging Face Hub dataset, or a local file, read with `datasets`.

Every source becomes a list of `Query` (stable id, problem text, gold answer) after validation. A bad row (missing,
empty or non-text problem/answer, duplicate id) is an error naming the file, row and field, or, with
`skip_invalid`, a skipped row counted in a printed summary. Nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, fields, replace
from pathlib import Path

import datasets

# File extension -> `datasets` builder. `.json` may hold JSON Lines or one JSON array; the json builder reads both.
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
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
        problem_field, answer_field: column names (default "problem", "answer").
        id_field: column holding a stable id; None uses "id" when the column exists, else a hash of the problem.
        answer_transform: "first" (take element 0 of a list answer) or "after_hash" (text after the last
            "####", GSM8K style); None keeps the answer as is.
        limit: read only the first `limit` rows.
        label: prefix of the query ids (default: the name, the file stem or the Hub id), so that two sources
            numbering their rows 0, 1, ... do not collide.
        hub: with `name`, read the registry's Hub dataset even when a packaged copy exists.
    """

    name: str | None = None
    path: str | None = None
    hub_id: str | None = None
    config: str | None = None
    split: str | None = None
    data_files: str | None = None
    problem_field: str | None = None
    answer_field: str | None = None
    id_field: str | None = None
    answer_transform: str | None = None
    limit: int | None = None
    label: str | None = None
    hub: bool = False


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
    """One validated training query. `row` is 1-based within its source, for error messages."""

    query_id: str
    problem: str
    answer: str
    source: str
    row: int


class DataError(ValueError):
    """A source cannot be used as configured; the message says where and what to change."""


def resolve_spec(spec: SourceSpec | dict) -> SourceSpec:
    """Validate a source spec (a dict from YAML is accepted) and fill in the registry defaults."""
    if isinstance(spec, dict):
        unknown = set(spec) - {f.name for f in fields(SourceSpec)}
        if unknown:
            raise DataError(f"unknown source keys {sorted(unknown)}; allowed: {[f.name for f in fields(SourceSpec)]}")
        spec = SourceSpec(**spec)
    locations = [key for key in ("name", "path", "hub_id") if getattr(spec, key)]
    if len(locations) != 1:
        raise DataError(f"a source needs exactly one of name / path / hub_id, got {locations or 'none'}: {spec}")
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
            given = {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) not in (None, False)}
            spec = replace(SourceSpec(path=str(packaged), label=spec.name), **{**given, "name": None})
        else:
            given = {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) is not None}
            spec = replace(REGISTRY[spec.name], **given)
    if spec.answer_transform not in (None, "first", "after_hash"):
        raise DataError(f"answer_transform must be first, after_hash or null, got {spec.answer_transform!r}")
    return spec


def describe(spec: SourceSpec) -> str:
    """Where a source lives, as error messages name it."""
    if spec.path:
        return spec.path
    parts = [spec.hub_id, spec.config, spec.data_files, f"split={spec.split or 'train'}"]
    return "hub:" + ":".join(part for part in parts if part)


def read_rows(spec: SourceSpec) -> datasets.Dataset:
    """The raw rows of a resolved source, as a `datasets.Dataset` (Hub access only for Hub sources)."""
    if spec.path:
        path = Path(spec.path)
        if path.suffix not in LOCAL_BUILDERS:
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(LOCAL_BUILDERS)}")
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        table = datasets.load_dataset(LOCAL_BUILDERS[path.suffix], data_files=str(path), split="train")
        if path.suffix == ".csv":
            # Reread every column as text: type inference would turn an answer like "025" into the integer 25.
            text = datasets.Features({column: datasets.Value("string") for column in table.column_names})
            table = datasets.load_dataset("csv", data_files=str(path), split="train", features=text)
    else:
        table = _load_hub(spec)
    if spec.limit is not None:
        table = table.select(range(min(spec.limit, len(table))))
    return table


def _load_hub(spec: SourceSpec) -> datasets.Dataset:
    """A Hub dataset; without network access a DataError that says how to use a local copy instead."""
    try:
        return datasets.load_dataset(spec.hub_id, spec.config, split=spec.split or "train", data_files=spec.data_files)
    except (ConnectionError, OSError) as error:  # requests' and huggingface_hub's offline errors derive from these
        raise DataError(
            f"no network: cannot read {describe(spec)} ({type(error).__name__}: {str(error)[:200]}); "
            "download it on a machine with access and point `path:` at the file"
        ) from error


def _answer_text(value: object, transform: str | None) -> str | None:
    """The gold answer as text, or None when it is not usable. Numbers are written as text, lists need `first`."""
    if transform == "first" and isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    if transform == "after_hash":
        value = value.rsplit("####", 1)[-1] if "####" in value else ""
    return value.strip() or None


def _check_columns(table: datasets.Dataset, spec: SourceSpec, where: str) -> tuple[str, str, str | None]:
    problem_field, answer_field = spec.problem_field or "problem", spec.answer_field or "answer"
    id_field = spec.id_field if spec.id_field is not None else ("id" if "id" in table.column_names else None)
    for key, column in (("problem_field", problem_field), ("answer_field", answer_field), ("id_field", id_field)):
        if column is not None and column not in table.column_names:
            raise DataError(f"{where}: no column {column!r} ({key}); its columns are {table.column_names}. Set {key}.")
    return problem_field, answer_field, id_field


def load_queries(spec: SourceSpec | dict, skip_invalid: bool = False) -> tuple[list[Query], Counter]:
    """Read and validate one source.

    Returns:
        the valid queries in file order, and a Counter of skipped rows by reason (empty unless `skip_invalid`).
    Raises:
        DataError listing the bad rows (file, 1-based row, field, problem) when `skip_invalid` is False.
    """
    spec = resolve_spec(spec)
    where = describe(spec)
    table = read_rows(spec)
    problem_field, answer_field, id_field = _check_columns(table, spec, where)
    label = spec.label or spec.name or (Path(spec.path).stem if spec.path else spec.hub_id)

    queries: list[Query] = []
    problems: list[str] = []
    skipped: Counter = Counter()
    first_row_of: dict[str, int] = {}
    for row_number, row in enumerate(table, start=1):
        problem, answer = row[problem_field], _answer_text(row[answer_field], spec.answer_transform)
        issue = None  # (field, reason counted in the summary, detail)
        if not isinstance(problem, str) or not problem.strip():
            issue = (problem_field, "bad problem", f"problem is {problem!r:.60} (empty or not text)")
        elif answer is None:
            issue = (answer_field, "bad answer", f"answer is {row[answer_field]!r:.60} (missing, empty or not text)")
        else:
            raw_id = row[id_field] if id_field else hashlib.sha256(problem.encode()).hexdigest()[:16]
            query_id = f"{label}/{raw_id}"
            if raw_id is None or str(raw_id).strip() == "":
                issue = (id_field, "bad id", f"id is {raw_id!r}")
            elif query_id in first_row_of:
                same = "same id" if id_field else "same problem text"
                detail = f"duplicate id {query_id!r} ({same} as row {first_row_of[query_id]})"
                issue = (id_field or problem_field, "duplicate id", detail)
        if issue is not None:
            problems.append(f"{where} row {row_number}, field {issue[0]!r}: {issue[2]}")
            skipped[issue[1]] += 1
            continue
        first_row_of[query_id] = row_number
        queries.append(Query(query_id, problem, answer, where, row_number))

    if problems and not skip_invalid:
        listed = "\n  ".join(problems[:MAX_LISTED_ERRORS])
        more = f"\n  ... and {len(problems) - MAX_LISTED_ERRORS} more" if len(problems) > MAX_LISTED_ERRORS else ""
        raise DataError(
            f"{len(problems)} invalid row(s) in {where}:\n  {listed}{more}\n"
            "Fix the data, correct problem_field/answer_field/id_field, or set skip_invalid: true to skip such rows."
        )
    return queries, skipped
