"""Generated hostile model outputs graded by the verifier pool (`rewards/pool.py`): every call returns a score within
``timeout_s + 1 s``, nothing raises and the pool stays healthy; a rollout batch with 1,500 nested ``{}`` is graded
in time, and a fit whose engine returns such a response trains on, counting it (issue 18).

Families: bracket nesting up to 100,000 levels (inside and outside ``\\boxed{}``), responses of 1-5 MB, mixed
unicode (astral characters, lone surrogates, combining marks, right-to-left text, NUL bytes), long digit runs,
unterminated boxes and large answers just under and over the size bounds. The fast tier feeds 50 of them; the
``slow`` tier all 500.
"""

from __future__ import annotations

import random
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers.grading import grade_one_by_one
from helpers.policies import PolicyModule, query_loader

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.rewards import MathReward
from erpo_lightning.rewards.math_reward import MAX_DEPTH, MAX_RESPONSE_CHARS
from erpo_lightning.rollout import HFEngine, Sample
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

TIMEOUT_S = 1.0
_UNICODE = ["\U0001f600", "\ud800", "\udfff", "\u0301", "\u202e", "\x00", "∑", "√", "π", "\ufeff", "é", "𝔸", "\u200b"]
_BRACKETS = [("{", "}"), ("(", ")"), ("[", "]"), ("\\left(", "\\right)"), ("\\frac{1}{", "}"), ("\\sqrt{", "}")]


def _noise(rng: random.Random, size: int) -> str:
    """``size`` characters of prose, LaTeX fragments and unusual unicode."""
    pieces = ["The answer ", "\\boxed{", "}", "$", "\\frac{", "x^{", "12", " so ", "\\\\", *_UNICODE]
    out: list[str] = []
    length = 0
    while length < size:
        piece = rng.choice(pieces) * rng.randint(1, 40)
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


def hostile_strings(count: int, seed: int = 0) -> list[str]:
    """``count`` hostile responses, cycling through the families (deterministic for a seed)."""
    rng = random.Random(seed)
    families = [
        lambda: "\\boxed{" + "{" * rng.randint(1_000, 100_000) + "1" + "}" * rng.randint(0, 100_000) + "}",
        lambda: "\\boxed{" + "{" * (n := rng.randint(1_000, 99_000)) + "1" + "}" * n + "}",
        lambda: "\\boxed{" + "".join(o for o, _ in [rng.choice(_BRACKETS)] * rng.randint(500, 50_000)) + "7}",
        lambda: "(" * rng.randint(100, 400) + _noise(rng, rng.randint(1_000_000, 5_000_000)) + "\\boxed{5}",
        lambda: _noise(rng, rng.randint(1_000_000, 5_000_000)),
        lambda: "".join(rng.choice(_UNICODE) for _ in range(rng.randint(10, 5_000))) + "\\boxed{5}",
        lambda: "The final answer is " + "9" * rng.randint(1_000, MAX_RESPONSE_CHARS - 100),
        lambda: "\\boxed{" * rng.randint(1_000, 90_000) + "1",
        lambda: "\\boxed{" + "1+" * rng.randint(10_000, 90_000) + "1}",
        lambda: "\\boxed{" + "(" * (MAX_DEPTH - 1) + "5" + ")" * (MAX_DEPTH - 1) + "}",
        lambda: _noise(rng, rng.randint(100, MAX_RESPONSE_CHARS - 1)),
    ]
    return [families[i % len(families)]() for i in range(count)]


@pytest.fixture(scope="module")
def reward():
    with MathReward(timeout_s=TIMEOUT_S, num_workers=2) as reward_fn:
        assert reward_fn(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"]) == [1.0]  # starts the pool once
        reward_fn.counters()
        yield reward_fn


def _feed(reward: MathReward, responses: list[str]) -> None:
    reward.counters()  # reading resets them: what an earlier test graded with the shared pool is not counted here
    slowest = grade_one_by_one(reward, responses, "5", TIMEOUT_S + 1.0)
    counters = reward.counters()
    assert counters["items"] == len(responses)
    assert counters["too_long"] > 0 and counters["too_deep"] > 0
    assert counters["errors"] == 0  # nothing reached the in-process safety net
    # The pool is still healthy afterwards.
    assert reward(["\\boxed{\\frac{x^2-1}{x-1}}", "\\boxed{x+2}"], ["x+1", "x+1"]) == [1.0, 0.0]
    print(f"{len(responses)} hostile responses, slowest {slowest:.2f} s, counters {counters}")


def test_50_hostile_strings_score_within_the_deadline(reward):
    _feed(reward, hostile_strings(50, seed=1))


@pytest.mark.slow
def test_500_hostile_strings_score_within_the_deadline(reward):
    _feed(reward, hostile_strings(500, seed=2))


def test_1500_nested_braces_in_a_rollout_batch():
    """A rollout batch as RolloutCallback grades it (one call, group of responses), one with 1,500 nested ``{}``."""
    nested = "Let me think. \\boxed{" + "{" * 1_500 + "7" + "}" * 1_500 + "}"
    responses = ["\\boxed{7}", nested, "The final answer is $7$.", "\\boxed{8}"]
    with MathReward(timeout_s=2.0, num_workers=1) as reward:
        start = time.monotonic()
        scores = reward(responses, ["7"] * len(responses))
        elapsed = time.monotonic() - start
        counters = reward.counters()
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert counters["too_deep"] == 1 and counters["items"] == 4
    assert elapsed < 3.0


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
