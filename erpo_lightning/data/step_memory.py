"""Whether one training step's sizes can fit the machine, judged from the settings before any model is loaded.

A step holds, on each device, the rollout of `data.batch_size` × `rollout.group_size` rows of up to
`data.max_prompt_length` + `rollout.max_new_tokens` tokens. `rollout.group_size: 1000000` used to be accepted and
the run was killed for memory minutes later, with no message. `step_memory` adds up what such a step cannot do
without, from the settings and the model's `config.json` (vocabulary V, hidden size H, layers L, key/value width kv),
each part a lower bound (d: bytes per value of `model.dtype`):

- rollout batch: rows × tokens × 16, the int64 token ids and attention mask alone (log-probs, masks and decoded texts
  come on top);
- generation (HFEngine): g × tokens × 2·L·kv × d + g × V × 4, the KV cache of the g rows generated at once (its
  `micro_batch_size`, else every row) and their float32 next-token logits; vLLM sizes its own cache and counts 0;
- micro-batch: t × V × 4 × 2, the float32 logits and log-softmax of one forward of t = max(`model.micro_batch_tokens`,
  one row's forward) tokens (activations come on top), a row's forward being its prompt and response, or under
  `model.query_kl_scoring: shared_prompt` (the default) its response alone (it runs on its prompt's kept keys and
  values; `update.microbatch.forwarded_lengths`); with `model.fused_output_layer` the logits exist one chunk of
  positions at a time (`logprobs.CHUNK_ELEMENTS` values), so t is at most one chunk's positions;
- weights: parameters × d / devices, the policy's weights, split over the devices as under FSDP;
- gradients: parameters × d / devices, the full fine-tune's gradients (0 with LoRA: the adapters' count below);
- optimizer state: 2 × parameters × d / devices, AdamW's two moments of a full fine-tune; 0 with LoRA, with
  `model.offload_optimizer` (the state lives in host memory) and with a `model.optimizer` of its own (whose state
  the planner does not know);
- LoRA adapters: a × 16 / devices, the float32 weights, gradients and AdamW's two moments of the a = Σ r · (in + out)
  parameters `model.peft` adds (a × 8 when the moments are offloaded; 0 without LoRA; `r` 100000 on a
  0.3M-parameter model once took 328 s a step).

Left out: activations, the autograd graph, allocator slack and a vLLM engine's share of the GPU
(`gpu_memory_utilization`, taken before training starts).

`check_fit_memory` compares the sum with the memory the machine has for the step: the RAM available now on CPU, the
free memory of the emptiest GPU (`nvidia-smi`, which leaves CUDA uninitialised) on GPU. Above 4× that it refuses the
settings (a ValueError naming them); above 1× it prints a warning; without a readable `config.json` or memory reading
it says nothing. A lower bound with a 4× margin refuses only settings that cannot run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from erpo_lightning.scoring.logprobs import CHUNK_ELEMENTS

REFUSE_FACTOR = 4.0  # refuse above this many times the memory available
ROLLOUT_BYTES_PER_TOKEN = 16  # int64 token id + int64 attention mask
ADAPTER_BYTES_PER_PARAMETER = 8  # float32 weight and gradient
ADAPTER_STATE_BYTES_PER_PARAMETER = 8  # AdamW's two float32 moments
ADAM_MOMENTS = 2
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a model's `config.json`."""

    vocab_size: int
    hidden_size: int
    layers: int
    kv_width: int  # key/value heads × head dimension
    parameters: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape | None:
        """The shape of a decoder config (Llama / Qwen / Mistral style, or its `text_config`); None when a size is
        missing."""
        config = config.get("text_config") or config
        vocab, hidden = config.get("vocab_size"), config.get("hidden_size") or config.get("n_embd")
        layers, heads = config.get("num_hidden_layers") or config.get("n_layer"), config.get("num_attention_heads")
        if not all(isinstance(value, int) and value > 0 for value in (vocab, hidden, layers, heads)):
            return None
        head_dim = config.get("head_dim") or hidden // heads
        kv_width = (config.get("num_key_value_heads") or heads) * head_dim
        mlp = config.get("intermediate_size") or 4 * hidden
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
        per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_width + 3 * hidden * mlp
        return cls(vocab, hidden, layers, kv_width, embeddings + layers * per_layer)

    @classmethod
    def read(cls, model_path: str) -> ModelShape | None:
        """The shape of the model at `model_path` (a directory, or a Hub id whose `config.json` is cached)."""
        from huggingface_hub import try_to_load_from_cache

        path = Path(model_path).expanduser() / "config.json"
        try:
            if not path.is_file() and not Path(model_path).expanduser().exists():
                cached = try_to_load_from_cache(model_path, "config.json")
                path = Path(cached) if isinstance(cached, str) else path
            return cls.from_config(json.loads(path.read_text()))
        except (OSError, ValueError, AttributeError):  # no config (or not a Hub id), or not a JSON object
            return None


