"""`ERPOTrainer` and `QueryKLCallback` (erpo_lightning.integrations.trl) on real TRL 1.16 and a real tiny Qwen2.

`ERPOTrainer`'s loss and gradients on a fixed batch are recomputed here from our own forward and
`objectives.rl_loss` (θ0 scores from a fresh copy of the initial model, w(q) by hand from them); with Query-KL and
w(q) off it equals TRL's own `GRPOTrainer`; gradient accumulation does not change its gradient. The callback reads
0 at θ0, a hand computation later, and leaves training unchanged. TRL is a bench-only extra: without it these tests
are skipped (except the import check), and importing TRL takes a while on a CPU, hence the slow tier.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.trl_setup import (
    COMPLETIONS,
    GROUP_SIZE,
    PROMPTS,
    REWARDS,
    fixed_rollout,
    gradients,
    length_reward,
    make_trainer,
    noisy_old_logprobs,
    perturb,
    requires_trl,
    scored_rows,
)

from erpo_lightning import objectives as obj
from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.fingerprint import CacheMismatchError
from erpo_lightning.data.reference_logprobs import batch_query_logprobs
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model, save_tiny_model

REPO = Path(__file__).resolve().parents[2]


def test_import_erpo_lightning_never_imports_trl():
    code = (
        "import sys, erpo_lightning, erpo_lightning.objectives, erpo_lightning.objectives.algorithms, "
        "erpo_lightning.integrations, erpo_lightning.integrations.reference_scores; "
        "print(sorted(name for name in sys.modules if name == 'trl' or name.startswith('trl.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("trl_integration") / "model", seed=0)


def hand_loss(trainer, model_path, inputs: dict, algorithm) -> tuple[torch.Tensor, obj.LossStats]:
    """`rl_loss` with θ0 scores from a fresh copy of the initial model and w(q) made here from the algorithm."""
    tokenizer = build_byte_tokenizer()
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    reference = ReferenceLogprobCache.from_rows(batch_query_logprobs(load_tiny_model(model_path), prompt_ids))
    query = torch.arange(len(COMPLETIONS)) // GROUP_SIZE  # rows in dataset order, G per prompt
    query_lp, query_mask, response_lp, response_mask = scored_rows(trainer.model, inputs)
    width = inputs["prompt_ids"].shape[1]
    if algorithm.query_weight_source == "reference":
        nll = reference.nll  # [3]
    else:  # the current policy's NLL of each prompt, unpadded
        with torch.no_grad():
            nll = -torch.stack([row.sum() for row in batch_query_logprobs(trainer.model, prompt_ids)])
    mean = reference.nll.mean() if algorithm.query_weight_norm == "dataset" else nll.mean()
    weights = obj.query_weights(nll, mean, algorithm.query_weight_clip)[query]
    advantages = obj.group_advantages(
        torch.tensor(REWARDS), GROUP_SIZE, algorithm.advantage_estimator, algorithm.advantage_eps
    )
    return obj.rl_loss(
        algorithm, response_lp, inputs["old_per_token_logps"], advantages, response_mask, query_lp,
        reference.padded(query, width), query_mask, torch.arange(len(COMPLETIONS)) % GROUP_SIZE == 0,
        seq_weights=weights, constant=16,
    )  # fmt: skip


@pytest.mark.slow
@requires_trl
@pytest.mark.parametrize("scoring", ["exact", "shared_forward"])
@pytest.mark.parametrize("preset", ["erpo", "erpo_released"])
def test_loss_and_gradients_equal_rl_loss(preset, scoring, model_path, tmp_path):
    """Both scorings against one hand computation from the [prompt; completion] forward: the exact one scores the
    queries again alone, which agrees to rounding in float32 (and equals the cache bit for bit at θ0)."""
    trainer = make_trainer(model_path, tmp_path, algorithm=preset, query_kl_scoring=scoring)
    perturb(trainer.model)  # after θ0 was scored: Query-KL is no longer 0, and w(q) 'current' moves
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)])
    assert (inputs["prompt_mask"] == 0).any(), "some prompts must be left-padded"
    inputs["old_per_token_logps"] = noisy_old_logprobs(trainer.model, inputs)
    # The Query-KL tolerance left unset is 0 when exact, else follows the compute dtype, as in `erpo fit`.
    tolerance = 0.0 if scoring == "exact" else obj.query_kl_tolerance_for(torch.float32)
    algorithm = resolve_algorithm(preset, query_kl_tolerance=tolerance)
    assert trainer.algorithm == algorithm
    assert trainer.args.weight_decay == algorithm.weight_decay  # the preset's optimizer default (0.01 for released)

    loss, grads = gradients(trainer.model, lambda: trainer.compute_loss(trainer.model, inputs))
    expected_loss, expected_grads = gradients(
        trainer.model, lambda: hand_loss(trainer, model_path, inputs, algorithm)[0]
    )
    drift = hand_loss(trainer, model_path, inputs, algorithm)[1].query_drift
    assert drift.query_kl.min() > 1e-3, "Query-KL must be non-trivial"
    weights = inputs["erpo_query_weights"]
    assert weights.max() - weights.min() > 0.05, "w(q) must differ between queries"
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-5, msg=name)
    assert max(g.abs().max() for g in grads.values()) > 1e-3
    estimator = algorithm.query_kl_estimator
    logged = trainer._metrics["train"]
    assert logged[f"query_kl/{estimator}"][-1] == pytest.approx(drift.query_kl.mean().item(), rel=1e-4)
    assert logged["query_kl/token_k3"][-1] == pytest.approx(drift.query_kl_token_k3.mean().item(), rel=1e-4)
    assert {"query_kl/weight_mean", "query_kl/weight_min", "query_kl/weight_max"} <= set(logged)


@pytest.mark.slow
@requires_trl
def test_without_query_kl_and_weights_it_is_trl_grpo(model_path, tmp_path):
    """α = 0 and no w(q) (advantage eps 1e-4, TRL's): the loss and gradients of TRL's GRPOTrainer (loss_type dapo)
    on a fixed off-policy batch, and the same parameters after two sampled SGD steps."""
    plain_settings = dict(algorithm="erpo", query_kl_coef=0.0, use_query_weights=False, advantage_eps=1e-4)
    losses = []
    for erpo in (True, False):
        trainer = make_trainer(model_path, tmp_path / str(erpo), erpo=erpo, **(plain_settings if erpo else {}))
        perturb(trainer.model)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)])
        inputs["old_per_token_logps"] = noisy_old_logprobs(trainer.model, inputs)
        losses.append(gradients(trainer.model, lambda t=trainer, i=inputs: t.compute_loss(t.model, i)))
    (erpo_loss, erpo_grads), (trl_loss, trl_grads) = losses
    assert trl_loss.abs() > 1e-3
    torch.testing.assert_close(erpo_loss, trl_loss, rtol=0, atol=1e-6)
    for name, grad in trl_grads.items():
        torch.testing.assert_close(erpo_grads[name], grad, rtol=0, atol=1e-6, msg=name)

    trained = []
    for erpo in (True, False):  # HF generate samples the completions: same seed, same samples, same steps
        trainer = make_trainer(
            model_path, tmp_path / f"train_{erpo}", erpo=erpo, fixed=False, max_steps=2, optim="sgd",
            learning_rate=0.5, **(plain_settings if erpo else {}),
        )  # fmt: skip
        trainer.train()
        trained.append({name: p.detach().clone() for name, p in trainer.model.named_parameters()})
    initial = load_tiny_model(model_path).state_dict()
    assert max((trained[1][name] - initial[name]).abs().max() for name in trained[1]) > 1e-4, "SGD must move"
    for name, value in trained[1].items():
        torch.testing.assert_close(trained[0][name], value, rtol=0, atol=1e-6, msg=name)


class GradientRecorder:
    """A TrainerCallback keeping each optimizer step's gradients (after clipping, before the step)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Recorder(TrainerCallback):
            def __init__(self):
                self.steps = []

            def on_pre_optimizer_step(self, args, state, control, model=None, **_):
                self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})

        return Recorder()


