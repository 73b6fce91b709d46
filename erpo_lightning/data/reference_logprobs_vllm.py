"""Optional fast path: reference query log-probs from a vLLM engine's `prompt_logprobs`.

`reference_logprobs.compute_logprob_shard` calls `vllm_query_logprobs` when it is given a `vllm.LLM` instead of a
torch model, so chunking, sharding and resuming are the same for both engines. vLLM is imported only here, and only
when used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def build_vllm_engine(model_path: str, max_model_len: int, dtype: str = "float32", gpu_memory_utilization: float = 0.3):
    """An in-process `vllm.LLM` for scoring prompts (eager, no prefix caching, seeded).

    On CPU the KV cache gets the rollout engine's fixed size (`CPU_KV_CACHE_BYTES`). vLLM sets torch's thread count
    to 1 when it starts; the previous value is restored so the rest of the process keeps its threads.
    """
    from erpo_lightning.rollout.vllm_engine import CPU_KV_CACHE_BYTES, import_vllm

    vllm = import_vllm()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        memory = {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    else:
        memory = {"gpu_memory_utilization": gpu_memory_utilization}
    threads = torch.get_num_threads()
    try:
        return vllm.LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=True,
            enable_prefix_caching=False,
            seed=0,
            **memory,
        )
    finally:
        torch.set_num_threads(threads)


def vllm_query_logprobs(llm, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Per-token log-probs of each prompt from `llm.generate(..., prompt_logprobs=0)`: float32 [L_q], entry 0 = 0."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts], params, use_tqdm=False)
    rows = []
    for ids, output in zip(prompts, outputs, strict=True):
        # prompt_logprobs[t] maps token ids (the prompt's own token t among them) to Logprob; entry 0 is None.
        values = [0.0] + [output.prompt_logprobs[t][token].logprob for t, token in enumerate(ids) if t > 0]
        rows.append(torch.tensor(values, dtype=torch.float32))
    return rows
