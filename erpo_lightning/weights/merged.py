"""A policy's weights as its base model names them: LoRA layers merged (W + scale·B·A), every other entry as is.

A policy trained with `model.peft` (modules/lora.py) holds, for each adapted linear layer `X`, the frozen base weight
`X.base_layer.weight` [out, in], its bias `X.base_layer.bias` [out], and the adapter `X.lora_A.<name>.weight`
[r, in] and `X.lora_B.<name>.weight` [out, r]. A reader of plain Hugging Face weights (vLLM's `reload_weights`, a
`save_pretrained` folder) expects `X.weight` and `X.bias`: `base_model_items` yields them, the weight merged in
float32 and cast back to its dtype, without changing the policy. A policy without LoRA layers passes through
unchanged, so every caller uses this one function. At B = 0 (step 0) the merged weight equals W to the bit.

A model whose config ties its LM head to its input embeddings (`tie_word_embeddings: true`) but whose merged head
differs from them (LoRA on the head, which training now refuses, in an older checkpoint) is written untied:
`tied_head_state` sets the flag to false, so that every loader (vLLM drops a tied model's `lm_head.weight`) reads
the trained head.

peft is not imported here: LoRA layers exist only once it is, so without it there is nothing to merge.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraMerge:
    """How one adapted layer's weight is merged: W + Σ_adapters scaling · (B @ A), transposed when the base layer
    stores its weight as [in, out] (`fan_in_fan_out`, GPT-2's Conv1D)."""

    scalings: dict[str, float]  # adapter name -> alpha / r, the active adapters only
    fan_in_fan_out: bool


def lora_layers(model: torch.nn.Module) -> dict[str, LoraMerge]:
    """{module name: LoraMerge} of the LoRA layers inside `model` ({} for a model without adapters)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            active = [a for a in module.active_adapters if a in module.lora_A]
            scalings = {adapter: float(module.scaling[adapter]) for adapter in active}
            layers[name] = LoraMerge(scalings, bool(getattr(module, "fan_in_fan_out", False)))
    return layers


def _detached(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach()


def base_model_items(
    state: Mapping[str, torch.Tensor],
    layers: Mapping[str, LoraMerge],
    materialize: Callable[[torch.Tensor], torch.Tensor] = _detached,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(base model name, tensor) for every entry of `state` (a policy's state dict), in its order.

    Args:
        state: the policy's state dict (its entries may be FSDP2 DTensor shards).
        layers: the policy's LoRA layers (`lora_layers`); {} passes every entry through.
        materialize: applied to each entry before use (e.g. gathering a DTensor shard into the full tensor, a
            collective under FSDP2: every rank must consume the iterator in the same order, which it does since the
            order is the state dict's). The adapters' entries are read when their layer's weight is merged and are
            not yielded.
    """
    for name, tensor in state.items():
        owner, _, leaf = name.rpartition(".")
        layer_name, _, part = owner.rpartition(".")
        if layer_name in layers and part == "base_layer":
            value = materialize(tensor)
            if leaf == "weight":
                value = _merged(value, state, layer_name, layers[layer_name], materialize)
            yield f"{layer_name}.{leaf}", value
        elif _is_adapter_entry(name, layers):
            continue
        else:
            yield name, materialize(tensor)


def _is_adapter_entry(name: str, layers: Mapping[str, LoraMerge]) -> bool:
    """Whether `name` is a LoRA layer's A or B weight (`<layer>.lora_A.<adapter>.weight`)."""
    for marker in (".lora_A.", ".lora_B."):
        layer_name, found, _ = name.partition(marker)
        if found and layer_name in layers:
            return True
    return False


def _merged(
    weight: torch.Tensor,
    state: Mapping[str, torch.Tensor],
    layer_name: str,
    merge: LoraMerge,
    materialize: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """W + Σ scaling · B @ A of one layer, in float32, cast back to W's dtype ([out, in], or [in, out] when
    `fan_in_fan_out`)."""
    total = weight.float()
    for adapter, scaling in merge.scalings.items():
        a = materialize(state[f"{layer_name}.lora_A.{adapter}.weight"]).float()  # [r, in]
        b = materialize(state[f"{layer_name}.lora_B.{adapter}.weight"]).float()  # [out, r]
        delta = (b @ a) * scaling
        total = total + (delta.T if merge.fan_in_fan_out else delta)
    return total.to(weight.dtype)


def base_model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain (unsharded) model's state dict under its base model's names, LoRA layers merged (a copy where
    merged; other entries are the model's own tensors, detached)."""
    return dict(base_model_items(model.state_dict(), lora_layers(model)))


def theta0_named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """`model.named_parameters()`, except for a model whose LoRA adapters all add nothing yet (every B is 0, as they
    start): that model computes its base model's function, so its base parameters are returned under the base
    model's names (peft's `PeftModel` prefix `base_model.model.` and the `.base_layer` level removed) and the
    adapters are left out. What fingerprints θ0 (integrations/reference_scores.py) then names the base model."""
    named = list(model.named_parameters())
    layers = lora_layers(model)
    adapters = [(name, p) for name, p in named if _is_adapter_entry(name, layers)]
    if not layers or any(".lora_B." in name and bool(p.detach().any()) for name, p in adapters):
        return named
    prefix = "base_model.model." if all(name.startswith("base_model.model.") for name, _ in named) else ""
    return [
        (name.removeprefix(prefix).replace(".base_layer.", "."), p)
        for name, p in named
        if not _is_adapter_entry(name, layers)
    ]


def embedding_weight_names(model: torch.nn.Module) -> tuple[str, str] | None:
    """(input embedding weight, LM head weight) of `model` under its base model's names (e.g.
    `model.embed_tokens.weight`, `lm_head.weight`); None when it has no such pair."""
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if not callable(get_input) or not callable(get_output):
        return None
    inputs, head = get_input(), get_output()
    names = {id(module): name for name, module in model.named_modules()}
    if inputs is None or head is None or id(inputs) not in names or id(head) not in names:
        return None
    return f"{names[id(inputs)]}.weight", f"{names[id(head)]}.weight"


def tied_head_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (`base_model_state_dict(model)`) made consistent with `model.config`'s `tie_word_embeddings` before it
    is written: a tied model's head that differs from its input embeddings unties the config (the flag set to false
    in place, the head written on its own); one equal to them but a separate copy (a LoRA head at B = 0) is replaced by
    the embeddings' tensor, so that one matrix is written. Untied models, and heads that are the embeddings' own
    tensor, are returned as they are."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = embedding_weight_names(model)
    if names is None or not getattr(text_config, "tie_word_embeddings", False):
        return state
    embeddings, head = names
    if embeddings not in state or head not in state or state[head].data_ptr() == state[embeddings].data_ptr():
        return state
    if torch.equal(state[head], state[embeddings]):
        return {**state, head: state[embeddings]}
    for owner in {id(config): config, id(text_config): text_config}.values():
        owner.tie_word_embeddings = False
    return state