@pytest.mark.slow
@requires_trl
@pytest.mark.parametrize("preset", ["erpo", "erpo_released"])
def test_gradient_accumulation_two_equals_one(preset, model_path, tmp_path):
    """The same 12 rows as one micro-batch or as two (shuffled by TRL): the same gradient of the optimizer step."""
    recorded = []
    for accumulation in (1, 2):
        trainer = make_trainer(
            model_path, tmp_path / str(accumulation), algorithm=preset, max_steps=1, optim="sgd",
            per_device_train_batch_size=len(COMPLETIONS) // accumulation, gradient_accumulation_steps=accumulation,
            max_grad_norm=0.0,  # no clipping: a norm-clipped gradient would hide a wrong scale
        )  # fmt: skip
        perturb(trainer.model)  # Query-KL and w(q) 'current' are not trivial
        recorder = GradientRecorder()
        trainer.add_callback(recorder)
        trainer.train()
        recorded.append(recorder.steps[0])
    assert max(g.abs().max() for g in recorded[0].values()) > 1e-3
    for name, grad in recorded[0].items():
        torch.testing.assert_close(recorded[1][name], grad, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
@requires_trl
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"temperature": 0.9}, "GRPOConfig.temperature"),
        ({"beta": 0.04}, "GRPOConfig.beta"),
        ({"epsilon_high": 0.28}, "GRPOConfig.epsilon_high"),  # the erpo preset's clip_high is None
        ({"algorithm": "grpo_kl"}, "policy_kl_coef"),
        ({"use_vllm": True, "vllm_mode": "server"}, "GRPOConfig.vllm_mode"),
    ],
)
def test_refuses_what_it_cannot_do_naming_the_setting(settings, named, model_path, tmp_path):
    with pytest.raises(ValueError, match=re.escape(named)) as error:
        make_trainer(model_path, tmp_path, **settings)
    assert "\n" not in str(error.value)


