"""θ0 query scores for trainers outside Lightning: scored once with the project's cache code, fingerprinted like
`erpo cache`'s, written next to the run and read back on resume (never rescored from a trained model).

Pure torch and `erpo_lightning.data`; no TRL import. `ERPOTrainer` scores every training prompt here, and
`QueryKLCallback` its probe prompts.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.data.cache import SCORES_FILE, ReferenceLogprobCache, read_manifest, write_cache
from erpo_lightning.data.fingerprint import _json_hash, check_manifest, fingerprint_digest
from erpo_lightning.data.reference_logprobs import compute_reference_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout
from erpo_lightning.weights.merged import theta0_named_parameters


def parameters_hash(model: torch.nn.Module) -> str:
    """sha256 over the names, dtypes, shapes and bytes of `model`'s parameters: which weights θ0 was. A model with
    LoRA adapters that add nothing yet (TRL's `peft_config` before the first step) hashes as its base model
    (`weights.merged.theta0_named_parameters`), so its θ0 scores are the base model's, reusable by either."""
    digest = hashlib.sha256()
    for name, parameter in theta0_named_parameters(model):
        tensor = parameter.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{tuple(parameter.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def reference_manifest(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence,
    prompt_ids: Sequence[Sequence[int]],
    template: dict,
    dtype: torch.dtype | None = None,
) -> dict:
    """The manifest of a score cache (`data.fingerprint.FINGERPRINT_FIELDS`) for a model held in memory.

    Args:
        prompts: the prompts as the trainer's dataset holds them (text, or chat messages).
        prompt_ids: [Q] their token ids as the trainer feeds them to the model.
        template: how the text became tokens (e.g. the chat template), recorded and compared.
        dtype: what the scoring forward computes in (an autocast's); None: the weights' dtype.
    """
    vocab = sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else None
    manifest = {
        "model_path": str(getattr(getattr(model, "config", None), "_name_or_path", type(model).__name__)),
        "weights_hash": parameters_hash(model),
        "tokenizer_hash": _json_hash([type(tokenizer).__name__, vocab]),
        "template": template,
        "dataset_fingerprint": _json_hash(list(prompts)),
        "prompt_tokens_hash": _json_hash([list(map(int, ids)) for ids in prompt_ids]),
        "max_prompt_length": max((len(ids) for ids in prompt_ids), default=0),
        "dtype": str(dtype or next(model.parameters()).dtype).removeprefix("torch."),
        "scoring_layout": QueryScoringLayout().to_dict(),  # what `compute_reference_logprobs` scores in by default
        "num_queries": len(prompt_ids),
        "num_prompt_tokens": sum(len(ids) for ids in prompt_ids),
        "package_version": importlib.metadata.version("erpo-lightning"),
    }
    # As written to and read back from manifest.json (sorted keys), so its fingerprint digest is the same then.
    return json.loads(json.dumps(manifest, sort_keys=True))


def load_or_score(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    directory: str | Path,
    manifest: dict,
    may_score: bool = True,
    trust_weights: bool = False,
) -> ReferenceLogprobCache:
    """The θ0 scores of `prompt_ids`: read from `directory` when it holds them, else scored from `model` and written.

    Args:
        manifest: `reference_manifest` of this run; a cache on disk with another fingerprint is refused
            (`CacheMismatchError` naming the fields), never overwritten.
        may_score: False when `model` is not θ0 (a resumed run): a missing cache is then an error, not a rescore.
        trust_weights: accept the cache's weights hash without comparing (a resumed run's weights are not θ0's).
    Returns:
        [Q] per-token scores (`ReferenceLogprobCache`, float32 on the CPU), in `prompt_ids` order.
    """
    directory = Path(directory)
    found = read_manifest(directory)
    if found is not None:
        expected = {**manifest, "weights_hash": found.get("weights_hash")} if trust_weights else manifest
        check_manifest(found, expected, directory)
        lengths = [len(ids) for ids in prompt_ids]
        cache = ReferenceLogprobCache.load(directory / SCORES_FILE, fingerprint_digest(found), lengths)
        cache.layout = QueryScoringLayout(**found["scoring_layout"])  # the manifest matched: the layout is this run's
        return cache
    if not may_score:
        raise FileNotFoundError(
            f"{directory}: no θ0 query scores to resume with, and the model is no longer θ0 (they are never rescored "
            "from a trained model); resume into the output_dir of the run that scored them"
        )
    was_training = model.training
    model.eval()
    try:
        cache = compute_reference_logprobs(model, [list(map(int, ids)) for ids in prompt_ids], progress=False)
    finally:
        model.train(was_training)
    write_cache(directory, cache, manifest, fingerprint_digest(manifest))
    return cache


def left_padded_query_mask(cache: ReferenceLogprobCache, rows: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] query mask (`objectives.query_token_mask`) of the cache rows `rows` left-padded to `width`."""
    lengths = cache.lengths[rows]
    attention = (torch.arange(width) >= (width - lengths).unsqueeze(1)).long()
    return obj.query_token_mask(attention, width)


def probe_query_kl(current: ReferenceLogprobCache, reference: ReferenceLogprobCache) -> dict[str, float]:
    """Query-KL of the current scores of Q prompts against their θ0 scores: the mean over prompts of
    `objectives.per_query_kl` with `token_k3` and with `sequence_k3` (default ±10 value clamp)."""
    rows = torch.arange(len(reference))
    width = int(reference.lengths.max())
    mask = left_padded_query_mask(reference, rows, width)
    now, then = current.padded(rows, width), reference.padded(rows, width)
    return {
        estimator: float(obj.per_query_kl(now, then, mask, estimator).mean())
        for estimator in ("token_k3", "sequence_k3")
    }
