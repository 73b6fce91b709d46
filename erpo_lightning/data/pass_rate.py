"""Difficulty filtering by pass rate: keep the training queries the base model solves at a rate inside a band.

The offline filter samples `samples` responses per training query from the initial policy at one temperature, with
the training reward and the sweep's seeding (`derive_seed`, chunks of `batch_size` prompts, one engine call each),
and keeps query q when low <= pass rate(q) <= high (a response passes when its reward reaches the rollout's
correctness threshold). The rates are cached in a JSON file named by a fingerprint of what they depend on (model
weights, tokenizer, queries and prompt tokens, reward, sampling settings), so a changed band re-filters without
generating again. It is the baseline to compare ERPO's query weights w(q) with: a hard 0/1 weight from the base
model's pass rate instead of a soft one from its reference likelihood (docs/data.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from erpo_lightning.data.files import DataError
from erpo_lightning.data.fingerprint import _json_hash, dataset_fingerprint, resolve_model_dir, tokenizer_hash
from erpo_lightning.data.fingerprint import weights_hash as model_weights_hash
from erpo_lightning.data.prepare import PreparedQueries
from erpo_lightning.rollout.engine import TEMPERATURE_RANGE, derive_seed, is_sampling_temperature
from erpo_lightning.rollout.sampler import RolloutSampler


@dataclass
class PassRateFilter:
    """`data.pass_rate_filter`: keep training queries whose base-model pass rate lies in [low, high].

    Attributes:
        low, high: the band, inclusive (0 <= low <= high <= 1); e.g. 0.1 and 0.9 drop what the base model always or
            never solves, whose groups carry no learning signal.
        samples: responses per query (the pass rate's denominator).
        temperature: sampling temperature of those responses.
        max_new_tokens: response cap; None = the rollout callback's.
        batch_size: prompts per engine call.
        seed: base seed of the sampling (`derive_seed`, as the sweep seeds its calls).
    """

    low: float = 0.0
    high: float = 1.0
    samples: int = 8
    temperature: float = 1.0
    max_new_tokens: int | None = None
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(
                f"data.pass_rate_filter: the band needs 0 <= low <= high <= 1, got low={self.low}, high={self.high}"
            )
        for name in ("samples", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.pass_rate_filter.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"data.pass_rate_filter.max_new_tokens must be >= 1 (or null), got {self.max_new_tokens}")
        if not is_sampling_temperature(self.temperature):
            raise ValueError(f"data.pass_rate_filter.temperature must be {TEMPERATURE_RANGE}, got {self.temperature}")

    @classmethod
    def of(cls, value: PassRateFilter | dict | None) -> PassRateFilter | None:
        """The filter of a setting given as a dict (YAML, Python) or already built; None stays None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"data.pass_rate_filter must be a mapping of {list(asdict(cls()))}, got {value!r}")
        unknown = sorted(set(value) - set(asdict(cls())))
        if unknown:
            raise ValueError(f"data.pass_rate_filter: unknown keys {unknown}; valid keys: {', '.join(asdict(cls()))}")
        return cls(**value)


def pass_rates(data: PreparedQueries, sampler: RolloutSampler, settings: PassRateFilter) -> torch.Tensor:
    """[Q] the share of `settings.samples` responses to each query that the sampler grades correct.

    `sampler` must be set up on the base model; the sweep's chunking and seeding are used, so the rates are
    reproducible. The reward receives the queries' `problems` and data columns as in training.
    """
    max_new_tokens = settings.max_new_tokens or sampler.settings.max_new_tokens
    sampler = sampler.with_settings(max_new_tokens=max_new_tokens)
    rates = torch.zeros(len(data.queries), dtype=torch.float64)
    for chunk, first in enumerate(range(0, len(data.queries), settings.batch_size)):
        rows = list(range(first, min(first + settings.batch_size, len(data.queries))))
        graded = sampler.sample_and_grade(
            [data.prompt_ids[i] for i in rows],
            [data.queries[i].answer for i in rows],
            settings.samples,
            settings.temperature,
            derive_seed(settings.seed, 0, settings.samples, chunk, 0),
            problems=data.problems(rows),
            data_columns=data.data_columns(rows),
        )
        rates[first : first + len(rows)] = graded.correct.double().mean(dim=1)
    return rates


def pass_rate_fingerprint(model_path: str, data: PreparedQueries, reward_name: str, settings: PassRateFilter) -> dict:
    """What the pass rates depend on: the model's weights and tokenizer, the queries and their prompt tokens, the
    reward, and the sampling settings (not the band, which only selects among the rates)."""
    model_dir = resolve_model_dir(model_path)
    sampling = {key: value for key, value in asdict(settings).items() if key not in ("low", "high")}
    return {
        "weights_hash": model_weights_hash(model_dir),
        "tokenizer_hash": tokenizer_hash(model_dir),
        "dataset_fingerprint": dataset_fingerprint(data.queries),
        "prompt_tokens_hash": _json_hash([list(ids) for ids in data.prompt_ids]),
        "reward": reward_name,
        "sampling": sampling,
    }


def rates_file_name(fingerprint: dict) -> str:
    """The name of the file holding the rates of `fingerprint`: the first 16 hex digits of its sha256, `.json`."""
    return f"{_json_hash(fingerprint)[:16]}.json"


def load_or_compute_rates(path: Path, fingerprint: dict, compute) -> tuple[torch.Tensor, bool]:
    """The rates stored at `path` when its fingerprint is `fingerprint`, else `compute()`'s, written there (to a
    temporary file, renamed). Returns (rates, whether they were loaded)."""
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = {}
        if stored.get("fingerprint") == fingerprint:
            return torch.tensor(stored["rates"], dtype=torch.float64), True
    rates = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"fingerprint": fingerprint, "rates": rates.tolist()}))
    temporary.replace(path)
    return rates, False


def keep_band(data: PreparedQueries, rates: torch.Tensor, settings: PassRateFilter) -> PreparedQueries:
    """The training set restricted to the queries whose rate lies in [low, high] (order kept).

    Raises:
        DataError when no query is left, naming the band and the range of the rates.
    """
    keep = [i for i, rate in enumerate(rates.tolist()) if settings.low <= rate <= settings.high]
    if not keep:
        raise DataError(
            f"data.pass_rate_filter keeps no query: no pass rate lies in [{settings.low}, {settings.high}] (the "
            f"{len(rates)} rates lie in [{rates.min():.3f}, {rates.max():.3f}]); widen the band or sample more"
        )
    return replace(
        data,
        queries=[data.queries[i] for i in keep],
        prompt_ids=[data.prompt_ids[i] for i in keep],
        source_index=[data.source_index[i] for i in keep] if data.source_index else [],
    )
