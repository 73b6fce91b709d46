"""What the step's passes read (`LossRows`: one forward's rows; `StepInputs`: what every pass of an optimizer step
shares) and the forwards that score rows (`Forward`).

`step.micro_batch_loss` takes a micro-batch's `LossRows` and scores them with `response_logits_forward` (the exact
pass scores the queries) or `full_logits_forward` (`shared_forward`: the queries are read from this forward too);
`shared_prompt.PromptPass.forward` scores them on their queries' kept keys and values instead. All three turn the
model's window of logits (or last hidden states) into log-probs and entropy by `window_logprobs_and_entropy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from erpo_lightning import objectives as obj
from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.rollout.batch import RolloutBatch
from erpo_lightning.scoring.logprobs import causal_lm_window, prompt_response_logprobs_and_entropy, response_window


@dataclass(frozen=True)
class LossRows:
    """The rows of one forward, as the loss reads them. N rows of `[prompt; response]`, P prompt and R response
    columns.

    Attributes:
        input_ids, attention_mask: [N, P + R] long; prompts left-padded to P, responses right-padded.
        prompt_length: P.
        temperature: T the responses were sampled at; they are scored under softmax(logits / T), the prompt at T = 1.
        response_mask: [N, R] long, the response tokens the loss sees.
        advantages: [N] float32.
        is_group_leader: [N] bool, one row per query (its group's first).
        query_index: [N] long, each row's query's row in the reference cache.
        old_logprobs: [N, R] the policy's log-probs before the batch's first update; None = on-policy (the rows'
            own forward, detached).
        sampling_logprobs: [N, R] the engine's log-probs of the sampled tokens (None: the trainer has none).
        query_weights: [N] w(q) of each row's query, or None.
        reference_query_logprobs: [N, P] θ0's log-probs of the prompt tokens, as the cache pads them; only for
            `shared_forward` scoring, which reads the queries from this forward (None under `exact`).
        constant: Dr. GRPO's normaliser (`seq_sum_constant`), or None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_length: int
    temperature: float
    response_mask: torch.Tensor
    advantages: torch.Tensor
    is_group_leader: torch.Tensor
    query_index: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    sampling_logprobs: torch.Tensor | None = None
    query_weights: torch.Tensor | None = None
    reference_query_logprobs: torch.Tensor | None = None
    constant: float | None = None


def rollout_loss_rows(
    batch: RolloutBatch, constant: float | None, reference_query_logprobs: torch.Tensor | None = None
) -> LossRows:
    """The `LossRows` of a `RolloutBatch` whose advantages are set (`ERPOModule.train_on` sets them)."""
    return LossRows(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        prompt_length=batch.prompt_length,
        temperature=batch.temperature,
        response_mask=batch.response_mask,
        advantages=batch.advantages,
        is_group_leader=batch.is_group_leader,
        query_index=batch.query_index,
        old_logprobs=batch.old_logprobs,
        sampling_logprobs=batch.sampling_logprobs,
        query_weights=batch.query_weights,
        reference_query_logprobs=reference_query_logprobs,
        constant=constant,
    )


GlobalMax = Callable[[int], int]  # a count's largest value over all ranks


def _one_process(count: int) -> int:
    return count


@dataclass(frozen=True)
class StepInputs:
    """What every pass of one optimizer step reads besides the policy and its rows: the update's entry points
    (`step.accumulate_gradients`, `step.micro_batch_loss`, `step.query_pass_term`, `query_pass.exact_query_kl`,
    `shared_prompt.prompt_pass`) take it whole.

    Attributes:
        algorithm: the loss settings (`objectives.LossSettings`), with this step's entropy coefficient.
        normalizers: the step's global counts (`step.step_normalizers`, summed over ranks); every pass divides by
            them, so the shares of micro-batches and query blocks sum to the step's loss.
        group_size: rows per query (its group); a query's Query-KL counts once per row.
        cache: θ0's query scores and the layout they were computed in, which the query pass reproduces; None under
            `shared_forward` scoring (the rows carry their reference, `LossRows.reference_query_logprobs`).
        most_blocks: this rank's count of forwards in, the largest over ranks out (every rank runs as many, since
            each forward of a sharded or data-parallel policy runs collectives); the identity on one process.
        fused_output: the rows' output layer runs inside the log-prob code, chunk by chunk (`output_layer.py`); the
            query pass keeps the cache's unfused layout.
    """

    algorithm: obj.LossSettings
    normalizers: dict[str, torch.Tensor]
    group_size: int
    cache: ReferenceLogprobCache | None = None
    most_blocks: GlobalMax = _one_process
    fused_output: bool = False


# A forward of `policy` over the rows: ([N, P + R] token log-probs, [N, P + R] entropy or None), column t scoring
# token t given the tokens before it (column 0 unscored), the prompt at T = 1 and the response at the rows' T. The
# entropy carries its gradient when the loss has an entropy bonus (`LossSettings.entropy_gradient`).
Forward = Callable[[torch.nn.Module, LossRows], tuple[torch.Tensor, torch.Tensor | None]]


def window_logprobs_and_entropy(
    window: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    temperature: float,
    weight: torch.Tensor | None,
    entropy_gradient: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logprobs.prompt_response_logprobs_and_entropy` of a forward's window (logits, or the last hidden states with
    the output layer's `weight`), whose logits nothing else reads. With `entropy_gradient` the entropy is
    `objectives.token_entropy`'s, with gradient (the entropy bonus): the window then has two readers, so backward
    writes the log-probs' gradient into a buffer of its own rather than into the logits."""
    if not entropy_gradient:
        return prompt_response_logprobs_and_entropy(
            window, input_ids, prompt_length, temperature, gradient_into_logits=True, output_weight=weight
        )
    logprobs, _ = prompt_response_logprobs_and_entropy(
        window, input_ids, prompt_length, temperature, with_entropy=False, output_weight=weight
    )
    scale = torch.ones(window.shape[1], dtype=torch.float32, device=window.device)
    scale[prompt_length - 1 :] = 1.0 / temperature
    entropy = obj.token_entropy(window, scale, weight)  # column t: the distribution at position t (predicts t + 1)
    return logprobs, torch.nn.functional.pad(entropy[:, :-1], (1, 0))


def full_logits_forward(
    policy: torch.nn.Module, rows: LossRows, fused_output: bool = False, entropy_gradient: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `Forward` of `shared_forward` scoring, which reads the prompt tokens too: the policy's logits at every
    position, then log-probs and entropy from them. The logits live only here, so backward writes their gradient
    into their own buffer (`gradient_into_logits`), as in `response_logits_forward`. `fused_output`: the output
    layer runs chunk by chunk inside the log-prob code, so the logits never exist (`output_layer.py`).
    `entropy_gradient`: as `window_logprobs_and_entropy`."""
    window, weight = causal_lm_window(policy, rows.input_ids, rows.attention_mask, fused_output=fused_output)
    return window_logprobs_and_entropy(
        window, rows.input_ids, rows.prompt_length, rows.temperature, weight, entropy_gradient
    )


def response_logits_forward(
    policy: torch.nn.Module, rows: LossRows, fused_output: bool = False, entropy_gradient: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `Forward` when no prompt log-prob is read (the exact pass scores the queries): the output layer, the
    log-softmax and the entropy run on the R + 1 positions that predict response tokens only (`logits_to_keep`),
    not on the P − 1 prompt positions, in every arm. The prompt columns of the result are 0. `fused_output` as in
    `full_logits_forward`; `entropy_gradient` as `window_logprobs_and_entropy`."""
    prompt_length = rows.prompt_length
    window, weight = response_window(
        policy, rows.input_ids, rows.attention_mask, prompt_length, fused_output=fused_output
    )
    # Column 0 of the kept window is the last prompt token, unscored; columns 1.. are the response at T.
    logprobs, entropy = window_logprobs_and_entropy(
        window, rows.input_ids[:, prompt_length - 1 :], 1, rows.temperature, weight, entropy_gradient
    )
    skipped = (prompt_length - 1, 0)
    return torch.nn.functional.pad(logprobs, skipped), torch.nn.functional.pad(entropy, skipped)
