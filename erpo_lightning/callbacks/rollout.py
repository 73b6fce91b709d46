"""RolloutCallback: before every training step, sample G responses per query, score them, attach the batch.

The step's `QueryBatch` gets its `rollout`: the `RolloutBatch` of the B kept queries (with dynamic sampling, not
necessarily the loader's B), on the module's device, each row with its query's scores as the query stream carried
them (reference NLL, precomputed w(q)). Metrics are logged under `rollout/`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from erpo_lightning.callbacks.progress import phase
from erpo_lightning.common import step_phases
from erpo_lightning.common.setting_rules import Rule, check_rules
from erpo_lightning.data.datamodule import QueryDataModule
from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.objectives import check_group_size
from erpo_lightning.rewards.combined import check_reward_inputs, response_components
from erpo_lightning.rewards.protocol import Reward
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch, assemble_batch, informative_groups, overlong_penalty
from erpo_lightning.rollout.engine import (
    SAMPLING_RULES,
    RolloutEngine,
    Sample,
    SamplingSettings,
    declare_context,
    eval_mode,
    pad_token_id,
    rollout_seed,
)
from erpo_lightning.rollout.sampler import RolloutSampler
from erpo_lightning.scoring.logprobs import response_logprobs

# (field, test, allowed range as the error states it); a field missing from the checked mapping is not checked.
_SETTING_RULES: tuple[Rule, ...] = (
    ("group_size", lambda v: v >= 1, ">= 1"),
    *(SAMPLING_RULES[name] for name in ("temperature", "top_p", "top_k", "max_new_tokens")),
    ("max_refill_rounds", lambda v: v >= 0, ">= 0"),
    ("overlong_buffer", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("overlong_penalty_factor", lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    ("logprob_check_every", lambda v: v >= 0, ">= 0 (0 = never)"),
    ("logprob_check_micro_batch_size", lambda v: v >= 1, ">= 1"),
    ("correct_threshold", lambda v: math.isfinite(v), "a finite number"),
)


def check_rollout_settings(settings: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first rollout setting outside its allowed range (`rollout.<field> must be ...`)."""
    check_rules("rollout", settings, _SETTING_RULES)


@dataclass
class _Group:
    """One query (its dataset row, prompt, and scores as the query stream carries them) and its G scored samples."""

    query_index: int
    prompt_ids: list[int]
    reference_nll: torch.Tensor | None  # 0-dim s(q), or None (see `QueryBatch`)
    query_weight: torch.Tensor | None  # 0-dim precomputed w(q), or None
    samples: list[Sample]
    rewards: torch.Tensor  # [G] after overlong shaping: what the advantages see
    correct: torch.Tensor  # [G] bool, raw reward at least the correct threshold
    informative: bool  # rewards not all equal
    components: dict[str, torch.Tensor] | None  # name -> [G] each reward component's raw value (`response_components`)


def _per_row_components(groups: list[_Group]) -> dict[str, torch.Tensor] | None:
    """Component name -> [B·G] raw values of the groups' rows; None unless every group has them."""
    if any(g.components is None for g in groups):
        return None
    return {name: torch.cat([g.components[name] for g in groups]) for name in groups[0].components}


def _per_query(values: list[torch.Tensor | None]) -> torch.Tensor | None:
    """[B] of the groups' carried scores; None when the query stream carried none (it carries all or none)."""
    return None if values[0] is None else torch.stack(values)


