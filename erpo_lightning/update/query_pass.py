"""An optimizer step's queries: Query-KL on its unique queries, scored alone in the reference cache's layout, and
their per-step weights w(q) (`step_query_weights`, shared by ERPOModule and the TRL integration).

The default way `ERPOModule` computes Query-KL (`query_kl_scoring: exact`). The queries are scored in the blocks the
cache was built in (`scoring.queries`), so at θ0 each query token's log-ratio is exactly 0 in any precision and
the regulariser sees only real drift: no tolerance is needed. It costs one more forward (and, when Query-KL is
optimised, backward) over the step's unique prompts, about Q·W tokens for Q queries padded to width W.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout, score_block
from erpo_lightning.update.forward import StepInputs

# A scoring block's forward: (policy, the block's queries' token ids, layout) -> one [L_q] log-prob row per query.
BlockScore = Callable[[torch.nn.Module, list[list[int]], QueryScoringLayout], list[torch.Tensor]]


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
    step: StepInputs,
    backward: Callable[[torch.Tensor], None] | None = None,
    constant: float | None = None,
    score: BlockScore = score_block,
) -> tuple[torch.Tensor, obj.QueryDrift]:
    """Score the step's unique queries block by block; when Query-KL is optimised (α > 0), α · its term.

    Every rank runs as many blocks (`step.most_blocks`; filler blocks, weighted 0, on ranks with fewer; a rank or
    micro-batch may hold no query at all), since each forward and backward of a sharded or data-parallel policy
    runs collectives.

    Args:
        prompts, query_index: the token ids of each query once, and its cache row [Q] (`unique_prompts`).
        step: the step's loss settings, global counts, group size (how many rows share each query) and reference
            cache (`step.cache`, with the `layout` its scores were computed in: required here).
        backward: called with each block's loss share, whose graph is then freed (Lightning's manual backward);
            None: the shares are summed, with their graph, into the returned term (a trainer that runs backward).
        constant: Dr. GRPO's normaliser, when the PG loss uses `seq_sum_constant` (`LossRows.constant`).
        score: the block's forward (`scoring.queries.score_block`'s contract; `shared_prompt.PromptPass` keeps
            its keys and values too). It runs with grad only when Query-KL is optimised, unless it enables grad.
    Returns:
        α · the Query-KL term on this rank's queries (detached when `backward` is given), and their drift
        (`objectives.QueryDrift`, one value per query).
    """
    cache, algorithm, normalizers = step.cache, step.algorithm, step.normalizers
    if cache is None:
        raise ValueError("the exact query pass scores the queries in the reference cache's layout: pass the cache")
    if cache.layout is None:
        raise ValueError(
            "query_kl_scoring 'exact' needs reference scores computed in a layout the step can reproduce, and these "
            "have none (data.cache_engine vllm, or a cache made without a layout): use data.cache_engine "
            "transformers, or query_kl_scoring 'shared_forward'"
        )
    layout, coef = cache.layout, algorithm.query_kl_coef
    blocks = layout.blocks([len(ids) for ids in prompts])
    device = next(policy.parameters()).device
    multiplicity = torch.full((len(prompts),), step.group_size, device=device)
    term_sum, recorded = torch.zeros((), device=device), []
    for number in range(step.most_blocks(len(blocks))):
        real = number < len(blocks)
        block = blocks[number] if real else []
        queries = [prompts[p] for p in block] if real else [[0, 0]]  # a filler: two padding tokens, weight 0
        with torch.set_grad_enabled(coef > 0 and torch.is_grad_enabled()):  # (an evaluation loop has it off)
            current, mask = right_padded_rows(score(policy, queries, layout))
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
    return term_sum, obj.QueryDrift.cat(recorded, device)


@torch.no_grad()
def step_query_weights(
    algorithm: obj.LossSettings,
    policy: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    reference_nll: torch.Tensor | None,
    groups: torch.Tensor,
    global_sum: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor | None:
    """w(q) of Q queries of one optimizer step when it depends on the step (not `Algorithm.static_query_weights`):
    `objectives.query_weights(s(q), s̄, clip)` with the algorithm's `query_weight_source` and `query_weight_clip`.

    s(q) is the carried reference NLL, or the current policy's summed NLL of the prompt (one no-grad forward: the
    released code's); s̄ is the mean of s(q) over the step's groups on all ranks.

    Args:
        prompt_ids, prompt_mask: [Q, P] the queries' left-padded prompts (read only for the `current` source).
        reference_nll: [Q] s(q) under θ0 (nats), for the `reference` source.
        groups: [Q] how many of this rank's groups each query leads (its weight in s̄; 1 each for group leaders).
        global_sum: sums a tensor over all ranks (the identity on one process).
    Returns:
        [Q] w(q), or None with the `current` source when w(q) is not applied (it would cost the forward).
    """
    if algorithm.query_weight_source == "current":
        if not algorithm.use_query_weights:
            return None
        logprobs = sequence_logprobs(policy, prompt_ids, prompt_mask)
        nll = -(logprobs * obj.query_token_mask(prompt_mask, prompt_ids.shape[1])).sum(-1)
    else:
        nll = reference_nll
    groups = groups.to(nll)
    totals = global_sum(torch.stack([(nll * groups).sum(), groups.sum()]))
    return obj.query_weights(nll, totals[0] / totals[1], algorithm.query_weight_clip)
