"""A resumable fit in this process (the steps it trained: queries, rows, logged metrics; the final weights), a run
resumed mid-way checked against the uninterrupted one (`resumed_equals_full_run`), and `erpo` in this process run to
its end (`run_main`: its exit status, 0 when it returns)."""

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.checkpoints.files import AtomicCheckpointIO
from erpo_lightning.cli.command import ERPOLightningTrainer, main
from erpo_lightning.data import QueryDataModule
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine

LOGGED = ("train/loss", "train/query_kl", "train/pg_loss", "rollout/reward_mean", "rollout/response_length_mean")


def character_parity_reward(responses: list[str], golds: list[str]) -> list[float]:
    """A reward the untrained tiny model earns half the time (so advantages, and updates, are not zero)."""
    return [float(sum(map(ord, text)) % 2 == 0) for text in responses]


class RecordQueriesAndMetrics(L.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = {name: float(trainer.callback_metrics[name]) for name in LOGGED}
        rollout, queries = batch.rollout, trainer.datamodule.data.queries
        trained = [queries[i].query_id for i in rollout.query_index[rollout.is_group_leader].tolist()]
        self.steps.append((trainer.global_step, trained, rollout.input_ids.tolist(), metrics))


def run(
    model_path, data_file, root, max_steps, ckpt_path=None, rollout_seed=0, extra_callbacks=(), logger=False,
    log_every_n_steps=50, module_kwargs=None,
):  # fmt: skip
    L.seed_everything(0)
    module = ERPOModule(str(model_path), learning_rate=1e-3, **(module_kwargs or {}))
    data = QueryDataModule(
        str(model_path), [{"path": str(data_file), "limit": 12}], template="plain", max_prompt_length=1024,
        batch_size=2, cache_dir=str(root / "cache"),
    )  # fmt: skip
    recorder = RecordQueriesAndMetrics()
    callbacks = [
        RolloutCallback(HFEngine(), character_parity_reward, group_size=4, max_new_tokens=6, seed=rollout_seed),
        ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_top_k=-1, filename="{step}"),
        recorder,
        *extra_callbacks,
    ]
    # The `erpo` command's trainer: its checkpoints are written by AtomicCheckpointIO (temporary file, then rename).
    trainer = ERPOLightningTrainer(
        max_steps=max_steps, accelerator="cpu", logger=logger, log_every_n_steps=log_every_n_steps,
        default_root_dir=root, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return recorder.steps, {k: v.clone() for k, v in module.policy.state_dict().items()}


def resumed_equals_full_run(model_path, data_file, root, rollout_seed=0, module_kwargs=None) -> dict:
    """Train 4 steps, and resume from that run's step-2 checkpoint (`root/full/ckpt/step=2.ckpt`, written at the point
    a run stopped after step 2 writes it; no second run to step 2) to step 4 under `root/resumed`; assert the resumed
    steps are the full run's last two (data position, sampled rows, logged metrics within 1e-6) and the final weights
    agree within 1e-6. Returns the full run's final weights."""
    settings = dict(rollout_seed=rollout_seed, module_kwargs=module_kwargs)
    full_steps, full_weights = run(model_path, data_file, root / "full", 4, **settings)
    checkpoint = root / "full" / "ckpt" / "step=2.ckpt"
    resumed_steps, resumed_weights = run(model_path, data_file, root / "resumed", 4, ckpt_path=checkpoint, **settings)
    assert [s[0] for s in resumed_steps] == [3, 4]
    for (step, queries, rows, metrics), (r_step, r_queries, r_rows, r_metrics) in zip(
        full_steps[2:], resumed_steps, strict=True
    ):
        assert (step, queries) == (r_step, r_queries)  # the same data position
        assert rows == r_rows  # the same sampled responses (seed counter, or the restored RNG state)
        for name in LOGGED:
            assert abs(metrics[name] - r_metrics[name]) < 1e-6, (step, name, metrics[name], r_metrics[name])
    assert resumed_weights.keys() == full_weights.keys()
    for key in full_weights:
        torch.testing.assert_close(resumed_weights[key], full_weights[key], atol=1e-6, rtol=0)
    return full_weights


def run_main(*args) -> int:
    """`erpo ARGS` in this process; its exit status (0 when it returns)."""
    try:
        main(list(args))
    except SystemExit as exited:
        return exited.code
    return 0
