"""A causal LM's decoder layers: the unit FSDP2 shards (`modules/sharding.py`) and `model.compile` compiles.

`compile_decoder_layers` runs each layer's forward under `torch.compile` (inductor) when it is given no key/value
cache: the update's forwards, the Query-KL pass and the reference cache's build, which then compute alike. A forward
with a cache (`generate`'s decoding, the shared prompt's responses) runs the layer as written: its cache object
changes shape every token and splits the compiled graph, which would recompile at every length.
"""

from __future__ import annotations

from typing import Any

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: modules whose class the model declares unsplittable (`_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} declares no decoder-layer class in `_no_split_modules`; cannot shard it per layer"
        )
    return layers


def compile_decoder_layers(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each decoder layer's forward compiled (dynamic shapes: a micro-batch's rows and columns vary)
    for the calls without a key/value cache, in place; a second call leaves it as it is. Every layer shares one
    compiled graph per grad mode (the layer is an input, not a constant)."""
    for layer in decoder_layers(model):
        if getattr(layer.forward, "erpo_compiled", None) is not None:
            continue
        eager = layer.forward
        compiled = torch.compile(eager, dynamic=True)

        def forward(*args: Any, _eager=eager, _compiled=compiled, **kwargs: Any) -> Any:
            return _eager(*args, **kwargs) if kwargs.get("past_key_values") is not None else _compiled(*args, **kwargs)

        forward.erpo_compiled = compiled
        layer.forward = forward
    return model