@pytest.mark.slow
@requires_trl
def test_reference_scores_are_reused_and_never_rescored_from_a_trained_model(model_path, tmp_path):
    trainer = make_trainer(model_path, tmp_path)
    scores = tmp_path / "erpo_reference" / "scores.safetensors"
    manifest = json.loads((tmp_path / "erpo_reference" / "manifest.json").read_text())
    assert manifest["num_queries"] == len(PROMPTS) and scores.is_file()
    prompt_ids = [build_byte_tokenizer()(p)["input_ids"] for p in PROMPTS]
    expected = ReferenceLogprobCache.from_rows(batch_query_logprobs(load_tiny_model(model_path), prompt_ids))
    torch.testing.assert_close(trainer.reference_cache.logprobs, expected.logprobs, rtol=0, atol=0)
    written = scores.stat().st_mtime_ns
    again = make_trainer(model_path, tmp_path)  # a resumed run builds its trainer from θ0 again: read back
    assert scores.stat().st_mtime_ns == written
    torch.testing.assert_close(again.reference_cache.logprobs, expected.logprobs, rtol=0, atol=0)

    trained = load_tiny_model(model_path)
    perturb(trained)
    with pytest.raises(CacheMismatchError, match="the model weights differ"):
        make_trainer(trained, tmp_path)
    assert scores.stat().st_mtime_ns == written

    from erpo_lightning.integrations.trl import QueryKLCallback

    with pytest.raises(ValueError, match="ERPOTrainer already logs query_kl"):
        QueryKLCallback(trainer)


