"""The frozen-reference query score cache: per-token log-probs of every training query under the initial policy θ0.

Stored as one safetensors file plus a JSON manifest (what it was computed from, see `fingerprint.py`). The trainer
reads it through `ReferenceScoreCache.padded`, which lines the cached values up with left-padded prompt tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SCORES_FILE = "scores.safetensors"
MANIFEST_FILE = "manifest.json"


@dataclass
class ReferenceScoreCache:
    """Reference log-probs of Q queries, flat.

    Attributes:
        logprobs: [T] float32, T = total prompt tokens. Query q owns `logprobs[offsets[q]:offsets[q+1]]`, one value
            per prompt token (template included): log p_θ0(token t | tokens < t), the first token's value is 0
            (it has no context and is never scored).
        offsets: [Q + 1] int64, offsets[0] = 0; offsets[q+1] - offsets[q] = prompt length of query q.
        nll: [Q] float32, summed negative log-likelihood -ℓθ0(q) over the scored tokens (nats).
        num_tokens: [Q] int64, number of scored tokens (prompt length - 1).
    """

    logprobs: torch.Tensor
    offsets: torch.Tensor
    nll: torch.Tensor
    num_tokens: torch.Tensor

    @classmethod
    def from_rows(cls, rows: list[torch.Tensor]) -> ReferenceScoreCache:
        """Build from one [L_q] tensor per query (first entry ignored and stored as 0)."""
        lengths = torch.tensor([row.numel() for row in rows], dtype=torch.long)
        logprobs = torch.cat([row.float() for row in rows]) if rows else torch.zeros(0)
        offsets = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
        logprobs[offsets[:-1][lengths > 0]] = 0.0
        # Sum in float64: a long query's ℓ is a sum of hundreds of terms and is compared across runs.
        nll = torch.stack([-row[1:].double().sum() for row in rows]).float() if rows else torch.zeros(0)
        return cls(logprobs, offsets, nll, (lengths - 1).clamp(min=0))

    def __len__(self) -> int:
        return self.nll.numel()

    @property
    def lengths(self) -> torch.Tensor:
        """[Q] prompt lengths in tokens."""
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, query_index: int) -> torch.Tensor:
        """[L_q] per-token log-probs of one query (entry 0 is the unscored first token)."""
        return self.logprobs[self.offsets[query_index] : self.offsets[query_index + 1]]

    def padded(self, query_index: torch.Tensor, width: int) -> torch.Tensor:
        """Per-token reference log-probs of a batch, right-aligned to match left-padded prompts.

        Args:
            query_index: [B] rows of the cache.
            width: P, the padded prompt width.
        Returns:
            [B, P] float32 on the cache's device; column j lines up with column j of the prompts left-padded to P.
            Padding and each row's first real token are 0.
        """
        query_index = query_index.to(self.offsets.device).long()
        starts, lengths = self.offsets[query_index], self.lengths[query_index]
        if len(lengths) and int(lengths.max()) > width:
            raise ValueError(f"width {width} is narrower than the longest prompt in the batch ({int(lengths.max())})")
        columns = torch.arange(width, device=self.offsets.device)
        first_column = (width - lengths).unsqueeze(1)
        real = columns >= first_column
        flat_index = starts.unsqueeze(1) + (columns - first_column)
        out = torch.zeros(len(query_index), width, dtype=self.logprobs.dtype, device=self.logprobs.device)
        out[real] = self.logprobs[flat_index[real]]
        return out

    def to(self, device: torch.device | str) -> ReferenceScoreCache:
        return ReferenceScoreCache(*(t.to(device) for t in (self.logprobs, self.offsets, self.nll, self.num_tokens)))

    def save(self, path: str | Path) -> None:
        tensors = {"logprobs": self.logprobs, "offsets": self.offsets, "nll": self.nll, "num_tokens": self.num_tokens}
        atomic_save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, Path(path))

    @classmethod
    def load(cls, path: str | Path) -> ReferenceScoreCache:
        tensors = load_file(str(path))
        return cls(tensors["logprobs"], tensors["offsets"], tensors["nll"], tensors["num_tokens"])


def atomic_save_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`safetensors.save_file` via a temporary file, so an interrupted write never leaves a truncated file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def write_cache(directory: str | Path, cache: ReferenceScoreCache, manifest: dict) -> Path:
    """Write scores then manifest (the manifest last: its presence marks a complete cache). Returns the directory."""
    directory = Path(directory)
    cache.save(directory / SCORES_FILE)
    tmp = directory / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, directory / MANIFEST_FILE)
    return directory


def read_manifest(directory: str | Path) -> dict | None:
    """The manifest of a complete cache in `directory`, or None when there is none."""
    path = Path(directory) / MANIFEST_FILE
    if not (path.is_file() and (Path(directory) / SCORES_FILE).is_file()):
        return None
    return json.loads(path.read_text())
