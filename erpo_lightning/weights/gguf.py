"""`.gguf` checkpoints as models: dequantized once into a cached Hugging Face directory, reused afterwards.

Everything downstream (the policy, the reference cache and its fingerprint, vLLM) reads a plain HF directory
(safetensors + tokenizer + chat template). `resolve_model_path` maps a `.gguf` path to that directory, named by the
file's sha256 under `cache_home()/gguf/`, and passes any other path through unchanged. Needs the optional extra
`gguf` (`pip install -e .[gguf]`: the `gguf` and `accelerate` packages) only when a conversion runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from erpo_lightning.common.file_hashes import cache_home, cached_file_sha256

GGUF_SUFFIX = ".gguf"
# Written last into a converted directory: its presence means the conversion finished.
MANIFEST_NAME = "erpo_gguf_manifest.json"
INSTALL_HINT = "Converting a .gguf model needs the `gguf` and `accelerate` packages: `pip install -e .[gguf]`."


def is_gguf(path: str | os.PathLike) -> bool:
    """True when `path` names a `.gguf` file (by its suffix; the file need not exist)."""
    return str(path).lower().endswith(GGUF_SUFFIX)


def converted_dir(gguf_file: Path, digest: str) -> Path:
    """Where the HF directory of `gguf_file` (sha256 `digest`) lives in the cache."""
    return cache_home() / "gguf" / f"{gguf_file.stem}-{digest[:16]}"


def resolve_model_path(path: str) -> str:
    """The HF model directory or Hub id to load for `path`: a `.gguf` file's cached conversion, else `path` itself.

    The first call for a `.gguf` file dequantizes it to float32 (seconds to minutes); later calls only hash the file
    (its sha256 is remembered per file version, see `file_hashes.file_version`). A changed file gets a new directory.
    """
    if not is_gguf(path):
        return path
    gguf_file = Path(path)
    if not gguf_file.is_file():
        raise FileNotFoundError(f"model path {path!r} ends in {GGUF_SUFFIX} but is not a file")
    digest = cached_file_sha256(gguf_file)
    target = converted_dir(gguf_file, digest)
    if (target / MANIFEST_NAME).is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert beside the target and rename: concurrent processes (ranks, parallel jobs) never see half a directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    # A long phase shows its start and end, as the cache build and the sweeps do (stderr, where progress goes).
    size = f"{gguf_file.stat().st_size / 2**20:.0f} MiB"
    print(f"[erpo] converting {gguf_file.name} to a float32 Hugging Face folder: started ({size})", file=sys.stderr)
    start = time.perf_counter()
    try:
        convert_gguf(gguf_file, staging, digest)
        share_like_other_files(staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / MANIFEST_NAME).is_file():  # not another process's finished conversion
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(
        f"[erpo] converting {gguf_file.name}: done in {time.perf_counter() - start:.0f} s ({target})", file=sys.stderr
    )
    return str(target)


def share_like_other_files(directory: Path) -> None:
    """Give `directory` and everything in it the permissions of a file made with `open` (0666 and 0777 less the
    umask, e.g. 0644 and 0755), not the 0700 of `mkdtemp` or the 0600 that `save_pretrained` gives weight files:
    other users of a shared cache home can read the conversion."""
    umask = os.umask(0o022)
    os.umask(umask)
    for path in [directory, *directory.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def convert_gguf(gguf_file: Path, out_dir: Path, digest: str) -> None:
    """Dequantize `gguf_file` into `out_dir`: float32 safetensors, config, generation config, tokenizer, template.

    transformers loads a `.gguf` dequantized but marks the model as GGUF-quantized and refuses to save it, so the
    weights are copied into a fresh model built from the same config without its `quantization_config`.
    """
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{' and '.join(missing)} not installed. {INSTALL_HINT}")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=gguf_file.parent, gguf_file=gguf_file.name)
    tokenizer = AutoTokenizer.from_pretrained(**where)  # with the file's chat template, when it has one
    loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_name_or_path", None)
    model_type = settings.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    manifest = {
        "source": gguf_file.name,
        "sha256": digest,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
        "dtype": "float32",
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
