"""A policy LightningModule, a parity reward, a query loader and a short fit, for tests of callbacks around a fit."""

import copy

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model


class ParityReward:
    """1.0 when the gold is "parity" and the response's character codes sum to an even number, else 0.0.

    Queries whose gold is "never" always score 0: their groups have zero reward variance.
    """

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, responses: list[str], golds: list[str]) -> list[float]:
        self.calls += 1
        return [
            float(gold == "parity" and sum(map(ord, text)) % 2 == 0)
            for text, gold in zip(responses, golds, strict=True)
        ]

    def counters(self) -> dict[str, float]:
        return {"timeouts": 0.0}


class PolicyModule(pl.LightningModule):
    """The smallest module honouring the contract: policy, policy_version, a REINFORCE step on the rollout batch."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.policy = load_tiny_model(path).train()
        self.policy_version = 0
        self.batches: list[RolloutBatch] = []

    def training_step(self, batch: QueryBatch, batch_idx):
        rollout = batch.rollout
        self.batches.append(copy.deepcopy(rollout))
        width_p = rollout.prompt_length
        scored = sequence_logprobs(self.policy, rollout.input_ids, rollout.attention_mask, rollout.temperature)
        logprobs = scored[:, width_p:]
        advantages = rollout.rewards - rollout.rewards.mean()
        mask = rollout.response_mask
        return -(advantages[:, None] * logprobs * mask).sum() / mask.sum() + 0.1 * (logprobs * mask).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.policy_version += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.5)


def query_loader(golds: list[str], batch_size: int) -> DataLoader:
    """`QueryBatch`es like QueryDataModule's, in file order from its query stream (which dynamic-sampling refills draw
    from); `loader.dataset[i]` is query i's `prompt_ids` (its `problems` text in the byte tokenizer's chat template)
    and `answers`, its carried scores `reference_nll` (10 + i) and `query_weights` (1 + i / 10), distinct per query,
    and a carried data column `level` (i)."""
    tokenizer = build_byte_tokenizer()
    items = [
        {
            "query_index": i,
            "prompt_ids": tokenizer.apply_chat_template(
                [{"role": "user", "content": "question " * (i % 3) + str(i)}], add_generation_prompt=True
            )["input_ids"],
            "problems": "question " * (i % 3) + str(i),
            "answers": gold,
            "reference_nll": 10.0 + i,
            "query_weights": 1.0 + i / 10,
            "level": i,
        }
        for i, gold in enumerate(golds)
    ]

    def collate(rows):
        return QueryBatch(
            torch.tensor([r["query_index"] for r in rows]),
            [r["prompt_ids"] for r in rows],
            [r["answers"] for r in rows],
            reference_nll=torch.tensor([r["reference_nll"] for r in rows]),
            query_weights=torch.tensor([r["query_weights"] for r in rows]),
            problems=[r["problems"] for r in rows],
            data_columns={"level": [r["level"] for r in rows]},
        )

    return DataLoader(items, batch_sampler=QueryBatchSampler(len(items), batch_size, shuffle=False), collate_fn=collate)


def fit_rollouts(module: pl.LightningModule, callback: pl.Callback, steps: int, **data) -> pl.Trainer:
    """`steps` training steps of `module` on CPU with `callback` (a RolloutCallback) and nothing else: no logger,
    checkpoint, progress bar or summary; `data` is `train_dataloaders=` or `datamodule=`, as `Trainer.fit` takes it."""
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, **data)
    return trainer
