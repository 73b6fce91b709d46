"""The final checkpoint (`callbacks/final_checkpoint.py`, issue 54 item 10): the step a run ends on is saved
whatever the checkpoint interval (5 steps at interval 2 left `last.ckpt` at step 4), once. The runs are
Lightning's BoringModel under the `erpo` trainer (ERPOLightningTrainer: its callbacks, its atomic checkpoint
writer), a few steps in this process."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from erpo_lightning.checkpoints.files import read_checkpoint
from erpo_lightning.cli.command import ERPOLightningTrainer


def train(folder: Path, max_steps: int, **checkpoint) -> ModelCheckpoint:
    """`max_steps` steps of BoringModel under the erpo trainer, with one ModelCheckpoint(`checkpoint`) in `folder`."""
    callback = ModelCheckpoint(dirpath=folder, **checkpoint)
    trainer = ERPOLightningTrainer(
        max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(BoringModel())
    return callback


def step_of(path: Path) -> int:
    return read_checkpoint(path)["global_step"]


# ------------------------------------------------------------------- issue 54 item 10: the final step is saved
def test_last_holds_the_final_step_when_max_steps_is_not_a_multiple_of_the_interval(tmp_path):
    train(tmp_path, 5, every_n_train_steps=2, save_last=True)
    assert step_of(tmp_path / "last.ckpt") == 5
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch=0-step=4.ckpt", "last.ckpt"]  # no extra file


def test_a_linked_last_becomes_a_file_of_the_final_step(tmp_path):
    train(tmp_path, 5, every_n_train_steps=2, save_last="link")
    assert not (tmp_path / "last.ckpt").is_symlink() and step_of(tmp_path / "last.ckpt") == 5
    assert step_of(tmp_path / "epoch=0-step=4.ckpt") == 4


def test_without_last_the_final_step_is_saved_as_an_interval_step(tmp_path):
    train(tmp_path, 5, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step=2.ckpt", "step=4.ckpt", "step=5.ckpt"]


def test_a_final_step_on_the_interval_is_saved_once(tmp_path, monkeypatch):
    saved = []
    original = ERPOLightningTrainer.save_checkpoint

    def counting(self, path, *args, **kwargs):
        saved.append(Path(path).name)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(ERPOLightningTrainer, "save_checkpoint", counting)
    train(tmp_path, 4, every_n_train_steps=2, save_last=True)
    assert step_of(tmp_path / "last.ckpt") == 4
    assert saved == ["epoch=0-step=2.ckpt", "last.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
