"""LoRA training of the policy (`model.peft`): the settings, their checks, and the adapters added to the policy.

With `model.peft` set, `ERPOModule.configure_model` loads the base model as before, then adds LoRA adapters to the
layers `target_modules` names (`add_lora_adapters`, peft's `inject_adapter_in_model`): the policy stays the same
Hugging Face model class (generation, FSDP2's per-layer units and the log-prob code see the model they always saw),
each adapted linear layer computes W·x + scale·B·A·x with scale = alpha / r, and only A and B train. B starts at 0, so
the policy at step 0 is the base model, θ0, to the bit, unless `adapter_path` starts the adapters at a saved adapter
(`lora_files.py`; the adapters-only checkpoints of `checkpoint: adapters` are `checkpoints/adapters_only.py`'s);
either way the reference cache is the base model's, whatever `peft` says.

`target_modules` is checked against the model before any weight loads (`lora_files.check_lora_targets_before_loading`:
the model built from its config.json on the meta device): every entry must name linear layers, and not the LM head of a
model that ties it to its input embeddings (`tie_word_embeddings: true`), whose adapted head vLLM and exported models
would drop, keeping the shared base matrix.

peft is imported only here and only when `model.peft` is set (`pip install -e '.[lora]'` from the repository
root). docs/lora.md.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from erpo_lightning.common.setting_rules import Rule, check_rules

LORA_INSTALL_HINT = (
    "model.peft needs the peft library: pip install -e '.[lora]' from the repository root (or pip install peft)"
)

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
    ("adapter_path", lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "null or a folder path"),
    ("checkpoint", lambda v: v in ("full", "adapters"), "'full' or 'adapters'"),
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
        adapter_path: a peft adapter folder (`adapter_config.json`, `adapter_model.safetensors`: what
            `erpo export --adapter_out` or peft's `save_pretrained` writes) whose A and B the adapters start at, in
            place of A drawn from `seed` and B = 0; None = a fresh adapter. Its r, lora_alpha and adapted layers
            must be this group's `r`, `alpha` and `target_modules` (refused before any weight loads, naming the
            field: nothing is taken from the folder silently). θ0 stays the base model (`model_path`): Query-KL,
            w(q) and Policy-KL measure from the base, so the first step's Query-KL is the adapter's own drift.
        checkpoint: what a checkpoint holds of the policy. `full`: every weight, the frozen base included.
            `adapters`: the adapters alone (and their optimizer state, as always), with the hash of the base
            model's weight files; loading (resume, `erpo export`, `erpo validate`) rebuilds the base from
            `model_path` and refuses a base whose files hash otherwise. Single-file checkpoints only (one device,
            DDP); refused under FSDP2. A resume may change it (it only decides what is written).
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] | Literal["all-linear"] = field(default="all-linear")
    seed: int = 0
    adapter_path: str | None = None
    checkpoint: Literal["full", "adapters"] = "full"

    def __post_init__(self) -> None:
        check_lora_settings(asdict(self))


def check_lora_settings(settings: LoraSettings | Mapping[str, Any] | None) -> None:
    """ValueError naming the first `model.peft.<field>` outside its range (None: nothing to check)."""
    if settings is None:
        return
    values = asdict(settings) if isinstance(settings, LoraSettings) else dict(settings)
    names = list(LoraSettings.__dataclass_fields__)
    unknown = sorted(set(values) - set(names))
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)  # peft's own lora_alpha, lora_dropout
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"model.peft has no field {unknown[0]!r}{hint}; fields: {', '.join(names)}")
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
    Raises ValueError when `target_modules` matches no layer or a layer LoRA cannot merge as a linear one
    (`check_lora_targets`, which `erpo fit` and the module's constructor already ran on the model's skeleton).
    """
    require_peft()
    check_lora_targets(settings, model, str(getattr(model, "name_or_path", "") or "the model"))
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


