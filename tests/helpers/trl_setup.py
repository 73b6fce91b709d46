"""The TRL integration tests' shared set-up: fixed prompts, completions and rewards, and an `ERPOTrainer` (or TRL's
`GRPOTrainer`) on them, so that no assertion depends on sampling (tests/integrations/test_trl.py,
tests/integrations/test_trl_guards.py); and the pieces both those tests and tests/end_to_end/test_trl_parity.py use
on a trainer's batch: our own forward over its rows (`scored_rows`), a policy moved by seeded noise (`perturb`),
off-policy old log-probs (`noisy_old_logprobs`) and a loss with its gradients (`gradients`)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from erpo_lightning import objectives as obj
from erpo_lightning.scoring.logprobs import causal_lm_logits, prompt_response_token_logprobs
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

requires_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="TRL is not installed (bench-only extra: pip install -e '.[trl]')"
)

GROUP_SIZE = 4
# Prompts of different lengths (left padding) and different likelihoods under the model (w(q) differs by query).
PROMPTS = ["Compute 7 + 8.", "What is 2 * 3? Be brief and exact.", "9 - 4?"]
COMPLETIONS = [
    "15<|im_end|>", "14", "it is 15<|im_end|>", "x",
    "6<|im_end|>", "six, I think<|im_end|>", "5", "66666666",
    "5<|im_end|>", "five", "5.0<|im_end|>", "the answer is 5",
]  # fmt: skip
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def rollout_for(dataset_prompts: list[str]):
    """A TRL `rollout_func`: COMPLETIONS for `dataset_prompts` in dataset order, G per prompt (no sampling)."""

    def fixed_rollout(prompts, trainer):
        tokenizer = trainer.processing_class
        assert prompts == [p for p in dataset_prompts for _ in range(GROUP_SIZE)]
        return {
            "prompt_ids": [tokenizer(p)["input_ids"] for p in prompts],
            "completion_ids": [tokenizer(c)["input_ids"] for c in COMPLETIONS],
            "logprobs": None,
        }

    return fixed_rollout


fixed_rollout = rollout_for(PROMPTS)  # the `rollout_func` of make_trainer's trainers


def fixed_reward(prompts, completions, **_):
    return list(REWARDS)


def grpo_settings(output_dir) -> dict:
    """The GRPOConfig settings the TRL tests start from: CPU, float32, no saving, G = GROUP_SIZE, one batch of all
    COMPLETIONS, dataset order, seed 0."""
    return dict(
        output_dir=str(output_dir), use_cpu=True, report_to="none", save_strategy="no", bf16=False,
        gradient_checkpointing=False, per_device_train_batch_size=len(COMPLETIONS), num_generations=GROUP_SIZE,
        max_completion_length=16, temperature=1.0, shuffle_dataset=False, logging_steps=1, disable_tqdm=True, seed=0,
    )  # fmt: skip


def make_trainer(
    model_path, output_dir, erpo: bool = True, fixed: bool = True, eval_prompts=None, inputs=None, **settings
):
    """An ERPOTrainer (or, erpo=False, TRL's GRPOTrainer) on PROMPTS; `settings` go to GRPOConfig, except Algorithm
    fields, `algorithm` and `query_kl_scoring`, which go to ERPOTrainer; `inputs` replace trainer arguments (e.g.
    `reward_funcs`)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # `rollout_func` is experimental in TRL
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from erpo_lightning.integrations.trl import ERPOTrainer
    from erpo_lightning.integrations.trl_config import ALGORITHM_FIELDS

    erpo_settings = {
        k: settings.pop(k) for k in list(settings) if k in ALGORITHM_FIELDS or k in ("algorithm", "query_kl_scoring")
    }
    config = grpo_settings(output_dir)
    config.update(settings)
    model = model_path if isinstance(model_path, torch.nn.Module) else str(model_path)
    kwargs = dict(
        model=model, reward_funcs=fixed_reward if fixed else length_reward, args=GRPOConfig(**config),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_byte_tokenizer(),
        rollout_func=fixed_rollout if fixed else None,
        eval_dataset=Dataset.from_dict({"prompt": eval_prompts}) if eval_prompts else None,
    )  # fmt: skip
    kwargs.update(inputs or {})
    return ERPOTrainer(**kwargs, **erpo_settings) if erpo else GRPOTrainer(**kwargs)


def length_reward(completions, **_):
    """A reward that varies within groups of sampled completions."""
    return [float(len(c) % 3 == 0) for c in completions]


def scored_rows(model, inputs: dict, temperature: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Our forward (logprobs.py, unfused) over a TRL batch's rows: query log-probs and mask [N, P], response
    log-probs (at `temperature`) and mask [N, R]."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["prompt_ids"].shape[1]
    logits = causal_lm_logits(model, input_ids, attention_mask)
    token_logprobs = prompt_response_token_logprobs(logits, input_ids, width, temperature)
    return obj.split_prompt_response(token_logprobs, attention_mask, width)


def perturb(model, scale: float = 0.05, seed: int = 1) -> None:
    """Move every parameter by `scale` times seeded Gaussian noise (away from θ0 and TRL's reference model)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def noisy_old_logprobs(model, inputs: dict, temperature: float = 1.0) -> torch.Tensor:
    """Off-policy old log-probs: the current response ones (at `temperature`) plus fixed noise, so ratios reach both
    sides of the clip range."""
    with torch.no_grad():
        _, _, current, mask = scored_rows(model, inputs, temperature)
    noise = 0.3 * torch.randn(current.shape, generator=torch.Generator().manual_seed(2))
    return (current + noise) * mask


def gradients(model, compute) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`compute()`'s loss (detached) and every parameter's gradient of it, the model's gradients left cleared."""
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads
