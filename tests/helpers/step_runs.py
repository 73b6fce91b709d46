"""One optimizer step's gradients through `update.accumulate_gradients` on one process, on the helpers' rollout batch,
with θ0's query scores computed as the cache build computes them."""

from dataclasses import replace

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.scoring.queries import QueryScoringLayout, score_block
from erpo_lightning.update import (
    StepInputs,
    accumulate_gradients,
    micro_batches,
    rollout_loss_rows,
    step_normalizers,
)
from helpers.batches import carrying_scores
from helpers.module_steps import PROMPTS, ReferenceLogprobs, rollout_batch


class LayoutScores(ReferenceLogprobs):
    """θ0's query scores computed as the cache build does: `score_block` in the layout, no grad."""

    def __init__(self, model, prompts, layout=None):
        super().__init__(model, prompts)
        self.layout = layout or QueryScoringLayout()
        with torch.no_grad():
            self.rows = [score_block(model, [p], self.layout)[0] for p in prompts]


def step(
    model, algorithm, batch, cache, max_tokens, share_prompt, reference_policy=None, fused_output=False,
    prompt_cached=False,
):  # fmt: skip
    """The parameters' gradients and the step's `StepStats` (loss, micro-batches' stats, query drift), from
    `update.accumulate_gradients` on one process; `prompt_cached`: the budget counts response tokens alone (as
    `ERPOModule` cuts under the shared prompt)."""
    model.zero_grad(set_to_none=True)
    rows = rollout_loss_rows(batch, 4)
    normalizers = step_normalizers(
        batch.response_mask, batch.attention_mask, batch.prompt_length, batch.is_group_leader, lambda total: total
    )
    micros = ((rollout_loss_rows(micro, 4), True) for _, micro in micro_batches(batch, max_tokens, prompt_cached))
    inputs = StepInputs(algorithm, normalizers, batch.group_size, cache, fused_output=fused_output)
    stats = accumulate_gradients(
        model, rows, micros, inputs, lambda loss: loss.backward(), reference_policy, share_prompt=share_prompt
    )
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return grads, stats


def theta0_step(model, max_tokens, share_prompt, layout=None):
    """`step` at θ0 (the weights not moved) under the `erpo` preset with a Query-KL tolerance of 0, θ0's scores made
    in `layout` on PROMPTS: the step where every query token's log-ratio must be exactly 0."""
    cache = LayoutScores(model, PROMPTS, layout)
    algorithm = resolve_algorithm("erpo", query_kl_tolerance=0.0)
    batch = prepared(model, cache, algorithm, perturb=False)
    return step(model, algorithm, batch, cache, max_tokens, share_prompt)


def prepared(model, cache, algorithm, perturb=True):
    """The helpers' rollout batch with advantages, θ0 scores and w(q) set; the weights moved off θ0 if `perturb`."""
    batch = rollout_batch(model)
    if perturb:  # off θ0, so Query-KL and its gradient are not 0
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.requires_grad:
                    noise = torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0))
                    parameter.add_(0.05 * noise.to(parameter.dtype))
    batch = carrying_scores(batch, algorithm, cache.nll)
    if batch.query_weights is None:
        batch = replace(batch, query_weights=obj.query_weights(cache.nll, cache.nll.mean()).repeat_interleave(2))
    return replace(batch, advantages=obj.group_advantages(batch.rewards, batch.group_size, "grpo"))
