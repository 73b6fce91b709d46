"""One query stream feeds each step's batch and its dynamic-sampling refills: next unused queries, resumable."""

import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.cli.command import ERPOLightningTrainer
from erpo_lightning.data import QueryDataModule
from erpo_lightning.data.sampler import QueryBatchSampler
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

NUM_QUERIES = 40
STEPS = 6


def even_gold_parity_reward(responses: list[str], golds: list[str]) -> list[float]:
    """Odd golds never score (their groups have zero variance, so they force refills); even golds score on parity."""
    pairs = zip(responses, golds, strict=True)
    return [float(int(gold) % 2 == 0 and sum(map(ord, text)) % 2 == 0) for text, gold in pairs]


class PromptRecordingEngine(HFEngine):
    """Hugging Face generate, keeping every prompt it was asked to complete (what the step generated for)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[tuple[int, ...]] = []

    def generate(self, prompt_ids, settings):
        self.prompts.extend(tuple(ids) for ids in prompt_ids)
        return super().generate(prompt_ids, settings)


class RecordQueries(L.Callback):
    """Per step: the query ids generated for (main batch then refills, in order) and the ids trained on."""

    def __init__(self, engine: PromptRecordingEngine) -> None:
        self.engine, self.steps = engine, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        data = trainer.datamodule.data
        query_of_prompt = {tuple(ids): q.query_id for ids, q in zip(data.prompt_ids, data.queries, strict=True)}
        generated = [query_of_prompt[prompt] for prompt in self.engine.prompts]
        self.engine.prompts.clear()
        rollout = batch.rollout
        trained = [data.queries[i].query_id for i in rollout.query_index[rollout.is_group_leader].tolist()]
        self.steps.append((trainer.global_step, generated, trained, rollout.input_ids.tolist()))


def run(model_path, data_file, root, max_steps, ckpt_path=None, num_queries=NUM_QUERIES):
    L.seed_everything(0)
    module = ERPOModule(str(model_path), learning_rate=1e-3)
    data = QueryDataModule(
        str(model_path), [{"path": str(data_file), "limit": num_queries}], template="plain",
        max_prompt_length=1024, batch_size=2, seed=5, cache_dir=str(root.parent / "cache"),
    )  # fmt: skip
    engine = PromptRecordingEngine()
    recorder = RecordQueries(engine)
    rollout = RolloutCallback(
        engine, even_gold_parity_reward, group_size=4, max_new_tokens=6, seed=0, dynamic_sampling=True,
        max_refill_rounds=2,
    )  # fmt: skip
    callbacks = [
        rollout,
        ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_top_k=-1, filename="{step}"),
        recorder,
    ]
    trainer = ERPOLightningTrainer(
        max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, default_root_dir=root,  # where the default SampledCompletions writes
    )  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return recorder.steps, data


def test_refills_take_the_next_unused_queries_and_resume_identically(tiny_model_path, benchmarks_dir, tmp_path):
    data_file = benchmarks_dir / "gsm8k.jsonl"
    full, data = run(tiny_model_path, data_file, tmp_path / "full", STEPS)
    assert [step for step, *_ in full] == list(range(1, STEPS + 1))
    for step, generated, trained, _ in full:
        assert len(generated) == len(set(generated)), (step, generated)  # no query twice within a step
        assert set(trained) <= set(generated) and len(trained) == 2
    assert sum(len(generated) > 2 for _, generated, _, _ in full) >= 2  # the reward did force refills
    # Main batches and refills are consecutive slices of one epoch order: each draw takes the next unused queries.
    ids = [q.query_id for q in data.data.queries]
    order = QueryBatchSampler(NUM_QUERIES, 2, seed=5).order(0).tolist()
    drawn = [query for _, generated, _, _ in full for query in generated]
    assert drawn == [ids[i] for i in order[: len(drawn)]]

    checkpoint = tmp_path / "full" / "ckpt" / "step=3.ckpt"  # the full run's: as a run stopped at step 3 writes it
    resumed, _ = run(tiny_model_path, data_file, tmp_path / "resumed", STEPS, checkpoint)
    assert [step for step, *_ in resumed] == [4, 5, 6]
    assert resumed == full[3:]  # same refills, same trained queries, same sampled responses


@pytest.mark.slow
def test_each_epoch_reshuffles_and_a_resume_across_epochs_continues_identically(
    tiny_model_path, benchmarks_dir, tmp_path
):
    # 9 queries, 2 per batch: the 9th is left over at each epoch end (drop_last) unless a refill takes it.
    data_file = benchmarks_dir / "gsm8k.jsonl"
    full, data = run(tiny_model_path, data_file, tmp_path / "full", 8, num_queries=9)
    assert data.batch_sampler.epoch >= 2  # Lightning set the epochs (on `batch_sampler.sampler`)
    ids = [q.query_id for q in data.data.queries]
    first, second = (QueryBatchSampler(9, 2, seed=5).order(e).tolist() for e in (0, 1))
    drawn = [query for _, generated, _, _ in full for query in generated]
    assert drawn[:8] == [ids[i] for i in first[:8]]
    assert drawn[8:10] in ([ids[i] for i in second[:2]], [ids[first[8]], ids[second[0]]])  # a new order

    checkpoint = tmp_path / "full" / "ckpt" / "step=5.ckpt"  # the full run's: as a run stopped at step 5 writes it
    resumed, _ = run(tiny_model_path, data_file, tmp_path / "resumed", 8, checkpoint, num_queries=9)
    assert resumed == full[5:]


def draw(samplers: list[QueryBatchSampler], pattern: str) -> list[list[list[int]]]:
    """Draw from every rank's sampler in step: 'm' the next main batch (the DataLoader's), 'r' a refill.

    Returns per draw the list of the ranks' shares.
    """
    iterators = [iter(sampler) for sampler in samplers]
    draws = []
    for kind in pattern:
        if kind == "m":
            draws.append([next(it) for it in iterators])
        else:
            draws.append([sampler.refill() for sampler in samplers])
    return draws


def test_stream_across_two_ranks_holds_the_global_batches_of_one_process():
    pattern = "mrrmmrmrrr"
    single = [shares[0] for shares in draw([QueryBatchSampler(48, 4, seed=1)], pattern)]
    ranks = draw([QueryBatchSampler(48, 2, seed=1, rank=r, world_size=2) for r in (0, 1)], pattern)
    for (rank0, rank1), one in zip(ranks, single, strict=True):
        assert rank0 == one[0::2] and rank1 == one[1::2]  # strided shares of the same global batch
    everything = [query for one in single for query in one]
    assert everything == QueryBatchSampler(48, 4, seed=1).order(0)[: len(everything)].tolist()


def test_two_rank_resume_with_a_prefetched_batch_continues_the_stream():
    # A DataLoader with workers draws main batches ahead of training. Here the stream hands out M1 M2 R1 M3 R2 R2
    # while steps 1 and 2 train (M3 drawn ahead), then the run stops. The checkpoint (rank 0's, loaded by every rank)
    # must hand M3 out again and continue the stream after step 2's refills, as the uninterrupted run does.
    def samplers():
        return [QueryBatchSampler(48, 2, seed=4, rank=r, world_size=2) for r in (0, 1)]

    full = draw(samplers(), "mmrmrr" + "mrmr")
    before = samplers()
    draw(before, "mmrmrr")
    state = before[0].state_dict(batches_done=2)
    after = samplers()
    for sampler in after:
        sampler.load_state_dict(state)
        sampler.set_epoch(0)
    resumed = draw(after, "m" + "mrmr")
    assert resumed == [full[3]] + full[6:]


def test_refills_past_the_epoch_end_take_the_leftover_then_the_next_epoch_and_say_so():
    sampler = QueryBatchSampler(7, 2, shuffle=False)
    main = iter(sampler)
    assert [next(main), sampler.refill(), next(main)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.warns(UserWarning, match="epoch 0.*a query can repeat within a step"):
        assert sampler.refill() == [6, 0]  # the leftover no full batch could hold, then epoch 1's first query
    assert list(main) == []  # the stream has left epoch 0: the DataLoader's epoch ends
    sampler.set_epoch(1)
    assert list(sampler) == [[1, 2], [3, 4], [5, 6]]  # epoch 1 continues after what the refill took

    shuffled = QueryBatchSampler(4, 2, seed=9)
    assert list(shuffled) == shuffled.order(0).view(-1, 2).tolist()
    with pytest.warns(UserWarning, match="epoch 0"):
        assert shuffled.refill() == shuffled.order(1)[:2].tolist()
    shuffled.set_epoch(1)
    assert list(shuffled) == [shuffled.order(1)[2:].tolist()]


def test_refills_crossing_epochs_warn_once_per_run():
    """Each refill past an epoch's end used to warn again, naming a new epoch (18 warnings in 3 steps)."""
    sampler = QueryBatchSampler(3, 2, shuffle=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            sampler.refill()
    assert sampler.epoch >= 3 and [str(w.message) for w in caught if "refills" in str(w.message)] == [
        str(caught[0].message)
    ]


def test_lightning_reaches_set_epoch():
    from lightning.fabric.utilities.data import _set_sampler_epoch  # what the fit loop calls at each epoch start

    sampler = QueryBatchSampler(8, 2, seed=3)
    _set_sampler_epoch(DataLoader(range(8), batch_sampler=sampler), 2)
    assert sampler.epoch == 2 and list(sampler) == sampler.order(2).view(-1, 2).tolist()


def test_checkpoint_refuses_another_stream():
    sampler = QueryBatchSampler(10, 2, seed=1)
    with pytest.raises(ValueError, match="data.seed"):
        sampler.load_state_dict({**QueryBatchSampler(10, 2, seed=2).state_dict(0)})
    with pytest.raises(ValueError, match="12 training queries"):
        sampler.load_state_dict({**QueryBatchSampler(12, 2, seed=1).state_dict(0)})


class TinyPolicy(L.LightningModule):
    def __init__(self, path) -> None:
        super().__init__()
        self.policy, self.policy_version = load_tiny_model(path), 0

    def training_step(self, batch, batch_idx):
        raise AssertionError("the query stream is checked before the first step")

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.1)


def test_dynamic_sampling_refuses_a_loader_without_the_query_stream(tiny_model_path):
    items = [{"prompt_ids": [1, 2], "answers": "2", "query_index": i} for i in range(4)]
    loader = DataLoader(items, batch_size=2, collate_fn=lambda rows: rows)
    callback = RolloutCallback(HFEngine(), even_gold_parity_reward, dynamic_sampling=True)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[callback])
    with pytest.raises(TypeError, match="dynamic_sampling.*QueryBatchSampler"):
        trainer.fit(TinyPolicy(tiny_model_path), train_dataloaders=loader)
