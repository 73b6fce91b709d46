"""Difficulty filtering by pass rate: keep the training queries the base model solves at a rate inside a band.

The offline filter samples `samples` responses per training query from the initial policy at one temperature, with
the training reward and the sweep's seeding (`derive_seed`, chunks of `batch_size` prompts, one engine call each),
and keeps query q when low <= pass rate(q) <= high (a response passes when its reward reaches the rollout's
correctness threshold). The rates are cached in a JSON file named by a fingerprint of what they depend on (model
weights, tokenizer, queries and prompt tokens, the reward's full settings, the correctness threshold, the engine's
sampling settings with the response cap, the dtype the model samples in, and the filter's own sampling fields), so a
changed band re-filters without generating again, and any other change measures again. It is the baseline to
compare ERPO's query weights w(q) with: a hard 0/1 weight from the base model's pass rate instead of a soft one from
its reference likelihood (docs/data.md).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from erpo_lightning.data.cache_build import report
from erpo_lightning.data.files import DataError
from erpo_lightning.data.fingerprint import _json_hash, dataset_fingerprint, resolve_model_dir, tokenizer_hash
from erpo_lightning.data.fingerprint import weights_hash as model_weights_hash
from erpo_lightning.data.prepare import PreparedQueries
from erpo_lightning.rewards.combined import CombinedReward
from erpo_lightning.rewards.protocol import Reward, reward_name
from erpo_lightning.rollout.engine import TEMPERATURE_RANGE, derive_seed, is_sampling_temperature
from erpo_lightning.rollout.sampler import RolloutSampler

# The layout of a rates file's fingerprint; a file holding another (or none: those written before the reward's
# settings, threshold, response cap and dtype were keyed) is measured again, never read.
KEY_FORMAT = 2


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


def _is_plain(value: object) -> bool:
    """Whether `value` is plain data with one JSON form: finite numbers, text, booleans, None, and lists, tuples and
    text-keyed dicts of them."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_plain(item) for key, item in value.items())
    return False


def _refuse(name: str, why: str) -> ValueError:
    return ValueError(
        f"data.pass_rate_filter keys its cached pass rates by the reward's settings, and the reward {name} cannot "
        f"describe them: {why}. Give it a `describe()` method that returns its settings as plain data (numbers, "
        "text, booleans, None, lists and dicts of them), docs/rewards.md"
    )


def _described_values(name: str, what: str, values: dict[str, object], strict: bool) -> dict[str, object]:
    """`values` with each callable replaced by its `reward_description` (a reward wrapping another, a closure over a
    helper); a value that is neither plain data nor callable is refused when `strict`, else left out."""
    described: dict[str, object] = {}
    for key, value in values.items():
        if _is_plain(value):
            described[key] = value
        elif callable(value):
            described[key] = reward_description(value)
        elif strict:
            raise _refuse(name, f"its {what} {key!r} is a {type(value).__name__}, not plain data")
    return described


def reward_description(reward: Reward) -> dict[str, object]:
    """A stable description of everything that sets `reward`'s values, as plain data (it keys the pass-rate cache).

    - a `CombinedReward`: its names, weights and each component described by these rules;
    - a `functools.partial`: its function described, and its bound arguments;
    - a bound method: its name and its object described;
    - a plain function: its import path, its defaults and the values its closure holds;
    - any other object: its class and its public attributes (attributes whose names start with `_` are state, e.g.
      counters and worker pools, and are left out).

    A callable value among those (a reward wrapping another) is described by the same rules. A reward with a
    `describe()` (MathReward, ThinkFormatReward) adds what it returns, and may hold values that are not plain data
    (MathReward's `settings`, which its `describe()` spells out); any other must hold only plain data: finite
    numbers, text, booleans, None, and lists and dicts of them.

    Raises:
        ValueError naming the reward and what it cannot describe.
    """
    name = reward_name(reward)
    if isinstance(reward, CombinedReward):
        components = [reward_description(component) for component in reward.rewards]
        return {"class": name, "names": list(reward.names), "weights": list(reward.weights), "components": components}
    if isinstance(reward, functools.partial):
        arguments = _described_values(name, "bound argument", {str(i): v for i, v in enumerate(reward.args)}, True)
        keywords = _described_values(name, "bound keyword argument", dict(reward.keywords), True)
        return {"partial": reward_description(reward.func), "args": list(arguments.values()), "keywords": keywords}
    if inspect.ismethod(reward):
        return {"method": name, "object": reward_description(reward.__self__)}
    describe = getattr(reward, "describe", None)
    described = describe() if callable(describe) else None
    if described is not None and not _is_plain(described):
        raise _refuse(name, "its describe() returns something that is not plain data")
    strict = described is None
    if inspect.isfunction(reward):
        defaults = {str(i): value for i, value in enumerate(reward.__defaults__ or ())}
        own = {
            "function": name,
            "defaults": _described_values(name, "default", defaults, strict),
            "keyword_defaults": _described_values(name, "keyword default", dict(reward.__kwdefaults__ or {}), strict),
            "closure": _described_values(name, "closure value", inspect.getclosurevars(reward).nonlocals, strict),
        }
    else:
        attributes = {key: value for key, value in getattr(reward, "__dict__", {}).items() if not key.startswith("_")}
        own = {"class": name, "attributes": _described_values(name, "attribute", attributes, strict)}
    return own if described is None else {**own, "describe": described}


