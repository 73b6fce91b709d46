"""The ERPO update as one unit, for any trainer: an optimizer step's forward, loss, Query-KL pass and w(q) in pure
torch (no Lightning import). `ERPOModule` (Lightning) and `integrations.trl.ERPOTrainer` (TRL) both call it.

    forward.py     `LossRows` (what one forward reads), `StepInputs` (what every pass of a step shares) and the
                   forwards that score rows
    step.py        `micro_batch_loss`, `query_pass_term`, `accumulate_gradients` (one optimizer step's backward),
                   `StepStats`, `step_normalizers`
    query_pass.py  Query-KL on the step's unique queries scored alone in the cache's layout; per-step w(q)
    microbatch.py  optimizer mini-batches of whole groups; micro-batches of length-sorted rows by a token budget,
                   as many on every rank
    shared_prompt.py  each query forwarded once (`prompt_pass`), its responses on its keys and values
"""

from erpo_lightning.update.forward import (
    Forward,
    LossRows,
    StepInputs,
    full_logits_forward,
    response_logits_forward,
    rollout_loss_rows,
)
from erpo_lightning.update.microbatch import (
    micro_batch_rows,
    micro_batches,
    minibatch_rows,
    rank_aligned_micro_batches,
    trim_padding,
)
from erpo_lightning.update.query_pass import exact_query_kl, step_query_weights, unique_prompts
from erpo_lightning.update.shared_prompt import PromptPass, prompt_pass
from erpo_lightning.update.step import (
    StepStats,
    accumulate_gradients,
    micro_batch_loss,
    query_pass_term,
    step_normalizers,
)

__all__ = [
    "Forward",
    "LossRows",
    "PromptPass",
    "StepInputs",
    "StepStats",
    "accumulate_gradients",
    "exact_query_kl",
    "full_logits_forward",
    "micro_batch_loss",
    "micro_batch_rows",
    "micro_batches",
    "minibatch_rows",
    "prompt_pass",
    "query_pass_term",
    "rank_aligned_micro_batches",
    "response_logits_forward",
    "rollout_loss_rows",
    "step_normalizers",
    "step_query_weights",
    "trim_padding",
    "unique_prompts",
]
