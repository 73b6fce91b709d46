"""Query-KL on an optimizer step's unique queries, scored alone in the reference cache's layout.

The default way `ERPOModule` computes Query-KL (`query_kl_scoring: exact`). The queries are scored in the blocks the
cache was built in (`data.query_scoring`), so at θ0 each query token's log-ratio is exactly 0 in any precision and
the regulariser sees only real drift: no tolerance is needed. It costs one more forward (and, when Query-KL is
optimised, backward) over the step's unique prompts, about Q·W tokens for Q queries padded to width W.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch

from erpo_lightning import objectives as obj
from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.query_scoring import score_block
from erpo_lightning.modules.distributed import all_reduce
from erpo_lightning.rollout.batch import RolloutBatch


def unique_prompts(batch: RolloutBatch) -> tuple[list[list[int]], torch.Tensor]:
    """The token ids of each query of `batch` once (its group leader's left-padded prompt without the padding), and
    their cache rows [Q]."""
    leaders = batch.is_group_leader
    ids, mask = batch.input_ids[leaders, : batch.prompt_length], batch.attention_mask[leaders, : batch.prompt_length]
    return [row[real.bool()].tolist() for row, real in zip(ids, mask, strict=True)], batch.query_index[leaders]


def right_padded_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] rows right-padded with 0 from [L_q] tensors, and the [B, L] mask of their scored tokens (every real
    token but the first, which has no context)."""
    width = max(len(row) for row in rows)
    padded = torch.stack([torch.nn.functional.pad(row, (0, width - len(row))) for row in rows])
    lengths = torch.tensor([len(row) for row in rows], device=padded.device)
    columns = torch.arange(width, device=padded.device)
    return padded, ((columns >= 1) & (columns < lengths[:, None])).to(padded.dtype)


def exact_query_kl(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    cache: ReferenceLogprobCache,
    algorithm: obj.LossSettings,
    normalizers: dict[str, torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    trainer: L.Trainer | None,
    device: torch.device,
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Score the step's unique queries block by block and, when Query-KL is optimised, backpropagate α · its term.

    Every rank runs as many blocks (filler blocks of one query, weighted 0, on ranks with fewer), since each forward
    and backward of a sharded or data-parallel policy runs collectives.

    Args:
        batch: the optimizer step's rows (whole groups).
        cache: reference scores with the `layout` they were computed in.
        algorithm: the loss settings (`query_kl_coef`, estimator, aggregation, clamp, tolerance).
        normalizers: the step's global counts (`objectives.loss_normalizers`, summed over ranks).
        backward: called with each block's loss share (already scaled for the strategy's gradient averaging).
        constant: Dr. GRPO's normaliser, when the PG loss uses `seq_sum_constant`.
    Returns:
        α · the Query-KL term on this rank's queries (a detached scalar, to add to the step's logged loss), and the
        parts `objectives.query_kl_parts` names, one value per query ([Q] each).
    """
    if cache.layout is None:
        raise ValueError(
            "model.query_kl_scoring exact needs reference scores computed in a layout the step can reproduce, and "
            "these have none (data.cache_engine vllm, or a cache made outside QueryDataModule without a layout): "
            "use data.cache_engine transformers, or model.query_kl_scoring shared_forward"
        )
    layout, coef = cache.layout, algorithm.query_kl_coef
    prompts, query_index = unique_prompts(batch)
    blocks = layout.blocks([len(ids) for ids in prompts])
    count = int(all_reduce(trainer, len(blocks), "max", device))
    rows_per_query = torch.full((len(prompts),), batch.group_size, device=device)
    term_sum, recorded = torch.zeros((), device=device), []
    for number in range(count):
        real = number < len(blocks)
        block = blocks[number] if real else blocks[0][:1]
        with torch.set_grad_enabled(coef > 0):
            current, mask = right_padded_rows(score_block(policy, [prompts[p] for p in block], layout))
        reference, _ = right_padded_rows([cache.row(int(q)).to(current) for q in query_index[block]])
        if coef > 0:
            term = coef * obj.query_kl_loss(
                algorithm, current, reference, mask, normalizers, constant, rows_per_query[block]
            )
            backward(term * (1.0 if real else 0.0))
            term_sum += term.detach() if real else 0.0
        if real:
            recorded.append(obj.query_kl_parts(algorithm, current.detach(), reference, mask))
    parts = {name: torch.cat([part[name] for part in recorded]) for name in recorded[0]}
    return term_sum, parts