@dataclass(frozen=True)
class StepSizes:
    """One step's sizes on one device, from the settings.

    Attributes:
        rows: `data.batch_size` × `rollout.group_size` (the batch size is per device).
        tokens: longest row, `data.max_prompt_length` + `rollout.max_new_tokens`.
        generated_at_once: rows per `generate` call (HFEngine `micro_batch_size`, else `rows`); 0 under vLLM.
        micro_batch_tokens: `model.micro_batch_tokens`.
        dtype_bytes: bytes per weight in `model.dtype`.
        devices: devices the weights may be split over.
        adapter_parameters: parameters the LoRA adapters add (`modules.lora.adapter_parameters_before_loading`).
        fused_output: `model.fused_output_layer`: the forward's logits exist one chunk at a time.
        row_forward: tokens the longest row's forward runs: `tokens`, or `rollout.max_new_tokens` under the shared
            prompt; None means `tokens`.
        optimizer_state: AdamW's moments are on the device: False with `model.offload_optimizer` (host memory) or
            with a `model.optimizer` of its own.
    """

    rows: int
    tokens: int
    generated_at_once: int
    micro_batch_tokens: int
    dtype_bytes: int
    devices: int = 1
    adapter_parameters: int = 0
    fused_output: bool = False
    optimizer_state: bool = True
    row_forward: int | None = None