# ------------------------------------------------------------------------------------------ target_modules checks
def model_skeleton(model_path: str, trust_remote_code: bool = False) -> torch.nn.Module | None:
    """The causal LM of `model_path` built from its config.json on the meta device (no weights read or allocated;
    milliseconds even for a 7B model); None when the config cannot be read (the model's load then reports why)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # an early check only: the real load reports the problem, and `add_lora_adapters` checks again
        return None


def adapter_parameters_before_loading(
    settings: LoraSettings | Mapping[str, Any] | None, model_path: str | None, trust_remote_code: bool = False
) -> int:
    """The parameters the adapters of `settings` add to the model at `model_path`, Σ r · (in + out) over the layers
    they adapt, counted on its skeleton (`model_skeleton`); 0 without settings, for a `.gguf` file or when the
    config cannot be read."""
    if settings is None or not model_path or str(model_path).lower().endswith(".gguf"):
        return 0
    skeleton = model_skeleton(str(model_path), trust_remote_code)
    if skeleton is None:
        return 0
    lora = lora_settings(settings)
    return sum(lora.r * (fan_in + fan_out) for _, fan_in, fan_out in _adapted_layers(lora, skeleton))


def check_lora_targets(settings: LoraSettings | Mapping[str, Any], model: torch.nn.Module, source: str) -> None:
    """ValueError naming the first `model.peft.target_modules` entry that does not adapt linear layers of `model` only:
    one that matches no module, a container (`layers`, `self_attn`, `mlp`), an embedding (`embed_tokens`), or the LM
    head of a model that ties it to its input embeddings (`all-linear` passes: peft leaves the head out); or `r`
    above min(in, out) of every adapted layer (`_check_rank`).

    Args:
        settings: the LoRA settings (their ranges are checked too).
        model: the model, or its meta-device skeleton (`model_skeleton`): only module names and types are read.
        source: the model's path or Hub id, as the error names it.
    """
    lora = lora_settings(settings)
    if lora.target_modules != "all-linear":
        _check_target_entries(lora, model, source)
    _check_rank(lora, model, source)


def _check_target_entries(lora: LoraSettings, model: torch.nn.Module, source: str) -> None:
    head = _tied_head(model)
    linear = _linear_layer_names(model, head)
    for entry in lora.target_modules:
        matched = _matching_modules(entry, model)
        field_entry = f"model.peft.target_modules entry {entry!r}"
        if not matched:
            raise ValueError(f"{field_entry} matches no layer of {source}; its linear layers: {', '.join(linear)}")
        for name, module in matched:
            if head is not None and module is head:
                raise ValueError(f"{field_entry}: {_tied_head_problem(name, source)}")
            if not _is_linear(module):
                kind = "a container of layers" if any(True for _ in module.children()) else "not a linear layer"
                raise ValueError(
                    f"{field_entry} matches {name} ({type(module).__name__}), {kind}: LoRA here adapts linear layers "
                    f"only (their merged weights are what the rollout engine and `erpo export` receive); the linear "
                    f"layers of {source}: {', '.join(linear)}"
                )


def _check_rank(lora: LoraSettings, model: torch.nn.Module, source: str) -> None:
    """ValueError when `model.peft.r` is above min(in, out) of every layer it adapts: B·A has rank at most that, so a
    larger r adds parameters, memory and step time and nothing else (r 100000 on the toy model took 328 s a step)."""
    layers = _adapted_layers(lora, model)
    if not layers:
        return
    name, fan_in, fan_out = max(layers, key=lambda layer: min(layer[1], layer[2]))
    usable = min(fan_in, fan_out)
    if lora.r > usable:
        raise ValueError(
            f"model.peft.r {lora.r} is above the rank any adapted layer of {source} can use: an adapter B·A has rank "
            f"at most min(in, out) of its layer, and the largest here is {usable} ({name}, {fan_in} -> {fan_out}); "
            f"a larger r adds parameters, memory and step time and nothing else. Use r <= {usable}"
        )


def adapted_layer_names(targets: str | Iterable[str], model: torch.nn.Module) -> set[str]:
    """Full names of the linear layers of `model` that `targets` adapts as peft matches them: `all-linear` is every
    linear layer but the LM head, a string otherwise a regex, a list names layers (`_target_matches`)."""
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    return {
        name
        for name, module in model.named_modules()
        if _is_linear(module) and (module is not head if targets == "all-linear" else _target_matches(targets, name))
    }


def _adapted_layers(lora: LoraSettings, model: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(name, in, out) of each linear layer `lora.target_modules` adapts in `model`: for `all-linear`, every linear
    layer but the LM head (peft leaves the output layer out), else those an entry names."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    layers = []
    for name, module in model.named_modules():
        if not _is_linear(module) or module is head:
            continue
        if lora.target_modules == "all-linear" or _target_matches(lora.target_modules, name):
            rows, columns = module.weight.shape  # Linear holds [out, in], GPT-2's Conv1D [in, out]
            fan_in, fan_out = (rows, columns) if isinstance(module, Conv1D) else (columns, rows)
            layers.append((name, int(fan_in), int(fan_out)))
    return layers


def peft_config_problem(peft_config: Any, model: Any, trust_remote_code: bool = False) -> str | None:
    """Why a peft `LoraConfig` cannot train `model` (a path, a Hub id or the model; TRL's `peft_config=`): its
    `target_modules` (a list, a regex, `all-linear` or None, as peft takes them) adapt the head `model` ties to its
    input embeddings. None when they do not, or when the model's config cannot be read (its load reports why)."""
    targets = getattr(peft_config, "target_modules", None)
    if targets is None or targets == "all-linear":
        return None
    source = str(model) if isinstance(model, str | Path) else str(getattr(model, "name_or_path", "") or "the model")
    if isinstance(model, str | Path):
        model = None if str(model).lower().endswith(".gguf") else model_skeleton(str(model), trust_remote_code)
    head = _tied_head(model) if isinstance(model, torch.nn.Module) else None
    for name, module in model.named_modules() if head is not None else ():
        if module is head and _target_matches(targets, name):
            shown = sorted(targets) if isinstance(targets, set | frozenset) else targets
            return f"peft_config.target_modules {shown!r}: {_tied_head_problem(name, source)}"
    return None


def _tied_head_problem(name: str, source: str) -> str:
    return (
        f"{name} is the LM head, which {source} ties to its input embeddings (tie_word_embeddings: true in "
        f"{source}/config.json); the rollout engine (vLLM) and exported models keep the one shared matrix, so the "
        f"adapted head would be lost and their log-probs would leave the policy's. Drop {name.rpartition('.')[2]} "
        "from target_modules, or use all-linear (which excludes the head)"
    )


def _tied_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The output embedding (LM head) of `model` when its config ties it to the input embedding, else None."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text_config, "tie_word_embeddings", False):
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    return get_head() if callable(get_head) else None


def _is_linear(module: torch.nn.Module) -> bool:
    """A layer whose LoRA merges into one [out, in] matrix: torch's Linear, or GPT-2's Conv1D ([in, out])."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, torch.nn.Linear | Conv1D)


def _linear_layer_names(model: torch.nn.Module, tied_head: torch.nn.Module | None) -> list[str]:
    """The last name parts of `model`'s linear layers (a tied head left out), in model order, once each."""
    names = [name.rpartition(".")[2] for name, m in model.named_modules() if _is_linear(m) and m is not tied_head]
    return list(dict.fromkeys(names))


def _target_matches(target: str | Iterable[str], name: str) -> bool:
    """peft's rule: a string is a regex the whole module name must match; a list entry matches the name itself or
    its last dotted parts."""
    if isinstance(target, str):
        return re.fullmatch(target, name) is not None
    return any(name == entry or name.endswith(f".{entry}") for entry in target)


def _matching_modules(entry: str, model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name, module) for name, module in model.named_modules() if name and _target_matches([entry], name)]