class RolloutCallback(pl.Callback):
    """Generates, scores and packs the rollout of each training batch (`on_train_batch_start`).

    Args:
        engine: a RolloutEngine: `erpo_lightning.rollout.VLLMEngine` (in-process vLLM colocated with training) or
            `erpo_lightning.rollout.HFEngine` (`generate` on the policy itself).
        reward: a `Reward` (rewards/protocol.py), `(responses, golds, **inputs) -> rewards`: a class by
            `class_path` (e.g. `erpo_lightning.rewards.MathReward`) or a plain function by its import path, several
            summed with `CombinedReward` ([docs/rewards.md](rewards.md)). It is given by keyword the `prompts`,
            `problems` and data columns (`SourceSpec.columns`) its signature accepts; an optional `counters()` dict
            is logged as `rollout/grader_<key>`, an optional `components()` dict (`CombinedReward`'s per-component
            means) as `rollout/reward/<name>`.
        group_size: G, responses per query, >= 1; >= 2 with the group estimators (`grpo`, `dr_grpo`, `rloo`), which
            compare the responses of one query.
        temperature: T of the sampling softmax(logits / T), > 0 and finite (greedy decoding, T = 0, is refused). The
            run's one sampling temperature: each `RolloutBatch` carries it and the module scores the response
            log-probs at it, those of the processed (tempered) distribution.
        top_p: nucleus sampling mass, in (0, 1] (1.0 = off).
        top_k: sample from the k most likely tokens, >= 0 (0 = off).
        max_new_tokens: response length cap, in tokens, >= 1.
        stop: strings that end a response, besides the tokenizer's eos (which always stops); the tokens that
            complete one stay in the response.
        stop_token_ids: token ids that end a response, besides the tokenizer's eos; the stop token stays in it.
        seed: None = unseeded; else rollout call c on rank r uses `rollout_seed(seed, c, r)` (one stream per rank;
            the call count is saved in checkpoints).
        dynamic_sampling: DAPO: keep only groups whose (raw) rewards differ, generating more batches until B groups;
            each refill batch is the next unused queries of the training loader's query stream (`QueryBatchSampler`,
            saved in checkpoints), so an epoch has fewer steps and a step never generates a query twice unless the
            epoch runs out; past the epoch's end refills continue with the next epoch's queries (warned, and counted
            in `rollout/repeated_queries`).
        max_refill_rounds: extra generation rounds allowed per step with `dynamic_sampling`, >= 0; past it
            zero-variance groups fill the batch.
        overlong_filter: mask out the loss of truncated responses (response_mask = 0 on them).
        overlong_buffer: DAPO's soft overlong punishment zone, the last this many tokens before `max_new_tokens`,
            >= 0 (0 = off).
        overlong_penalty_factor: scale of that punishment (reward lowered by up to this much), >= 0.
        correct_threshold: a response counts as correct for `rollout/accuracy` when its raw reward is at least this;
            a finite number.
        logprob_check_every: every this many steps, recompute the response log-probs with the policy and log
            `rollout/logprob_abs_diff`, >= 0 (0 = never; costs one no-grad forward of the batch). It is ~1e-6 in
            fp32 with top_k / top_p off; those truncate the engine's distribution, which the trainer does not.
            ERPOModule logs the same quantity for free as `train/logprob_abs_diff` (from its first forward), so
            this extra check is off by default.
        logprob_check_micro_batch_size: rows per forward of that check, >= 1.
        tokenizer: tokenizer path or Hub id; None = the policy's `name_or_path`.

    Engine, reward, tokenizer and sampling settings form `self.sampler` (a `RolloutSampler`), through which the
    temperature sweep samples and grades too.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        reward: Reward,
        group_size: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        dynamic_sampling: bool = False,
        max_refill_rounds: int = 3,
        overlong_filter: bool = False,
        overlong_buffer: int = 0,
        overlong_penalty_factor: float = 1.0,
        correct_threshold: float = 1.0,
        logprob_check_every: int = 0,
        logprob_check_micro_batch_size: int = 16,
        tokenizer: str | None = None,
    ) -> None:
        check_rollout_settings(
            {
                "group_size": group_size,
                "temperature": temperature,
                "top_p": top_p,
                "top_k": top_k,
                "max_new_tokens": max_new_tokens,
                "max_refill_rounds": max_refill_rounds,
                "overlong_buffer": overlong_buffer,
                "overlong_penalty_factor": overlong_penalty_factor,
                "logprob_check_every": logprob_check_every,
                "logprob_check_micro_batch_size": logprob_check_micro_batch_size,
                "correct_threshold": correct_threshold,
            }
        )
        self.settings = SamplingSettings(
            n=group_size,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            stop=list(stop or []),
            stop_token_ids=list(stop_token_ids or []),
        )
        self.sampler = RolloutSampler(engine, reward, self.settings, tokenizer, correct_threshold)
        self.seed = seed
        self.dynamic_sampling = dynamic_sampling
        self.max_refill_rounds = max_refill_rounds
        self.overlong_filter = overlong_filter
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty_factor = overlong_penalty_factor
        self.logprob_check_every = logprob_check_every
        self.logprob_check_micro_batch_size = logprob_check_micro_batch_size
        self._calls = 0  # generation calls so far: the seed stream, saved in checkpoints
        self._rank = 0
        self._steps = 0
        self._synced_version: int | None = None
        self._timing = {"tokens": 0, "seconds": 0.0}
        self._first_step_checked = False  # the all-truncated warning is about this process's first step

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Refuse groups of one for an ERPOModule whose advantage estimator compares the responses of a group, and a
        reward requiring an input the training data does not carry (`check_reward_inputs`), before any rollout is
        generated (the datamodule's setup, which Lightning runs first, has run)."""
        if stage == "fit" and isinstance(pl_module, ERPOModule):
            check_group_size(pl_module.algorithm.advantage_estimator, self.settings.n)
        if stage == "fit":  # a reward's NaN stops the rollout, unless the module's guard skips non-finite steps
            self.sampler.non_finite_rewards = getattr(getattr(pl_module, "guard", None), "nan_policy", "stop")
        data = getattr(trainer, "datamodule", None)
        if stage == "fit" and isinstance(data, QueryDataModule):
            check_reward_inputs(self.sampler.reward, data.prepare_queries().columns)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Load the tokenizer and build / bind the engine (after `configure_model`, so the policy exists).

        An engine that fixes its context when built is first told the longest sequence of a rollout: the
        datamodule's `max_prompt_length` + `max_new_tokens` (`engine.declare_context`).
        """
        if isinstance(trainer.datamodule, QueryDataModule):
            declare_context(self.sampler.engine, trainer.datamodule.max_prompt_length + self.settings.max_new_tokens)
        engine = type(self.sampler.engine).__name__
        with phase(
            f"rollout engine start-up ({engine})",
            f"{self.settings.n} samples per query, up to {self.settings.max_new_tokens} new tokens",
        ):
            self.sampler.setup(pl_module.policy)
        self._synced_version = None
        self._rank = trainer.global_rank

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse dynamic sampling without a query stream to refill from (the loader exists from here on), and say
        once when the training set cannot fill one batch."""
        if self.dynamic_sampling:
            query_stream(trainer.train_dataloader)
        stream = getattr(trainer.train_dataloader, "batch_sampler", None)
        if isinstance(stream, QueryBatchSampler) and stream.num_queries < stream.global_batch:
            rank_zero_warn(
                f"{stream.num_queries} training queries cannot fill one batch of {stream.global_batch} "
                f"(data.batch_size x ranks): every step trains on the same {stream.num_queries}, in a new order, "
                "and each step is an epoch; add queries or lower data.batch_size"
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: QueryBatch, batch_idx: int
    ) -> None:
        """Attach the step's rollout batch to `batch.rollout`, syncing engine weights first if needed."""
        metrics: dict[str, float] = {}
        engine = self.sampler.engine
        with step_phases.timed("engine_wake_sleep"):
            engine.wake_up()
        if pl_module.policy_version != self._synced_version:
            start = perf_counter()
            with step_phases.timed("weight_sync"):
                engine.sync_weights(pl_module.policy)
            metrics["weight_sync_ms"] = 1000 * (perf_counter() - start)
            self._synced_version = pl_module.policy_version
        self._timing = {"tokens": 0, "seconds": 0.0}
        groups, generated, rounds = self._collect_groups(trainer, batch)
        with step_phases.timed("engine_wake_sleep"):
            engine.sleep()

        with step_phases.timed("rollout_batch"):
            rollout = self._assemble(groups)
        if self.logprob_check_every and self._steps % self.logprob_check_every == 0:
            with step_phases.timed("logprob_check"):
                metrics["logprob_abs_diff"] = self._logprob_abs_diff(pl_module.policy, rollout, pl_module.device)
        if self.overlong_filter:
            rollout.response_mask[rollout.truncated] = 0
        self._steps += 1

        metrics.update(self._generation_metrics(generated))
        if not self._first_step_checked:
            self._first_step_checked = True
            if metrics["truncated_ratio"] == 1.0:
                rank_zero_warn(
                    f"every response of this run's first step reached rollout.max_new_tokens "
                    f"({self.settings.max_new_tokens}) unfinished: the reward sees no complete answer and the groups "
                    "carry no learning signal; raise rollout.max_new_tokens (or check the stop tokens)"
                )
        if self.dynamic_sampling:
            metrics["refill_rounds"] = float(rounds)
            indices = [g.query_index for g in generated]
            metrics["repeated_queries"] = float(len(indices) - len(set(indices)))
        with step_phases.timed("rollout_batch"):
            batch.rollout = rollout.to(pl_module.device)
        pl_module.log_dict(
            {f"rollout/{name}": value for name, value in metrics.items()},
            on_step=True,
            on_epoch=False,
            batch_size=len(groups),
        )

    def _assemble(self, groups: list[_Group]) -> RolloutBatch:
        """The `RolloutBatch` of the kept groups, on the CPU."""
        return assemble_batch(
            [g.prompt_ids for g in groups],
            [g.samples for g in groups],
            torch.cat([g.rewards for g in groups]),
            torch.tensor([g.query_index for g in groups]),
            pad_token_id(self.sampler.tokenizer),
            self.settings.temperature,
            max_new_tokens=self.settings.max_new_tokens,
            reference_nll=_per_query([g.reference_nll for g in groups]),
            query_weights=_per_query([g.query_weight for g in groups]),
            reward_components=_per_row_components(groups),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self._calls, "steps": self._steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._calls = state_dict["calls"]
        self._steps = state_dict["steps"]

    def _collect_groups(self, trainer: pl.Trainer, batch: QueryBatch) -> tuple[list[_Group], list[_Group], int]:
        """The B groups to train on, every group generated this step, and the number of refill rounds."""
        groups = self._generate_groups(batch)
        if not self.dynamic_sampling:
            return groups, groups, 0
        wanted = len(groups)
        generated = list(groups)
        kept = [g for g in groups if g.informative]
        rounds = 0
        # Every rank takes part in every round (the vote is a collective, and so is generation under FSDP).
        while rounds < self.max_refill_rounds and trainer.strategy.reduce_boolean_decision(
            len(kept) < wanted, all=False
        ):
            more = self._generate_groups(self._next_refill_batch(trainer))
            generated += more
            kept += [g for g in more if g.informative]
            rounds += 1
        # Past the cap, zero-variance groups fill the batch: their group-relative advantage is zero anyway.
        kept += [g for g in generated if not g.informative][: max(0, wanted - len(kept))]
        return kept[:wanted], generated, rounds

    def _next_refill_batch(self, trainer: pl.Trainer) -> QueryBatch:
        """The batch of the next unused training queries, drawn from the loader's query stream (`refill()`)."""
        loader = trainer.train_dataloader
        return loader.collate_fn([loader.dataset[i] for i in query_stream(loader).refill()])

    def _generate_groups(self, batch: QueryBatch) -> list[_Group]:
        """Sample G responses for each query of `batch` and score them."""
        seed = None if self.seed is None else rollout_seed(self.seed, self._calls, self._rank)
        self._calls += 1
        prompts = [list(ids) for ids in batch.prompt_ids]
        graded = self.sampler.sample_and_grade(
            prompts,
            list(batch.answers),
            self.settings.n,
            self.settings.temperature,
            seed,
            problems=batch.problems,
            data_columns=batch.data_columns,
        )
        self._timing["seconds"] += graded.generate_s
        step_phases.add("generation", graded.generate_s)
        step_phases.add("grading", graded.grade_s)
        lengths = graded.lengths
        self._timing["tokens"] += int(lengths.sum())
        penalty = overlong_penalty(lengths.flatten(), self.settings.max_new_tokens, self.overlong_buffer)
        shaped = graded.rewards + self.overlong_penalty_factor * penalty.view_as(graded.rewards)
        informative = informative_groups(graded.rewards.flatten(), self.settings.n).tolist()
        raw = response_components(self.sampler.reward, graded.rewards.flatten().tolist())
        components = None  # name -> [B, G] float32
        if raw is not None:
            components = {name: graded.rewards.new_tensor(row).view_as(graded.rewards) for name, row in raw.items()}
        return [
            _Group(
                int(batch.query_index[b]),
                prompts[b],
                None if batch.reference_nll is None else batch.reference_nll[b],
                None if batch.query_weights is None else batch.query_weights[b],
                graded.samples[b],
                shaped[b],
                graded.correct[b],
                informative[b],
                None if components is None else {name: values[b] for name, values in components.items()},
            )
            for b in range(len(prompts))
        ]

    def _generation_metrics(self, generated: list[_Group]) -> dict[str, float]:
        """Reward, accuracy, length and throughput statistics over every response generated this step."""
        rewards = torch.cat([g.rewards for g in generated])
        lengths = torch.tensor([float(len(s.token_ids)) for g in generated for s in g.samples])
        truncated = torch.tensor([s.finish_reason == "length" for g in generated for s in g.samples])
        metrics = {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "accuracy": torch.cat([g.correct for g in generated]).float().mean().item(),
            "response_length_mean": lengths.mean().item(),
            "response_length_max": lengths.max().item(),
            "truncated_ratio": truncated.float().mean().item(),
            "zero_variance_groups": 1.0 - sum(g.informative for g in generated) / len(generated),
            "tokens_per_s": self._timing["tokens"] / max(self._timing["seconds"], 1e-9),
        }
        reward = self.sampler.reward
        counters = getattr(reward, "counters", None)
        if counters is not None:
            metrics.update({f"grader_{key}": float(value) for key, value in counters().items()})
        components = getattr(reward, "components", None)
        if components is not None:
            metrics.update({f"reward/{name}": float(value) for name, value in components().items()})
        return metrics

    @torch.no_grad()
    def _logprob_abs_diff(self, policy: torch.nn.Module, rollout: RolloutBatch, device: torch.device) -> float:
        """Mean |engine log-prob − policy log-prob| over the sampled response tokens, at the sampling temperature."""
        width_p = rollout.prompt_length
        total, count = 0.0, 0
        size = self.logprob_check_micro_batch_size
        with eval_mode(policy):
            for start in range(0, rollout.num_rows, size):
                rows = slice(start, start + size)
                logprobs = response_logprobs(
                    policy,
                    rollout.input_ids[rows].to(device),
                    rollout.attention_mask[rows].to(device),
                    width_p,
                    rollout.temperature,
                ).cpu()
                mask = rollout.response_mask[rows].bool()
                total += (logprobs - rollout.sampling_logprobs[rows]).abs()[mask].sum().item()
                count += int(mask.sum())
        return total / max(count, 1)


def query_stream(loader: Any) -> QueryBatchSampler:
    """The query stream of a training DataLoader, which dynamic-sampling refills draw from.

    Raises:
        TypeError when `loader` is not a DataLoader whose `batch_sampler` is a `QueryBatchSampler`: refills drawn
            from anything else would repeat or skip the step batches' queries.
    """
    sampler = getattr(loader, "batch_sampler", None) if isinstance(loader, DataLoader) else None
    if not isinstance(sampler, QueryBatchSampler):
        raise TypeError(
            "rollout.dynamic_sampling refills from the training query stream: the train DataLoader's batch_sampler "
            f"must be a QueryBatchSampler (QueryDataModule's), got {type(sampler or loader).__name__}"
        )
    return sampler
