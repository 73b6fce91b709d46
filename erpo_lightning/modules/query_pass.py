"""Query-KL on an optimizer step's unique queries, scored alone in the reference cache's layout.

The default way `ERPOModule` computes Query-KL (`query_kl_scoring: exact`). The queries are scored in the blocks the
cache was built in (`data.query_scoring`), so at θ0 each query token's log-ratio is exactly 0 in any precision and
the regulariser sees only real drift: no tolerance is needed. It costs one more forward (and, when Query-KL is
optimised, backward) over the step's unique prompts, about Q·W tokens for Q queries padded to width W.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.query_scoring import score_block


def unique_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, is_leader: torch.Tensor) -> list[list[int]]:
    """The token ids of each query once: its group leader's left-padded prompt [N, P] without the padding."""
    rows = zip(prompt_ids[is_leader], prompt_mask[is_leader], strict=True)
    return [ids[real.bool()].tolist() for ids, real in rows]


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
    prompts: list[list[int]],
    query_index: torch.Tensor,
    rows_per_query: int,
    cache: ReferenceLogprobCache,
    algorithm: obj.LossSettings,
    normalizers: dict[str, torch.Tensor],
    backward: Callable[[torch.Tensor], None] | None,
    most_blocks: Callable[[int], int],
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Score the step's unique queries block by block; when Query-KL is optimised (α > 0), α · its term.

    Every rank runs as many blocks (filler blocks, weighted 0, on ranks with fewer; a rank or micro-batch may hold no
    query at all), since each forward and backward of a sharded or data-parallel policy runs collectives.

    Args:
        prompts, query_index: the token ids of each query once, and its cache row [Q] (`unique_prompts`).
        rows_per_query: how many rows of the step share each query (its group size).
        cache: reference scores with the `layout` they were computed in.
        algorithm: the loss settings (`query_kl_coef`, estimator, aggregation, clamp, tolerance).
        normalizers: the step's global counts (`objectives.loss_normalizers`, summed over ranks).
        backward: called with each block's loss share, whose graph is then freed (Lightning's manual backward);
            None: the shares are summed, with their graph, into the returned term (a trainer that runs backward).
        most_blocks: this rank's block count in, the largest over ranks out.
        constant: Dr. GRPO's normaliser, when the PG loss uses `seq_sum_constant`.
    Returns:
        α · the Query-KL term on this rank's queries (detached when `backward` is given), and the parts
        `objectives.query_kl_parts` names, one value per query ([Q] each).
    """
    if cache.layout is None:
        raise ValueError(
            "query_kl_scoring 'exact' needs reference scores computed in a layout the step can reproduce, and these "
            "have none (data.cache_engine vllm, or a cache made without a layout): use data.cache_engine "
            "transformers, or query_kl_scoring 'shared_forward'"
        )
    layout, coef = cache.layout, algorithm.query_kl_coef
    blocks = layout.blocks([len(ids) for ids in prompts])
    device = next(policy.parameters()).device
    multiplicity = torch.full((len(prompts),), rows_per_query, device=device)
    term_sum, recorded = torch.zeros((), device=device), []
    for number in range(most_blocks(len(blocks))):
        real = number < len(blocks)
        block = blocks[number] if real else []
        queries = [prompts[p] for p in block] if real else [[0, 0]]  # a filler: two padding tokens, weight 0
        with torch.set_grad_enabled(coef > 0 and torch.is_grad_enabled()):  # (an evaluation loop has it off)
            current, mask = right_padded_rows(score_block(policy, queries, layout))
        if real:
            reference, _ = right_padded_rows([cache.row(int(q)).to(current) for q in query_index[block]])
            rows_each = multiplicity[block]
        else:
            reference, rows_each = current.detach(), torch.zeros(len(queries), device=device)
        if coef > 0:
            term = (
                coef
                * obj.query_kl_loss(algorithm, current, reference, mask, normalizers, constant, rows_each)
                * (1.0 if real else 0.0)
            )
            if backward is not None and term.requires_grad:
                backward(term)
                term = term.detach()
            term_sum = term_sum + term
        if real:
            recorded.append(obj.query_kl_parts(algorithm, current.detach(), reference, mask))
    names = ("query_kl", "query_kl_token_k3", "query_loglik_change")  # `objectives.query_kl_parts`'
    parts = {name: torch.cat([part[name] for part in recorded] or [torch.zeros(0, device=device)]) for name in names}
    return term_sum, parts
