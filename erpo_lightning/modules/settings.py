"""The settings ERPOModule owns, checked before anything is built: their ranges and the compute dtype's one owner.

`erpo fit` runs these checks on the parsed config before any class is instantiated; the module's constructor runs
them again (a Python user gets the same one-line errors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from erpo_lightning.common.setting_rules import Rule, check_rules
from erpo_lightning.modules.lora import check_lora_settings, model_skeleton, require_peft
from erpo_lightning.modules.lora_files import check_lora_targets_before_loading
from erpo_lightning.modules.optim import NonFiniteGuard, check_optimizer_settings
from erpo_lightning.scoring.output_layer import fused_output_problem

Dtype = Literal["float32", "bfloat16", "float16"]
QueryKLScoring = Literal["exact", "shared_prompt", "shared_forward"]
MixedPrecision = Literal["none", "bfloat16"]

# One rule for the weights' dtype and the FSDP2 compute dtype: float16 needs loss scaling, which the step does not do.
_NOT_FLOAT16 = (
    "float16 is not supported: it needs float32 master weights and loss scaling, which training does not do (float16 "
    "weights turn NaN/inf in the first optimizer step); bfloat16 has float32's range at float16's memory"
)

# (field, test, allowed range as the error states it) of the module's own numeric and dtype settings; the optimizer's
# are checked by `optim.check_optimizer_settings`, nan_policy's by `NonFiniteGuard`, the algorithm's by
# `resolve_algorithm`.
_SETTING_RULES: tuple[Rule, ...] = (
    ("num_iterations", lambda v: v >= 1, ">= 1"),
    ("update_batch_size", lambda v: v is None or v >= 1, ">= 1 (or null)"),
    ("micro_batch_tokens", lambda v: v >= 1, ">= 1"),
    ("loss_constant", lambda v: v is None or (math.isfinite(v) and v > 0), "> 0 (or null)"),
    ("gradient_clip_norm", lambda v: v is None or (math.isfinite(v) and v > 0), "> 0 (null = no clipping)"),
    ("dtype", lambda v: v != "float16", f"float32 or bfloat16 ({_NOT_FLOAT16})"),
    ("fsdp_mixed_precision", lambda v: v != "float16", f"float32, bfloat16 or null ({_NOT_FLOAT16})"),
    ("mixed_precision", lambda v: v in ("none", "bfloat16"), f"none or bfloat16 ({_NOT_FLOAT16})"),
)


def check_trainer_precision(precision: object) -> None:
    """ValueError unless Lightning's `trainer.precision` is left at full precision (None, 32, "32", "32-true").

    The policy's dtypes have one owner, this module (`model.dtype`, and `model.fsdp_mixed_precision` under FSDP2),
    which the reference cache follows; a Lightning precision plugin would cast or autocast behind it (and
    `16-mixed` would bypass the float16 refusal).
    """
    if precision in (None, 32, "32", "32-true"):
        return
    hint = "float16 is refused (model.dtype)" if "16" in str(precision) and "bf16" not in str(precision) else (
        "set model.mixed_precision: bfloat16 (or, under FSDP2, model.fsdp_mixed_precision: bfloat16)"
        if "mixed" in str(precision) else
        "set model.dtype: bfloat16 (or, under FSDP2, model.fsdp_mixed_precision: bfloat16)"
    )  # fmt: skip
    raise ValueError(
        f"trainer.precision {precision!r} is not used: the policy's dtype is set by model.dtype and its compute dtype "
        f"under FSDP2 by model.fsdp_mixed_precision, which the reference cache follows; leave trainer.precision "
        f"unset ({hint})"
    )


def check_module_settings(settings: Mapping[str, Any]) -> None:
    """ValueError naming the first `model.` setting outside its allowed range (`model.<field> must be ...`).

    `settings` maps ERPOModule's parameter names to values (the constructor's arguments, or the CLI's parsed `model:`
    group before anything is built); a name missing from it is not checked. With `peft` set, its `target_modules`
    are checked against the model's layers, read from `model_path`'s config.json (no weights).
    """
    check_rules("model", settings, _SETTING_RULES)
    check_optimizer_settings(
        settings.get("optimizer"), settings.get("lr_scheduler"), settings.get("learning_rate"),
        settings.get("weight_decay"), settings.get("warmup_steps", 0),
    )  # fmt: skip
    NonFiniteGuard(settings.get("nan_policy", "stop"), settings.get("max_consecutive_skips", 10))
    check_mixed_precision(
        settings.get("mixed_precision", "none"), settings.get("dtype", "float32"), settings.get("fsdp_mixed_precision")
    )
    if settings.get("compile"):
        check_compile(settings.get("query_kl_scoring", "shared_prompt"))  # ERPOModule's default
    if settings.get("fused_output_layer"):
        check_fusable_before_loading(settings.get("model_path"), bool(settings.get("trust_remote_code", False)))
    if settings.get("peft") is not None:  # LoRA: its ranges, peft installed, its targets, before any weight loads
        check_lora_settings(settings["peft"])
        require_peft()
        check_lora_targets_before_loading(
            settings["peft"], settings.get("model_path"), bool(settings.get("trust_remote_code", False))
        )


def check_compile(query_kl_scoring: str) -> None:
    """ValueError for `model.compile` with `query_kl_scoring: shared_prompt`: the responses run on the prompt's keys
    and values through a cache object, which the compiled layers do not take, so the prompt forward would run
    uncompiled while the reference cache was computed compiled, and Query-KL would drift from 0 at θ0 by rounding."""
    if query_kl_scoring == "shared_prompt":
        raise ValueError(
            "model.compile cannot be used with model.query_kl_scoring 'shared_prompt': its prompt forward carries a "
            "key/value cache, which the compiled layers do not take, so the query scores would differ from the "
            "compiled reference cache's in the last bits and Query-KL would not be exactly 0 at θ0; use "
            "query_kl_scoring 'exact' with compile, or compile: false"
        )


def check_mixed_precision(mixed_precision: str, dtype: str, fsdp_mixed_precision: str | None) -> None:
    """ValueError unless `model.mixed_precision` bfloat16 (autocast over float32 master weights) comes with
    `model.dtype` float32 and without `model.fsdp_mixed_precision` (FSDP2's own split of the same roles)."""
    if mixed_precision == "none":
        return
    if dtype != "float32":
        raise ValueError(
            f"model.mixed_precision {mixed_precision!r} computes in {mixed_precision} over float32 master weights, so "
            f"model.dtype must be float32, got {dtype!r} (bfloat16 weights lose updates below 1/256 of a weight)"
        )
    if fsdp_mixed_precision is not None:
        raise ValueError(
            f"model.mixed_precision {mixed_precision!r} and model.fsdp_mixed_precision {fsdp_mixed_precision!r} both "
            "set the compute dtype: under FSDP2 set model.fsdp_mixed_precision only, elsewhere model.mixed_precision"
        )


def check_offload_strategy(offload_optimizer: bool, strategy: object) -> None:
    """ValueError naming `model.offload_optimizer` and `trainer.strategy` when the optimizer would be offloaded under
    `ModelParallelStrategy` (FSDP2), whose sharded parameters it cannot copy to the host and which already splits
    the optimizer's state over the ranks. `strategy` is `trainer.strategy` as configured: a name, a `class_path`
    group or a Strategy."""
    if not offload_optimizer:
        return
    name = strategy.get("class_path") if isinstance(strategy, Mapping) else strategy
    if "ModelParallelStrategy" in (name if isinstance(name, str) else type(name).__name__):
        raise ValueError(
            "model.offload_optimizer cannot be used with trainer.strategy ModelParallelStrategy (FSDP2): its weights "
            "are sharded over the ranks, and so is the optimizer's state already; set model.offload_optimizer false, "
            "or add GPUs to shard over"
        )


def check_scoring_cache_engine(query_kl_scoring: str, cache_engine: str) -> None:
    """ValueError naming `model.query_kl_scoring` and `data.cache_engine` as given when the step's Query-KL scoring
    needs the reference scores' layout and the cache engine records none.

    `exact` and `shared_prompt` score each query in the layout the reference cache was computed in, to equal it bit
    for bit at θ0; vLLM's `prompt_logprobs` (cache_engine `vllm`) have no such layout and match only to about 1e-6,
    which `shared_forward`'s tolerance absorbs. Checked before the cache is built, not when the first step needs it.
    """
    if cache_engine == "vllm" and query_kl_scoring in ("exact", "shared_prompt"):
        raise ValueError(
            f"model.query_kl_scoring {query_kl_scoring!r} cannot be used with data.cache_engine 'vllm': it scores each "
            "query in the layout the reference cache was computed in, to equal it bit for bit, and vLLM's "
            "prompt_logprobs have no such layout (they match to about 1e-6); set data.cache_engine transformers, or "
            "model.query_kl_scoring shared_forward"
        )


def check_fusable_before_loading(model_path: str | None, trust_remote_code: bool = False) -> None:
    """ValueError naming `model.fused_output_layer` when the skeleton of `model_path` (`lora.model_skeleton`: its
    config.json, no weights) cannot fuse its output layer (`output_layer.fused_output_problem`). Not checked without
    a path, for a `.gguf` file or when the config cannot be read: `ERPOModule.configure_model` checks the loaded
    model."""
    if not model_path or str(model_path).lower().endswith(".gguf"):
        return
    skeleton = model_skeleton(str(model_path), trust_remote_code)
    if skeleton is not None and (problem := fused_output_problem(skeleton)) is not None:
        raise ValueError(f"model.fused_output_layer cannot be used with {model_path}: {problem}; set it to false")
