"""RolloutCallback inside a real Trainer.fit on the tiny model, with Hugging Face generate and with real vLLM."""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.logprobs import sequence_logprobs
from erpo_lightning.rollout import HFEngine, VLLMEngine
from erpo_lightning.tiny_qwen2 import build_byte_tokenizer, load_tiny_model

TEMPERATURE = 0.8
GROUP_SIZE = 4
METRICS = [
    "reward_mean",
    "reward_std",
    "accuracy",
    "response_length_mean",
    "response_length_max",
    "truncated_ratio",
    "zero_variance_groups",
    "tokens_per_s",
    "weight_sync_ms",
    "logprob_abs_diff",
    "grader_timeouts",
]


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
        self.batches: list[dict] = []

    def training_step(self, batch, batch_idx):
        self.batches.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        width_p = batch["prompt_length"]
        logprobs = sequence_logprobs(self.policy, batch["input_ids"], batch["attention_mask"], TEMPERATURE)[:, width_p:]
        advantages = batch["rewards"] - batch["rewards"].mean()
        mask = batch["response_mask"]
        return -(advantages[:, None] * logprobs * mask).sum() / mask.sum() + 0.1 * (logprobs * mask).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.policy_version += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.5)


def query_loader(golds: list[str], batch_size: int) -> DataLoader:
    """Batches shaped like QueryDataModule's (query_index, query_id, prompt_ids, answers, query_weight), in file order
    from its query stream (which dynamic-sampling refills draw from)."""
    tokenizer = build_byte_tokenizer()
    items = [
        {
            "query_index": i,
            "query_id": f"q{i}",
            "prompt_ids": tokenizer.apply_chat_template(
                [{"role": "user", "content": "question " * (i % 3) + str(i)}], add_generation_prompt=True
            )["input_ids"],
            "answers": gold,
            "query_weight": 1.0 + i / 10,
        }
        for i, gold in enumerate(golds)
    ]

    def collate(rows):
        return {
            "query_index": torch.tensor([r["query_index"] for r in rows]),
            "query_id": [r["query_id"] for r in rows],
            "prompt_ids": [r["prompt_ids"] for r in rows],
            "answers": [r["answers"] for r in rows],
            "query_weight": torch.tensor([r["query_weight"] for r in rows]),
        }

    return DataLoader(items, batch_sampler=QueryBatchSampler(len(items), batch_size, shuffle=False), collate_fn=collate)


def fit(path, engine, loader, steps: int, **callback_kwargs):
    module = PolicyModule(str(path))
    reward = ParityReward()
    callback = RolloutCallback(
        engine,
        reward,
        group_size=GROUP_SIZE,
        temperature=TEMPERATURE,
        max_new_tokens=12,
        seed=0,
        logprob_check_every=1,
        **callback_kwargs,
    )
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)
    return module, trainer


def check_rollout_batch(batch: dict, tokenizer, reward: ParityReward) -> None:
    """The rollout keys agree with each other and with the per-query keys they came from."""
    n = len(batch["prompt_ids"]) * GROUP_SIZE
    width_p = batch["prompt_length"]
    assert batch["input_ids"].shape[0] == n and batch["group_size"] == GROUP_SIZE
    assert torch.equal(batch["group_index"], torch.arange(n // GROUP_SIZE).repeat_interleave(GROUP_SIZE))
    for row in range(n):
        query = batch["group_index"][row].item()
        prompt = batch["prompt_ids"][query]
        assert batch["input_ids"][row, width_p - len(prompt) : width_p].tolist() == prompt
        assert batch["query_index"][row] == batch["query_index"][query * GROUP_SIZE]
        assert batch["query_id"][query] == f"q{batch['query_index'][row].item()}"
        response = batch["input_ids"][row, width_p:][batch["response_mask"][row].bool()].tolist()
        text = tokenizer.decode(response, skip_special_tokens=True)
        assert batch["rewards"][row] == reward([text], [batch["answers"][query]])[0]


def test_fit_with_hf_engine_attaches_batch_and_logs(tiny_model_path):
    loader = query_loader(["parity"] * 8, batch_size=2)
    module, trainer = fit(tiny_model_path, HFEngine(), loader, steps=2)
    tokenizer = build_byte_tokenizer()
    assert len(module.batches) == 2
    for batch in module.batches:
        check_rollout_batch(batch, tokenizer, ParityReward())
    assert module.batches[1]["query_index"].unique().tolist() == [2, 3]
    metrics = trainer.callback_metrics
    assert all(f"rollout/{name}" in metrics for name in METRICS)
    assert metrics["rollout/logprob_abs_diff"] < 1e-4


def test_dynamic_sampling_keeps_only_informative_groups(tiny_model_path):
    # Every other query can never be rewarded: its groups carry no signal and must be replaced by refills.
    loader = query_loader(["never", "parity"] * 8, batch_size=2)
    module, trainer = fit(tiny_model_path, HFEngine(), loader, steps=2, dynamic_sampling=True, max_refill_rounds=6)
    tokenizer = build_byte_tokenizer()
    for batch in module.batches:
        check_rollout_batch(batch, tokenizer, ParityReward())
        assert batch["answers"] == ["parity", "parity"]
        assert len(set(batch["query_id"])) == 2
        grouped = batch["rewards"].view(-1, GROUP_SIZE)
        assert (grouped != grouped[:, :1]).any(dim=1).all()
    assert trainer.callback_metrics["rollout/refill_rounds"] >= 1
    assert trainer.callback_metrics["rollout/zero_variance_groups"] >= 0.5
    assert trainer.callback_metrics["rollout/repeated_queries"] == 0  # 16 queries: the stream never ran out


def test_overlong_filter_masks_truncated_responses(tiny_model_path):
    loader = query_loader(["parity"] * 4, batch_size=2)
    module, _ = fit(tiny_model_path, HFEngine(), loader, steps=1, overlong_filter=True, overlong_buffer=4)
    batch = module.batches[0]
    assert batch["truncated"].any()
    assert batch["response_mask"][batch["truncated"]].sum() == 0
    # Truncated responses have the full 12 tokens: the buffer of 4 gives them the maximum penalty, -1.
    raw = batch["rewards"][batch["truncated"]] + 1.0
    assert ((raw == 0.0) | (raw == 1.0)).all()


@pytest.mark.vllm
def test_fit_with_vllm_engine_syncs_weights_every_step(tiny_model_path):
    engine = VLLMEngine(dtype="float32", max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=32 * 2**20)
    threads = torch.get_num_threads()
    loader = query_loader(["parity"] * 6, batch_size=2)
    module, trainer = fit(tiny_model_path, engine, loader, steps=3)
    assert torch.get_num_threads() == threads
    tokenizer = build_byte_tokenizer()
    for batch in module.batches:
        check_rollout_batch(batch, tokenizer, ParityReward())
    # After two optimizer steps the engine samples from the trained weights, not the checkpoint it was built from.
    assert trainer.callback_metrics["rollout/logprob_abs_diff"] < 1e-4
    assert trainer.callback_metrics["rollout/weight_sync_ms"] > 0
    last = module.batches[-1]
    with torch.no_grad():
        original = load_tiny_model(tiny_model_path)
        stale = sequence_logprobs(original, last["input_ids"], last["attention_mask"], TEMPERATURE)
    diff = (stale[:, last["prompt_length"] :] - last["sampling_logprobs"]).abs()[last["response_mask"].bool()]
    assert diff.mean() > 1e-3
