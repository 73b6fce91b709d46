"""What a reference score cache was computed from, and the check that refuses a stale one.

The manifest records the model (path and a hash of its weight files), the tokenizer (hash of its files), the prompt
template, the data (a hash of every query's id, problem and answer, and of the prompt token ids), the maximum prompt
length, the forward dtype (with the autocast and TF32 the policy computes under, when set:
`cache_build.ComputePath`) and the query scoring layout (the shape the scores were computed at, which the training
step reproduces). Any difference in those fields means the cached scores are not the reference scores
of this run, so loading refuses and says which field differs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from erpo_lightning.common.file_hashes import cached_file_sha256
from erpo_lightning.data.sources import Query
from erpo_lightning.scoring.queries import QueryScoringLayout

# Fields that must match for a cache to be reused; the rest of the manifest is informational.
FINGERPRINT_FIELDS = (
    "weights_hash",
    "tokenizer_hash",
    "template",
    "dataset_fingerprint",
    "prompt_tokens_hash",
    "max_prompt_length",
    "dtype",
    "scoring_layout",
)
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


class CacheMismatchError(RuntimeError):
    """A cache on disk was computed from something else than this run's model, tokenizer, template or data."""


def resolve_model_dir(model_path: str) -> Path:
    """The local directory of a model: `model_path` itself, or its Hugging Face Hub snapshot (downloaded if needed)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path))


def hash_files(paths: Iterable[Path]) -> str:
    """sha256 over the names and contents of `paths` (in the given order)."""
    return _json_hash([[path.name, cached_file_sha256(path)] for path in paths])


def weights_hash(model_dir: Path) -> str:
    """Hash of the model's weight files (safetensors, else PyTorch .bin shards)."""
    for pattern in WEIGHT_PATTERNS:
        files = sorted(model_dir.glob(pattern))
        if files:
            return hash_files(files)
    raise FileNotFoundError(f"{model_dir}: no weight files ({' or '.join(WEIGHT_PATTERNS)})")


def tokenizer_hash(model_dir: Path) -> str:
    """Hash of the tokenizer files present in `model_dir`."""
    files = [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if not files:
        raise FileNotFoundError(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return hash_files(files)


def _json_hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def dataset_fingerprint(queries: Sequence[Query]) -> str:
    """Hash of the training set in order: ids, problems and answers of the kept queries, and the turns of
    conversational ones (a text query's entry is as it was before conversations, so existing caches still match)."""
    return _json_hash([[q.query_id, q.problem, q.answer, *([list(q.messages)] if q.messages else [])] for q in queries])


def build_manifest(
    model_path: str,
    template: dict,
    queries: Sequence[Query],
    prompt_ids: Sequence[Sequence[int]],
    max_prompt_length: int,
    dtype: str,
    scoring_layout: QueryScoringLayout | None = None,
) -> dict:
    """The manifest of a cache for this model, template and data (hashes the model's weight files: seconds per GB).
    `scoring_layout`: the blocks the scores are computed in; None for an engine whose scores no training forward
    reproduces bit for bit (vLLM)."""
    model_dir = resolve_model_dir(model_path)
    return {
        "model_path": str(model_path),
        "weights_hash": weights_hash(model_dir),
        "tokenizer_hash": tokenizer_hash(model_dir),
        "template": template,
        "dataset_fingerprint": dataset_fingerprint(queries),
        "prompt_tokens_hash": _json_hash([list(ids) for ids in prompt_ids]),
        "max_prompt_length": max_prompt_length,
        "dtype": dtype,
        "scoring_layout": None if scoring_layout is None else scoring_layout.to_dict(),
        "num_queries": len(queries),
        "num_prompt_tokens": sum(len(ids) for ids in prompt_ids),
        "package_version": importlib.metadata.version("erpo-lightning"),
    }


def fingerprint_digest(manifest: dict) -> str:
    """A short hash of the fingerprint fields: names a cache (or its partial chunks) by what it was computed from."""
    return _json_hash({key: manifest[key] for key in FINGERPRINT_FIELDS})[:16]


def check_manifest(found: dict, expected: dict, where: Path) -> None:
    """Raise `CacheMismatchError` naming every fingerprint field that differs between a cache and this run."""
    differences = [
        f"  {key}: cache has {found.get(key)!r:.120}, this run has {expected[key]!r:.120}"
        for key in FINGERPRINT_FIELDS
        if found.get(key) != expected[key]
    ]
    if not differences:
        return
    hints = {
        "weights_hash": "the model weights differ",
        "tokenizer_hash": "the tokenizer differs",
        "template": "the prompt template differs",
        "dataset_fingerprint": "the training queries differ",
        "prompt_tokens_hash": "the prompts tokenize differently",
        "max_prompt_length": "max_prompt_length differs",
        "dtype": "the forward dtype differs: it follows the policy's compute dtype unless data.cache_dtype is set "
        "(model.dtype, and model.mixed_precision's autocast, model.tf32 and model.compile when set)",
        "scoring_layout": "the query scoring layout differs (data.query_score_rows / query_score_width_multiple or "
        "the engine; caches from before exact scoring have none)",
    }
    reasons = ", ".join(hints[key] for key in FINGERPRINT_FIELDS if found.get(key) != expected[key])
    raise CacheMismatchError(
        f"the reference score cache in {where} does not belong to this run ({reasons}; it was computed from "
        f"{found.get('model_path')!r}):\n" + "\n".join(differences) + "\n"
        f"Rebuild it with `erpo cache --config <your config> --force true`, delete {where}, "
        "or set data.cache_dir to another directory (or to null: a directory named by the fingerprint)."
    )
