"""LoRA training of the policy (`model.peft`): the settings, their checks, and the adapters added to the policy.

With `model.peft` set, `ERPOModule.configure_model` loads the base model as before, then adds LoRA adapters to the
layers `target_modules` names (`add_lora_adapters`, peft's `inject_adapter_in_model`): the policy stays the same
Hugging Face model class (generation, FSDP2's per-layer units and the log-prob code see the model they always saw),
each adapted linear layer computes W·x + scale·B·A·x with scale = alpha / r, and only A and B train. B starts at 0, so
the policy at step 0 is the base model, θ0, to the bit: the reference cache is the base model's, whatever `peft` says.

peft is imported only here and only when `model.peft` is set (`pip install 'erpo_lightning[lora]'`). docs/lora.md.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from erpo_lightning.setting_rules import Rule, check_rules

LORA_INSTALL_HINT = "model.peft needs the peft library: pip install 'erpo_lightning[lora]' (or pip install peft)"

# (field, test, allowed range) of LoraSettings; `check_lora_settings` runs them on the parsed config and the object.
_LORA_RULES: tuple[Rule, ...] = (
    ("r", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    ("alpha", lambda v: isinstance(v, int | float) and math.isfinite(v) and v > 0, "> 0"),
    ("dropout", lambda v: isinstance(v, int | float) and 0 <= v < 1, "in [0, 1)"),
    (
        "target_modules",
        lambda v: v == "all-linear" or (isinstance(v, list | tuple) and len(v) > 0 and all(isinstance(n, str) and n
                                                                                          for n in v)),
        "'all-linear' or a non-empty list of module names (e.g. [q_proj, v_proj])",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters trained in place of the full policy (`model.peft`; docs/lora.md).

    Attributes:
        r: rank of each adapter (A is r × in_features, B is out_features × r).
        alpha: scale numerator: an adapter adds (alpha / r) · B·A to its layer's weight.
        dropout: dropout on the adapters' input during training forwards (0 keeps the training forward
            deterministic, as the full model's is).
        target_modules: `all-linear` (every linear layer of the decoder, not the LM head) or the names of the
            layers to adapt, as peft matches them (e.g. `[q_proj, k_proj, v_proj, o_proj]`).
        seed: seed of A's random initialisation (B starts at 0). Every rank draws the same A (FSDP2 does not
            broadcast the initial weights), and runs of one seed start from the same adapters.
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] | Literal["all-linear"] = field(default="all-linear")
    seed: int = 0

    def __post_init__(self) -> None:
        check_lora_settings(asdict(self))


def check_lora_settings(settings: LoraSettings | Mapping[str, Any] | None) -> None:
    """ValueError naming the first `model.peft.<field>` outside its range (None: nothing to check)."""
    if settings is None:
        return
    values = asdict(settings) if isinstance(settings, LoraSettings) else dict(settings)
    unknown = sorted(set(values) - {f for f in LoraSettings.__dataclass_fields__})
    if unknown:
        raise ValueError(f"model.peft has no field {unknown[0]!r} (fields: r, alpha, dropout, target_modules, seed)")
    check_rules("model.peft", values, _LORA_RULES)


def lora_settings(value: LoraSettings | Mapping[str, Any] | None) -> LoraSettings | None:
    """`value` as LoraSettings (a mapping, as a checkpoint's hyper-parameters hold it, is converted); checked."""
    if value is None or isinstance(value, LoraSettings):
        return value
    check_lora_settings(value)
    values = dict(value)
    if isinstance(values.get("target_modules"), tuple):
        values["target_modules"] = list(values["target_modules"])
    return LoraSettings(**values)


def require_peft() -> None:
    """ImportError with the install line when peft is missing (checked before any model loads)."""
    if importlib.util.find_spec("peft") is None:
        raise ImportError(LORA_INSTALL_HINT)


def lora_config(settings: LoraSettings) -> Any:
    """The `peft.LoraConfig` of `settings` (plain LoRA: no DoRA, rsLoRA or bias training)."""
    require_peft()
    from peft import LoraConfig

    target = settings.target_modules if settings.target_modules == "all-linear" else list(settings.target_modules)
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=target)


def add_lora_adapters(model: torch.nn.Module, settings: LoraSettings) -> str:
    """Add LoRA adapters to `model` in place and freeze everything else; one line saying what trains
    (`trainable_summary`).

    A is drawn from `settings.seed` without touching the global RNG; B is 0, so the model's outputs are unchanged.
    Raises ValueError when `target_modules` matches no layer or a layer LoRA cannot merge as a linear one.
    """
    require_peft()
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    cuda_devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(settings.seed)
        try:
            inject_adapter_in_model(lora_config(settings), model)
        except ValueError as error:  # e.g. "Target modules {...} not found in the base model"
            raise ValueError(f"model.peft.target_modules {settings.target_modules!r}: {error}") from None
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and not isinstance(module, LoraLinear):
            raise ValueError(
                f"model.peft.target_modules matches {name} ({type(module).__name__}): only linear layers are "
                "supported (their merged weights are what the rollout engine and `erpo export` receive)"
            )
    return trainable_summary(settings, model)


def trainable_summary(settings: LoraSettings, model: torch.nn.Module) -> str:
    """One line: what trains, e.g. `LoRA r=16 alpha=32 on all-linear: 1,843,200 of 136,358,208 parameters train
    (1.35%)`."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return (
        f"LoRA r={settings.r} alpha={settings.alpha:g} on {settings.target_modules}: {trainable:,} of {total:,} "
        f"parameters train ({100 * trainable / total:.2f}%)"
    )