def step_memory(sizes: StepSizes, shape: ModelShape) -> dict[str, int]:
    """Bytes one step needs at least, by part (the table of the module docstring)."""
    at_once, vocab = sizes.generated_at_once, shape.vocab_size
    forward_tokens = max(sizes.micro_batch_tokens, sizes.tokens if sizes.row_forward is None else sizes.row_forward)
    if sizes.fused_output:
        forward_tokens = min(forward_tokens, max(1, CHUNK_ELEMENTS // vocab))
    weights, lora = shape.parameters * sizes.dtype_bytes // sizes.devices, sizes.adapter_parameters > 0
    adapter_bytes = ADAPTER_BYTES_PER_PARAMETER + (ADAPTER_STATE_BYTES_PER_PARAMETER if sizes.optimizer_state else 0)
    return {
        "rollout batch": sizes.rows * sizes.tokens * ROLLOUT_BYTES_PER_TOKEN,
        "generation": at_once * (sizes.tokens * 2 * shape.layers * shape.kv_width * sizes.dtype_bytes + vocab * 4),
        "micro-batch": forward_tokens * vocab * 4 * 2,
        "weights": weights,
        "gradients": 0 if lora else weights,
        "optimizer state": 0 if lora or not sizes.optimizer_state else ADAM_MOMENTS * weights,
        "LoRA adapters": sizes.adapter_parameters * adapter_bytes // sizes.devices,
    }


def memory_verdict(sizes: StepSizes, parts: dict[str, int], available: int, where: str) -> str | None:
    """None when `parts` fit in `available` bytes; a warning line when they exceed it; ValueError (naming the settings)
    above REFUSE_FACTOR times it."""
    needed = sum(parts.values())
    if needed <= available:
        return None
    detail = ", ".join(f"{name} {_size(value)}" for name, value in parts.items() if value)
    line = (
        f"one step needs at least {_size(needed)} per device ({detail}) for data.batch_size × rollout.group_size = "
        f"{sizes.rows} rows of up to {sizes.tokens} tokens (data.max_prompt_length + rollout.max_new_tokens), "
    )
    if needed > REFUSE_FACTOR * available:
        hint = " or rollout.engine.init_args.micro_batch_size" if parts["generation"] > needed / 2 else ""
        if parts.get("gradients", 0) + parts.get("optimizer state", 0) > needed / 2:
            hint += "; or train LoRA adapters (model.peft) or offload the optimizer (model.offload_optimizer)"
        raise ValueError(
            f"{line}over {REFUSE_FACTOR:g}x the {_size(available)} {where}: lower rollout.group_size, data.batch_size "
            f"or the lengths{hint}"
        )
    return f"{line}more than the {_size(available)} {where}: it may be killed for memory"


def fit_step_sizes(
    model: Mapping, data: Mapping, rollout: Mapping, trainer: Mapping, adapter_parameters: int = 0
) -> StepSizes:
    """The StepSizes of an `erpo fit` config: its `model`, `data`, `rollout` and `trainer` groups as dicts, and
    `adapter_parameters` the parameters `model.peft` adds."""
    engine = rollout.get("engine") or {}
    rows = data["batch_size"] * rollout["group_size"]
    if "VLLMEngine" in str(engine.get("class_path", "")):
        at_once = 0
    else:
        at_once = min(rows, (engine.get("init_args") or {}).get("micro_batch_size") or rows)
    return StepSizes(
        rows, data["max_prompt_length"] + rollout["max_new_tokens"], at_once, model["micro_batch_tokens"],
        DTYPE_BYTES.get(str(model.get("dtype")), 4), _devices(trainer), adapter_parameters,
        bool(model.get("fused_output_layer")), not model.get("offload_optimizer") and model.get("optimizer") is None,
        rollout["max_new_tokens"] if model.get("query_kl_scoring") == "shared_prompt" else None,
    )  # fmt: skip


def check_fit_memory(
    model: Mapping, data: Mapping, rollout: Mapping, trainer: Mapping, adapter_parameters: int = 0
) -> None:
    """`erpo fit`'s check of the step's sizes against the machine (module docstring): ValueError when they cannot fit,
    a warning on stderr when they may not. The arguments are `fit_step_sizes`'."""
    shape = ModelShape.read(str(model["model_path"]))
    machine = available_memory(str(trainer.get("accelerator") or "auto"))
    if shape is None or machine is None:
        return
    sizes = fit_step_sizes(model, data, rollout, trainer, adapter_parameters)
    warning = memory_verdict(sizes, step_memory(sizes, shape), *machine)
    if warning is not None:
        print(f"[erpo] warning: {warning}", file=sys.stderr, flush=True)


def available_memory(accelerator: str) -> tuple[int, str] | None:
    """(bytes, where) of the memory a step may use: the free memory of the emptiest GPU under `gpu` / `cuda` /
    `auto` on a machine with one, else the RAM available now; None when it cannot be read."""
    if accelerator in ("gpu", "cuda", "auto"):
        free = _gpu_free_bytes()
        if free is not None:
            return free, "free on the GPU"
        if accelerator != "auto":
            return None
    try:
        import psutil

        return psutil.virtual_memory().available, "of RAM available"
    except ImportError:
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
        return (pages * os.sysconf("SC_PAGE_SIZE"), "of RAM available") if pages > 0 else None


def _gpu_free_bytes() -> int | None:
    """The free memory of the emptiest GPU, from `nvidia-smi` (so that CUDA stays uninitialised before the launcher
    forks); None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"]
    try:
        lines = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return min(int(line) for line in lines) * 2**20 if lines else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _devices(trainer: Mapping) -> int:
    """Devices × nodes when both are numbers (a list of devices counts its entries); else 1."""
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    count = len(devices) if isinstance(devices, list | tuple) else devices
    try:
        return max(1, int(count)) * max(1, int(nodes))
    except (TypeError, ValueError):
        return 1


def _size(value: float) -> str:
    """Bytes as MiB, GiB, TiB or PiB."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", GIB)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value / 2**20:.1f} MiB"
