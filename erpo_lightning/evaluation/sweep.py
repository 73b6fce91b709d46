"""The temperature sweep: benchmarks × temperatures × k samples, generated with a rollout engine and graded.

`SweepConfig` is the one settings object of `erpo validate` and of `TemperatureSweepCallback`, and `Sweep` the one
object both drive: it samples and grades with the training run's `RolloutSampler` (engine, reward, tokenizer) into a
`SweepMetric`. For each temperature it sends every problem of every benchmark with the same k through the engine in
chunks of `batch_size` prompts, so a sweep is a handful of large engine calls and the engine is never rebuilt.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from erpo_lightning.common.memory import release_free_heap
from erpo_lightning.common.setting_rules import Rule, check_rules, or_null
from erpo_lightning.data.prepare import PromptFormat, prepare_queries
from erpo_lightning.data.sources import DataError, SourceSpec, describe, resolve_spec
from erpo_lightning.data.templates import PromptTemplate, resolve_template
from erpo_lightning.evaluation.sweep_metrics import SweepMetric
from erpo_lightning.rollout.engine import (
    SAMPLING_RULES,
    TEMPERATURE_RANGE,
    declare_context,
    derive_seed,
    is_sampling_temperature,
)
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
        template: prompt preset used only when the sweep is given no `PromptFormat` (the erpo CLI gives the training
            data's, which then wins).
        max_prompt_length: longest eval prompt in tokens, likewise only without a `PromptFormat`; a longer one is an
            error.
        progress: show the sweep's progress on stderr (rank 0): a bar on a terminal; when stderr is a file or a pipe
            (SLURM, nohup), one plain `[erpo]` line per temperature instead, since a bar redrawn with carriage
            returns leaves nothing readable in a log.
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
        bad = [t for t in self.temperatures if not is_sampling_temperature(t)]
        if bad:
            raise ValueError(f"sweep.temperatures: every temperature must be {TEMPERATURE_RANGE} (got {bad})")
        rules: tuple[Rule, ...] = (
            or_null(SAMPLING_RULES["max_new_tokens"]),  # null: the RolloutCallback's
            SAMPLING_RULES["top_p"],
            SAMPLING_RULES["top_k"],
            ("max_problems", lambda v: v is None or v >= 1, ">= 1 (or null)"),
            ("batch_size", lambda v: v >= 1, ">= 1"),
            ("max_prompt_length", lambda v: v >= 1, ">= 1"),
        )
        check_rules("sweep", {name: getattr(self, name) for name, _, _ in rules}, rules)


@dataclass
class PreparedBenchmark:
    """A benchmark ready to generate: `prompt_ids[i]` (template applied) and `answers[i]` are problem i; its text
    `problems[i]` and the extra columns its source names (`data_columns`: name -> values) are offered to the reward
    (None: not carried)."""

    label: str
    k: int
    pass_k: int
    prompt_ids: list[list[int]]
    answers: list[str]
    problems: list[str] | None = None
    data_columns: dict[str, list] | None = None


def source_label(spec: SourceSpec) -> str:
    """The name a benchmark has in metrics and tables: `label`, else the built-in name, file stem or Hub id."""
    return spec.label or spec.name or (Path(spec.path).stem if spec.path else spec.hub_id)


def benchmark_source(benchmark: Benchmark, config: SweepConfig) -> tuple[str, SourceSpec]:
    """A benchmark's label and resolved source, limited to `config.max_problems` unless it has a limit of its own;
    DataError naming the benchmark when its source is not valid."""
    try:
        spec = resolve_spec(benchmark.source)
    except DataError as error:
        raise DataError(f"benchmark {benchmark.source}: {error}") from error
    if spec.limit is None and config.max_problems is not None:
        return source_label(spec), replace(spec, limit=config.max_problems)
    return source_label(spec), spec


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
        label, spec = benchmark_source(benchmark, config)
        try:
            data = prepare_queries([spec], tokenizer, template, max_prompt_length, overlong="error")
        except Exception as error:  # noqa: BLE001 - any load failure is reported with the benchmark's name
            raise DataError(f"benchmark {label!r} ({describe(spec)}) cannot be used: {error}") from error
        pass_k = benchmark.pass_k or benchmark.k
        if not 1 <= pass_k <= benchmark.k:
            raise DataError(f"benchmark {label!r}: pass_k={pass_k} must be between 1 and k={benchmark.k}")
        rows = range(len(data.queries))
        answers = [q.answer for q in data.queries]
        prepared.append(
            PreparedBenchmark(
                label, benchmark.k, pass_k, data.prompt_ids, answers, data.problems(rows), data.data_columns(rows)
            )
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


@dataclass
class SweepResult:
    """One sweep of one policy: the global metric values (`SweepMetric.compute()` names), this rank's throughput, the
    grader's counters over the sweep (the reward's `counters()`; empty without one) and, when the sweep keeps them
    (`Sweep(keep_completions=True)`), this rank's graded responses: one row per problem and temperature,
    `{"benchmark", "index", "problem", "temperature", "responses", "correct"}` (`problem` None when the benchmark
    carries no problem text; `responses` and `correct` hold the k samples in order)."""

    values: dict[str, torch.Tensor]
    timing: SweepTiming
    grader: dict[str, float]
    completions: list[dict] = field(default_factory=list)


class Sweep:
    """A temperature sweep: every benchmark × temperature × k, sampled and graded with a `RolloutSampler`.

    `erpo validate` and `TemperatureSweepCallback` drive it alike: `declare_context()` before the sampler's engine is
    built, `prepare()` once the tokenizer is there (or let the first `run` do it), then `run(policy, rank, world_size)`
    per evaluation.

    Args:
        config: benchmarks, temperatures, k, top_p / top_k, response cap, seed, chunking.
        sampler: the training run's sampler (`rollout:`: engine, reward, tokenizer, stop strings / ids, correctness
            threshold); the sweep's own top_p, top_k and response cap replace its.
        prompts: template, prompt limit and tokenizer of the eval prompts, the training data's
            (`QueryDataModule.prompt_format()`); None = `config.template` and `config.max_prompt_length` with the
            sampler's tokenizer.
        keep_completions: also return every graded response (`SweepResult.completions`).
    """

    def __init__(
        self,
        config: SweepConfig,
        sampler: RolloutSampler,
        prompts: PromptFormat | None = None,
        keep_completions: bool = False,
    ) -> None:
        self.config = config
        self.sampler = sampler
        self.prompts = prompts or PromptFormat(resolve_template(config.template), config.max_prompt_length)
        self.keep_completions = keep_completions
        self.max_new_tokens = config.max_new_tokens or sampler.settings.max_new_tokens
        self.benchmarks: list[PreparedBenchmark] | None = None
        self.metric: SweepMetric | None = None

    def declare_context(self) -> None:
        """Tell the sampler's engine, before it is built, the sweep's longest sequence: prompt limit + response cap.

        A VLLMEngine then sizes `max_model_len` (and its KV cache) to what the sweep generates instead of the model's
        whole context; once built, an engine too short for the sweep raises an error naming `max_model_len`.
        """
        declare_context(self.sampler.engine, self.prompts.max_prompt_length + self.max_new_tokens)

    def prepare(self, unaveraged: list[PreparedBenchmark] | None = None) -> list[PreparedBenchmark]:
        """Load and tokenize the benchmarks (after `sampler.setup`, when the prompts bring no tokenizer) and make the
        metric; `unaveraged` benchmarks (e.g. a sample of training queries) are evaluated too but left out of `mean`.

        Raises:
            DataError as `prepare_benchmarks` does, or when an `unaveraged` label is a benchmark's.
        """
        prompts = self.prompts
        tokenizer = prompts.tokenizer or self.sampler.tokenizer
        benchmarks = prepare_benchmarks(self.config, tokenizer, prompts.template, prompts.max_prompt_length)
        averaged = [b.label for b in benchmarks]
        for extra in unaveraged or []:
            if extra.label in averaged:
                raise DataError(
                    f"a benchmark is labelled {extra.label!r}, the name of another evaluated set (the sample of "
                    "training queries): relabel it"
                )
            benchmarks.append(extra)
        self.benchmarks = benchmarks
        self.metric = SweepMetric(
            [b.label for b in benchmarks], self.config.temperatures, [b.pass_k for b in benchmarks], averaged
        )
        return benchmarks

    def run(
        self, policy: torch.nn.Module, rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu"
    ) -> SweepResult:
        """Sweep `policy` (its weights pushed into the engine first; a collective under sharding) on rank `rank`'s
        share of the problems; the global values.

        Problems are dealt to ranks round-robin; the metric, kept on `device` (the one the ranks reduce on), puts the
        shares back together.
        """
        if self.benchmarks is None:
            self.prepare()
        engine = self.sampler.engine
        engine.wake_up()
        engine.sync_weights(policy)
        self.metric.to(device)
        counters = getattr(self.sampler.reward, "counters", dict)  # `counters()` is optional (rewards/protocol.py)
        counters()  # what was graded before (the rollout since its last log, an earlier run) is not this sweep's
        completions: list[dict] = []
        timing = self._sample_and_grade(rank, world_size, completions if self.keep_completions else None)
        engine.sleep()
        values = self.metric.compute()
        self.metric.reset()
        grader = counters()
        # A CombinedReward's component means since its last report: this sweep's, not the next rollout step's.
        getattr(self.sampler.reward, "components", dict)()
        release_free_heap()  # the sweep's buffers: see erpo_lightning/common/memory.py
        return SweepResult(values, timing, grader, completions)

    def _sample_and_grade(self, rank: int, world_size: int, completions: list[dict] | None = None) -> SweepTiming:
        """Evaluate rank `rank`'s share of every problem at every temperature into the metric (index order of both),
        each temperature's problems with the same k in chunks of `batch_size` prompts: one engine call per chunk;
        the graded responses go to `completions` when it is a list."""
        config, benchmarks = self.config, self.benchmarks
        timing = SweepTiming()
        start = perf_counter()
        sampler = self.sampler.with_settings(top_p=config.top_p, top_k=config.top_k, max_new_tokens=self.max_new_tokens)
        # Work items (benchmark index, problem index) of this rank, grouped by k.
        by_k: dict[int, list[tuple[int, int]]] = {}
        for b, bench in enumerate(benchmarks):
            by_k.setdefault(bench.k, []).extend((b, i) for i in range(rank, len(bench.prompt_ids), world_size))
        per_temperature = sum(len(items) for items in by_k.values())
        total = len(config.temperatures) * per_temperature
        shown = config.progress and rank == 0
        terminal = shown and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        bar = tqdm(total=total, desc="temperature sweep", unit="problem", file=sys.stderr, leave=False,
                   disable=not terminal)  # fmt: skip
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
                        **_reward_inputs(benchmarks, part),
                    )
                    _record(graded, part, t, self.metric, timing)
                    if completions is not None:
                        completions.extend(_completion_rows(graded, part, benchmarks, temperature))
                    bar.update(len(part))
            if shown and not terminal:
                done, elapsed = (t + 1) * per_temperature, perf_counter() - start
                print(f"[erpo] temperature sweep: T={temperature:g} done, {done}/{total} problems in {elapsed:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        bar.close()
        timing.wall_s = perf_counter() - start
        return timing


def _reward_inputs(benchmarks: list[PreparedBenchmark], items: list[tuple[int, int]]) -> dict[str, Any]:
    """`problems` and `data_columns` of the (benchmark, problem) `items`, as far as all their benchmarks carry them
    (a column only when every one of them carries it)."""
    parts = [benchmarks[b] for b in sorted({b for b, _ in items})]
    problems = None
    if all(part.problems is not None for part in parts):
        problems = [benchmarks[b].problems[i] for b, i in items]
    names = set.intersection(*(set(part.data_columns or ()) for part in parts))
    columns = {name: [benchmarks[b].data_columns[name][i] for b, i in items] for name in names}
    return {"problems": problems, "data_columns": columns or None}


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


def _completion_rows(
    graded: GradedGroups, items: list[tuple[int, int]], benchmarks: list[PreparedBenchmark], temperature: float
) -> list[dict]:
    """One row per (benchmark, problem) of `items` (SweepResult.completions): its k responses and their grading."""
    rows = []
    for j, (b, i) in enumerate(items):
        k = len(graded.samples[j])
        problems = benchmarks[b].problems
        rows.append(
            {
                "benchmark": benchmarks[b].label,
                "index": i,
                "problem": None if problems is None else problems[i],
                "temperature": temperature,
                "responses": graded.texts[j * k : (j + 1) * k],
                "correct": [bool(c) for c in graded.correct[j].tolist()],
            }
        )
    return rows
