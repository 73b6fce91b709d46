"""RolloutCallback inside a real Trainer.fit on the tiny model, with Hugging Face generate and with real vLLM; and the
callbacks' own settings checks."""

import pytest
import torch
from helpers.policies import ParityReward, PolicyModule, fit_rollouts, query_loader

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.data import QueryDataModule
from erpo_lightning.rollout import HFEngine, VLLMEngine
from erpo_lightning.rollout.batch import RolloutBatch
from erpo_lightning.scoring.logprobs import sequence_logprobs
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model

TEMPERATURE = 0.8
GROUP_SIZE = 4
METRICS = [
    "reward_mean",
    "reward_std",
    "accuracy",
    "response_length_mean",
    "response_length_max",
    "truncated_ratio",
    "zero_variance_groups",
    "tokens_per_s",
    "weight_sync_ms",
    "logprob_abs_diff",
    "grader_timeouts",
]


def fit(path, engine, loader, steps: int, **callback_kwargs):
    module = PolicyModule(str(path))
    reward = ParityReward()
    callback = RolloutCallback(
        engine,
        reward,
        group_size=GROUP_SIZE,
        temperature=TEMPERATURE,
        max_new_tokens=12,
        seed=0,
        logprob_check_every=1,
        **callback_kwargs,
    )
    return module, fit_rollouts(module, callback, steps, train_dataloaders=loader)


def check_rollout_batch(batch: RolloutBatch, queries, tokenizer, reward: ParityReward, num_queries: int = 2) -> None:
    """The rollout's rows agree with each other and with the queries (`queries[i]`: prompt_ids, answers) they answer."""
    n = num_queries * GROUP_SIZE
    width_p = batch.prompt_length
    assert batch.num_rows == n and batch.group_size == GROUP_SIZE and batch.temperature == TEMPERATURE
    assert torch.equal(batch.is_group_leader, torch.arange(n) % GROUP_SIZE == 0)
    for row in range(n):
        query = queries[batch.query_index[row].item()]
        prompt = query["prompt_ids"]
        assert batch.input_ids[row, width_p - len(prompt) : width_p].tolist() == prompt
        assert batch.query_index[row] == batch.query_index[row - row % GROUP_SIZE]
        assert batch.reference_nll[row].item() == pytest.approx(query["reference_nll"])  # the stream's scores
        assert batch.query_weights[row].item() == pytest.approx(query["query_weights"])
        response = batch.input_ids[row, width_p:][batch.response_mask[row].bool()].tolist()
        text = tokenizer.decode(response, skip_special_tokens=True)
        assert batch.rewards[row] == reward([text], [query["answers"]])[0]


def test_fit_with_hf_engine_attaches_batch_and_logs(tiny_model_path):
    loader = query_loader(["parity"] * 8, batch_size=2)
    module, trainer = fit(tiny_model_path, HFEngine(), loader, steps=2)
    tokenizer = build_byte_tokenizer()
    assert len(module.batches) == 2
    for batch in module.batches:
        check_rollout_batch(batch, loader.dataset, tokenizer, ParityReward())
    assert module.batches[1].query_index.unique().tolist() == [2, 3]
    metrics = trainer.callback_metrics
    assert all(f"rollout/{name}" in metrics for name in METRICS)
    assert metrics["rollout/logprob_abs_diff"] < 1e-4


def test_dynamic_sampling_keeps_only_informative_groups(tiny_model_path):
    # Every other query can never be rewarded: its groups carry no signal and must be replaced by refills.
    loader = query_loader(["never", "parity"] * 8, batch_size=2)
    module, trainer = fit(tiny_model_path, HFEngine(), loader, steps=2, dynamic_sampling=True, max_refill_rounds=6)
    tokenizer = build_byte_tokenizer()
    for batch in module.batches:
        check_rollout_batch(batch, loader.dataset, tokenizer, ParityReward())
        queries = batch.query_index[batch.is_group_leader].tolist()
        assert [loader.dataset[q]["answers"] for q in queries] == ["parity", "parity"]
        assert len(set(queries)) == 2
        grouped = batch.rewards.view(-1, GROUP_SIZE)
        assert (grouped != grouped[:, :1]).any(dim=1).all()
    assert trainer.callback_metrics["rollout/refill_rounds"] >= 1
    assert trainer.callback_metrics["rollout/zero_variance_groups"] >= 0.5
    assert trainer.callback_metrics["rollout/repeated_queries"] == 0  # 16 queries: the stream never ran out


def test_overlong_filter_masks_truncated_responses(tiny_model_path):
    loader = query_loader(["parity"] * 4, batch_size=2)
    module, _ = fit(tiny_model_path, HFEngine(), loader, steps=1, overlong_filter=True, overlong_buffer=4)
    batch = module.batches[0]
    assert batch.truncated.any()
    assert batch.response_mask[batch.truncated].sum() == 0
    # Truncated responses have the full 12 tokens: the buffer of 4 gives them the maximum penalty, -1.
    raw = batch.rewards[batch.truncated] + 1.0
    assert ((raw == 0.0) | (raw == 1.0)).all()


