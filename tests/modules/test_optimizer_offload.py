"""`model.offload_optimizer`: the optimizer steps host (CPU) copies of the trainable weights, its state never on the
device; the same steps with and without it give the same weights, also across a resume; refused under FSDP2; the
step-memory planner moves AdamW's moments off the device with it.

On this CPU-only machine the "device" is the CPU too, so what is checked is the bookkeeping (separate host copies,
the gradients in and the weights out at each step, the device's gradients cleared, the optimizer state restored
into the host copies on resume), not the transfer's speed.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers.batches import carrying_scores, rollout_loader
from helpers.cli_runs import fails_in_one_line
from helpers.module_steps import PROMPTS, ReferenceLogprobs, rollout_batch
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.data import step_memory
from erpo_lightning.data.step_memory import ModelShape, StepSizes
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.settings import check_offload_strategy
from erpo_lightning.toy import SHIPPED_DIR
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model

STEPS = 2  # rollout batches; update_batch_size 1 gives 2 optimizer steps on each


def fit(model_path, offload: bool, steps: int = STEPS, resume: str | None = None, checkpoints=None):
    """ERPOModule on the same rollout batch `steps` times, 2 optimizer steps each (AdamW at lr 1e-3, clipping
    active); returns the module and its trainer."""
    model = load_tiny_model(model_path)
    module = ERPOModule(
        str(model_path), learning_rate=1e-3, update_batch_size=1, gradient_clip_norm=0.5, offload_optimizer=offload
    )
    module.reference_cache = ReferenceLogprobs(model, PROMPTS)
    batch = carrying_scores(rollout_batch(model), module.algorithm, module.reference_cache.nll)
    callbacks = [] if checkpoints is None else [ModelCheckpoint(checkpoints, every_n_train_steps=2, save_top_k=-1)]
    trainer = L.Trainer(
        max_steps=2 * steps, accelerator="cpu", logger=False, enable_checkpointing=checkpoints is not None,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=rollout_loader([batch] * steps), ckpt_path=resume)
    return module, trainer


def weights(module: ERPOModule) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.policy.named_parameters()}


def assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory):
    """The on-device and the offloaded runs, and the offloaded run resumed from its checkpoint after the first batch."""
    initial = {name: p.detach().clone() for name, p in load_tiny_model(tiny_model_path).named_parameters()}
    on_device, _ = fit(tiny_model_path, offload=False)
    checkpoints = tmp_path_factory.mktemp("offload_checkpoints")
    offloaded, trainer = fit(tiny_model_path, offload=True, checkpoints=checkpoints)
    resumed, _ = fit(tiny_model_path, offload=True, resume=str(checkpoints / "epoch=0-step=2.ckpt"))
    return {"initial": initial, "on_device": on_device, "offloaded": offloaded, "trainer": trainer, "resumed": resumed}


def test_the_offloaded_steps_equal_the_on_device_steps(runs):
    """4 AdamW steps with clipping: the weights moved (by ~1e-3) and equal the on-device run's."""
    moved = max((p - runs["initial"][n]).abs().max() for n, p in weights(runs["on_device"]).items())
    assert moved > 1e-4
    assert_same_weights(weights(runs["on_device"]), weights(runs["offloaded"]))


def test_the_optimizer_and_its_state_hold_host_copies_not_the_policy(runs):
    module, optimizer = runs["offloaded"], runs["trainer"].optimizers[0]
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    assert stepped == module.offload.host_parameters and len(stepped) == len(list(module.policy.parameters()))
    policy_storage = {p.untyped_storage().data_ptr() for p in module.policy.parameters()}
    assert not policy_storage & {p.untyped_storage().data_ptr() for p in stepped}
    assert set(optimizer.state) == set(stepped)
    moments = [t for state in optimizer.state.values() for t in state.values() if t.dim() > 0]
    assert len(moments) == 2 * len(stepped) and all(t.device.type == "cpu" for t in moments)
    for device_parameter, host in zip(module.policy.parameters(), stepped, strict=True):
        assert torch.equal(device_parameter.detach(), host.detach())
    assert all(p.grad is None for p in module.policy.parameters())  # cleared after the last step


def test_a_resumed_offloaded_run_equals_the_uninterrupted_one(runs):
    """The host copies are taken after the checkpoint's weights load, and the optimizer state loads into them."""
    assert_same_weights(weights(runs["offloaded"]), weights(runs["resumed"]))


def test_refused_under_fsdp2(capsys, tmp_path):
    strategy = {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}
    with pytest.raises(ValueError, match="model.offload_optimizer cannot be used with trainer.strategy Model"):
        check_offload_strategy(True, strategy)
    check_offload_strategy(False, strategy)
    check_offload_strategy(True, "ddp")
    line = fails_in_one_line(
        capsys, "fit", "--config", "configs/quickstart.yaml", "--model.offload_optimizer", "true",
        "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
        "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    assert "model.offload_optimizer cannot be used with trainer.strategy ModelParallelStrategy (FSDP2)" in line


def test_the_planner_moves_adams_moments_off_the_device(monkeypatch):
    """Full fine-tuning: weights, gradients and 2 moments of d bytes each; offloaded (or an optimizer of its own):
    the moments leave the device. LoRA: the adapters' moments, 8 of their 16 bytes."""
    shape = ModelShape.read(str(SHIPPED_DIR))
    full = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4), shape)
    assert full["weights"] == full["gradients"] == shape.parameters * 4
    assert full["optimizer state"] == 2 * full["weights"]
    offloaded = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, optimizer_state=False), shape)
    assert offloaded == {**full, "optimizer state": 0}
    lora = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, adapter_parameters=1000), shape)
    lora_offloaded = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, 1, 1000, optimizer_state=False), shape)
    assert (lora["gradients"], lora["optimizer state"], lora["LoRA adapters"]) == (0, 0, 16_000)
    assert lora_offloaded["LoRA adapters"] == 8_000
    model = {"model_path": str(SHIPPED_DIR), "micro_batch_tokens": 1000, "dtype": "float32"}
    groups = {"batch_size": 2, "max_prompt_length": 50}, {"group_size": 4, "max_new_tokens": 50}, {"devices": 1}
    seen = []
    monkeypatch.setattr(step_memory, "memory_verdict", lambda sizes, parts, *machine: seen.append(parts))
    for changes in ({}, {"offload_optimizer": True}, {"optimizer": {"class_path": "torch.optim.SGD"}}):
        step_memory.check_fit_memory({**model, **changes}, *groups)
    assert [parts["optimizer state"] > 0 for parts in seen] == [True, False, False]


def test_a_refusal_for_the_optimizer_state_names_lora_and_the_offload():
    parts = {"rollout batch": 0, "generation": 0, "micro-batch": 0, "weights": 2**30, "gradients": 2**30,
             "optimizer state": 2**31}  # fmt: skip
    with pytest.raises(ValueError, match=r"\(model.peft\) or offload the optimizer \(model.offload_optimizer\)$"):
        step_memory.memory_verdict(StepSizes(8, 100, 0, 1000, 4), parts, 2**28, "free on the GPU")
