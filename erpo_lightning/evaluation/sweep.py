"""The temperature sweep: benchmarks × temperatures × k samples, generated with a rollout engine and graded.

`SweepConfig` is the one settings object of `erpo validate` and of `TemperatureSweepCallback`. `SweepRunner` samples
and grades with the training run's `RolloutSampler` (engine, reward, tokenizer) and feeds a `SweepMetric`: for each
temperature it sends every problem of every benchmark with the same k through the engine in chunks of
`batch_size` prompts, so a sweep is a handful of large engine calls and the engine is never rebuilt.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from erpo_lightning.data.prepare import prepare_queries
from erpo_lightning.data.sources import DataError, SourceSpec, describe, resolve_spec
from erpo_lightning.data.templates import PromptTemplate, resolve_template
from erpo_lightning.evaluation.sweep_metrics import SweepMetric
from erpo_lightning.memory import release_free_heap
from erpo_lightning.rollout.engine import declare_context, derive_seed
from erpo_lightning.rollout.sampler import GradedGroups, RolloutSampler

DEFAULT_TEMPERATURES = [0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5]


@dataclass
class Benchmark:
    """One evaluation set.

    Attributes:
        source: where the problems are (a built-in `name`, a local `path` or a `hub_id`; see `SourceSpec`; a dict
            with those keys is accepted too).
        k: samples per problem at each temperature (e.g. 32 for AIME, 4 for MATH500).
        pass_k: the k of the reported Pass@k (at most `k`); None = `k`.
    """

    source: SourceSpec
    k: int = 4
    pass_k: int | None = None


@dataclass
class SweepConfig:
    """What a temperature sweep evaluates and how.

    Attributes:
        benchmarks: the evaluation sets.
        temperatures: sampling temperatures (the paper: 0.1, 0.3, ..., 1.5).
        max_new_tokens: response cap in tokens; None = the RolloutCallback's.
        top_p, top_k: nucleus mass (1.0 = off) and top-k (0 = off) at every temperature.
        seed: base seed; every engine call gets `derive_seed(seed, temperature index, k, chunk, rank)`; None =
            unseeded.
        max_problems: read at most this many problems of each benchmark (None = all); a benchmark's own
            `source.limit` wins.
        batch_size: prompts per engine call (each expands to k samples).
        output_dir: where `erpo validate` writes results.json / results.csv / the plot; None = the trainer's log
            directory.
        template: prompt preset used only when no datamodule gives one (the training template always wins).
        max_prompt_length: longest eval prompt in tokens when no datamodule gives one; a longer one is an error.
        progress: show a progress bar over the sweep (rank 0).
    """

    benchmarks: list[Benchmark] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=lambda: list(DEFAULT_TEMPERATURES))
    max_new_tokens: int | None = None
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    max_problems: int | None = None
    batch_size: int = 512
    output_dir: str | None = None
    template: str = "qwen25-math-cot"
    max_prompt_length: int = 1024
    progress: bool = True

    def __post_init__(self) -> None:
        bad = [t for t in self.temperatures if not (math.isfinite(t) and t > 0)]
        if bad:
            raise ValueError(
                f"sweep.temperatures: every temperature must be > 0 and finite (got {bad}); sampling at T <= 0 is not "
                "defined (greedy decoding is not a temperature)"
            )
        for name, allowed, description in (
            ("max_new_tokens", lambda v: v is None or v >= 1, ">= 1 (or null)"),
            ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
            ("top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
            ("max_problems", lambda v: v is None or v >= 1, ">= 1 (or null)"),
            ("batch_size", lambda v: v >= 1, ">= 1"),
            ("max_prompt_length", lambda v: v >= 1, ">= 1"),
        ):
            if not allowed(getattr(self, name)):
                raise ValueError(f"sweep.{name} must be {description}, got {getattr(self, name)!r}")


@dataclass
class PreparedBenchmark:
    """A benchmark ready to generate: `prompt_ids[i]` (template applied) and `answers[i]` are problem i."""

    label: str
    k: int
    pass_k: int
    prompt_ids: list[list[int]]
    answers: list[str]


def source_label(spec: SourceSpec) -> str:
    """The name a benchmark has in metrics and tables: `label`, else the built-in name, file stem or Hub id."""
    return spec.label or spec.name or (Path(spec.path).stem if spec.path else spec.hub_id)


def prepare_benchmarks(
    config: SweepConfig, tokenizer: PreTrainedTokenizerBase, template: PromptTemplate, max_prompt_length: int
) -> list[PreparedBenchmark]:
    """Load, validate and tokenize every benchmark of `config`.

    Raises:
        DataError naming the benchmark (and the file / row / field, as the data module does) when one is missing,
        malformed, has a prompt longer than `max_prompt_length`, or when two benchmarks share a label.
    """
    if not config.benchmarks:
        raise DataError("no benchmarks configured: set sweep.benchmarks (a list of {source: {...}, k: ...})")
    prepared = []
    for benchmark in config.benchmarks:
        try:
            spec = resolve_spec(benchmark.source)
        except DataError as error:
            raise DataError(f"benchmark {benchmark.source}: {error}") from error
        label = source_label(spec)
        if spec.limit is None and config.max_problems is not None:
            spec = replace(spec, limit=config.max_problems)
        try:
            data = prepare_queries([spec], tokenizer, template, max_prompt_length, overlong="error")
        except Exception as error:  # noqa: BLE001 - any load failure is reported with the benchmark's name
            raise DataError(f"benchmark {label!r} ({describe(spec)}) cannot be used: {error}") from error
        pass_k = benchmark.pass_k or benchmark.k
        if not 1 <= pass_k <= benchmark.k:
            raise DataError(f"benchmark {label!r}: pass_k={pass_k} must be between 1 and k={benchmark.k}")
        prepared.append(
            PreparedBenchmark(label, benchmark.k, pass_k, data.prompt_ids, [q.answer for q in data.queries])
        )
    labels = [b.label for b in prepared]
    if len(set(labels)) != len(labels):
        raise DataError(f"two benchmarks share a label in {labels}: give them distinct `source.label`s")
    return prepared


@dataclass
class SweepTiming:
    """Throughput of one sweep on this rank: problem-temperature pairs, samples, tokens and seconds."""

    problems: int = 0
    samples: int = 0
    tokens: int = 0
    generate_s: float = 0.0
    grade_s: float = 0.0
    wall_s: float = 0.0

    def summary(self) -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        return {
            **vars(self),
            "problems_per_s": self.problems / wall,
            "samples_per_s": self.samples / wall,
            "tokens_per_s": self.tokens / max(self.generate_s, 1e-9),
        }


class SweepRunner:
    """Generates and grades sweeps with one `RolloutSampler` (the training run's: its engine, reward, tokenizer,
    stop strings / ids and correctness threshold; the sweep's own top_p, top_k and response cap)."""

    def __init__(self, sampler: RolloutSampler) -> None:
        self.sampler = sampler

    def run(
        self,
        benchmarks: list[PreparedBenchmark],
        config: SweepConfig,
        metric: SweepMetric,
        max_new_tokens: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> SweepTiming:
        """Evaluate rank `rank`'s share of every problem at every temperature into `metric` (index order of both).

        Problems are dealt to ranks round-robin; the metric's sum reduction puts the shares back together.
        """
        timing = SweepTiming()
        start = perf_counter()
        sampler = self.sampler.with_settings(top_p=config.top_p, top_k=config.top_k, max_new_tokens=max_new_tokens)
        # Work items (benchmark index, problem index) of this rank, grouped by k: one engine call per chunk.
        by_k: dict[int, list[tuple[int, int]]] = {}
        for b, bench in enumerate(benchmarks):
            by_k.setdefault(bench.k, []).extend((b, i) for i in range(rank, len(bench.prompt_ids), world_size))
        total = len(config.temperatures) * sum(len(items) for items in by_k.values())
        bar = tqdm(
            total=total, desc="temperature sweep", unit="problem", file=sys.stderr, leave=False,
            disable=not config.progress or rank != 0,
        )  # fmt: skip
        for t, temperature in enumerate(config.temperatures):
            bar.set_postfix_str(f"T={temperature:g}")
            for k, items in by_k.items():
                for chunk, first in enumerate(range(0, len(items), config.batch_size)):
                    part = items[first : first + config.batch_size]
                    seed = None if config.seed is None else derive_seed(config.seed, t, k, chunk, rank)
                    graded = sampler.sample_and_grade(
                        [benchmarks[b].prompt_ids[i] for b, i in part],
                        [benchmarks[b].answers[i] for b, i in part],
                        k,
                        temperature,
                        seed,
                    )
                    _record(graded, part, t, metric, timing)
                    bar.update(len(part))
        bar.close()
        timing.wall_s = perf_counter() - start
        release_free_heap()  # the sweep's buffers: see erpo_lightning/memory.py
        return timing


def _record(
    graded: GradedGroups, items: list[tuple[int, int]], temperature_index: int, metric: SweepMetric, timing: SweepTiming
) -> None:
    """Put the graded samples of the (benchmark, problem) `items` into the metric and the timing."""
    lengths = graded.lengths.double()
    for b in sorted({b for b, _ in items}):
        rows = torch.tensor([j for j, (item_b, _) in enumerate(items) if item_b == b])
        metric.update(b, temperature_index, graded.correct[rows], lengths[rows], graded.truncated[rows])
    timing.problems += len(items)
    timing.samples += lengths.numel()
    timing.tokens += int(lengths.sum())
    timing.generate_s += graded.generate_s
    timing.grade_s += graded.grade_s


def find_sampler(trainer: Any) -> RolloutSampler:
    """The RolloutSampler a callback of the trainer holds (the `rollout:` group's): the sweep samples and grades
    with it, as training does."""
    for callback in trainer.callbacks:
        sampler = getattr(callback, "sampler", None)
        if isinstance(sampler, RolloutSampler):
            return sampler
    raise ValueError("a temperature sweep needs the `rollout:` config group (a RolloutCallback: engine and reward)")


def prompt_limit(datamodule: Any, config: SweepConfig) -> int:
    """The longest eval prompt in tokens: the training data's `max_prompt_length` when a datamodule has one, else
    the config's."""
    return getattr(datamodule, "max_prompt_length", None) or config.max_prompt_length


def response_cap(config: SweepConfig, sampler: RolloutSampler) -> int:
    """The sweep's `max_new_tokens`: its own, else the rollout's."""
    return config.max_new_tokens or sampler.settings.max_new_tokens


def declare_sweep_context(sampler: RolloutSampler, datamodule: Any, config: SweepConfig) -> None:
    """Tell the sampler's engine, before it is built, the sweep's longest sequence: prompt limit + response cap.

    A VLLMEngine then sizes `max_model_len` (and its KV cache) to what the sweep generates instead of the model's
    whole context; once built, an engine too short for the sweep raises an error naming `max_model_len`.
    """
    declare_context(sampler.engine, prompt_limit(datamodule, config) + response_cap(config, sampler))


def prompt_settings(
    datamodule: Any, config: SweepConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[PromptTemplate, PreTrainedTokenizerBase, int]:
    """(template, tokenizer, max prompt length) of the training data when a datamodule has them, else the config's."""
    template = getattr(datamodule, "template", None) or resolve_template(config.template)
    return template, getattr(datamodule, "tokenizer", None) or tokenizer, prompt_limit(datamodule, config)