@pytest.mark.vllm
def test_fit_with_vllm_engine_syncs_weights_every_step(tiny_model_path):
    engine = VLLMEngine(dtype="float32", max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=32 * 2**20)
    threads = torch.get_num_threads()
    loader = query_loader(["parity"] * 6, batch_size=2)
    module, trainer = fit(tiny_model_path, engine, loader, steps=3)
    assert torch.get_num_threads() == threads
    tokenizer = build_byte_tokenizer()
    for batch in module.batches:
        check_rollout_batch(batch, loader.dataset, tokenizer, ParityReward())
    # After two optimizer steps the engine samples from the trained weights, not the checkpoint it was built from.
    assert trainer.callback_metrics["rollout/logprob_abs_diff"] < 1e-4
    assert trainer.callback_metrics["rollout/weight_sync_ms"] > 0
    last = module.batches[-1]
    with torch.no_grad():
        original = load_tiny_model(tiny_model_path)
        stale = sequence_logprobs(original, last.input_ids, last.attention_mask, TEMPERATURE)
    diff = (stale[:, last.prompt_length :] - last.sampling_logprobs).abs()[last.response_mask.bool()]
    assert diff.mean() > 1e-3


class FixedContextEngine(HFEngine):
    """Hugging Face generate behind a context fixed when the engine is built, as VLLMEngine's `max_model_len` is:
    it takes `require_context` declarations (the `engine.declare_context` protocol) until `setup`."""

    def __init__(self) -> None:
        super().__init__()
        self.declared = 0
        self.context_at_setup: int | None = None

    def require_context(self, tokens: int) -> None:
        self.declared = max(self.declared, tokens)

    def setup(self, policy, tokenizer) -> None:
        self.context_at_setup = self.declared
        super().setup(policy, tokenizer)


def test_engine_is_told_the_longest_rollout_before_it_is_built(tiny_model_path, benchmarks_dir, tmp_path):
    """on_fit_start declares data.max_prompt_length + rollout.max_new_tokens to the engine, before its setup."""
    engine = FixedContextEngine()
    datamodule = QueryDataModule(
        str(tiny_model_path), train=[{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 4}], template="plain",
        max_prompt_length=700, batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    callback = RolloutCallback(
        engine, ParityReward(), group_size=GROUP_SIZE, temperature=TEMPERATURE, max_new_tokens=12
    )
    fit_rollouts(PolicyModule(str(tiny_model_path)), callback, 1, datamodule=datamodule)
    assert engine.context_at_setup == 700 + 12


def test_callbacks_check_their_numeric_settings():
    from erpo_lightning.callbacks import HFExportCallback, TemperatureSweepCallback
    from erpo_lightning.evaluation import SweepConfig

    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    with pytest.raises(ValueError, match=r"rollout.correct_threshold must be a finite number, got nan"):
        RolloutCallback(HFEngine(), reward, correct_threshold=float("nan"))
    with pytest.raises(ValueError, match="TemperatureSweepCallback train_k must be >= 1, got 0"):
        TemperatureSweepCallback(SweepConfig(), train_k=0)
    with pytest.raises(ValueError, match="TemperatureSweepCallback train_sample_size must be >= 0, got -1"):
        TemperatureSweepCallback(SweepConfig(), train_sample_size=-1)
    with pytest.raises(ValueError, match="HFExportCallback every_n_steps must be >= 0"):
        HFExportCallback(every_n_steps=-1)
    for settings, message in (
        ({"temperatures": [float("inf")]}, "every temperature must be > 0 and finite"),
        ({"top_p": 0.0}, r"sweep.top_p must be in \(0, 1\], got 0.0"),
        ({"max_new_tokens": 0}, "sweep.max_new_tokens must be >= 1"),
        ({"batch_size": 0}, "sweep.batch_size must be >= 1, got 0"),
        ({"max_problems": 0}, "sweep.max_problems must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            SweepConfig(**settings)


def test_rollout_callback_checks_its_settings():
    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    with pytest.raises(ValueError, match=r"rollout.temperature must be > 0 .*got -1"):
        RolloutCallback(HFEngine(), reward, temperature=-1)
    with pytest.raises(ValueError, match=r"rollout.max_new_tokens must be >= 1, got 0"):
        RolloutCallback(HFEngine(), reward, max_new_tokens=0)
    with pytest.raises(ValueError, match=r"rollout.temperature must be > 0 .*got nan"):
        RolloutCallback(HFEngine(), reward, temperature=float("nan"))
    RolloutCallback(HFEngine(), reward, group_size=1, temperature=0.6)  # G = 1 is the module's concern
