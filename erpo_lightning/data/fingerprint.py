"""What a reference score cache was computed from, and the check that refuses a stale one.

The manifest records the model (path and a hash of its weight files), the tokenizer (hash of its files), the prompt
template, the data (a hash of every query's id, problem and answer, and of the prompt token ids), the maximum prompt
length and the forward dtype. Any difference in those fields means the cached scores are not the reference scores
of this run, so loading refuses and says which field differs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from erpo_lightning.data.sources import Query

# Fields that must match for a cache to be reused; the rest of the manifest is informational.
FINGERPRINT_FIELDS = (
    "weights_hash",
    "tokenizer_hash",
    "template",
    "dataset_fingerprint",
    "prompt_tokens_hash",
    "max_prompt_length",
    "dtype",
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
_READ_BYTES = 16 * 2**20
_SAMPLE_BYTES = 64 * 2**10


def cache_home() -> Path:
    """`$ERPO_CACHE_HOME` (default `~/.cache/erpo_lightning`): reference caches, file hashes and the toy build."""
    return Path(os.environ.get("ERPO_CACHE_HOME") or Path.home() / ".cache" / "erpo_lightning")


HASH_MEMO = cache_home() / "file_hashes.json"


class CacheMismatchError(RuntimeError):
    """A cache on disk was computed from something else than this run's model, tokenizer, template or data."""


def resolve_model_dir(model_path: str) -> Path:
    """The local directory of a model: `model_path` itself, or its Hugging Face Hub snapshot (downloaded if needed)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path))


def _file_version(path: Path) -> tuple[str, str]:
    """(resolved path, what identifies this version of the file) for the hash memo.

    Size and modification time alone can lie: `touch -d`, `cp -p` and rsync set mtime back, and a file rewritten in
    place keeps its size. The change time (ctime, which no user call can set back) and the inode catch such a
    rewrite, and a digest of three 64 KiB samples (start, middle, end) catches one on filesystems whose times are
    coarse. Reading the samples costs three seeks, not a read of the whole file.
    """
    stat = path.stat()
    samples = hashlib.sha256()
    with open(path, "rb") as handle:
        for offset in sorted({0, max(0, stat.st_size // 2 - _SAMPLE_BYTES // 2), max(0, stat.st_size - _SAMPLE_BYTES)}):
            handle.seek(offset)
            samples.update(handle.read(_SAMPLE_BYTES))
    times = f"{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    return str(path.resolve()), f"{stat.st_size}|{times}|{samples.hexdigest()[:16]}"


def _file_sha256(path: Path) -> str:
    """sha256 of one file, remembered in `HASH_MEMO` by path and `_file_version`, so a 15 GB checkpoint is read once."""
    resolved, version = _file_version(path)
    key = f"{resolved}|{version}"
    try:
        memo = json.loads(HASH_MEMO.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    if key not in memo:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(_READ_BYTES):
                digest.update(block)
        # Older versions of the same file can never match again: keep the memo to one entry per path.
        memo = {known: value for known, value in memo.items() if not known.startswith(f"{resolved}|")}
        memo[key] = digest.hexdigest()
        try:  # the memo is only a speed-up: an unwritable cache home just means hashing again next time
            HASH_MEMO.parent.mkdir(parents=True, exist_ok=True)
            tmp = HASH_MEMO.with_name(f".{HASH_MEMO.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, HASH_MEMO)
        except OSError:
            pass
    return memo[key]


def hash_files(paths: Iterable[Path]) -> str:
    """sha256 over the names and contents of `paths` (in the given order)."""
    return _json_hash([[path.name, _file_sha256(path)] for path in paths])


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
    """Hash of the training set in order: ids, problems and answers of the kept queries."""
    return _json_hash([[q.query_id, q.problem, q.answer] for q in queries])


def build_manifest(
    model_path: str,
    template: dict,
    queries: Sequence[Query],
    prompt_ids: Sequence[Sequence[int]],
    max_prompt_length: int,
    dtype: str,
) -> dict:
    """The manifest of a cache for this model, template and data (hashes the model's weight files: seconds per GB)."""
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
        "dtype": "the forward dtype differs: it follows the policy's compute dtype unless data.cache_dtype is set",
    }
    reasons = ", ".join(hints[key] for key in FINGERPRINT_FIELDS if found.get(key) != expected[key])
    raise CacheMismatchError(
        f"the reference score cache in {where} does not belong to this run ({reasons}; it was computed from "
        f"{found.get('model_path')!r}):\n" + "\n".join(differences) + "\n"
        f"Rebuild it with `erpo cache --config <your config> --force true`, delete {where}, "
        "or set data.cache_dir to another directory (or to null: a directory named by the fingerprint)."
    )
