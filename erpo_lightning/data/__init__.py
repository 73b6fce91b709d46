"""Training data for RLVR: sources, prompt templates, and the frozen-reference query log-prob cache.

A training batch (what `QueryDataModule.train_dataloader` yields) is a `erpo_lightning.rollout.batch.QueryBatch`:
`query_index` [B] (the row of each query in the dataset and in the reference cache), `prompt_ids` (unpadded, template
applied), `answers` (gold answers as the source gives them), and for the reward the `problems` and the `data_columns`
the sources name (`SourceSpec.columns`). The cache (`ReferenceLogprobCache`) holds the
reference's per-token query log-probs and summed NLL -ℓθ0(q), from which the LightningModule makes Query-KL and w(q).
"""

from erpo_lightning.data.cache import CacheCorruptError, ReferenceLogprobCache
from erpo_lightning.data.cache_build import load_reference_model, policy_compute_dtype
from erpo_lightning.data.datamodule import QueryDataModule, build_or_load_cache
from erpo_lightning.data.fingerprint import CacheMismatchError
from erpo_lightning.data.prepare import PreparedQueries, PromptFormat, prepare_queries
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
    "PromptFormat",
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
