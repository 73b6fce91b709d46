"""ERPO inside TRL 1.16: `ERPOTrainer`, a `GRPOTrainer` whose loss is `objectives.rl_loss`, and `QueryKLCallback`,
a Query-KL monitor for any `GRPOTrainer` run.

`ERPOTrainer` overrides three hooks of `GRPOTrainer`:
    `_calculate_rewards`              keeps the rewards of the whole generation batch (all processes), refusing a
                                      non-finite one (`trl_guards`)
    `_generate_and_score_completions` forms the advantages with the algorithm's estimator, and adds each row's θ0
                                      query scores, w(q), group leader flag and the step's global counts
    `_compute_loss`                   the update unit's loss of one micro-batch (`erpo_lightning.update`, as
                                      `ERPOModule` runs it): the exact Query-KL pass, then one forward over
                                      [prompt; completion] through TRL's fused LM head with the prompt labels kept
                                      and `objectives.rl_loss` with the resolved `Algorithm` (and vLLM's sampling
                                      log-probs, for `rollout_correction`)
The θ0 scores of every training (and evaluation) prompt are computed in `__init__` (before any step) with the
project's cache code, fingerprinted, written to `<output_dir>/erpo_reference` and read back on resume
(`reference_scores.load_or_score`).

Importing this module imports TRL; `import erpo_lightning` does not.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOTrainer

from erpo_lightning import objectives as obj
from erpo_lightning.data.reference_logprobs import compute_reference_logprobs
from erpo_lightning.integrations.reference_scores import load_or_score, probe_query_kl, reference_manifest
from erpo_lightning.integrations.trl_config import (
    ALGORITHM_FIELDS,
    config_default,
    config_problem,
    trainer_algorithm,
    trl_loss_menu,
    trl_rollout_correction,
)
from erpo_lightning.integrations.trl_guards import (
    FiniteWeightsCallback,
    NaNReturns,
    chat_template,
    empty_dataset_problem,
    named_datasets,
    prompt_problem,
    reward_problem,
)
from erpo_lightning.modules.lora import peft_config_problem
from erpo_lightning.modules.settings import QueryKLScoring
from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.scoring.logprobs import position_ids_from_mask
from erpo_lightning.update import LossRows, StepInputs, micro_batch_loss, query_pass_term, step_query_weights

__all__ = ["ERPOTrainer", "QueryKLCallback"]


def _prompt_ids(trainer: GRPOTrainer, prompts: list) -> list[list[int]]:
    """Token ids of `prompts` exactly as `trainer` tokenizes them for generation (chat template included)."""
    return [list(map(int, ids)) for ids in trainer._tokenize_prompts(prompts)[0]]


def _template(trainer: GRPOTrainer, prompts: list) -> dict:
    conversational = bool(prompts) and isinstance(prompts[0], list)
    return {"source": "trl", "chat_template": chat_template(trainer) if conversational else None}


_NO_SAMPLING_LOGPROBS = (
    "needs the engine's log-probs of the sampled tokens, which TRL has with use_vllm=True or from a rollout_func "
    "that returns `logprobs`"
)


def _unsupported_inputs(trainer: GRPOTrainer, algorithm: Algorithm) -> str | None:
    """The first trainer input ERPOTrainer cannot honour, as a one-line reason, or None."""
    if algorithm.rollout_correction != "none" and not (trainer.use_vllm or trainer.rollout_func is not None):
        return f"algorithm rollout_correction={algorithm.rollout_correction!r} {_NO_SAMPLING_LOGPROBS}"
    if trainer.tools or trainer.environment_factories is not None:
        return "tools and environment_factory are not supported (their tokens are not the prompt's)"
    if not all(isinstance(dataset, Dataset) for _, dataset in named_datasets(trainer)):
        return "train_dataset and eval_dataset must be map-style datasets.Dataset (θ0 scores every prompt once)"
    return prompt_problem(trainer)


def _dataset_prompts(trainer: GRPOTrainer) -> tuple[list, int]:
    """The training prompts then the evaluation prompts (θ0 scores both), and how many are training prompts."""
    prompts = [list(dataset["prompt"]) for _, dataset in named_datasets(trainer)]
    return [prompt for dataset in prompts for prompt in dataset], len(prompts[0])


class ERPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` trained with ERPO (or any `Algorithm` without Policy-KL): `objectives.rl_loss` on the
    rows TRL generates, Query-KL against cached θ0 scores, w(q) per query; no reference model.

    Args (besides GRPOTrainer's):
        algorithm: a preset name (`erpo`, `erpo_released`, ...) or an `Algorithm`.
        reference_dir: where the θ0 scores are kept (default `<output_dir>/erpo_reference`).
        query_kl_scoring: `exact` (default): each micro-batch's unique queries are scored again alone, in the θ0
            cache's layout and compute dtype (the cache is scored under the trainer's autocast), so at θ0 Query-KL
            is exactly 0 and `query_kl_tolerance` defaults to 0; `shared_forward`: the query tokens come from the
            fused forward over [prompt; completion] rows (no extra forward), and the tolerance defaults to the
            compute dtype's noise floor (docs/erpo.md, "Query-KL at θ0").
        **fields: single `Algorithm` fields overriding the preset (e.g. `query_kl_coef=0.05`).
    GRPOConfig's `vllm_importance_sampling_correction` (TRL's default, with vLLM) sets the algorithm's
    `rollout_correction` fields from its mode and clip bounds (`trl_config.trl_rollout_correction`); its
    `importance_sampling_level`, `loss_type='cispo'` and entropy settings (`entropy_coef`, `use_adaptive_entropy`
    with its target and bounds, `top_entropy_quantile`) set our loss-menu fields (`trl_config.trl_loss_menu`). The
    adaptive entropy coefficient lives in TRL's own `entropy_coef` / `_last_world_entropy`, which TRL checkpoints.
    The loss side (loss_type, clip range, advantages) follows the algorithm; a GRPOConfig loss field set to
    something else is refused, as is every setting rl_loss cannot reproduce (one line naming it). An empty dataset
    is refused before TRL builds anything; empty prompts and chat prompts without a chat template before θ0
    scoring; a non-finite reward at the step that meets it, and non-finite weights after the optimizer step that
    made them (`trl_guards`).
    """

    def __init__(
        self,
        *args,
        algorithm: str | Algorithm = "erpo",
        reference_dir: str | Path | None = None,
        query_kl_scoring: QueryKLScoring = "exact",
        **kwargs,
    ):
        overrides = {name: kwargs.pop(name) for name in list(kwargs) if name in ALGORITHM_FIELDS}
        algorithm = trainer_algorithm(algorithm, overrides)
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is not None:
            try:
                algorithm = trl_loss_menu(config, trl_rollout_correction(config, algorithm))
            except ValueError as error:
                raise ValueError(f"ERPOTrainer: {str(error).replace('model.', '')}") from None
        problem = config_problem(config, algorithm) if config is not None else None  # before TRL builds anything
        problem = problem or empty_dataset_problem(
            kwargs.get("train_dataset", args[3] if len(args) > 3 else None),
            kwargs.get("eval_dataset", args[4] if len(args) > 4 else None),
        )
        if problem is None:  # LoRA on a tied LM head: refused before the model loads (modules/lora.py)
            remote = bool((getattr(config, "model_init_kwargs", None) or {}).get("trust_remote_code", False))
            peft_config = kwargs.get("peft_config", args[10] if len(args) > 10 else None)
            problem = peft_config_problem(peft_config, kwargs.get("model", args[0] if args else None), remote)
        if problem is None:
            super().__init__(*args, **kwargs)
            problem = config_problem(self.args, algorithm) or _unsupported_inputs(self, algorithm)
        if problem is not None:
            raise ValueError(f"ERPOTrainer: {problem}")
        if query_kl_scoring not in ("exact", "shared_forward"):
            raise ValueError(
                f"ERPOTrainer: query_kl_scoring must be 'exact' or 'shared_forward' ('shared_prompt' is erpo fit's "
                f"only), got {query_kl_scoring!r}"
            )
        self.query_kl_scoring = query_kl_scoring
        if algorithm.query_kl_tolerance is None:  # as erpo fit: nothing under exact scoring, else the noise floor
            tolerance = 0.0 if query_kl_scoring == "exact" else obj.query_kl_tolerance_for(self._compute_dtype())
            algorithm = replace(algorithm, query_kl_tolerance=tolerance)
        self.algorithm = algorithm
        # TRL's adaptive-entropy state (saved and restored by GRPOTrainer's checkpoint hooks) holds our controller's.
        self.entropy_coef, self.use_adaptive_entropy = algorithm.entropy_coef, algorithm.entropy_target is not None
        self._erpo_entropy_window = torch.zeros(2)  # [Σ H over kept tokens, kept tokens] of the accumulation window
        if self.args.weight_decay == config_default(
            "weight_decay"
        ):  # an optimizer default of the preset (erpo_released)
            self.args.weight_decay = algorithm.weight_decay
        prompts, num_train = _dataset_prompts(self)
        prompt_ids = _prompt_ids(self, prompts)
        manifest = reference_manifest(
            self.model, self.processing_class, prompts, prompt_ids, _template(self, prompts), self._compute_dtype()
        )
        directory = Path(reference_dir or Path(self.args.output_dir) / "erpo_reference")
        with self.accelerator.main_process_first(), self.accelerator.autocast():  # the training forward's dtype
            self.reference_cache = load_or_score(self.model, prompt_ids, directory, manifest)
        # [rows] w(q) of every scored prompt when the algorithm makes it static, made once: s̄ is the training set's.
        nll = self.reference_cache.nll
        self._query_weight_table = algorithm.query_weight_table(nll, nll[:num_train])
        self._cache_row = {}  # prompt token ids -> first cache row holding them
        for row, ids in enumerate(prompt_ids):
            self._cache_row.setdefault(tuple(ids), row)
        self._rewards_per_func: torch.Tensor | None = None
        self._nan_returns = NaNReturns(len(self.reward_funcs))
        self.reward_funcs = [
            func if isinstance(func, torch.nn.Module) else self._nan_returns.wrap(index, func)
            for index, func in enumerate(self.reward_funcs)
        ]
        self.add_callback(FiniteWeightsCallback())

    def _compute_dtype(self) -> torch.dtype:
        """What the training forward computes in: bf16 / fp16 autocast when GRPOConfig asks, else the weights' dtype."""
        if self.args.bf16:
            return torch.bfloat16
        return torch.float16 if self.args.fp16 else next(self.model.parameters()).dtype

    # ------------------------------------------------------------------------------------------ generation side
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """[B, F] rewards of the generation batch (all processes), kept; a non-finite one, or a row no function
        scored, is refused on every process alike (one line naming the function, the value and the row)."""
        self._nan_returns.clear(len(prompts))
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        problem = reward_problem(self, rewards, self._nan_returns, completions)
        if problem is not None:
            raise ValueError(f"ERPOTrainer: {problem}")
        self._rewards_per_func = rewards
        return rewards

    def _cache_rows(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """[N] cache row of each left-padded prompt, found by its token ids."""
        rows = []
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
            key = tuple(token for token, real in zip(ids, mask, strict=True) if real)
            if key not in self._cache_row:
                raise ValueError(
                    "ERPOTrainer: a generated row's prompt tokens are not among the training prompts' θ0 scores "
                    "(a rollout_func or tokenizer that changes the prompt is not supported)"
                )
            rows.append(self._cache_row[key])
        return torch.tensor(rows, dtype=torch.long)

    @torch.no_grad()
    def _query_weights(self, rows: torch.Tensor, prompt_ids, prompt_mask, is_leader) -> torch.Tensor | None:
        """[N] w(q) of each row's query (`objectives.query_weights` with the algorithm's source, norm and clip), or
        None when it is not applied and would cost a forward. A dataset-static w(q) is read from the table made in
        `__init__`."""
        device = prompt_ids.device
        if self._query_weight_table is not None:
            return self._query_weight_table[rows].to(device)
        distinct, inverse = rows.unique(return_inverse=True)  # each query once; s̄ counts it once per group it leads
        first = torch.zeros(len(distinct), dtype=torch.long).scatter_(0, inverse, torch.arange(len(rows))).to(device)
        groups = torch.bincount(inverse[is_leader.cpu()], minlength=len(distinct))
        weights = step_query_weights(
            self.algorithm, self.accelerator.unwrap_model(self.model), prompt_ids[first], prompt_mask[first],
            self.reference_cache.nll[distinct].to(device), groups.to(device),
            lambda total: self.accelerator.reduce(total, "sum"),
        )  # fmt: skip
        return None if weights is None else weights[inverse.to(device)]

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if "pixel_values" in output or "tool_mask" in output:
            raise ValueError("ERPOTrainer: images and tool calls are not supported")
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        rewards = (self._rewards_per_func * self.reward_weights.to(self._rewards_per_func.device)).nansum(dim=1)
        algorithm, local = self.algorithm, len(output["prompt_ids"])
        advantages = obj.group_advantages(rewards, group, algorithm.advantage_estimator, algorithm.advantage_eps)
        first = self.accelerator.process_index * local
        device = output["prompt_ids"].device
        output["advantages"] = advantages[first : first + local].to(device)
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        rows = self._cache_rows(prompt_ids, prompt_mask)
        is_leader = (torch.arange(first, first + local) % group == 0).to(device)
        width = prompt_ids.shape[1]
        output["erpo_ref_query_logprobs"] = self.reference_cache.padded(rows, width).to(device)
        output["erpo_cache_rows"] = rows.to(device)
        output["erpo_is_leader"] = is_leader
        weights = self._query_weights(rows, prompt_ids, prompt_mask, is_leader)
        if weights is not None:
            output["erpo_query_weights"] = weights
            self._log_weight_stats(mode, weights[is_leader])
        # The step's global counts (rl_loss's normalizers): one generation batch is one optimizer step per process.
        counts = obj.loss_normalizers(output["completion_mask"], obj.query_token_mask(prompt_mask, width), is_leader)
        totals = self.accelerator.reduce(torch.stack(list(counts.values())), "sum")
        for name, total in zip(counts, totals, strict=True):
            output[f"erpo_count_{name}"] = total  # 0-dim: TRL's shuffle and split pass it through unchanged
        return output

    @torch.no_grad()
    def _log_weight_stats(self, mode: str, weights: torch.Tensor) -> None:
        """Mean, min and max of w(q) over the queries of all processes ([Q_local] in, any Q_local, 0 included)."""
        totals = self.accelerator.reduce(torch.stack([weights.sum(), weights.new_tensor(float(len(weights)))]), "sum")
        inf = weights.new_tensor([float("inf")])
        low = self.accelerator.gather(weights.min(0, keepdim=True)[0] if len(weights) else inf).min()
        high = self.accelerator.gather(weights.max(0, keepdim=True)[0] if len(weights) else -inf).max()
        if totals[1] > 0:
            self._metrics[mode]["query_kl/weight_mean"].append((totals[0] / totals[1]).item())
            self._metrics[mode]["query_kl/weight_min"].append(low.item())
            self._metrics[mode]["query_kl/weight_max"].append(high.item())

    # ------------------------------------------------------------------------------------------------ the loss
    def _fused_forward(self, model, rows: LossRows) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The update's `Forward` through TRL's fused LM head, with the prompt labels kept (Query-KL needs them):
        [N, P + R] log-probs and entropies at T = 1, column 0 unscored."""
        labels = rows.input_ids.masked_fill(rows.attention_mask == 0, -100)
        with self.accelerator.autocast():
            out = model(
                input_ids=rows.input_ids, attention_mask=rows.attention_mask, labels=labels, fused_lm_head=True,
                position_ids=position_ids_from_mask(rows.attention_mask),
            )  # fmt: skip
        # Column t = log p(token t | tokens < t); column 0 has no context and is never scored.
        entropy = None if out.entropy is None else torch.nn.functional.pad(out.entropy.float(), (1, 0))
        return torch.nn.functional.pad(out.log_probs.float(), (1, 0)), entropy

    def _compute_loss(self, model, inputs):
        """The update's loss of one micro-batch (`update.query_pass_term`, then `update.micro_batch_loss` scored by
        one forward whose fused head covers the prompt too).

        Rows: N = micro-batch rows, P = padded prompt width, R = padded completion width. Divided by the step's
        global counts, so the micro-batch losses of an optimizer step sum to the step's loss on every process
        (times the number of processes, which the gradient all-reduce averages over).
        """
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_mask = inputs["completion_mask"]
        sampling = inputs.get("sampling_per_token_logps")  # vLLM's NaN where it had none: see micro_batch_loss
        if sampling is None and self.algorithm.rollout_correction != "none":
            correction = self.algorithm.rollout_correction
            raise ValueError(
                f"ERPOTrainer: rollout_correction={correction!r} {_NO_SAMPLING_LOGPROBS}; this batch has none"
            )
        exact = self.query_kl_scoring == "exact"
        rows = LossRows(
            input_ids=torch.cat([prompt_ids, inputs["completion_ids"]], dim=1),
            attention_mask=torch.cat([prompt_mask, completion_mask], dim=1),
            prompt_length=prompt_ids.shape[1],
            temperature=1.0,
            response_mask=completion_mask,
            advantages=inputs["advantages"],
            is_group_leader=inputs["erpo_is_leader"],
            query_index=inputs["erpo_cache_rows"],
            old_logprobs=inputs.get("old_per_token_logps"),
            sampling_logprobs=sampling,
            query_weights=inputs.get("erpo_query_weights"),
            reference_query_logprobs=None if exact else inputs["erpo_ref_query_logprobs"],
            constant=self.max_completion_length,
        )
        normalizers = {
            name: inputs[f"erpo_count_{name}"] for name in ("tokens", "sequences", "queries", "query_tokens")
        }
        control = obj.EntropyControl.of(replace(self.algorithm, entropy_coef=self.entropy_coef))
        control.last_entropy = self._last_world_entropy
        step = StepInputs(
            replace(self.algorithm, entropy_coef=control.applied),  # the bonus's coefficient this step
            normalizers,
            self.num_generations if self.model.training else self.num_generations_eval,
            self.reference_cache if exact else None,
            lambda count: int(self.accelerator.reduce(torch.tensor(count, device=prompt_ids.device), "max")),
        )
        term, drift = None, None
        if exact:
            with self.accelerator.autocast():  # the cache's dtype: it was scored under the same autocast
                term, drift = query_pass_term(model, rows, step)
        loss, stats = micro_batch_loss(model, rows, step, forward=self._fused_forward)
        if exact:
            loss, stats = loss + term, replace(stats, query_drift=drift)
        if self.algorithm.entropy_target is not None and self.model.training:
            self._update_entropy_control(control, stats, completion_mask)
        self._log_loss_metrics(stats, completion_mask)
        return loss * (self.accelerator.num_processes if self.model.training else 1)

    @torch.no_grad()
    def _update_entropy_control(self, control: obj.EntropyControl, stats: obj.LossStats, completion_mask) -> None:
        """Add the micro-batch's kept-token entropy to the accumulation window; at the optimizer step's boundary,
        step the coefficient with the window's mean over all processes (as TRL's controller) and keep its state in
        TRL's attributes."""
        tokens = completion_mask.sum().float().cpu()
        kept = tokens * float(stats.pg_stats.get("entropy_kept_frac", 1.0))
        self._erpo_entropy_window += torch.stack([float(stats.pg_stats["bonus_entropy"]) * kept, kept])
        if self.accelerator.sync_gradients:
            window = self.accelerator.reduce(self._erpo_entropy_window.to(completion_mask.device), "sum")
            control.update(float(window[0] / window[1].clamp(min=1.0)))
            self.entropy_coef, self._last_world_entropy = control.coef, control.last_entropy
            self._erpo_entropy_window = torch.zeros(2)

    @torch.no_grad()
    def _log_loss_metrics(self, stats: obj.LossStats, completion_mask) -> None:
        """Query-KL (the run's estimator and the token_k3 yardstick: mean over the micro-batch's group leaders on all
        processes; TRL averages the micro-batches between two logs), TRL's entropy and clip-ratio metrics, and with
        `rollout_correction` the token mean of its ratio and the share of tokens outside its band."""
        mode = "train" if self.model.training else "eval"
        estimator = self.algorithm.query_kl_estimator
        drift = stats.query_drift
        values = {f"query_kl/{estimator}": drift.query_kl, "query_kl/token_k3": drift.query_kl_token_k3}
        for name, per_query in values.items():
            totals = self.accelerator.reduce(
                torch.stack([per_query.sum(), per_query.new_tensor(float(per_query.numel()))]), "sum"
            )
            if totals[1] > 0:
                self._metrics[mode][name].append((totals[0] / totals[1]).item())
        real = completion_mask.float()
        counts = self.accelerator.reduce(real.sum(), "sum").clamp(min=1)
        if stats.entropy is not None:
            self._metrics[mode]["entropy"].append(
                (self.accelerator.reduce((stats.entropy * real).sum(), "sum") / counts).item()
            )
        token_means = {name: stats.pg_stats[key] * real.sum() for name, key in (
            ("clip_ratio/low_mean", "clip_frac_low"), ("clip_ratio/high_mean", "clip_frac_high"),
            ("cispo/truncated_frac", "cispo_truncated_frac"), ("gspo/seq_ratio_dev", "seq_ratio_dev"),
            ("entropy/kept_frac", "entropy_kept_frac"), ("entropy_coef", "entropy_coef"),
            ("entropy/bonus", "entropy_bonus"), ("entropy/target", "entropy_target"),
        ) if key in stats.pg_stats}  # fmt: skip
        if stats.rollout_is_ratio is not None:
            token_means["rollout_correction/ratio_mean"] = (stats.rollout_is_ratio * real).sum()
            token_means["rollout_correction/capped_frac"] = (stats.rollout_is_outside * real).sum()
        for name, local in token_means.items():
            self._metrics[mode][name].append((self.accelerator.reduce(local, "sum") / counts).item())


