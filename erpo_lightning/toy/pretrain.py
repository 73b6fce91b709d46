"""Pre-train the toy model: supervised next-token training on worked solutions, stopped at a middling accuracy.

The loop is plain torch (no Lightning): teacher forcing on `prompt + solution + eos`, loss on the solution and eos
tokens only. Every `eval_every` steps it samples one answer per held-out problem at temperature 1 and stops once
that pass@1 reaches `target_accuracy`, leaving headroom that RL can turn into accuracy. Everything is seeded, and
the stopping decision is made at fixed steps, so a run is repeatable on one machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from erpo_lightning.data.templates import tokenize_prompts
from erpo_lightning.rewards import MathReward
from erpo_lightning.rollout.engine import left_pad
from erpo_lightning.toy.task import toy_template
from erpo_lightning.toy.tiny_qwen2 import build_tiny_qwen2

IGNORE_INDEX = -100
# The longest solution (35 characters) plus its eos, plus slack: also the rollout length to configure.
MAX_NEW_TOKENS = 48


@dataclass(frozen=True)
class PretrainConfig:
    """Model size and optimisation settings of the toy pre-training (all of it goes into the asset manifest).

    The default model has 0.28M parameters, head_dim 32 (the smallest vLLM's CPU attention takes). It trains on
    one torch thread: on two cores shared with other processes, two OpenMP threads ran 5-15x slower than one.
    `target_accuracy` is the validation pass@1 at temperature 1 that ends training.
    """

    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 256
    seed: int = 0
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    max_steps: int = 800
    eval_every: int = 25
    target_accuracy: float = 0.3
    num_threads: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PretrainResult:
    """What a pre-training run produced: the model and its loss curve (one mean loss per step)."""

    model: Qwen2ForCausalLM
    losses: list[float]
    steps: int


def encode_examples(rows: list[dict], tokenizer: PreTrainedTokenizerFast) -> list[tuple[list[int], int]]:
    """`(ids, prompt_length)` per row: the rendered prompt, then the solution and eos, as one token sequence."""
    prompts = tokenize_prompts(toy_template(), [row["problem"] for row in rows], tokenizer)
    solutions = tokenizer([row["solution"] for row in rows], add_special_tokens=False)["input_ids"]
    return [
        (prompt + list(solution) + [tokenizer.eos_token_id], len(prompt))
        for prompt, solution in zip(prompts, solutions, strict=True)
    ]


def collate(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids` [B, L] and `labels` [B, L] (IGNORE_INDEX on prompt and padding)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
    return input_ids, labels


@torch.no_grad()
def sample_correct(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict],
    grader: MathReward,
    num_samples: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 256,
) -> torch.Tensor:
    """Generate `num_samples` responses per problem and grade them against the gold answers.

    `temperature` 0 decodes greedily. Sampling is plain (no top-k / top-p), as the rollout engine samples.
    Returns:
        bool [len(rows), num_samples]: whether each response's final answer is right.
    """
    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    prompts = tokenize_prompts(toy_template(), [row["problem"] for row in rows], tokenizer)
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    else:
        sampling = {"do_sample": False}
    responses: list[str] = []
    for start in range(0, len(rows), batch_size):
        input_ids, attention_mask = left_pad(prompts[start : start + batch_size], tokenizer.pad_token_id)
        # generate() numbers positions from the attention mask, so left padding does not shift them.
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=MAX_NEW_TOKENS,
            num_return_sequences=num_samples,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        responses += tokenizer.batch_decode(output[:, input_ids.shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    golds = [row["answer"] for row in rows for _ in range(num_samples)]
    return torch.tensor(grader.verdicts(responses, golds)).view(len(rows), num_samples)


def learning_rate_at(step: int, config: PretrainConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to 10% at `max_steps`."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def pretrain(
    tokenizer: PreTrainedTokenizerFast,
    train_rows: list[dict],
    eval_rows: list[dict],
    config: PretrainConfig,
    grader: MathReward,
    on_step: Callable[[int, float, float | None], None] | None = None,
) -> PretrainResult:
    """Train a fresh tiny Qwen2 on `train_rows` until T=1 pass@1 on `eval_rows` reaches `config.target_accuracy`
    or `config.max_steps` steps are done. Batches of `batch_size` rows walk through a fresh seeded shuffle of
    `train_rows` each epoch.

    `on_step(step, loss, accuracy)` is called after every step; `accuracy` is None except on evaluation steps.
    """
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        max_positions=128,
        seed=config.seed,
    ).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01, betas=(0.9, 0.98))
    examples = encode_examples(train_rows, tokenizer)
    generator = torch.Generator().manual_seed(config.seed)
    order: list[int] = []
    losses: list[float] = []
    step = 0
    while step < config.max_steps:
        if len(order) < config.batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        batch, order = [examples[i] for i in order[: config.batch_size]], order[config.batch_size :]
        input_ids, labels = collate(batch, tokenizer.pad_token_id)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, config)
        # No attention mask: padding sits after the real tokens, which causal attention never lets them see.
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        accuracy = None
        if step % config.eval_every == 0:
            accuracy = (
                sample_correct(model, tokenizer, eval_rows, grader, seed=config.seed + step).float().mean().item()
            )
        if on_step is not None:
            on_step(step, losses[-1], accuracy)
        if accuracy is not None and accuracy >= config.target_accuracy:
            break
    return PretrainResult(model.eval(), losses, step)
