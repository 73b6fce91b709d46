"""`model.skip_zero_signal_steps`: an optimizer step whose gradient is exactly 0 (no group with reward variance, no
Query-KL pull) is skipped: weights, optimizer state and LR schedule stay bit-identical, while the step still counts
towards max_steps. Without it AdamW's momentum keeps moving a policy that has no signal (the coasting baseline)."""

import copy

import lightning as L
import pytest
import torch
from helpers.batches import carrying_scores, rollout_loader
from helpers.module_steps import PROMPTS, ReferenceLogprobs, fit_one_batch, make_module, rollout_batch

from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.reference_logprobs import batch_query_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout


class Snapshot(L.Callback):
    """Weights, optimizer state and learning rate after each training batch."""

    def __init__(self):
        self.after = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        optimizer = trainer.optimizers[0]
        self.after.append({
            "weights": copy.deepcopy(pl_module.policy.state_dict()),
            "optimizer": copy.deepcopy(optimizer.state_dict()["state"]),
            "lr": optimizer.param_groups[0]["lr"],
            "scheduler_steps": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
        })  # fmt: skip


def same(a: dict, b: dict) -> bool:
    """Bit-identical nested dicts of tensors and numbers."""
    if a.keys() != b.keys():
        return False
    return all(
        same(a[k], b[k])
        if isinstance(a[k], dict)
        else torch.equal(a[k], b[k])
        if torch.is_tensor(a[k])
        else a[k] == b[k]
        for k in a
    )


def signal_then_nothing(model):
    """A batch with reward variance, then two whose rewards are all 0 (every advantage 0)."""
    signal = rollout_batch(model)
    nothing = type(signal)(**{**signal.__dict__, "rewards": torch.zeros_like(signal.rewards)})
    return [signal, nothing, nothing]


def fit_batches(module, batches, **trainer_kwargs):
    snapshot = Snapshot()
    trainer = L.Trainer(
        max_steps=len(batches), accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[snapshot], **trainer_kwargs,
    )  # fmt: skip
    batches = [carrying_scores(b, module.algorithm, module.reference_cache.nll) for b in batches]
    trainer.fit(module, train_dataloaders=rollout_loader(batches))
    return trainer, snapshot.after


@pytest.mark.parametrize("skip", [True, False])
def test_a_zero_signal_step_leaves_weights_and_optimizer_state_bit_identical(tiny_model_path, tiny_model, skip):
    reference = ReferenceLogprobs(tiny_model, PROMPTS)
    module = make_module(tiny_model_path, reference, algorithm="grpo", skip_zero_signal_steps=skip, warmup_steps=5)
    trainer, after = fit_batches(module, signal_then_nothing(tiny_model))
    assert trainer.global_step == 3  # a skipped step still counts towards max_steps (its batch is consumed)
    unchanged = [same(after[0][key], after[2][key]) for key in ("weights", "optimizer")]
    if skip:
        assert unchanged == [True, True] and module.zero_signal_skips == 2
        assert after[2]["scheduler_steps"] == after[0]["scheduler_steps"] == 1  # the schedule counts updates
        assert trainer.callback_metrics["train/zero_signal_skips"].item() == 2.0
    else:  # the defect the setting removes: AdamW's momentum moves the policy with a gradient of exactly 0
        assert unchanged == [False, False] and module.zero_signal_skips == 0
        assert after[2]["scheduler_steps"] == 3


def test_a_query_kl_pull_is_signal_so_erpo_still_steps(tiny_model_path, tiny_model):
    """Once the policy has moved, erpo's Query-KL has a gradient on a zero-advantage batch: not skipped."""
    reference = ReferenceLogprobs(tiny_model, PROMPTS)
    module = make_module(tiny_model_path, reference, algorithm="erpo", skip_zero_signal_steps=True)
    _, after = fit_batches(module, signal_then_nothing(tiny_model))
    assert module.zero_signal_skips == 0 and not same(after[0]["weights"], after[2]["weights"])


def test_the_first_steps_of_a_zero_signal_run_are_skipped_for_erpo_too(tiny_model_path, tiny_model):
    """At θ0, against a real cache scored in the layout the step uses, erpo's Query-KL gradient is exactly 0 as
    well: nothing to do, nothing done."""
    cache = ReferenceLogprobCache.from_rows(batch_query_logprobs(tiny_model, PROMPTS), QueryScoringLayout())
    module = make_module(tiny_model_path, cache, algorithm="erpo", skip_zero_signal_steps=True)
    module.configure_model()
    before = copy.deepcopy(module.policy.state_dict())
    fit_one_batch(module, signal_then_nothing(tiny_model)[1], steps=2)
    assert module.zero_signal_skips == 2 and same(before, module.policy.state_dict())