class QueryKLCallback(TrainerCallback):
    """Query-KL of a fixed probe set of training prompts, for any `GRPOTrainer` run; changes nothing in training.

    At train begin the first `num_probes` training prompts are scored at θ0 (the model before its first step) and
    written to `<output_dir>/query_kl_probes` (a resumed run reads them back). Every `logging_steps` optimizer steps
    they are rescored without gradient, in eval mode, with the RNG state restored, and `query_kl/token_k3` and
    `query_kl/sequence_k3` (`objectives.per_query_kl`, mean over the probes) go into TRL's logged metrics.
    `history` keeps (global step, values), step 0 included.
    """

    def __init__(self, trainer: GRPOTrainer, num_probes: int = 64):
        if isinstance(trainer, ERPOTrainer):
            raise ValueError(
                "QueryKLCallback: ERPOTrainer already logs query_kl/* from its training batches, under the same names"
            )
        self.trainer, self.num_probes = trainer, num_probes
        self.reference = None
        self.prompt_ids: list[list[int]] = []
        self.history: list[tuple[int, dict[str, float]]] = []

    def _score(self, model) -> dict[str, float]:
        was_training = model.training
        cpu_state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        model.eval()
        try:
            current = compute_reference_logprobs(model, self.prompt_ids, progress=False)
        finally:
            model.train(was_training)
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state_all(cuda_state)
        return probe_query_kl(current, self.reference)

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(kwargs.get("model") or trainer.model)
        dataset = trainer.train_dataset
        prompts = list(dataset.select(range(min(self.num_probes, len(dataset))))["prompt"])
        self.prompt_ids = _prompt_ids(trainer, prompts)
        manifest = reference_manifest(
            model, trainer.processing_class, prompts, self.prompt_ids, _template(trainer, prompts)
        )
        resumed = state.global_step > 0
        with trainer.accelerator.main_process_first():
            self.reference = load_or_score(
                model, self.prompt_ids, Path(args.output_dir) / "query_kl_probes", manifest,
                may_score=not resumed, trust_weights=resumed,
            )  # fmt: skip
        if not resumed:
            self.history.append((0, self._score(model)))

    def on_step_end(self, args, state, control, **kwargs):
        if not control.should_log:
            return
        model = self.trainer.accelerator.unwrap_model(kwargs.get("model") or self.trainer.model)
        values = self._score(model)
        self.history.append((state.global_step, values))
        for estimator, value in values.items():
            self.trainer._metrics["train"][f"query_kl/{estimator}"].append(value)
