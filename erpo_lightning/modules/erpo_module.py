"""ERPOModule: the policy, its loss, and the optimizer loop over one rollout batch.

One `training_step` receives the step's `QueryBatch` with its `RolloutBatch` attached (the RolloutCallback generated
and scored it, see `erpo_lightning/callbacks/rollout.py`) and runs `num_iterations` passes of optimizer steps over
it, each on `update_batch_size` queries. Each optimizer step's forwards and backwards are the update unit's
(`erpo_lightning.update.accumulate_gradients`, which TRL's `ERPOTrainer` runs too): the unique queries scored alone,
in the reference cache's layout, for an exact Query-KL (`query_kl_scoring`), then one forward per micro-batch (a token
budget) for the response log-probs. This module owns what is Lightning's or the run's: the models, the optimizer and
its schedule, gradient clipping, the non-finite guard, the collectives and the logged metrics. Manual optimization:
several optimizer steps per batch, which also works under FSDP2 (`ModelParallelStrategy`).
"""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from transformers import AutoModelForCausalLM

from erpo_lightning import objectives as obj
from erpo_lightning.checkpoints.adapters_only import trainable_state_names
from erpo_lightning.checkpoints.module_state import load_module_state, save_module_state
from erpo_lightning.common.memory import release_free_heap
from erpo_lightning.common.step_phases import timed
from erpo_lightning.data.cache_build import ComputePath, policy_compute_dtype
from erpo_lightning.data.datamodule import QueryDataModule
from erpo_lightning.modules.batch_checks import check_carried_weights, check_loss_constant
from erpo_lightning.modules.distributed import all_reduce, global_advantages
from erpo_lightning.modules.lora import LoraSettings, add_lora_adapters, lora_settings
from erpo_lightning.modules.lora_files import load_adapter_weights
from erpo_lightning.modules.optim import NonFiniteGuard, OptimizerOffload, build_optimizer, weight_norm
from erpo_lightning.modules.settings import (
    Dtype,
    MixedPrecision,
    QueryKLScoring,
    check_module_settings,
    check_offload_strategy,
    check_trainer_precision,
)
from erpo_lightning.modules.sharding import clip_grad_norm, data_parallel_mesh, shard_causal_lm
from erpo_lightning.modules.step_metrics import (
    SaturatedCorrection,
    build_train_metrics,
    compute_and_reset,
    update_step_metrics,
)
from erpo_lightning.objectives.algorithms import Algorithm, AlgorithmName, loss_setting_args_doc, resolve_algorithm
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch
from erpo_lightning.scoring.logprobs import response_logprobs
from erpo_lightning.scoring.output_layer import fused_output_problem
from erpo_lightning.update import (
    LossRows,
    StepInputs,
    StepStats,
    accumulate_gradients,
    minibatch_rows,
    rank_aligned_micro_batches,
    rollout_loss_rows,
    step_normalizers,
    step_query_weights,
)


