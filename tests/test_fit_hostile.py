"""Training survives a hostile model output: a response with 1,500 nested `{}` inside `\\boxed{}` (issue 18)."""

import lightning.pytorch as pl
import torch
from helpers.policies import PolicyModule, query_loader

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.rewards import MathReward
from erpo_lightning.rollout import HFEngine, Sample
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

NESTED = "Let me think. \\boxed{" + "{" * 1_500 + "7" + "}" * 1_500 + "}"


class OneHostileResponseEngine(HFEngine):
    """Hugging Face generate, except that the first response of the first call is `NESTED` (its tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.hostile_ids = build_byte_tokenizer().encode(NESTED, add_special_tokens=False)
        self.injected = False

    def generate(self, prompt_ids, settings):
        groups = super().generate(prompt_ids, settings)
        if not self.injected:
            groups[0][0] = Sample(self.hostile_ids, [0.0] * len(self.hostile_ids), "stop")
            self.injected = True
        return groups


class RecordGraderCounters(pl.Callback):
    def __init__(self) -> None:
        self.too_deep: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.too_deep.append(float(trainer.callback_metrics["rollout/grader_too_deep"]))


def test_fit_survives_1500_nested_braces_and_counts_them(tiny_model_path):
    module = PolicyModule(str(tiny_model_path))
    engine = OneHostileResponseEngine()
    recorder = RecordGraderCounters()
    with MathReward(num_workers=1, timeout_s=2.0) as reward:
        rollout = RolloutCallback(engine, reward, group_size=2, temperature=0.8, max_new_tokens=8, seed=0)
        trainer = pl.Trainer(
            max_steps=2, accelerator="cpu", callbacks=[rollout, recorder], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module, train_dataloaders=query_loader(["7", "7"], batch_size=1))

    assert engine.injected and len(module.batches) == 2
    first = module.batches[0]
    response = first.input_ids[0, first.prompt_length :][first.response_mask[0].bool()]
    assert response.tolist() == engine.hostile_ids  # the hostile response was trained on, as generated
    assert first.rewards[0] == 0.0  # too deep to grade: scored wrong, not raised
    assert recorder.too_deep == [1.0, 0.0]  # counted in the step that graded it (counters reset per step)
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())
