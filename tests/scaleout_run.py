"""One training run of `tests/end_to_end/test_distributed.py`: ERPOModule on fixed global rollout batches, under a
strategy.

    python tests/scaleout_run.py MODEL_DIR OUT_DIR --strategy {single,ddp,fsdp} --config CONFIG [CONFIG ...]
        [--save-checkpoints] [--resume CHECKPOINT] [--num-nodes 2]

Lightning launches the second process itself (it re-runs this script); with `--num-nodes 2`, each of two `torchrun
--nnodes 2` launchers starts one process. The CONFIGs (of CONFIGS) train one after another in the same processes,
each from the initial model with a trainer of its own (the process group is set up once: a launch costs seconds of
imports, a tiny run a fraction of that). Every run trains on the same global batches, one per epoch; rank r of W
takes the whole groups r, r + W, ... of each. Rank 0 writes `OUT_DIR/CONFIG/run.json` (the logged `train/` metrics of
every batch, whether the policy was sharded and checkpointed its activations) and `OUT_DIR/CONFIG/weights.pt` (the
final full policy state dict); `--save-checkpoints` writes `OUT_DIR/CONFIG/checkpoints`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from helpers.batches import carrying_scores, make_rollout, with_rollout
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset, Sampler

from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora import LoraSettings
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch
from erpo_lightning.scoring.logprobs import gather_token_logprobs, sequence_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

PAD = 256
TEMPERATURE = 0.8
GROUP_SIZE = 2
NUM_BATCHES = 3
# Groups 0 and 2 (rank 0 of 2) are long, 1 and 3 short: under a small token budget rank 0 has more micro-batches.
PROMPT_LENGTHS = [6, 3, 5, 4]
RESPONSE_LENGTHS = [[5, 4], [1, 2], [5, 5], [2, 1]]
CONFIGS = {
    # The paper's ERPO (GRPO advantages, token-mean, w(q), token-k3 Query-KL); two optimizer steps per batch, the
    # second off-policy; clipping active so that the global gradient norm matters.
    "erpo": dict(
        algorithm="erpo", query_kl_coef=0.5, update_batch_size=2, micro_batch_tokens=20, warmup_steps=2,
        gradient_clip_norm=0.5,
    ),
    # Batch-global baseline and weights (the released code's batch-normalised reference weights, unclipped),
    # sequence-k3, Policy-KL against a (sharded) reference model, activation checkpointing, two PPO epochs.
    "reinforce": dict(
        algorithm="erpo", advantage_estimator="reinforce", query_weight_norm="batch", query_weight_clip="none",
        loss_aggregation="seq_mean_token_mean",
        query_kl_estimator="sequence_k3", policy_kl_coef=0.05, num_iterations=2, micro_batch_tokens=20,
        gradient_checkpointing=True,
    ),
    # `erpo` with the shared prompt: each query forwarded once, its responses on its keys and values.
    "shared_prompt": dict(
        algorithm="erpo", query_kl_coef=0.5, update_batch_size=2, micro_batch_tokens=20, warmup_steps=2,
        gradient_clip_norm=0.5, query_kl_scoring="shared_prompt",
    ),
    # `erpo` with the output layer fused into the log-probs: its weight is read outside the module's forward.
    "fused_output": dict(
        algorithm="erpo", query_kl_coef=0.5, update_batch_size=2, micro_batch_tokens=20, warmup_steps=2,
        gradient_clip_norm=0.5, fused_output_layer=True,
    ),
    # LoRA adapters on every linear layer (the base frozen), as `erpo`; activation checkpointing through the adapters.
    "lora": dict(
        algorithm="erpo", query_kl_coef=0.5, update_batch_size=2, micro_batch_tokens=20, gradient_clip_norm=0.5,
        gradient_checkpointing=True, peft=LoraSettings(r=4, alpha=8),
    ),
}  # fmt: skip


def global_batches(model: torch.nn.Module) -> list[RolloutBatch]:
    """NUM_BATCHES rollout batches of 4 groups × GROUP_SIZE rows: prompts left-padded, responses right-padded."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(NUM_BATCHES):
        prompts, responses = [], []
        for prompt_length, lengths in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True):
            prompts.append(torch.randint(10, 250, (prompt_length,), generator=generator).tolist())
            responses += [torch.randint(10, 250, (length,), generator=generator).tolist() for length in lengths]
        rewards = torch.randint(0, 2, (len(responses),), generator=generator).float().tolist()
        batch = make_rollout(
            prompts, responses, rewards, TEMPERATURE, query_index=[4 * step + q for q in range(4)], pad_token_id=PAD
        )
        with torch.no_grad():  # sampled by the initial policy: later steps are off-policy
            logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask, TEMPERATURE)
        batch.sampling_logprobs = logprobs[:, batch.prompt_length :] * batch.response_mask
        batches.append(batch)
    return batches


