"""`QueryDataModule`: streams training queries (`QueryBatch`) and serves their cached reference log-probs.

On `setup("fit")` it loads and validates the sources, renders the prompts, and loads the reference score cache, or
computes it (sharded across the trainer's ranks) when it is missing; from the cache it then makes, once, the w(q) of
every query when the trained module's algorithm makes it a constant of the query (the paper's reference-derived,
dataset-normalised weights). Each `QueryBatch` carries its queries' reference NLL s(q) and those w(q). The
LightningModule takes `datamodule.cache` for the per-token reference log-probs of Query-KL
(`ReferenceLogprobCache.padded`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict
from functools import cached_property
from typing import Any, Literal

import datasets
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from erpo_lightning.common.file_hashes import cache_home
from erpo_lightning.common.setting_rules import Rule, at_least, check_rules
from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.cache_build import (
    CacheRequest,
    load_or_compute_cache,
    load_reference_model,
    policy_compute_dtype,
    report,
)
from erpo_lightning.data.fingerprint import build_manifest
from erpo_lightning.data.pass_rate import (
    PassRateFilter,
    keep_band,
    load_or_compute_rates,
    pass_rate_fingerprint,
    pass_rates,
    rates_file_name,
)
from erpo_lightning.data.prepare import Overlong, PreparedQueries, PromptFormat, check_golds, prepare_queries
from erpo_lightning.data.reference_logprobs import (
    LogprobBatching,
)
from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.data.sources import SourceSpec
from erpo_lightning.data.templates import resolve_template
from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.rollout.batch import QueryBatch
from erpo_lightning.rollout.hf_engine import HFEngine
from erpo_lightning.rollout.sampler import RolloutSampler
from erpo_lightning.scoring.queries import QueryScoringLayout

Dtype = Literal["float32", "bfloat16", "float16"]
PASS_RATE_ROOT = cache_home() / "pass_rates"  # the pass-rate filter's rates, one file per fingerprint
# (field, test, allowed range) of the data module's counts.
_SETTING_RULES: tuple[Rule, ...] = tuple(
    (name, at_least(minimum), f">= {minimum}")
    for name, minimum in (
        ("batch_size", 1),
        ("max_prompt_length", 1),
        ("num_workers", 0),
        ("cache_max_tokens", 1),
        ("cache_batch_size", 1),
        ("cache_chunk_size", 1),
        ("query_score_rows", 1),
        ("query_score_width_multiple", 1),
    )
)


def check_data_settings(settings: Mapping[str, Any]) -> None:
    """ValueError naming the first `data.` setting outside its allowed range (`data.<field> must be >= n, got v`).

    `settings` maps QueryDataModule's parameter names to values (the constructor's arguments, or the CLI's parsed
    `data:` group before anything is built); a name missing from it is not checked.
    """
    check_rules("data", settings, _SETTING_RULES)


def training_sampler(trainer) -> RolloutSampler | None:
    """The sampler of the trainer's rollout callback (the callback with a `sampler` holding a reward), or None."""
    for callback in getattr(trainer, "callbacks", None) or ():
        sampler = getattr(callback, "sampler", None)
        if getattr(sampler, "reward", None) is not None:
            return sampler
    return None


def training_reward(trainer) -> object | None:
    """The reward of the trainer's rollout callback, or None."""
    sampler = training_sampler(trainer)
    return None if sampler is None else sampler.reward


def in_memory_note(source: object) -> object:
    """A source as the saved hyperparameters hold it: an in-memory dataset is described, not stored (checkpoints
    would otherwise pickle the whole table)."""
    dataset = source if isinstance(source, datasets.Dataset) else getattr(source, "dataset", None)
    if isinstance(source, dict):
        dataset = source.get("dataset")
    if not isinstance(dataset, datasets.Dataset):
        return source
    return f"in-memory datasets.Dataset ({dataset.num_rows} rows, fingerprint {dataset._fingerprint})"


