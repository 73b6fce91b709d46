"""The shipped toy model: one completed build, kept as package data, that the quickstart and the toy study start from.

Pre-training is repeatable on one machine but not across CPUs: its stopping step moves with floating-point rounding,
and every downstream number moves with it. So the files in `erpo_lightning/toy/shipped/`, not a rebuild, define the
toy model. The folder is flat:

    config.json, generation_config.json, model.safetensors, tokenizer*.json ...   the model (save_pretrained)
    train.jsonl, test.jsonl                                                        the task's splits
    manifest.json                                                                  identity and provenance

`manifest.json` holds `files` (name -> sha256 of every other file), `sha256` (the identity of the whole set: sha256
of the sorted `<sha256>  <name>` lines, as `sha256sum` prints them), `weights_sha256` (over the tensors' names,
dtypes, shapes and bytes, so a rebuild is compared on its weights, not on how a safetensors version lays out the
file) and `build` (the build's own manifest: settings and the accuracies measured when it was built).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from erpo_lightning.toy.assets import ToyAssets

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
SHIPPED_MANIFEST = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
TASK_FILES = ("train.jsonl", "test.jsonl")


def file_sha256(path: Path) -> str:
    """sha256 of one file's bytes (hex)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def files_sha256(hashes: dict[str, str]) -> str:
    """The identity of a set of files: sha256 of `<sha256>  <name>\\n` lines sorted by name (`sha256sum`'s format)."""
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(hashes.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def weights_sha256(path: Path) -> str:
    """sha256 over a safetensors file's tensors, by name: each name, dtype and shape, then the raw bytes."""
    digest = hashlib.sha256()
    tensors = load_file(path)
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_manifest(directory: Path = SHIPPED_DIR) -> dict:
    """The shipped `manifest.json` of `directory` (no hash check: see `verify_shipped`)."""
    path = directory / SHIPPED_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the shipped toy model is incomplete; reinstall erpo_lightning, or rebuild it with "
            "`python -m erpo_lightning.toy --ship`"
        )
    return json.loads(path.read_text())


def verify_shipped(directory: Path = SHIPPED_DIR) -> dict:
    """Check every shipped file in `directory` against `manifest.json` (sha256 per file, and no other file).

    Returns:
        the manifest.
    Raises:
        ValueError naming the files that are missing, changed or not in the manifest.
    """
    manifest = read_manifest(directory)
    problems = []
    for name, expected in sorted(manifest["files"].items()):
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} missing")
        elif file_sha256(path) != expected:
            problems.append(f"{name} changed (sha256 {file_sha256(path)[:12]}, manifest {expected[:12]})")
    present = {path.name for path in directory.iterdir() if path.is_file()}
    unlisted = present - set(manifest["files"]) - {SHIPPED_MANIFEST}
    problems += [f"{name} not in the manifest" for name in sorted(unlisted)]
    if files_sha256(manifest["files"]) != manifest["sha256"]:
        problems.append("the manifest's sha256 is not that of its file list")
    if problems:
        listed = "; ".join(problems)
        raise ValueError(f"the shipped toy model in {directory} does not match its {SHIPPED_MANIFEST}: {listed}")
    return manifest


def shipped_assets(directory: Path = SHIPPED_DIR, verify: bool = True) -> ToyAssets:
    """The shipped model and splits as `ToyAssets` (`manifest` = the build's manifest), checked first by default."""
    manifest = verify_shipped(directory) if verify else read_manifest(directory)
    return ToyAssets(directory, directory / TASK_FILES[0], directory / TASK_FILES[1], manifest["build"])


def compare_with_shipped(assets: ToyAssets, directory: Path = SHIPPED_DIR) -> tuple[bool, list[str]]:
    """Whether the build `assets` has the shipped weights and task files, and one line per compared item."""
    manifest = read_manifest(directory)
    built = {
        "weights": (weights_sha256(assets.model_dir / WEIGHTS_FILE), manifest["weights_sha256"]),
        TASK_FILES[0]: (file_sha256(assets.train_file), manifest["files"][TASK_FILES[0]]),
        TASK_FILES[1]: (file_sha256(assets.test_file), manifest["files"][TASK_FILES[1]]),
    }
    lines = [
        f"{name}: {'same as shipped' if mine == theirs else 'DIFFERENT from shipped'} "
        f"(sha256 {mine[:16]}, shipped {theirs[:16]})"
        for name, (mine, theirs) in built.items()
    ]
    return all(mine == theirs for mine, theirs in built.values()), lines


def ship(assets: ToyAssets, directory: Path = SHIPPED_DIR) -> dict:
    """Make the build `assets` the shipped toy model: replace the files in `directory` and write its manifest.

    The new set is written to a temporary sibling that replaces `directory` only when complete. A `directory`
    holding a file its manifest does not name is refused rather than deleted.
    Returns:
        the new manifest.
    """
    sources = {path.name: path for path in sorted(assets.model_dir.iterdir()) if path.is_file()}
    sources.update({TASK_FILES[0]: assets.train_file, TASK_FILES[1]: assets.test_file})
    if SHIPPED_MANIFEST in sources:
        raise ValueError(f"{assets.model_dir} holds a {SHIPPED_MANIFEST}, the name of the shipped manifest")
    if directory.exists():
        known = {SHIPPED_MANIFEST}
        if (directory / SHIPPED_MANIFEST).exists():
            known |= set(read_manifest(directory)["files"])
        foreign = {path.name for path in directory.iterdir()} - known
        if foreign:
            raise FileExistsError(f"{directory} holds files the shipped manifest does not name: {sorted(foreign)}")
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    staging.chmod(0o755)
    try:
        for name, source in sources.items():
            shutil.copyfile(source, staging / name)
        hashes = {name: file_sha256(staging / name) for name in sources}
        manifest = {
            "sha256": files_sha256(hashes),
            "weights_sha256": weights_sha256(staging / WEIGHTS_FILE),
            "files": hashes,
            "build": assets.manifest,
        }
        (staging / SHIPPED_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest
