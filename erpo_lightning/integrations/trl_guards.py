"""What `ERPOTrainer` (integrations/trl.py) checks beyond TRL: its inputs before θ0 scoring, every reward of a
generation batch, and the weights after every optimizer step.

- Prompts: an empty prompt, or conversational prompts with no chat template to tokenize them, are refused before the
  θ0 scores are computed (one line naming the dataset and row).
- Rewards: a reward function's value must be None (TRL's "this function does not score this completion") or finite.
  TRL turns None into NaN in its reward tensor, so `NaNReturns` records which values a function itself returned as
  NaN; a non-finite reward would turn the advantages, then the weights, into NaN.
- Weights: `FiniteWeightsCallback` applies `erpo fit`'s check (`NonFiniteGuard.check_weights`) after each step.

Importing this module imports TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import is_async_callable

from erpo_lightning.modules.optim import NonFiniteGuard, weight_norm

WEIGHTS_REMEDY = "lower GRPOConfig.learning_rate or set GRPOConfig.max_grad_norm"


# ------------------------------------------------------------------------------------------------------- prompts
def named_datasets(trainer: GRPOTrainer) -> list[tuple[str, Dataset]]:
    """(argument name, dataset) of the training set then each evaluation set (a dict's keys as `eval_dataset[key]`)."""
    evaluation = trainer.eval_dataset
    if isinstance(evaluation, dict):
        evaluations = [(f"eval_dataset[{key!r}]", dataset) for key, dataset in evaluation.items()]
    else:
        evaluations = [("eval_dataset", evaluation)] if evaluation is not None else []
    return [("train_dataset", trainer.train_dataset), *evaluations]


def empty_dataset_problem(train_dataset, eval_dataset) -> str | None:
    """The first of the trainer's datasets that has no rows, as a one-line reason, or None. Checked on the arguments,
    before GRPOTrainer builds anything: TRL meets an empty dataset with a bare IndexError. A dataset without a
    length (an iterable one) is left to the other checks."""
    evaluations = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    named = [("train_dataset", train_dataset)]
    named += [("eval_dataset" if key is None else f"eval_dataset[{key!r}]", data) for key, data in evaluations]
    for name, dataset in named:
        if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
            return f"{name} is empty (0 rows): give it at least one prompt (a filter or split that kept nothing?)"
    return None


def chat_template(trainer: GRPOTrainer) -> str | None:
    """The chat template TRL applies to conversational prompts: GRPOConfig.chat_template_path's, or the tokenizer's."""
    return trainer.chat_template or getattr(trainer.processing_class, "chat_template", None)


def _is_empty(prompt) -> bool:
    """Whether a prompt has no text: a blank string, or a conversation none of whose messages has content."""
    if isinstance(prompt, str):
        return not prompt.strip()
    return not any(not isinstance(message.get("content"), str) or message["content"].strip() for message in prompt)


def prompt_problem(trainer: GRPOTrainer) -> str | None:
    """The first prompt of the datasets that cannot be trained on, as a one-line reason, or None."""
    for name, dataset in named_datasets(trainer):
        prompts = dataset["prompt"]
        empty = next((row for row, prompt in enumerate(prompts) if _is_empty(prompt)), None)
        if empty is not None:
            return f"{name} row {empty} has an empty prompt ({prompts[empty]!r}): every prompt needs text"
        if len(prompts) and isinstance(prompts[0], list) and chat_template(trainer) is None:
            return (
                f"{name} holds conversational prompts but the tokenizer has no chat template: set "
                "processing_class.chat_template or GRPOConfig.chat_template_path, or give plain-text prompts"
            )
    return None


# ------------------------------------------------------------------------------------------------------- rewards
def _is_nan(value) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):  # None, or not a number (TRL itself refuses the latter)
        return False


class NaNReturns:
    """Which completions of the current generation batch each reward function returned NaN for.

    `wrap(index, func)` is `func` (sync or async alike) recording into column `index` of `rows` ([B_local, F] bool,
    cleared by `clear(B_local)` before each batch) and passing its values on unchanged.
    """

    def __init__(self, num_funcs: int):
        self.rows = torch.zeros(0, num_funcs, dtype=torch.bool)

    def clear(self, num_rows: int) -> None:
        self.rows = torch.zeros(num_rows, self.rows.shape[1], dtype=torch.bool)

    def _record(self, index: int, values):
        for row, value in enumerate(values[: len(self.rows)]):  # a wrong count is TRL's to refuse
            self.rows[row, index] = _is_nan(value)
        return values

    def wrap(self, index: int, func: Callable) -> Callable:
        if is_async_callable(func):

            async def recorded(**kwargs):
                return self._record(index, await func(**kwargs))
        else:

            def recorded(**kwargs):
                return self._record(index, func(**kwargs))

        return recorded


def reward_problem(
    trainer: GRPOTrainer, rewards: torch.Tensor, nan_returns: NaNReturns, completions: list
) -> str | None:
    """A one-line reason naming the first non-finite reward (function, value, row), or the first row that no function
    scored; None when every row has a reward and all are finite. Every process reaches the same answer.

    Args:
        rewards: [B, F] the generation batch's rewards of all processes (NaN where a function returned None or NaN).
        nan_returns: where this process's functions returned NaN themselves ([B_local, F]).
        completions: [B_local] this process's completions (quoted in the reason when the row is one of them).
    """
    returned_nan = trainer.accelerator.gather(nan_returns.rows.to(rewards.device, torch.uint8)) > 0
    models = torch.tensor([isinstance(f, torch.nn.Module) for f in trainer.reward_funcs], device=rewards.device)
    bad = rewards.isinf() | returned_nan | (rewards.isnan() & models)  # a reward model's NaN is never a None
    unscored = rewards.isnan().all(dim=1)
    if not (bad.any() or unscored.any()):
        return None
    row, column = bad.nonzero()[0].tolist() if bad.any() else (int(unscored.nonzero()[0]), None)
    local = row - trainer.accelerator.process_index * len(completions)
    quoted = f" (completion {str(completions[local])[:80]!r})" if 0 <= local < len(completions) else ""
    where = f"row {row} of the generation batch{quoted}"
    if column is None:
        return f"every reward function returned None for {where}: each completion needs at least one reward"
    return (
        f"reward function {trainer.reward_func_names[column]!r} returned {float(rewards[row, column])} for {where}: "
        "rewards must be finite (return None for a completion a function does not score)"
    )


# ------------------------------------------------------------------------------------------------------- weights
class FiniteWeightsCallback(TrainerCallback):
    """After each optimizer step, `erpo fit`'s check: the weights' global norm must be finite (else
    `NonFiniteLossError`, before the step is counted, logged or saved)."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        where = f"global step {state.global_step + 1}"  # TRL counts the step after this callback
        NonFiniteGuard().check_weights(weight_norm(model.parameters()), where, remedy=WEIGHTS_REMEDY)