def reference_cache(model: torch.nn.Module, batches: list[RolloutBatch]) -> ReferenceLogprobCache:
    """Reference query scores of every batch's queries, shifted so that Query-KL is not zero at the first step."""
    rows = []
    with torch.no_grad():
        for batch in batches:
            for row in range(0, batch.num_rows, GROUP_SIZE):
                width = batch.prompt_length
                prompt = batch.input_ids[row, :width][batch.attention_mask[row, :width].bool()].unsqueeze(0)
                rows.append(gather_token_logprobs(model(prompt).logits, prompt)[0] + 0.05 * (row + 1))
    return ReferenceLogprobCache.from_rows(rows, QueryScoringLayout())  # the step scores queries in this layout


def rank_shard(batch: RolloutBatch) -> QueryBatch:
    """This rank's rows: whole groups r, r + W, ... (DistributedSampler's interleaving, applied to groups)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    groups = torch.arange(rank, batch.num_rows // GROUP_SIZE, world)
    rows = (groups.unsqueeze(1) * GROUP_SIZE + torch.arange(GROUP_SIZE)).reshape(-1)
    return with_rollout(batch.select_rows(rows))


class EpochSampler(Sampler):
    """Yields the epoch number: epoch e trains on batch e, also after resuming from an end-of-epoch checkpoint."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        yield self.epoch

    def __len__(self) -> int:
        return 1


class Shards(Dataset):
    def __init__(self, batches: list[RolloutBatch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> QueryBatch:
        return rank_shard(self.batches[index])


class RecordMetrics(Callback):
    def __init__(self) -> None:
        self.records: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        self.records.append({"epoch": trainer.current_epoch, **metrics})


def train(args: argparse.Namespace, name: str, initial: torch.nn.Module, batches: list[RolloutBatch]) -> None:
    """Train config `name` under `args.strategy` from `args.model_dir`; rank 0 writes its files to OUT_DIR/name."""
    out_dir = Path(args.out_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    world_size = 1 if args.strategy == "single" else 2
    config = dict(CONFIGS[name])
    if "update_batch_size" in config:  # queries per optimizer step, per rank
        config["update_batch_size"] //= world_size
    module = ERPOModule(args.model_dir, learning_rate=1e-3, **config)
    module.reference_cache = reference_cache(initial, batches)
    batches = [carrying_scores(batch, module.algorithm, module.reference_cache.nll) for batch in batches]

    strategy = {
        "single": "auto",
        "ddp": DDPStrategy(),
        "fsdp": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
    }[args.strategy]
    recorder = RecordMetrics()
    callbacks: list[Callback] = [recorder]
    if args.save_checkpoints:
        callbacks.append(
            ModelCheckpoint(out_dir / "checkpoints", "{epoch}", save_top_k=-1, save_on_train_epoch_end=True)
        )
    trainer = L.Trainer(
        accelerator="cpu", devices=world_size // args.num_nodes, num_nodes=args.num_nodes, strategy=strategy,
        max_epochs=NUM_BATCHES,
        logger=False, enable_checkpointing=args.save_checkpoints, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, callbacks=callbacks,
    )  # fmt: skip
    loader = DataLoader(Shards(batches), batch_size=None, sampler=EpochSampler())
    trainer.fit(module, train_dataloaders=loader, ckpt_path=args.resume)

    weights = get_model_state_dict(module.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.is_global_zero:
        run = {
            "records": recorder.records,
            "sharded": any(isinstance(p, DTensor) for p in module.policy.parameters()),
            "activation_checkpointing": module.policy.is_gradient_checkpointing,
        }
        (out_dir / "run.json").write_text(json.dumps(run, indent=1))
        torch.save(weights, out_dir / "weights.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--strategy", choices=["single", "ddp", "fsdp"], required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), nargs="+", required=True)
    parser.add_argument("--save-checkpoints", action="store_true")
    parser.add_argument("--resume")
    parser.add_argument("--num-nodes", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)

    initial = load_tiny_model(args.model_dir)
    batches = global_batches(initial)
    for name in args.config:
        train(args, name, initial, batches)


if __name__ == "__main__":
    main()