def hand_query_kl(model, reference_model, prompts: list[str]) -> dict[str, float]:
    """Query-KL of `prompts` by hand: one unpadded forward per prompt and model, k3 per token (mean over the
    scored tokens) and of the summed log-ratio, each clamped at 10 as the default value clamp, mean over prompts."""
    tokenizer = build_byte_tokenizer()
    token_k3, sequence_k3 = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            scores = [
                torch.log_softmax(m(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
                for m in (model, reference_model)
            ]
            delta = scores[1] - scores[0]  # log θ0 - log θ per scored token
            token_k3.append((torch.expm1(delta) - delta).clamp(max=10).mean())
            total = delta.sum()
            sequence_k3.append((torch.expm1(total) - total).clamp(max=10))
    return {"token_k3": float(torch.stack(token_k3).mean()), "sequence_k3": float(torch.stack(sequence_k3).mean())}


def train_plain(model_path, output_dir, with_callback: bool, steps: int = 2):
    from erpo_lightning.integrations.trl import QueryKLCallback

    trainer = make_trainer(
        model_path, output_dir, erpo=False, fixed=False, max_steps=steps, optim="sgd", learning_rate=0.5
    )
    callback = QueryKLCallback(trainer, num_probes=len(PROMPTS)) if with_callback else None
    if callback is not None:
        trainer.add_callback(callback)
    trainer.train()
    return trainer, callback


@pytest.mark.slow
@requires_trl
def test_query_kl_callback_reads_zero_at_theta0_then_the_hand_computation(model_path, tmp_path):
    trainer, callback = train_plain(model_path, tmp_path, with_callback=True)
    assert callback.history[0] == (0, {"token_k3": 0.0, "sequence_k3": 0.0})
    assert [step for step, _ in callback.history] == [0, 1, 2]
    hand = hand_query_kl(trainer.model, load_tiny_model(model_path), PROMPTS)
    assert hand["token_k3"] > 1e-4, "the model must have moved"
    assert callback.history[-1][1] == pytest.approx(hand, rel=1e-4, abs=1e-7)
    logged = [entry for entry in trainer.state.log_history if "query_kl/token_k3" in entry]
    assert [entry["query_kl/token_k3"] for entry in logged] == [
        values["token_k3"] for _, values in callback.history[1:]
    ]
    assert (tmp_path / "query_kl_probes" / "scores.safetensors").is_file()


@pytest.mark.slow
@requires_trl
def test_query_kl_callback_does_not_change_training(model_path, tmp_path):
    parameters = []
    for with_callback in (False, True):
        trainer, _ = train_plain(model_path, tmp_path / str(with_callback), with_callback)
        parameters.append({name: p.detach().clone() for name, p in trainer.model.named_parameters()})
    initial = load_tiny_model(model_path).state_dict()
    assert any(not torch.equal(value, initial[name]) for name, value in parameters[0].items())
    for name, value in parameters[0].items():
        assert torch.equal(parameters[1][name], value), name


@pytest.mark.slow
@requires_trl
def test_query_kl_callback_reloads_theta0_scores_on_resume(model_path, tmp_path):
    from transformers import TrainerControl, TrainerState

    from erpo_lightning.integrations.trl import QueryKLCallback

    _, first = train_plain(model_path, tmp_path, with_callback=True, steps=1)
    resumed = make_trainer(model_path, tmp_path, erpo=False, fixed=False)
    perturb(resumed.model)  # what a resumed run's model is at train begin: trained, not θ0
    callback = QueryKLCallback(resumed, num_probes=len(PROMPTS))
    callback.on_train_begin(resumed.args, TrainerState(global_step=1), TrainerControl(), model=resumed.model)
    torch.testing.assert_close(callback.reference.logprobs, first.reference.logprobs, rtol=0, atol=0)
    assert callback.history == []

    elsewhere = make_trainer(model_path, tmp_path / "elsewhere", erpo=False, fixed=False)
    with pytest.raises(FileNotFoundError, match="never rescored from a trained model"):
        QueryKLCallback(elsewhere).on_train_begin(
            elsewhere.args, TrainerState(global_step=1), TrainerControl(), model=elsewhere.model
        )


@pytest.mark.slow
@requires_trl
def test_docs_erpo_inside_trl_example_runs(tmp_path, monkeypatch):
    """docs/trl.md's "ERPO inside TRL" example, as written (at most 15 lines), on the shipped toy model."""
    text = (REPO / "docs" / "trl.md").read_text()
    blocks = re.findall(r"<!-- example: erpo-trl -->\s*```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/trl.md lost its ERPO inside TRL example"
    assert len(blocks[0].splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "docs/trl.md:erpo-trl", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == trainer.args.max_steps
    logged = [entry for entry in trainer.state.log_history if "query_kl/sequence_k3" in entry]
    assert logged and all(entry["query_kl/token_k3"] >= 0 for entry in logged)
    assert (tmp_path / "runs" / "erpo_trl" / "erpo_reference" / "manifest.json").is_file()


@pytest.mark.slow
@requires_trl
def test_conversational_prompts_are_scored_through_the_chat_template(tmp_path):
    """Chat prompts: θ0 scores the tokens TRL generates from (its own chat templating), and a sampled step runs."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from erpo_lightning.integrations.trl import ERPOTrainer
    from erpo_lightning.toy import SHIPPED_DIR

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    chats = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    config = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", bf16=False,
        gradient_checkpointing=False, per_device_train_batch_size=len(COMPLETIONS), num_generations=GROUP_SIZE,
        max_completion_length=8, max_steps=1, logging_steps=1, disable_tqdm=True,
    )  # fmt: skip
    trainer = ERPOTrainer(
        model=str(SHIPPED_DIR), reward_funcs=length_reward, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": chats}), algorithm="erpo",
    )  # fmt: skip
    chat_ids = tokenizer.apply_chat_template(chats[0], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert trainer.reference_cache.row(0).numel() == len(chat_ids["input_ids"]) > len(tokenizer(PROMPTS[0]).input_ids)
    manifest = json.loads((tmp_path / "erpo_reference" / "manifest.json").read_text())
    assert manifest["template"]["chat_template"] == tokenizer.chat_template
    trainer.train()
    assert any("query_kl/sequence_k3" in entry for entry in trainer.state.log_history)


@pytest.mark.slow
@requires_trl
def test_resume_from_a_checkpoint_reads_the_theta0_scores_back(model_path, tmp_path):
    first = make_trainer(model_path, tmp_path, max_steps=1, save_strategy="steps", save_steps=1, optim="sgd")
    first.train()
    scores = tmp_path / "erpo_reference" / "scores.safetensors"
    written = scores.stat().st_mtime_ns
    resumed = make_trainer(model_path, tmp_path, max_steps=2, save_strategy="steps", save_steps=1, optim="sgd")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2
    assert scores.stat().st_mtime_ns == written
    torch.testing.assert_close(resumed.reference_cache.logprobs, first.reference_cache.logprobs, rtol=0, atol=0)


@pytest.mark.slow
@requires_trl
def test_evaluation_prompts_get_theta0_scores_and_log_query_kl(model_path, tmp_path):
    """Evaluation prompts are scored at θ0 too (w(q)'s s̄ stays the training set's mean) and evaluation logs Query-KL."""
    eval_prompts = ["Compute 1 + 1.", "Compute 2 + 5 - 3."]
    trainer = make_trainer(
        model_path, tmp_path, fixed=False, eval_prompts=eval_prompts, max_steps=1, eval_strategy="steps",
        eval_steps=1, per_device_eval_batch_size=len(eval_prompts) * GROUP_SIZE,
    )  # fmt: skip
    assert len(trainer.reference_cache) == len(PROMPTS) + len(eval_prompts)
    trainer.train()
    evaluated = [entry for entry in trainer.state.log_history if "eval_query_kl/sequence_k3" in entry]
    assert evaluated and evaluated[0]["eval_query_kl/sequence_k3"] >= 0
    hand = obj.query_weights(trainer.reference_cache.nll, trainer.reference_cache.nll[: len(PROMPTS)].mean())
    assert evaluated[0]["eval_query_kl/weight_max"] == pytest.approx(hand[len(PROMPTS) :].max().item(), rel=1e-5)


@pytest.mark.slow
@requires_trl
def test_query_kl_tolerance_is_zero_when_exact_else_follows_the_compute_dtype_unless_set(model_path, tmp_path):
    assert make_trainer(model_path, tmp_path / "exact", bf16=True).algorithm.query_kl_tolerance == 0.0
    shared = {"query_kl_scoring": "shared_forward"}
    assert make_trainer(model_path, tmp_path / "bf16", bf16=True, **shared).algorithm.query_kl_tolerance == (
        obj.query_kl_tolerance_for(torch.bfloat16)
    )
    assert make_trainer(model_path, tmp_path / "fp32", **shared).algorithm.query_kl_tolerance == (
        obj.query_kl_tolerance_for(torch.float32)
    )
    assert (
        make_trainer(model_path, tmp_path / "set", bf16=True, query_kl_tolerance=0.0).algorithm.query_kl_tolerance == 0
    )


@pytest.mark.slow
@requires_trl
@pytest.mark.parametrize("bf16", [False, True])
def test_exact_query_kl_is_zero_at_theta0_and_stays_there_without_signal(model_path, tmp_path, bf16):
    """ERPOTrainer's default scoring: the queries are scored alone in the θ0 cache's layout and autocast dtype, so
    at θ0 Query-KL is exactly 0, and with every reward equal (no signal) and no tolerance it stays 0 (float32 and
    bfloat16 autocast; weight decay off: it moves weights whatever the signal, docs/erpo.md)."""
    trainer = make_trainer(
        model_path, tmp_path / "run", bf16=bf16, max_steps=3, weight_decay=0.0, learning_rate=1e-3,
        inputs={"reward_funcs": lambda completions, **_: [0.0] * len(completions)},
    )  # fmt: skip
    assert trainer.algorithm.query_kl_tolerance == 0.0
    trainer.train()
    logged = [entry["query_kl/token_k3"] for entry in trainer.state.log_history if "query_kl/token_k3" in entry]
    assert len(logged) == 3 and logged == [0.0, 0.0, 0.0], logged


@requires_trl
@pytest.mark.parametrize(
    ("trl_settings", "expected"),
    [
        ({}, ("mis", "sequence", 3.0, None)),  # TRL's default: sequence_mask, C_max 3
        ({"vllm_importance_sampling_mode": "token_truncate"}, ("tis", "token", 3.0, None)),
        (
            {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5},
            ("mis", "token", 3.0, 0.5),
        ),  # fmt: skip
        (
            {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_clip_max": 2.0},
            ("tis", "sequence", 2.0, None),
        ),  # fmt: skip
        (
            {"vllm_importance_sampling_clip_max": None, "vllm_importance_sampling_clip_min": 0.2},
            ("mis", "sequence", float("inf"), 0.2),
        ),  # fmt: skip
    ],
)
def test_trl_importance_sampling_correction_maps_onto_rollout_correction(trl_settings, expected, tmp_path):
    """GRPOConfig's vLLM importance-sampling settings become the algorithm's `rollout_correction` fields (no model
    is built: the mapping happens before TRL builds anything)."""
    from trl import GRPOConfig

    from erpo_lightning.integrations.trl_config import trl_rollout_correction

    def config(**settings):
        return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **settings)

    algorithm = resolve_algorithm("erpo")
    mapped = trl_rollout_correction(config(use_vllm=True, **trl_settings), algorithm)
    fields = ("rollout_correction", "rollout_correction_level", "rollout_correction_cap", "rollout_correction_floor")
    assert tuple(getattr(mapped, name) for name in fields) == expected
    assert mapped == replace(algorithm, **dict(zip(fields, expected, strict=True)))  # nothing else changes
    # TRL corrects only with vLLM, and only when asked.
    assert trl_rollout_correction(config(**trl_settings), algorithm) == algorithm
    off = config(use_vllm=True, vllm_importance_sampling_correction=False, **trl_settings)
    assert trl_rollout_correction(off, algorithm) == algorithm


@requires_trl
def test_a_correction_set_twice_is_refused_before_trl_builds_anything(tmp_path):
    with pytest.raises(ValueError, match="both set the mismatch correction") as error:
        make_trainer("no-such-model", tmp_path, use_vllm=True, rollout_correction="tis")
    assert "model." not in str(error.value)


@pytest.mark.slow
@requires_trl
def test_a_correction_without_the_engines_logprobs_is_refused(model_path, tmp_path):
    """Neither vLLM nor a rollout_func: TRL samples with transformers and keeps no log-probs to correct with."""
    with pytest.raises(ValueError, match=re.escape("ERPOTrainer: algorithm rollout_correction='tis' needs the")):
        make_trainer(model_path, tmp_path, fixed=False, rollout_correction="tis")


@pytest.mark.slow
@requires_trl
def test_rollout_correction_weights_the_loss_with_the_engines_logprobs(model_path, tmp_path):
    """A rollout_func that returns the engine's log-probs: tokens with ρ above the cap leave the PG loss (mis), the
    share is logged, and without those log-probs the correction is refused."""

    def with_logprobs(prompts, trainer):
        rollout = fixed_rollout(prompts, trainer)
        # -20 nats: ρ = π / μ far above any cap; -0.01: ρ below 1, inside the band.
        rollout["logprobs"] = [
            [-20.0 if t % 2 else -0.01 for t in range(len(ids))] for ids in rollout["completion_ids"]
        ]
        return rollout

    trainer = make_trainer(
        model_path,
        tmp_path,
        rollout_correction="mis",
        rollout_correction_cap=1.5,
        inputs={"rollout_func": with_logprobs},
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)])
    corrected = trainer.compute_loss(trainer.model, inputs).item()
    mask = inputs["completion_mask"].bool()
    odd = (torch.arange(mask.shape[1]) % 2 == 1).expand_as(mask)
    assert trainer._metrics["train"]["rollout_correction/capped_frac"][-1] == pytest.approx(
        (odd & mask).sum().item() / mask.sum().item()
    )
    assert trainer._metrics["train"]["rollout_correction/ratio_mean"][-1] > 1.5
    trainer.algorithm = replace(trainer.algorithm, rollout_correction="none")
    assert abs(trainer.compute_loss(trainer.model, inputs).item() - corrected) > 1e-4
    trainer.algorithm = replace(trainer.algorithm, rollout_correction="tis")
    del inputs["sampling_per_token_logps"]
    with pytest.raises(ValueError, match="ERPOTrainer: rollout_correction='tis' needs the engine's log-probs"):
        trainer.compute_loss(trainer.model, inputs)