class QueryDataModule(LightningDataModule):
    """Training queries for RLVR with ERPO's frozen-reference query scores: per-token log-probs (the module reads
    them from `cache`), and each query's NLL s(q) and, when the module's rule makes it static, its w(q) (in every
    `QueryBatch`).

    The constructor only checks the settings (`check_data_settings`, as `erpo` does before anything loads); the
    tokenizer loads on first use, the data, the cache and the w(q) table in `setup`. The w(q) rule has one owner,
    the trained module's `algorithm` (`Algorithm.query_weight_table`), which `setup("fit")` reads: this module has
    no w(q) setting.

    Args:
        model_path: local directory or Hub id of the initial policy: its tokenizer renders the prompts and its
            weights are the frozen reference θ0 of the score cache. `erpo` sets it from `model.model_path`.
        train: sources (`SourceSpec` or dicts with `name` | `path` | `hub_id`, field map, `limit`, ...: the fields
            of [a source](data.md#a-source)); needed for `fit` and `cache`, not for `validate`.
        template: prompt preset: `qwen25-math-cot`, `erpo-paper` or `plain`
            ([docs/data.md](data.md#prompt-templates)); `use_chat_template`, `system_prompt` and `suffix` override
            its values.
        use_chat_template: render with the tokenizer's chat template (`false` for base models without one); None =
            the preset's.
        system_prompt: system turn (chat) or leading paragraph (plain); None = the preset's, "" = none.
        suffix: text appended to every problem; None = the preset's, "" = none.
        max_prompt_length: longest prompt in tokens (template included), >= 1; longer ones follow `overlong`.
        overlong: a longer prompt is dropped (`drop`, counted and reported) or fails the run, listing them
            (`error`).
        skip_invalid: skip bad rows (counted and reported) instead of failing on the first file with any.
        batch_size: queries per RL step on each device, >= 1.
        shuffle: shuffle the training queries each epoch (the query stream, `QueryBatchSampler`).
        seed: seed of that shuffle and of the training DataLoader's generator.
        num_workers: the training DataLoader's worker processes, >= 0.
        cache_dir: where the reference score cache lives; None uses a directory named by the fingerprint,
            `$ERPO_CACHE_HOME/reference/<fingerprint>` (default `~/.cache/erpo_lightning/...`), so a changed model or
            data never meets a stale cache.
        cache_force: recompute the cache even if one exists.
        cache_dtype: dtype of the reference forward (`float32`, `bfloat16`, `float16`); None (the default) takes
            the policy's compute dtype (`policy_compute_dtype`: `model.fsdp_mixed_precision` under FSDP2, else
            `model.dtype`; float32 where no model is given to the data module), so that Query-KL at θ0 compares like
            with like. A value that differs from the policy's compute dtype is refused. Part of the fingerprint.
        cache_device: device of the reference forward; None uses the trainer's device (else CUDA if available).
        cache_max_tokens: padded tokens per vLLM batch (rows × longest prompt), >= 1; bounds memory, since logits
            are tokens × vocabulary. The `transformers` engine scores in the `query_score_rows` layout instead.
        cache_batch_size: rows per vLLM batch, >= 1.
        cache_chunk_size: queries per resumable chunk of the cache build, >= 1, and the unit of work shared between
            ranks.
        cache_engine: `transformers` (a forward with `logprobs.sequence_logprobs`, what the trainer uses) or `vllm`
            (the engine's `prompt_logprobs`, one process; needs vLLM installed; equal to ~1e-6 in float32, not bit
            for bit, so it needs the module's `query_kl_scoring: shared_forward`).
        query_score_rows: queries per query-scoring forward, >= 1, in the cache build and in every training step
            (`scoring.queries.QueryScoringLayout`; a short block is filled with padding rows). Equal shapes make the
            step's scores at θ0 equal the cache's bit for bit
            ([docs/erpo.md](erpo.md#query-kl-at-θ0-exact-scoring-query_kl_scoring)). Part of the fingerprint.
        query_score_width_multiple: each query is right-padded to its length rounded up to this many tokens, >= 1,
            in the cache build and in the step. Part of the fingerprint.
        pass_rate_filter: keep only the training queries whose pass rate under the initial policy lies in a band
            (`pass_rate.PassRateFilter`: `low`, `high`, `samples`, `temperature`, `max_new_tokens`, `batch_size`,
            `seed`; [docs/data.md](data.md#pass-rate-filtering-the-baseline-to-compare-wq-with)), measured at the
            start of a fit with the rollout callback's reward before the reference cache is built, and cached by
            fingerprint; None keeps every query.
    """

    def __init__(
        self,
        model_path: str,
        train: list[SourceSpec] | None = None,
        template: str = "qwen25-math-cot",
        use_chat_template: bool | None = None,
        system_prompt: str | None = None,
        suffix: str | None = None,
        max_prompt_length: int = 1024,
        overlong: Overlong = "drop",
        skip_invalid: bool = False,
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        cache_force: bool = False,
        cache_dtype: Dtype | None = None,
        cache_device: str | None = None,
        cache_max_tokens: int = 16384,
        cache_batch_size: int = 64,
        cache_chunk_size: int = 512,
        cache_engine: Literal["transformers", "vllm"] = "transformers",
        query_score_rows: int = 8,
        query_score_width_multiple: int = 64,
        pass_rate_filter: PassRateFilter | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if self.hparams.get("train"):  # as saved: the CLI's config values (dicts), or the objects given in Python
            self.hparams["train"] = [in_memory_note(source) for source in self.hparams["train"]]
        if isinstance(self.hparams.get("pass_rate_filter"), PassRateFilter):  # plain data in checkpoints
            self.hparams["pass_rate_filter"] = asdict(self.hparams["pass_rate_filter"])
        check_data_settings(self.hparams)
        self.model_path = model_path
        self.sources = list(train or [])
        self.template = resolve_template(template, use_chat_template, system_prompt, suffix)
        self.max_prompt_length, self.overlong, self.skip_invalid = max_prompt_length, overlong, skip_invalid
        self.batch_size, self.shuffle, self.seed, self.num_workers = batch_size, shuffle, seed, num_workers
        self.cache_dir, self.cache_force = cache_dir, cache_force
        self.cache_dtype, self.cache_device, self.cache_engine = cache_dtype, cache_device, cache_engine
        layout = QueryScoringLayout(query_score_rows, query_score_width_multiple)
        self.score_settings = LogprobBatching(cache_max_tokens, cache_batch_size, cache_chunk_size, layout)
        self.data: PreparedQueries | None = None
        self.cache: ReferenceLogprobCache | None = None
        # [Q] w(q) of every query when the module's algorithm makes it static (made in setup("fit")), else None.
        self.query_weights: torch.Tensor | None = None
        self.batch_sampler: QueryBatchSampler | None = None
        self.cache_digest: str | None = None  # fingerprint of the reference scores in use, saved in checkpoints
        self._resume_position: dict | None = None  # from a checkpoint, used by the next train_dataloader()
        self.pass_rate_filter = PassRateFilter.of(pass_rate_filter)  # settings are checked before anything loads
        self.pass_rates: torch.Tensor | None = None  # [all prepared queries] the filter's rates, once measured

    # -- data ------------------------------------------------------------------------------------------------------

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The initial policy's tokenizer, loaded on first use (constructing the module loads nothing)."""
        return AutoTokenizer.from_pretrained(self.model_path)

    def prompt_format(self) -> PromptFormat:
        """The training prompts' template, length limit and tokenizer (loads the tokenizer)."""
        return PromptFormat(self.template, self.max_prompt_length, self.tokenizer)

    def prepare_queries(self) -> PreparedQueries:
        """Load, validate and tokenize the training set (once)."""
        if not self.sources:
            raise ValueError("data.train is empty: list at least one source (name, path or hub_id) to train on")
        if self.data is None:
            self.data = prepare_queries(
                self.sources, self.tokenizer, self.template, self.max_prompt_length, self.overlong, self.skip_invalid
            )
            report(self.data.summary(self.max_prompt_length))
        return self.data

    def setup(self, stage: str | None = None) -> None:
        fitting = stage in ("fit", None)
        building = fitting and self.cache is None
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        strategy = trainer.strategy if trainer is not None else None
        if building:
            self.reference_dtype(module, strategy)  # a dtype conflict fails before the data is read
        self.prepare_queries()
        if fitting:  # a reward that needs golds meets data without them before the reference model loads
            check_golds(self.data, training_reward(trainer))
            self.filter_by_pass_rate(trainer, self.reference_dtype(module, strategy), strategy)
        if building:
            self.attach_cache(self.build_or_load_cache(strategy=strategy, module=module))
        if fitting:  # made for this fit's module, also when the cache was set up before it
            algorithm = getattr(module, "algorithm", None)  # the w(q) rule's owner: ERPOModule.algorithm
            self.query_weights = (
                algorithm.query_weight_table(self.cache.nll) if isinstance(algorithm, Algorithm) else None
            )

    def filter_by_pass_rate(self, trainer, dtype: str, strategy=None) -> None:
        """Apply `pass_rate_filter` (once): measure (or load) each query's pass rate under the initial policy with
        the rollout callback's reward, sampling settings and correctness threshold on a transformers engine, and
        keep the queries in the band.

        Raises:
            ValueError when the trainer has no rollout callback to take the reward from.
        """
        settings = self.pass_rate_filter
        if settings is None or self.pass_rates is not None:
            return
        training = training_sampler(trainer)
        if training is None:
            raise ValueError(
                "data.pass_rate_filter grades with the rollout callback's reward, and this trainer has no "
                "RolloutCallback: add one, or remove data.pass_rate_filter"
            )
        data = self.data
        fingerprint = pass_rate_fingerprint(self.model_path, data, training, settings, dtype)
        path = PASS_RATE_ROOT / rates_file_name(fingerprint)

        def measure() -> torch.Tensor:
            report(f"measuring the pass rate of {len(data.queries)} queries ({settings.samples} samples each)")
            device = self.cache_device or (strategy.root_device if strategy is not None else None)
            sampler = RolloutSampler(
                HFEngine(), training.reward, training.settings, self.tokenizer, training.correct_threshold
            )
            sampler.setup(load_reference_model(self.model_path, dtype, device))
            return pass_rates(data, sampler, settings)

        rates, loaded = load_or_compute_rates(path, fingerprint, measure)
        self.pass_rates = rates
        self.data = keep_band(data, rates, settings)
        report(
            f"pass-rate filter [{settings.low}, {settings.high}]: kept {len(self.data.queries)} of {len(rates)} "
            f"queries (rates {'loaded from' if loaded else 'written to'} {path})"
        )

    def attach_cache(self, cache: ReferenceLogprobCache) -> None:
        """Serve `cache` as the reference log-probs and NLL of this run's queries."""
        self.cache = cache
        nll = cache.nll
        report(f"reference NLL of the queries: mean {nll.mean():.2f} nats, min {nll.min():.2f}, max {nll.max():.2f}")

    def collate(self, indices: list[int]) -> QueryBatch:
        """The `QueryBatch` of dataset rows `indices`."""
        if self.cache is None:
            raise RuntimeError("QueryDataModule.setup('fit') has not run: no reference scores to batch with")
        index = torch.as_tensor(indices, dtype=torch.long)
        return QueryBatch(
            query_index=index,
            prompt_ids=[list(self.data.prompt_ids[i]) for i in indices],
            answers=[self.data.queries[i].answer for i in indices],
            reference_nll=self.cache.nll[index],
            query_weights=None if self.query_weights is None else self.query_weights[index],
            problems=self.data.problems(indices),
            data_columns=self.data.data_columns(indices),
        )

    def train_dataloader(self) -> DataLoader:
        """Batches of `batch_size` queries per rank from the query stream (`QueryBatchSampler`), which
        dynamic-sampling refills also draw from; resumable mid-epoch."""
        num_queries = len(self.prepare_queries().queries)
        trainer = self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        data = self.prepare_queries()
        sampler = QueryBatchSampler(
            num_queries, self.batch_size, self.shuffle, self.seed, True, rank, world_size,
            sources=data.source_index, weights=data.source_weights,
        )  # fmt: skip
        if self._resume_position is not None:
            sampler.load_state_dict(self._resume_position)
            self._resume_position = None
        self.batch_sampler = sampler
        # Its own generator: creating an iterator (each epoch, and after a resume) then draws nothing from the global
        # RNG, whose state checkpoints carry for unseeded rollouts.
        return DataLoader(
            range(num_queries), batch_sampler=sampler, num_workers=self.num_workers, collate_fn=self.collate,
            generator=torch.Generator().manual_seed(self.seed),
        )  # fmt: skip

    def state_dict(self) -> dict:
        """The query stream's position, saved in Lightning checkpoints (see `QueryBatchSampler.state_dict`)."""
        if self.batch_sampler is None or self.trainer is None:
            return {}
        # Checkpoints are written in on_train_batch_end: the current batch counts as processed, not yet completed.
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"sampler": self.batch_sampler.state_dict(done), "cache_digest": self.cache_digest}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the data position; refuse a checkpoint trained against other reference scores."""
        saved, current = state_dict.get("cache_digest"), self.cache_digest
        if saved is not None and current is not None and saved != current:
            raise ValueError(
                f"this checkpoint was trained with reference scores {saved}, but this run's model/data/template give "
                f"{current}: resume with the configuration the run started with (its config.yaml in the log directory)"
            )
        self._resume_position = state_dict.get("sampler")
        # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one can (the sampler skips ahead).
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")

    # -- reference score cache --------------------------------------------------------------------------------------

    def reference_dtype(self, module=None, strategy=None) -> str:
        """The dtype of the reference forward: `cache_dtype`, or the policy's compute dtype when that is None.

        Raises:
            ValueError when `cache_dtype` is set and differs from the policy's compute dtype: the cached θ0 scores
            would then differ from the policy's own at θ0 by the rounding of another dtype (a first-step Query-KL of
            2e-4 to 1e-3 on the tiny model in bfloat16 against a float32 cache), which its gradient would pull towards.
        """
        policy = policy_compute_dtype(module, strategy)
        if self.cache_dtype is None:
            return policy or "float32"
        if policy is not None and policy != self.cache_dtype:
            raise ValueError(
                f"data.cache_dtype is {self.cache_dtype} but the policy computes in {policy} (model.dtype / "
                "model.fsdp_mixed_precision): reference scores must come from the policy's own precision; set "
                f"data.cache_dtype: {policy}, or null to follow the policy"
            )
        return self.cache_dtype

    def cache_manifest(self, dtype: str | None = None) -> dict:
        """The fingerprint of the cache this configuration needs (hashes the model's weight files).

        Args:
            dtype: the reference forward's dtype (default: `reference_dtype()` without a policy to follow).
        """
        data = self.prepare_queries()
        manifest = build_manifest(
            self.model_path,
            self.template.to_dict(),
            data.queries,
            data.prompt_ids,
            self.max_prompt_length,
            dtype or self.reference_dtype(),
            self.scoring_layout(),
        )
        return {**manifest, "engine": self.cache_engine}

    def scoring_layout(self) -> QueryScoringLayout | None:
        """The layout the cache's scores were computed in, which the training step can reproduce bit for bit; None
        with the vLLM engine, whose scores no training forward reproduces exactly."""
        return self.score_settings.layout if self.cache_engine == "transformers" else None

    def cache_request(self, module=None, strategy=None) -> CacheRequest:
        """What this run's reference score cache is loaded or computed from (hashes the model's weight files).

        Args:
            module: the LightningModule to be trained, whose compute dtype the reference forward takes
                (`reference_dtype`); None: `cache_dtype`, else float32.
            strategy: the Lightning strategy the policy is trained under (FSDP2 may change its compute dtype).
        """
        dtype = self.reference_dtype(module, strategy)
        policy = policy_compute_dtype(module, strategy)
        source = "data.cache_dtype" if self.cache_dtype is not None else "the policy's" if policy else "the default"
        return CacheRequest(
            model_path=self.model_path,
            prompt_ids=self.prepare_queries().prompt_ids,
            manifest=self.cache_manifest(dtype),
            dtype=dtype,
            dtype_source=source,
            cache_dir=self.cache_dir,
            engine=self.cache_engine,
            device=self.cache_device,
            max_prompt_length=self.max_prompt_length,
            batching=self.score_settings,
            layout=self.scoring_layout(),
        )

    def build_or_load_cache(
        self, force: bool | None = None, strategy=None, module=None, repair: bool = False
    ) -> ReferenceLogprobCache:
        """Load the cache if it exists and matches this run; otherwise compute it and write it (rank 0):
        `cache_build.load_or_compute_cache` on `cache_request(module, strategy)` (`force` None: `cache_force`)."""
        request = self.cache_request(module, strategy)
        self.cache_digest = request.digest
        return load_or_compute_cache(request, self.cache_force if force is None else force, strategy, repair)


def build_or_load_cache(
    datamodule: QueryDataModule, force: bool = False, strategy=None, module=None
) -> ReferenceLogprobCache:
    """What `erpo cache` runs: load or (re)compute the reference score cache of a configured datamodule.

    A damaged cache (unreadable, cut short, scores that are not its manifest's) is rebuilt, with the reason reported.
    `module` (the configured LightningModule) sets the forward's dtype when `data.cache_dtype` is null.
    """
    cache = datamodule.build_or_load_cache(force, strategy, module, repair=True)
    datamodule.attach_cache(cache)
    return cache
