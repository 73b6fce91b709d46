"""A resumable fit in this process (the steps it trained: queries, rows, logged metrics; the final weights), and `erpo`
in this process run to its end (`run_main`: its exit status, 0 when it returns)."""

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.checkpointing import AtomicCheckpointIO
from erpo_lightning.cli import ERPOLightningTrainer, main
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
    log_every_n_steps=50,
):  # fmt: skip
    L.seed_everything(0)
    module = ERPOModule(str(model_path), learning_rate=1e-3)
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
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return recorder.steps, {k: v.clone() for k, v in module.policy.state_dict().items()}


def run_main(*args) -> int:
    """`erpo ARGS` in this process; its exit status (0 when it returns)."""
    try:
        main(list(args))
    except SystemExit as exited:
        return exited.code
    return 0
