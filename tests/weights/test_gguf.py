"""The `.gguf` conversion's files (issue 30, item 12): readable like any other file, not 0600."""

from __future__ import annotations

import json
import os
from pathlib import Path

import erpo_lightning.weights.gguf as gguf_module
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model


def test_the_converted_directory_is_readable_by_other_users(tmp_path, monkeypatch):
    """The conversion saves with `save_pretrained`, whose weight file is 0600; the cache then holds it as 0644."""

    def convert(gguf_file: Path, out_dir: Path, digest: str) -> None:  # the real one needs a real .gguf model
        save_tiny_model(out_dir)
        (out_dir / gguf_module.MANIFEST_NAME).write_text(json.dumps({"sha256": digest}))

    monkeypatch.setattr(gguf_module, "convert_gguf", convert)
    monkeypatch.setattr(gguf_module, "cache_home", lambda: tmp_path / "home")
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF not really")
    umask = os.umask(0o027)  # a stricter umask than the usual one is honoured too
    try:
        target = Path(gguf_module.resolve_model_path(str(source)))
    finally:
        os.umask(umask)
    modes = {path.name: path.stat().st_mode & 0o777 for path in [target, *target.iterdir()]}
    assert modes.pop(target.name) == 0o750
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes


def test_a_conversion_shows_its_start_and_end_once(tmp_path, monkeypatch, capsys):
    """Issue 40 item 1: a long phase has a visible start (with its size) and end; a cached one prints nothing."""

    def convert(gguf_file: Path, out_dir: Path, digest: str) -> None:
        save_tiny_model(out_dir)
        (out_dir / gguf_module.MANIFEST_NAME).write_text(json.dumps({"sha256": digest}))

    monkeypatch.setattr(gguf_module, "convert_gguf", convert)
    monkeypatch.setattr(gguf_module, "cache_home", lambda: tmp_path / "home")
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF not really" * 100_000)
    target = gguf_module.resolve_model_path(str(source))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[erpo]")]
    assert (
        len(lines) == 2 and lines[0] == "[erpo] converting model.gguf to a float32 Hugging Face folder: started (1 MiB)"
    )
    assert lines[1].startswith("[erpo] converting model.gguf: done in ") and lines[1].endswith(f" s ({target})")
    assert gguf_module.resolve_model_path(str(source)) == target and capsys.readouterr().err == ""