class ERPOModule(L.LightningModule):
    """Trains a Hugging Face causal LM with ERPO or one of its baselines.

    Args:
        model_path: local directory or Hub id of the initial policy (also the frozen reference θ0).
        algorithm: preset name (`erpo` (the paper), `erpo_released` (the authors' code), `grpo`, `grpo_kl`, `dapo`,
            `dapo_erpo`, `rloo`, `rloo_erpo`, `dr_grpo`, `reinforce`, `gspo`, `gspo_erpo`, `cispo`, `cispo_erpo`;
            compared in the README's table and [docs/erpo.md](erpo.md)). The keyword arguments named like the fields
            of `algorithms.Algorithm` (`advantage_estimator` to `entropy_top_fraction`, and `weight_decay`: the loss
            fields, [docs/loss_settings.md](loss_settings.md)) replace single fields of the preset (None = keep);
            their help, after the others, is the fields' own docstrings (`algorithms.loss_setting_args_doc`). Every
            choice is checked here, before any model is loaded.
        num_iterations: passes (PPO epochs) over each rollout batch, >= 1.
        update_batch_size: queries per optimizer step, >= 1 (None = the whole rollout batch, one step, on-policy);
            with several optimizer steps per rollout batch the old log-probs are recomputed first.
        micro_batch_tokens: token budget of one forward, in tokens (rows × longest row), >= 1; the rows are sorted
            by length first, so rows of similar length share a forward, and gradients accumulate across the
            micro-batches. A row counts the tokens it forwards: prompt and response, or under `query_kl_scoring:
            shared_prompt` its response alone (the prompt's keys and values come from the query pass).
        loss_constant: Dr. GRPO's constant normaliser (`seq_sum_constant`), in tokens, > 0; None = the response cap
            the rollout sampled with (`RolloutBatch.max_new_tokens`, i.e. rollout.max_new_tokens: Dr. GRPO's and
            TRL's choice).
        learning_rate: learning rate of the default AdamW, >= 0 (None = 1e-6); its weight decay is `weight_decay`
            (None = the preset's: 0.01 for `erpo_released`, else 0). Must stay None with `optimizer` set.
        warmup_steps: optimizer steps of the default schedule's linear warm-up (then constant), >= 0 (0 = constant
            from the first step). Must stay 0 with `lr_scheduler` set.
        optimizer: callable `params -> Optimizer`, any `torch.optim` class (in a config: `class_path` +
            `init_args`, e.g. `--model.optimizer SGD --model.optimizer.lr 0.01`); None = AdamW with `learning_rate`
            and `weight_decay`. A set optimizer owns its learning rate and weight decay: `learning_rate` and
            `weight_decay` must then stay unset, and the preset's weight decay is not applied (`modules/optim.py`).
            LightningCLI's top-level `optimizer:` group is not used: it would build the optimizer before the policy
            is loaded.
        lr_scheduler: callable `Optimizer -> LRScheduler` (in a config: `class_path` + `init_args`); None =
            `optim.LinearWarmup(warmup_steps)`. A set schedule owns the schedule (`warmup_steps` must stay 0); it is
            stepped once per optimizer step, so it counts optimizer steps, and `ReduceLROnPlateau` is refused.
        gradient_clip_norm: max global gradient norm, > 0 (None = no clipping).
        query_kl_scoring: how the step scores the queries for Query-KL. `shared_prompt` (the default): the unique
            queries alone, in the reference cache's layout (`update/query_pass.py`), equal to the cache bit for bit
            at θ0 in any precision, and that same forward of each query carries its G responses, which run on its
            cached keys and values (`update/shared_prompt.py`): each prompt is forwarded once per step instead of
            G + 1 times, with or without gradient checkpointing; it holds the query forward's keys, values and
            last logits until the step's last backward. `exact`: the same query forward, without carrying the
            responses (each response row forwards its prompt again): for a step whose memory cannot hold the
            query forward's activations beside a micro-batch's. `shared_forward`: from the [prompt; response]
            forward that scores the responses (the paper's "no extra forward"), whose rounding differs from the
            cache's, so `query_kl_tolerance` defaults to the compute dtype's noise floor
            ([docs/erpo.md](erpo.md#query-kl-at-θ0-exact-scoring-query_kl_scoring)). `shared_prompt` and `exact`
            need `data.cache_engine: transformers`.
        skip_zero_signal_steps: skip an optimizer step whose gradient is exactly 0 on every rank (no group with
            reward variance and no Query-KL or Policy-KL pull): no optimizer or LR-schedule update, so AdamW's
            momentum and weight decay do not move the policy. It still counts towards `max_steps` and consumes its
            batch; `train/zero_signal_skips` counts them.
        monitor_policy_kl: load a frozen reference model to log Policy-KL for any algorithm, even when its
            coefficient is 0.
        nan_policy: `stop`: a non-finite (NaN/inf) loss or gradient raises, naming the step, before the optimizer
            step; `skip`: that optimizer step is dropped (not counted towards `max_steps`) and counted, and the run
            stops after `max_consecutive_skips` in a row. Under either policy the weights are checked after every
            optimizer step: a non-finite weight norm stops the run (a step already taken cannot be dropped), and no
            checkpoint with non-finite weights is written.
        max_consecutive_skips: with `nan_policy: skip`, skipped optimizer steps in a row that stop the run, >= 1.
        dtype: `float32` | `bfloat16` for the policy weights; `float16` is refused before loading: it needs loss
            scaling, which training does not do (`modules/settings.py`).
        gradient_checkpointing: recompute each decoder layer's activations in backward (activation checkpointing).
        fused_output_layer: the step's forwards (with gradient, and the old-policy recompute and Policy-KL's
            reference forward without) stop at the last hidden states and the output layer runs inside the log-prob
            code, a chunk of positions at a time, so the [rows, positions, vocabulary] logits never exist: less
            memory for one more output-layer matmul in backward (`scoring/output_layer.py`,
            [docs/benchmarks.md](benchmarks.md#the-fused-output-layer-issue-52-lever-4-the-logits-never-exist)).
            Llama, Mistral, Qwen2 and Qwen3 models with a plain output layer; a LoRA-adapted one, or another model
            type, is refused before training.
        fsdp_mixed_precision: under `ModelParallelStrategy` (FSDP2), the dtype layers compute in (e.g. `bfloat16`)
            while the sharded weights and optimizer state keep `dtype`; gradients are reduced in float32.
            None = compute in `dtype`; `float16` is refused. Ignored without FSDP2 ([docs/scaling.md](scaling.md)).
        mixed_precision: `none` | `bfloat16`: every forward of the policy (and of the θ0 reference model) runs under
            `torch.autocast(bfloat16)` on its device, CPU or CUDA, while the weights (`dtype`, which must be
            float32), their gradients and the optimizer state stay float32, so an update of 1e-6 is kept. The
            reference cache is computed along the same path and records it (`data.cache_build.ComputePath`), so
            Query-KL stays exactly 0 at θ0 and a cache of another precision is rebuilt or refused. For FSDP2 use
            `fsdp_mixed_precision` instead (setting both is refused); `float16` is refused (loss scaling)
            ([docs/one_gpu.md](one_gpu.md)).
        tf32: let CUDA's float32 matmuls and cuDNN use TF32 (`torch.backends.cuda.matmul.allow_tf32`,
            `torch.backends.cudnn.allow_tf32`), for this process from `configure_model` on and in every policy and
            reference forward, the backward included; part of the reference cache's fingerprint. No effect on CPU.
        offload_optimizer: keep the optimizer and its state in host (CPU) memory (`optim.OptimizerOffload`): it is
            built over CPU copies of the trainable weights; each optimizer step copies the gradients to the host,
            steps there, and copies the weights back. Frees AdamW's two moments on the device (2 × the trainable
            weights: 11.5 GiB for a float32 1.5B model), for host memory of 16 bytes per float32 trainable
            parameter (its weights, gradients and moments), two copies of the trainable weights' bytes over the bus
            and AdamW on the CPU at every optimizer step (seconds for a 1.5B model; unmeasured on a GPU). The update
            is the on-device one (equal on CPU, tested). For full fine-tuning on a card too small for the optimizer
            state; no use with LoRA (its state is small). One device or DDP; refused under `ModelParallelStrategy`
            (FSDP2), which already splits the state over the ranks.
        compile: run each decoder layer's forward under `torch.compile` (inductor, dynamic shapes;
            `scoring/layers.py`), which fuses the elementwise chains between the matmuls (norms, rotary embeddings,
            activations, residual adds). The θ0 reference model and the reference cache's build run the same compiled
            layers and the cache records it (`+compiled` in its compute path), so Query-KL stays exactly 0 at θ0 and
            a cache of the uncompiled path is rebuilt or refused. Forwards with a key/value cache (the HF engine's
            decoding) run uncompiled. The first steps pay the compilation (seconds on the toy model, longer on larger
            ones; needs a C++ compiler on CPU). Needs `query_kl_scoring: exact`: refused with the shared prompt (the
            default), whose responses run on a key/value cache, so its prompt forward would not be the cache's and
            Query-KL would drift from 0 at θ0 by rounding ([docs/benchmarks.md](benchmarks.md#a-compiled-forward)).
        trust_remote_code: let transformers run the model repository's own modelling code when it loads the policy,
            the reference model and a skeleton for the settings' checks (`from_pretrained(trust_remote_code=...)`);
            only for a model whose code you trust.
        peft: LoRA adapters (`r`, `alpha`, `dropout`, `target_modules`, `seed`; `adapter_path`: start from a peft
            adapter folder; `checkpoint`: `full` or `adapters`-only checkpoints: `modules/lora.LoraSettings`) train
            instead of the whole policy, fresh or from an adapter folder; θ0 stays the base model, so the reference
            cache is the full fine-tuning one ([docs/lora.md](lora.md)). None = full fine-tuning.
    """

    def __init__(
        self,
        model_path: str,
        algorithm: AlgorithmName = "erpo",
        advantage_estimator: obj.Estimator | None = None,
        advantage_eps: float | None = None,
        loss_aggregation: obj.AggregationMode | None = None,
        clip_low: float | None = None,
        clip_high: float | None = None,
        dual_clip: float | None = None,
        query_kl_coef: float | None = None,
        query_kl_estimator: obj.QueryKLEstimator | None = None,
        query_kl_aggregation: obj.QueryKLAggregation | None = None,
        query_kl_tolerance: float | None = None,
        kl_clamp_mode: obj.KLClampMode | None = None,
        kl_clamp: float | None = None,
        use_query_weights: bool | None = None,
        query_weight_source: obj.QueryWeightSource | None = None,
        query_weight_norm: obj.QueryWeightNorm | None = None,
        query_weight_clip: tuple[float, float] | Literal["none"] | None = None,
        policy_kl_coef: float | None = None,
        policy_kl_kind: obj.KLKind | None = None,
        rollout_correction: obj.RolloutCorrection | None = None,
        rollout_correction_level: obj.RolloutCorrectionLevel | None = None,
        rollout_correction_cap: float | None = None,
        rollout_correction_floor: float | None = None,
        ratio_level: obj.RatioLevel | None = None,
        sequence_clip_low: float | None = None,
        sequence_clip_high: float | None = None,
        policy_loss: obj.PolicyLoss | None = None,
        cispo_weight_cap: float | None = None,
        entropy_coef: float | None = None,
        entropy_target: float | None = None,
        entropy_coef_delta: float | None = None,
        entropy_coef_range: tuple[float, float] | None = None,
        entropy_top_fraction: float | None = None,
        num_iterations: int = 1,
        update_batch_size: int | None = None,
        micro_batch_tokens: int = 16384,
        loss_constant: float | None = None,
        learning_rate: float | None = None,
        weight_decay: float | None = None,
        warmup_steps: int = 0,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        gradient_clip_norm: float | None = 1.0,
        query_kl_scoring: QueryKLScoring = "shared_prompt",
        skip_zero_signal_steps: bool = False,
        monitor_policy_kl: bool = False,
        nan_policy: Literal["stop", "skip"] = "stop",
        max_consecutive_skips: int = 10,
        dtype: Dtype = "float32",
        gradient_checkpointing: bool = False,
        fused_output_layer: bool = False,
        fsdp_mixed_precision: Dtype | None = None,
        mixed_precision: MixedPrecision = "none",
        tf32: bool = False,
        offload_optimizer: bool = False,
        compile: bool = False,
        trust_remote_code: bool = False,
        peft: LoraSettings | None = None,
    ) -> None:
        super().__init__()
        # Callables are not plain data (a `weights_only` checkpoint load refuses them); the CLI's config keeps them.
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        check_module_settings({**self.hparams, "optimizer": optimizer, "lr_scheduler": lr_scheduler})
        self.optimizer_factory, self.lr_scheduler_factory = optimizer, lr_scheduler
        self.lora = lora_settings(peft)  # checkpoints hold it as plain data (`weights_only` loading)
        self.hparams["peft"] = None if self.lora is None else asdict(self.lora)
        # Every field of `Algorithm` is a parameter of this module of the same name: None keeps the preset's value.
        overrides = {field.name: self.hparams[field.name] for field in fields(Algorithm)}
        self.algorithm: Algorithm = resolve_algorithm(algorithm, **overrides)
        if self.algorithm.query_kl_tolerance is None and query_kl_scoring != "shared_forward":  # exact: none needed
            self.algorithm = replace(self.algorithm, query_kl_tolerance=0.0)
        self.guard = NonFiniteGuard(nan_policy, max_consecutive_skips)
        self.automatic_optimization = False
        self.policy: torch.nn.Module | None = None
        self.reference_policy: torch.nn.Module | None = None
        self.offload: OptimizerOffload | None = None  # the host copies the optimizer steps (`offload_optimizer`)
        # A data.ReferenceLogprobCache: `padded(query_index, width) -> [B, width]` reference log-probs (Query-KL).
        self.reference_cache: Any = None
        self.policy_version = 0  # optimizer steps that changed the weights; the rollout engine syncs on change
        self.zero_signal_skips = 0  # optimizer steps skipped by skip_zero_signal_steps
        self.train_metrics = build_train_metrics()
        self.saturated_correction = SaturatedCorrection(self.algorithm)  # warns when no token is left in the band
        self.entropy_control = obj.EntropyControl.of(self.algorithm)  # the entropy bonus's coefficient, per step
        self._logged_train_metrics: set[str] = set()  # every `train/` name logged so far (see _log_train_metrics)

    # ----------------------------------------------------------------------------------------------- model set-up
    def _compute_path(self) -> ComputePath:
        """The autocast, TF32 and compiled layers of the policy's forwards (`mixed_precision`, `tf32`, `compile`)
        over its `dtype` weights."""
        autocast = None if self.hparams.mixed_precision == "none" else self.hparams.mixed_precision
        return ComputePath(self.hparams.dtype, autocast, self.hparams.tf32, self.hparams.compile)

    def _load_causal_lm(self) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(
            self.hparams.model_path,
            dtype=getattr(torch, self.hparams.dtype),
            trust_remote_code=self.hparams.trust_remote_code,
        )
        return self._compute_path().apply(model)

    def configure_model(self) -> None:
        """Load the policy (and the frozen reference model when Policy-KL is used or monitored).

        Under `ModelParallelStrategy` both are sharded with FSDP2, one unit per decoder layer
        (`sharding.shard_causal_lm`); under DDP or one device they stay whole. With `model.peft`, the adapters
        start at B = 0 (still θ0) or at the weights of `peft.adapter_path`.
        """
        if self.policy is not None:
            return
        if self.hparams.tf32:  # the backward's and the optimizer's matmuls too, not only the forwards'
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        if self.device_mesh is not None and self.lora is not None and self.lora.checkpoint == "adapters":
            raise ValueError(
                "model.peft.checkpoint 'adapters' is not supported under ModelParallelStrategy (FSDP2), whose sharded "
                "checkpoints load every weight they expect; use checkpoint 'full'"
            )
        if self.device_mesh is not None:  # set by ModelParallelStrategy only
            check_offload_strategy(self.hparams.offload_optimizer, self.trainer.strategy)
        self.policy = self._load_causal_lm().train()
        if self.lora is not None:  # adapters in place: same model class, B = 0 so still θ0
            summary = add_lora_adapters(self.policy, self.lora)
            if self.lora.adapter_path is not None:
                load_adapter_weights(self.policy, self.lora.adapter_path)
                summary += f"; starting from the adapter at {self.lora.adapter_path}"
            if self._trainer is None or self.trainer.is_global_zero:
                print(f"[erpo] {summary}", flush=True)
        if self.hparams.gradient_checkpointing:
            # Non-reentrant: the recomputed forward goes through FSDP2's per-layer hooks again, like the first one.
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if self.lora is not None:  # the frozen embeddings' output must carry grad into checkpointed layers
                self.policy.enable_input_require_grads()
        self.policy.config.use_cache = False
        if self.hparams.fused_output_layer and (problem := fused_output_problem(self.policy)) is not None:
            raise ValueError(
                f"model.fused_output_layer cannot be used with {self.hparams.model_path}: {problem}; set it to false"
            )
        if self.algorithm.policy_kl_coef > 0 or self.hparams.monitor_policy_kl:
            self.reference_policy = self._load_causal_lm().eval().requires_grad_(False)
        if self.device_mesh is not None:  # set by ModelParallelStrategy only
            mesh = data_parallel_mesh(self.device_mesh)
            for model in (self.policy, self.reference_policy):
                if model is not None:
                    shard_causal_lm(model, mesh, self.hparams.fsdp_mixed_precision)

    def setup(self, stage: str) -> None:
        check_trainer_precision(self.trainer.precision)
        if self.algorithm.query_kl_tolerance is None:  # shared_forward: the noise floor of the compute dtype
            path = ComputePath.parse(policy_compute_dtype(self, self.trainer.strategy) or "float32")
            self.algorithm = replace(self.algorithm, query_kl_tolerance=obj.query_kl_tolerance_for(path.compute_dtype))
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if self.reference_cache is None and isinstance(datamodule, QueryDataModule):
            self.reference_cache = datamodule.cache  # built by the datamodule's setup, which Lightning runs first

    def on_fit_start(self) -> None:
        if self.reference_cache is None:
            raise RuntimeError(
                "ERPOModule has no reference query scores (needed for Query-KL, which every algorithm logs): train "
                "with erpo_lightning.data.QueryDataModule, which computes or loads them, or set module.reference_cache"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add the module's counters and RNG states; refuse non-finite weights (`checkpoints/module_state.py`)."""
        counters = {
            "policy_version": self.policy_version, "zero_signal_skips": self.zero_signal_skips,
            "skipped_steps": self.guard.skipped_steps, "consecutive_skips": self.guard.consecutive_skips,
        }  # fmt: skip
        adapters_only = self.lora is not None and self.lora.checkpoint == "adapters"
        trainable = trainable_state_names(self) if adapters_only else None
        save_module_state(checkpoint, counters, self.hparams.model_path, trainable, self._trainer)
        checkpoint["erpo_entropy_control"] = self.entropy_control.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the counters and RNG states; complete an adapters-only checkpoint (`checkpoints/module_state.py`)."""
        ckpt_path = self.trainer.ckpt_path if self._trainer is not None else None
        counters = load_module_state(
            checkpoint, ckpt_path, self.hparams.model_path, self.state_dict, trainable_state_names(self)
        )
        self.policy_version = counters["policy_version"]
        self.zero_signal_skips = counters["zero_signal_skips"]
        self.guard.skipped_steps = counters["skipped_steps"]
        self.guard.consecutive_skips = counters["consecutive_skips"]
        if "erpo_entropy_control" in checkpoint:
            self.entropy_control.load_state_dict(checkpoint["erpo_entropy_control"])

    def configure_optimizers(self):
        parameters = [p for p in self.policy.parameters() if p.requires_grad]
        if self.hparams.offload_optimizer:
            self.offload = OptimizerOffload(parameters)
            parameters = self.offload.host_parameters
        optimizer, scheduler = build_optimizer(
            parameters, self.optimizer_factory, self.lr_scheduler_factory,
            self.hparams.learning_rate, self.algorithm.weight_decay, self.hparams.warmup_steps,
        )  # fmt: skip
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --------------------------------------------------------------------------------------------- forward passes
    @torch.no_grad()
    def _recompute_old_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """Response log-probs of the current policy before any update on this batch: [N, R]."""
        old = torch.zeros_like(batch.sampling_logprobs)
        for micro, rows in self._micro_batches(batch):  # rows sorted by length, not in order; None: a filler
            response = response_logprobs(
                self.policy, micro.input_ids, micro.attention_mask, micro.prompt_length, micro.temperature,
                fused_output=self.hparams.fused_output_layer,
            )  # fmt: skip
            if rows is not None:
                old[rows, : response.shape[1]] = response
        return old

    @torch.no_grad()
    def _step_query_weights(self, batch: RolloutBatch) -> torch.Tensor | None:
        """w(q) of an optimizer step's rows, [N], when it depends on the step: `objectives.query_weights(s(q), s̄,
        clip)` with the algorithm's `query_weight_source`, `query_weight_norm` and `query_weight_clip`.

        A dataset-static w(q) (`Algorithm.static_query_weights`) is the query stream's, made once at set-up and
        carried by the batch: it is returned as is. Otherwise s̄ is the mean over the step's queries on all ranks and
        s(q) is the carried reference NLL, or the current policy's (one no-grad forward over the group leaders'
        prompts before the step: the released code's `prepare_backward_batch`). None when w(q) is not applied and
        would cost that forward; otherwise it is computed (and logged) even when not applied.
        """
        if self.algorithm.static_query_weights:
            return batch.query_weights
        leaders, width = batch.is_group_leader, batch.prompt_length
        reference = None if batch.reference_nll is None else batch.reference_nll[leaders]
        weights = step_query_weights(
            self.algorithm, self.policy, batch.input_ids[leaders, :width], batch.attention_mask[leaders, :width],
            reference, torch.ones(int(leaders.sum()), device=self.device), self._global_sum,
        )  # fmt: skip
        return None if weights is None else weights.repeat_interleave(batch.group_size)

    # --------------------------------------------------------------------------------------------- the RL update
    def _global_sum(self, value: torch.Tensor | float) -> torch.Tensor:
        return all_reduce(self._trainer, value, "sum", self.device)

    def _most_over_ranks(self, count: int) -> int:
        return int(all_reduce(self._trainer, count, "max", self.device))

    def _micro_batches(self, batch: RolloutBatch, prompt_cached: bool = False):
        """(micro-batch, row indices or None for a filler) pairs within the token budget, as many on every rank
        (`update.rank_aligned_micro_batches`); `prompt_cached`: the rows forward their responses alone."""
        return rank_aligned_micro_batches(batch, self.hparams.micro_batch_tokens, self._most_over_ranks, prompt_cached)

    def _loss_rows(self, batch: RolloutBatch) -> LossRows:
        """What the update reads of `batch`; under `shared_forward`, with θ0's query scores from the cache."""
        reference = None
        if self.hparams.query_kl_scoring == "shared_forward":
            reference = self.reference_cache.padded(batch.query_index, batch.prompt_length)
        return rollout_loss_rows(batch, self.hparams.loss_constant or batch.max_new_tokens, reference)

    def _optimizer_step(self, batch: RolloutBatch) -> None:
        """Forward/backward every micro-batch of `batch` (one optimizer step's rows: `update.accumulate_gradients`),
        then clip and step."""
        with timed("query_weights"):
            batch = replace(batch, query_weights=self._step_query_weights(batch))
        normalizers = step_normalizers(
            batch.response_mask, batch.attention_mask, batch.prompt_length, batch.is_group_leader, self._global_sum
        )
        # Gradients of ranks are averaged by DDP/FSDP, while our loss is already divided by global counts.
        scale = self.trainer.world_size if self._trainer is not None else 1
        scoring = self.hparams.query_kl_scoring
        algorithm = self.algorithm  # with the adaptive entropy coefficient of this step
        if algorithm.entropy_target is not None:
            algorithm = replace(algorithm, entropy_coef=self.entropy_control.applied)
        inputs = StepInputs(
            algorithm, normalizers, batch.group_size, None if scoring == "shared_forward" else self.reference_cache,
            self._most_over_ranks, self.hparams.fused_output_layer,
        )  # fmt: skip
        step = accumulate_gradients(
            self.policy, rollout_loss_rows(batch, self.hparams.loss_constant or batch.max_new_tokens),
            ((self._loss_rows(micro), rows is not None)
             for micro, rows in self._micro_batches(batch, prompt_cached=scoring == "shared_prompt")), inputs,
            self.manual_backward,
            self.reference_policy, share_prompt=scoring == "shared_prompt", loss_scale=scale,
        )  # fmt: skip
        # the whole step's values, equal on every rank
        step_loss, step_pg_loss = self._global_sum(torch.stack([step.loss, step.pg_loss]))
        where = f"global step {self.global_step} (epoch {self.current_epoch})"
        finite, grad_norm = self.guard.finite("loss", step_loss, where), None
        if finite:
            grads = [p for p in self.policy.parameters() if p.grad is not None]  # the norm is over all ranks/shards
            with timed("optimizer"):
                grad_norm = clip_grad_norm(grads, self.hparams.gradient_clip_norm)
            finite = self.guard.finite("gradient norm", grad_norm, where)
        with timed("metrics"):
            if finite:
                self._update_step_metrics(step, step_loss, step_pg_loss, grad_norm, algorithm)
        with timed("optimizer"):
            self._apply_step(finite, grad_norm, where)

    def _update_step_metrics(
        self, step: StepStats, loss: torch.Tensor, pg_loss: torch.Tensor, grad_norm: torch.Tensor, algorithm: Algorithm
    ) -> None:
        """The `train/` metrics of one finite optimizer step, and the adaptive entropy coefficient's update."""
        update_step_metrics(self.train_metrics, loss, pg_loss, grad_norm, step)
        if algorithm.entropy_target is not None:  # H̄ of the step's kept tokens, over micro-batches and ranks
            weighted = [(stats.pg_stats["bonus_entropy"] * rows.response_mask.sum(), rows.response_mask.sum())
                        for rows, stats in step.micro]  # fmt: skip
            totals = self._global_sum(torch.tensor(
                [sum(float(w) for w, _ in weighted), sum(float(n) for _, n in weighted)], device=self.device
            ))  # fmt: skip
            self.entropy_control.update(float(totals[0] / totals[1].clamp(min=1)))

    def _apply_step(self, finite: bool, grad_norm: torch.Tensor | None, where: str) -> None:
        """Step the optimizer and schedule on a finite step (or skip a zero-signal one), then clear the gradients."""
        optimizer = self.optimizers()
        if finite and self.hparams.skip_zero_signal_steps and grad_norm == 0:
            self._skip_zero_signal_step()
        elif finite:
            if self.offload is None:
                optimizer.step()
            else:
                self.offload.step(optimizer.optimizer, optimizer.step)
            self.lr_schedulers().step()
            self.policy_version += 1
            self.guard.check_weights(weight_norm(self.policy.parameters()), where)
        else:
            self.print(f"[erpo] non-finite loss or gradient at {where}: optimizer step skipped")
        self.guard.record(stepped=finite)
        optimizer.zero_grad(set_to_none=True)
        if self.offload is not None:  # the optimizer holds the host copies: the policy's own gradients stay
            self.policy.zero_grad(set_to_none=True)

    def _skip_zero_signal_step(self) -> None:
        """Leave weights, optimizer state and LR schedule as they are, but count the step towards `max_steps` (the
        batch is consumed: the run sees the same data as one that stepped)."""
        self.zero_signal_skips += 1
        if self._trainer is not None:  # Lightning counts a manual-optimization step when the optimizer steps
            progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
            progress.increment_ready()
            progress.increment_completed()

    def training_step(self, batch: QueryBatch, batch_idx: int) -> None:
        """Run the optimizer steps of the step's rollout batch (see the module docstring)."""
        if batch.rollout is None:
            raise RuntimeError("training_step got queries without their rollout: train with a RolloutCallback")
        self.train_on(batch.rollout)

    def train_on(self, rollout: RolloutBatch) -> None:
        """The optimizer steps of one rollout batch: advantages (and old log-probs when the batch is used more than
        once) are computed here, w(q) per optimizer step unless the batch carries it (`_step_query_weights`)."""
        check_loss_constant(self.algorithm, self.hparams.algorithm, self.hparams.loss_constant, rollout)
        check_carried_weights(self.algorithm, rollout)
        algorithm, group_size = self.algorithm, rollout.group_size
        advantages = global_advantages(
            self._trainer, rollout.rewards, group_size, algorithm.advantage_estimator, algorithm.advantage_eps
        )
        batch = replace(rollout, advantages=advantages)
        updates = minibatch_rows(batch.num_rows, group_size, self.hparams.update_batch_size)
        if self.hparams.num_iterations > 1 or len(updates) > 1:
            with timed("old_logprobs"):
                batch = replace(batch, old_logprobs=self._recompute_old_logprobs(batch))
            mismatch = (batch.old_logprobs - batch.sampling_logprobs).abs()
            self.train_metrics["logprob_abs_diff"].update(mismatch, batch.response_mask)
        for _ in range(self.hparams.num_iterations):
            for rows in updates:
                self._optimizer_step(batch.select_rows(rows))
        with timed("metrics"):
            self._log_train_metrics()
        with timed("release_heap"):
            release_free_heap()  # the step's activations and gradients: see erpo_lightning/common/memory.py

    def _log_train_metrics(self) -> None:
        """Log the step's `train/` metrics; one logged before but not updated in this step (the loss of a skipped
        optimizer step) is logged as NaN, since Lightning would otherwise write its previous value again."""
        logged = compute_and_reset(self.train_metrics)
        logged.update({name: float("nan") for name in self._logged_train_metrics - logged.keys()})
        self._logged_train_metrics |= logged.keys()
        if (warning := self.saturated_correction.update(logged.get("train/rollout_is_capped_frac"))) is not None:
            rank_zero_warn(warning)
        logged["train/skipped_steps"] = float(self.guard.skipped_steps)
        logged["train/zero_signal_skips"] = float(self.zero_signal_skips)
        logged["train/policy_version"] = float(self.policy_version)
        logged["train/lr"] = self.optimizers().param_groups[0]["lr"]
        self.log_dict(logged, on_step=True, prog_bar=False, batch_size=1)


# Each loss setting is documented once, in `Algorithm`'s docstrings; the CLI's help for `--model.<field>` reads it here.
ERPOModule.__doc__ = f"{ERPOModule.__doc__.rstrip()}\n{loss_setting_args_doc()}\n"