def pass_rate_fingerprint(
    model_path: str, data: PreparedQueries, sampler: RolloutSampler, settings: PassRateFilter, dtype: str
) -> dict:
    """What the pass rates depend on: the model's weights and tokenizer, the queries and their prompt tokens, the
    reward's full settings (`reward_description`), the correctness threshold, the engine's sampling settings with
    the response cap the filter uses (its own `max_new_tokens`, else the rollout's), the dtype the model samples in,
    and the filter's sampling fields (not the band, which only selects among the rates).

    Returned as its JSON form (keys sorted), so that it compares equal to the copy a rates file holds.

    Raises:
        ValueError when the reward cannot describe its settings (`reward_description`).
    """
    model_dir = resolve_model_dir(model_path)
    sampling = {key: value for key, value in asdict(settings).items() if key not in ("low", "high")}
    engine = asdict(sampler.settings)
    engine["max_new_tokens"] = settings.max_new_tokens or sampler.settings.max_new_tokens
    for per_call in ("n", "temperature", "seed"):  # given per call by `pass_rates`, from the filter's fields
        engine.pop(per_call, None)
    fingerprint = {
        "key_format": KEY_FORMAT,
        "weights_hash": model_weights_hash(model_dir),
        "tokenizer_hash": tokenizer_hash(model_dir),
        "dataset_fingerprint": dataset_fingerprint(data.queries),
        "prompt_tokens_hash": _json_hash([list(ids) for ids in data.prompt_ids]),
        "reward": reward_description(sampler.reward),
        "correct_threshold": float(sampler.correct_threshold),
        "engine_settings": engine,
        "dtype": str(dtype).removeprefix("torch."),
        "sampling": sampling,
    }
    return json.loads(json.dumps(fingerprint, sort_keys=True))


def rates_file_name(fingerprint: dict) -> str:
    """The name of the file holding the rates of `fingerprint`: the first 16 hex digits of its sha256, `.json`."""
    return f"{_json_hash(fingerprint)[:16]}.json"


def load_or_compute_rates(path: Path, fingerprint: dict, compute) -> tuple[torch.Tensor, bool]:
    """The rates stored at `path` when its fingerprint is `fingerprint`, else `compute()`'s, written there (to a
    temporary file, renamed). A file there that cannot be read, that was written with another key format (an older
    erpo_lightning's, which left out the reward's settings, the threshold, the response cap and the dtype) or with
    another fingerprint is measured again, saying why; it is never read. Returns (rates, whether they were loaded)."""
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
            stored_fingerprint, stored_rates = stored["fingerprint"], stored["rates"]
        except (OSError, ValueError, TypeError, KeyError):
            stored_fingerprint = stored_rates = None
        if stored_fingerprint == fingerprint and isinstance(stored_rates, list):
            return torch.tensor(stored_rates, dtype=torch.float64), True
        if not isinstance(stored_fingerprint, dict):
            why = "it cannot be read as a rates file"
        elif stored_fingerprint.get("key_format") != fingerprint.get("key_format"):
            why = (
                f"it was written with key format {stored_fingerprint.get('key_format', 1)}, not "
                f"{fingerprint.get('key_format')} (an older key left out the reward's settings, the correctness "
                "threshold, the response cap and the dtype)"
            )
        else:
            changed = sorted(key for key in {*fingerprint, *stored_fingerprint}
                             if fingerprint.get(key) != stored_fingerprint.get(key))  # fmt: skip
            why = f"its {', '.join(changed) or 'rates'} differ from this run's"
        report(f"pass-rate filter: measuring again instead of reading {path}: {why}")
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
