"""One optimizer step's loss and gradients, the same for every trainer: the rows' forward, `objectives.rl_loss` and
the exact Query-KL pass, in one order.

A trainer hands the step its rows as `LossRows` (what one forward reads: `forward.py`) and what every pass shares as
`StepInputs` (the loss settings, the global counts of `step_normalizers`, the group size, the reference cache, the
collective that aligns ranks); `micro_batch_loss` scores the rows and returns the loss with its typed `LossStats`;
`query_pass_term` scores the step's unique queries alone, in the reference cache's layout
(`query_pass.exact_query_kl`). `accumulate_gradients` runs both over an optimizer step for a trainer that drives
backward itself (`ERPOModule`); a trainer whose loop runs backward on a returned loss (TRL's) calls `query_pass_term`
then `micro_batch_loss` per micro-batch and adds them.
Nothing here imports Lightning: collectives come in as functions (the identity on one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.common.step_phases import timed
from erpo_lightning.scoring.logprobs import response_logprobs
from erpo_lightning.update.forward import (
    Forward,
    LossRows,
    StepInputs,
    full_logits_forward,
    response_logits_forward,
)
from erpo_lightning.update.query_pass import exact_query_kl, unique_prompts
from erpo_lightning.update.shared_prompt import prompt_pass

GlobalSum = Callable[[torch.Tensor], torch.Tensor]  # a tensor summed over all ranks
Backward = Callable[[torch.Tensor], None]  # runs backward on a loss (a share of the step's, already scaled)


@dataclass
class StepStats:
    """What one optimizer step's forwards and backwards produced on this rank.

    Attributes:
        loss, pg_loss: 0-dim, this rank's share of the step's loss and policy-gradient term (sum them over ranks for
            the step's values); the loss includes the Query-KL term of the exact pass.
        micro: each real micro-batch's rows with its `LossStats`, for the metrics.
        query_drift: the step's queries' drift from the exact pass (None under `shared_forward`, where each
            micro-batch's `LossStats.query_drift` holds it).
    """

    loss: torch.Tensor
    pg_loss: torch.Tensor
    micro: list[tuple[LossRows, obj.LossStats]] = field(default_factory=list)
    query_drift: obj.QueryDrift | None = None


def step_normalizers(
    response_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    is_leader: torch.Tensor,
    global_sum: GlobalSum,
) -> dict[str, torch.Tensor]:
    """The step's global counts `rl_loss` divides by (`objectives.loss_normalizers` of its rows, summed over ranks):
    every micro-batch's loss is divided by the whole step's counts, so the shares sum to the step's loss."""
    query_mask = obj.query_token_mask(attention_mask, prompt_length)
    counts = obj.loss_normalizers(response_mask, query_mask, is_leader)
    return dict(zip(counts, global_sum(torch.stack(list(counts.values()))), strict=True))


def micro_batch_loss(
    policy: torch.nn.Module,
    rows: LossRows,
    step: StepInputs,
    reference_policy: torch.nn.Module | None = None,
    forward: Forward | None = None,
) -> tuple[torch.Tensor, obj.LossStats]:
    """The loss of one micro-batch (`objectives.rl_loss` with `step.algorithm`), already divided by its step's
    global counts (`step.normalizers`).

    One forward scores the responses (policy gradient) and, under `shared_forward` (`rows.reference_query_logprobs`
    given), the prompts (Query-KL); the entropy comes from the same pass. `reference_policy`, when given, scores the
    responses for Policy-KL (no gradient). `forward` None: `full_logits_forward` under `shared_forward`, else
    `response_logits_forward`, with the output layer fused into the log-probs if `step.fused_output`.
    Returns:
        the loss (0-dim) and its `LossStats`, with the response entropy [N, R] and, on policy, the engine–trainer
        log-prob gap [N, R] (`logprob_abs_diff`: this forward is the trainer's view of the sampled tokens).
    """
    algorithm, fused_output = step.algorithm, step.fused_output
    prompt_length = rows.prompt_length
    if forward is None:
        forward = response_logits_forward if rows.reference_query_logprobs is None else full_logits_forward
        token_logprobs, entropy = forward(policy, rows, fused_output, algorithm.entropy_gradient)
    else:
        token_logprobs, entropy = forward(policy, rows)
    query_lp, query_mask, response_lp, _ = obj.split_prompt_response(token_logprobs, rows.attention_mask, prompt_length)
    on_policy = rows.old_logprobs is None
    old = response_lp.detach() if on_policy else rows.old_logprobs
    sampling = rows.sampling_logprobs
    if sampling is not None:  # an engine with no log-prob for a token (vLLM's NaN): ρ = 1 there, as in TRL
        sampling = torch.where(sampling.isnan(), old, sampling)
    ref_response = None
    if reference_policy is not None:
        with torch.no_grad():
            ref_response = response_logprobs(
                reference_policy, rows.input_ids, rows.attention_mask, prompt_length, rows.temperature,
                fused_output=fused_output,
            )  # fmt: skip
    reference = rows.reference_query_logprobs
    loss, stats = obj.rl_loss(
        algorithm, response_lp, old, rows.advantages, rows.response_mask,
        None if reference is None else query_lp, None if reference is None else reference.to(query_lp), query_mask,
        rows.is_group_leader,
        seq_weights=rows.query_weights if algorithm.use_query_weights else None,
        constant=rows.constant, normalizers=step.normalizers,
        ref_response_logprobs=ref_response, sampling_logprobs=sampling,
        entropy=None if entropy is None else entropy[:, prompt_length:],
    )  # fmt: skip
    difference = (old - sampling).abs() if on_policy and sampling is not None else None
    response_entropy = None if entropy is None else entropy[:, prompt_length:].detach()
    return loss, replace(stats, entropy=response_entropy, logprob_abs_diff=difference)


def step_queries(rows: LossRows) -> tuple[list[list[int]], torch.Tensor]:
    """The step's unique queries: each group leader's prompt without its padding, and its cache row [Q] (on CPU)."""
    leaders, width = rows.is_group_leader, rows.prompt_length
    prompts = unique_prompts(rows.input_ids[:, :width], rows.attention_mask[:, :width], leaders)
    return prompts, rows.query_index[leaders].cpu()


def query_pass_term(
    policy: torch.nn.Module, rows: LossRows, step: StepInputs, backward: Backward | None = None
) -> tuple[torch.Tensor, obj.QueryDrift]:
    """α · the Query-KL term of `rows`' unique queries (their group leaders' prompts), scored alone in the cache's
    layout (`query_pass.exact_query_kl`, whose arguments these are), and their drift."""
    prompts, query_index = step_queries(rows)
    return exact_query_kl(policy, prompts, query_index, step, backward, rows.constant)


def accumulate_gradients(
    policy: torch.nn.Module,
    step_rows: LossRows,
    micro_batches: Iterable[tuple[LossRows, bool]],
    step: StepInputs,
    backward: Backward,
    reference_policy: torch.nn.Module | None = None,
    share_prompt: bool = False,
    loss_scale: float = 1.0,
) -> StepStats:
    """Forward and backward of one optimizer step on this rank: first the exact Query-KL pass over the step's unique
    queries (`step.cache` given; None under `shared_forward`), then every micro-batch. The gradients accumulate in
    the policy; nothing is stepped.

    Under FSDP2 a forward without backward leaves the root's weights gathered, and the micro-batches' backward is
    what reshards them: so the query pass (whose backward is skipped when Query-KL is only monitored) runs first.
    With `share_prompt` (`shared_prompt.prompt_pass`) the query pass keeps each query's keys and values, the
    micro-batches forward only their responses on them, and one last backward runs through the query pass.

    Args:
        step_rows: the step's rows (its unique queries are read from them).
        micro_batches: (rows, real) pairs (`microbatch.rank_aligned_micro_batches`); a filler (real False) runs
            forward and backward with weight 0, since every rank must run as many (each runs collectives).
        step: what every pass shares (`forward.StepInputs`).
        backward: runs backward on a loss.
        loss_scale: what each loss share is multiplied by before `backward` (a trainer's averaging over ranks).
    """
    device = step_rows.input_ids.device
    stats = StepStats(torch.zeros((), device=device), torch.zeros((), device=device))
    forward, shared = None, None
    if share_prompt:
        if step.cache is None:
            raise ValueError("the shared prompt scores the queries in the reference cache's layout: pass the cache")
        prompts, query_index = step_queries(step_rows)
        with timed("query_pass"):
            shared = prompt_pass(policy, prompts, query_index, step, step_rows.constant)
        stats.query_drift, forward = shared.drift, shared.forward
    elif step.cache is not None:
        with timed("query_pass"):
            term, stats.query_drift = query_pass_term(
                policy, step_rows, step, lambda share: backward(share * loss_scale)
            )
        stats.loss = stats.loss + term
    for rows, real in micro_batches:
        with timed("forward"):
            loss, loss_stats = micro_batch_loss(policy, rows, step, reference_policy, forward)
        # Even a non-finite loss goes through backward: every rank must run the same collectives.
        with timed("backward"):
            backward(loss * (loss_scale if real else 0.0))
        if real:
            stats.loss = stats.loss + loss.detach()
            stats.pg_loss = stats.pg_loss + loss_stats.pg_loss
            stats.micro.append((rows, loss_stats))
    if shared is not None:
        with timed("query_pass"):
            closing = shared.closing_loss(loss_scale)
            if closing.requires_grad:
                backward(closing)
        stats.loss = stats.loss + shared.term.detach()
    return stats
