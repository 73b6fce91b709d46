"""The reference cache's fingerprint (`data/fingerprint.py`): a weight file rewritten in place with the same size
and mtime is hashed again (issue 18 item 6)."""

from __future__ import annotations

import json
import os


def test_a_weight_file_rewritten_in_place_with_the_same_size_and_mtime_is_hashed_again(tmp_path, monkeypatch):
    from erpo_lightning.common import file_hashes
    from erpo_lightning.data import fingerprint

    monkeypatch.setattr(file_hashes, "HASH_MEMO", tmp_path / "memo.json")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    stat = weights.stat()
    first = fingerprint.weights_hash(tmp_path)
    weights.write_bytes(b"a" * 2048 + b"b" * 2048)  # same size, new content, then the old mtime restored
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    second = fingerprint.weights_hash(tmp_path)
    assert second != first
    assert second == fingerprint.hash_files([weights]) and len(json.loads((tmp_path / "memo.json").read_text())) == 1
