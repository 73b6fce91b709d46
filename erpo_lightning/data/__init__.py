"""Training data for RLVR: sources, prompt templates, the frozen-reference query score cache, per-query weights.

A training batch (what `QueryDataModule.train_dataloader` yields) is a dict:
    query_index   LongTensor [B]    row of each query in the dataset and in the reference cache
    query_id      list[str]         stable ids ("<source label>/<id or content hash>")
    prompt_ids    list[list[int]]   unpadded prompt token ids, template applied
    answers       list[str]         gold answers, as the source gives them
    query_weight  FloatTensor [B]   ERPO's w(q) (1.0 when weight_source is "current" or "none")
    ref_query_nll FloatTensor [B]   -ℓθ0(q), the summed reference NLL of the query's scored tokens (nats)
"""

from erpo_lightning.data.cache import CacheCorruptError, ReferenceLogprobCache
from erpo_lightning.data.datamodule import (
    QueryDataModule,
    build_or_load_cache,
    load_reference_model,
    policy_compute_dtype,
)
from erpo_lightning.data.fingerprint import CacheMismatchError
from erpo_lightning.data.prepare import PreparedQueries, prepare_queries
from erpo_lightning.data.reference_logprobs import (
    LogprobBatching,
    assemble,
    compute_logprob_shard,
    compute_reference_logprobs,
)
from erpo_lightning.data.sources import REGISTRY, DataError, Query, SourceSpec, load_queries
from erpo_lightning.data.templates import PRESETS, PromptTemplate, render_prompt, resolve_template, tokenize_prompts

__all__ = [
    "PRESETS",
    "REGISTRY",
    "CacheCorruptError",
    "CacheMismatchError",
    "DataError",
    "PreparedQueries",
    "PromptTemplate",
    "Query",
    "QueryDataModule",
    "ReferenceLogprobCache",
    "LogprobBatching",
    "SourceSpec",
    "assemble",
    "build_or_load_cache",
    "compute_reference_logprobs",
    "load_queries",
    "load_reference_model",
    "policy_compute_dtype",
    "prepare_queries",
    "render_prompt",
    "resolve_template",
    "compute_logprob_shard",
    "tokenize_prompts",
]
