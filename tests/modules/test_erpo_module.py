"""ERPOModule on a hand-built rollout batch: loss equals the formulas, one forward per micro-batch, NaN handling."""

import copy

import lightning as L
import pytest
import torch
from helpers.batches import carrying_scores, make_rollout
from helpers.module_steps import (
    PAD,
    PROMPTS,
    RESPONSES,
    REWARDS,
    TEMPERATURE,
    ReferenceLogprobs,
    fit_one_batch,
    make_module,
    rollout_batch,
)

from erpo_lightning import objectives as obj
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.optim import NonFiniteLossError
from erpo_lightning.scoring.logprobs import gather_token_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout


def hand_loss(
    model, reference, algorithm_coef, query_kl_shift=0.0, masked_rows=(), estimator="token_k3", tolerance=0.0
):
    """The ERPO loss from per-row unpadded forwards and the paper's formula (token-mean PG, w(q), α·Query-KL), and
    the Query-KL the run logs. In the loss each token's log-ratio is first shrunk by `tolerance` (nats)."""
    advantages = obj.group_advantages(torch.tensor(REWARDS), 2, "grpo")
    weights = obj.query_weights(reference.nll, reference.nll.mean()).repeat_interleave(2).tolist()
    pg_terms, tokens = 0.0, 0
    with torch.no_grad():
        for i, response in enumerate(RESPONSES):
            if i in masked_rows:
                continue
            # on-policy: ratio 1, the PG loss term per token is -A
            pg_terms += -advantages[i].item() * weights[i] * len(response)
            tokens += len(response)
        kls, penalised = [], []
        for q, prompt in enumerate(PROMPTS):
            current = gather_token_logprobs(model(torch.tensor([prompt])).logits, torch.tensor([prompt]))[0, 1:]
            ref = reference.rows[q][1:] + query_kl_shift
            for values, shrink in ((kls, 0.0), (penalised, tolerance)):
                delta = ref - current
                delta = torch.sign(delta) * (delta.abs() - shrink).clamp(min=0)
                if estimator == "sequence_k3":  # k3 of the summed log-likelihoods (well inside the clamp here)
                    delta = delta.sum()
                values.append((torch.exp(delta) - delta - 1).mean().item())
    return pg_terms / tokens + algorithm_coef * sum(penalised) / len(penalised), sum(kls) / len(kls)


@pytest.fixture()
def setup(tiny_model_path, tiny_model):
    reference = ReferenceLogprobs(tiny_model, PROMPTS)
    return tiny_model_path, reference, rollout_batch(tiny_model), tiny_model


@pytest.mark.parametrize(("scoring", "tolerance"), [("exact", 0.0), ("shared_prompt", 0.0), ("shared_forward", 1e-3)])
@pytest.mark.parametrize("estimator", ["sequence_k3", "token_k3"])
@pytest.mark.parametrize("fused", [False, True])
def test_loss_matches_formula_at_step_zero(setup, estimator, scoring, tolerance, fused):
    """With the output layer fused into the log-probs (`model.fused_output_layer`) too."""
    path, reference, batch, model = setup
    # Shift the cached reference so that Query-KL is non-zero and its coefficient matters.
    shifted = copy.deepcopy(reference)
    shifted.rows = [row + 0.05 for row in reference.rows]
    module = make_module(
        path, shifted, query_kl_coef=0.5, query_kl_estimator=estimator, query_kl_scoring=scoring,
        fused_output_layer=fused,
    )  # fmt: skip
    assert module.algorithm.query_kl_estimator == estimator
    trainer = fit_one_batch(module, batch)
    # Exact scoring tolerates nothing; the shared forward takes float32's noise floor, resolved from model.dtype.
    assert module.algorithm.query_kl_tolerance == tolerance
    expected_loss, expected_kl = hand_loss(
        model, reference, 0.5, query_kl_shift=0.05, estimator=estimator, tolerance=tolerance
    )
    metrics = trainer.callback_metrics
    assert metrics["train/loss"].item() == pytest.approx(expected_loss, abs=1e-5)
    assert metrics["train/query_kl"].item() == pytest.approx(expected_kl, abs=1e-6)
    assert metrics["train/ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/logprob_abs_diff"].item() < 1e-5  # sampling log-probs came from the same weights
    assert metrics["train/entropy"].item() == pytest.approx(hand_response_entropy(model), abs=1e-5)
    assert module.policy_version == 1


def hand_response_entropy(model):
    """Mean over response tokens of the entropy (nats) of the tempered distribution each was sampled from."""
    entropies = []
    with torch.no_grad():
        for i, response in enumerate(RESPONSES):
            prompt = PROMPTS[i // 2]
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1] / TEMPERATURE
            entropies.append(torch.distributions.Categorical(logits=logits).entropy())
    return torch.cat(entropies).mean().item()


def test_rows_masked_by_the_rollout_leave_the_loss(setup):
    """Overlong filtering zeroes a row's response mask: the loss must follow the batch's mask."""
    path, reference, batch, model = setup
    batch.response_mask[1] = 0
    module = make_module(path, reference, query_kl_coef=0.5)
    trainer = fit_one_batch(module, batch)
    expected_loss, _ = hand_loss(model, reference, 0.5, masked_rows=(1,))
    assert trainer.callback_metrics["train/loss"].item() == pytest.approx(expected_loss, abs=1e-5)


@pytest.mark.parametrize(
    ("scoring", "query_forwards", "rows"),
    [("shared_forward", 0, [2, 2]), ("exact", 1, [2, 2]), ("shared_prompt", 1, [4])],
)
def test_exactly_one_forward_per_micro_batch(setup, scoring, query_forwards, rows):
    """Plus, with exact scoring or the shared prompt, one per query-scoring block: both prompts (5 and 3 tokens) pad
    to one width. Under the shared prompt the micro-batches forward their responses alone (4 columns), and the
    budget counts only those: all 4 rows fit 18 tokens (4 × 4), where [prompt; response] rows (9 wide) fit 2."""
    path, reference, batch, _ = setup
    module = make_module(path, reference, micro_batch_tokens=18, query_kl_scoring=scoring)  # rows are 9 wide
    calls = []
    module.configure_model()
    module.policy.register_forward_hook(
        lambda _, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    fit_one_batch(module, batch)
    assert len(calls) == len(rows) + query_forwards and [shape[0] for shape in calls[query_forwards:]] == rows
    assert calls[:query_forwards] == [torch.Size([QueryScoringLayout().rows, 64])] * query_forwards  # queries first
    if scoring == "shared_prompt":  # responses alone: at most the widest response's 4 tokens, no prompt column
        assert all(shape[1] <= 4 for shape in calls[query_forwards:])


def test_query_kl_zero_at_step_zero_then_logged_and_growing_for_grpo(setup):
    path, reference, batch, _ = setup
    module = make_module(path, reference, algorithm="grpo")
    trainer = fit_one_batch(module, batch)
    assert trainer.callback_metrics["train/query_kl"].item() < 1e-8
    module = make_module(path, reference, algorithm="grpo")
    module.hparams.learning_rate = 3e-2
    trainer = fit_one_batch(module, batch, steps=3)
    assert trainer.callback_metrics["train/query_kl"].item() > 1e-6  # the policy moved, queries drifted


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_loss_is_handled_as_configured(setup, policy):
    path, reference, batch, _ = setup
    batch.rewards = torch.tensor([float("nan"), 0.0, 0.0, 1.0])
    module = make_module(path, reference, nan_policy=policy)
    module.configure_model()
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match="non-finite loss at global step 0"):
            fit_one_batch(module, batch)
    else:
        trainer = fit_one_batch(module, batch, max_epochs=1)  # a skipped step does not count towards max_steps
        assert module.guard.skipped_steps == 1 and trainer.callback_metrics["train/skipped_steps"].item() == 1
    for key, value in module.policy.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} changed although the step had a NaN loss"


def test_reference_weights_are_logged_and_applied(setup):
    """The paper's w(q) (reference NLL / its training-set mean, clipped) reaches the metrics, and the loss only when
    use_query_weights is on."""
    path, reference, batch, model = setup
    expected = torch.tensor([4 / 3, 0.8])  # 4 nats (the mean of 3 and 5) / NLL
    for use in (True, False):
        trainer = fit_one_batch(make_module(path, reference, use_query_weights=use, query_kl_coef=0.5), batch)
        metrics = trainer.callback_metrics
        assert metrics["train/query_weight_mean"].item() == pytest.approx(expected.mean().item(), rel=1e-6)
        assert metrics["train/query_weight_max"].item() == pytest.approx(4 / 3, rel=1e-6)
        applied, _ = hand_loss(model, reference, 0.5)
        assert (metrics["train/loss"].item() == pytest.approx(applied, abs=1e-5)) == use
    clipped = fit_one_batch(make_module(path, reference, query_weight_clip=(0.9, 1.2)), batch)
    assert clipped.callback_metrics["train/query_weight_max"].item() == pytest.approx(1.2)
    assert clipped.callback_metrics["train/query_weight_min"].item() == pytest.approx(0.9)


class ReferenceWithoutNLL(ReferenceLogprobs):
    """The per-token reference log-probs of `ReferenceLogprobs`, but any read of the cache's NLL fails the test."""

    def __init__(self, reference):
        self.rows = reference.rows

    @property
    def nll(self):
        pytest.fail("the module read the reference cache's NLL")


@pytest.mark.parametrize("norm", ["dataset", "batch"])
def test_reference_weights_come_from_the_batch_not_the_cache(setup, norm):
    """The stream's scores are what the module weighs by: the dataset-static w(q) as carried (the carried values
    differ from what the cache would give), and under the batch norm the carried s(q) normalised by the step's mean;
    the cache's NLL is never read."""
    path, reference, batch, _ = setup
    module = make_module(path, ReferenceWithoutNLL(reference), query_weight_norm=norm, query_weight_clip="none")
    carried_nll = torch.tensor([2.0, 6.0])  # not the cache's 3 and 5
    batch = carrying_scores(batch, module.algorithm, carried_nll)
    if norm == "dataset":
        assert batch.query_weights.tolist() == pytest.approx([2.0, 2.0, 2 / 3, 2 / 3])  # mean 4 / s(q)
    trainer = fit_one_batch(module, batch, carry=False)
    metrics = trainer.callback_metrics
    assert metrics["train/query_weight_max"].item() == pytest.approx(2.0, rel=1e-6)  # 4 / 2
    assert metrics["train/query_weight_min"].item() == pytest.approx(2 / 3, rel=1e-6)  # 4 / 6


def test_carried_scores_that_do_not_fit_the_rule_are_refused(setup):
    """Precomputed w(q) only with a dataset-static rule, and always with it; per-step reference weights need s(q)."""
    path, reference, batch, _ = setup
    with pytest.raises(ValueError, match="w\\(q\\) is a constant of each query that the query stream carries"):
        fit_one_batch(make_module(path, reference), batch, carry=False)
    static = carrying_scores(batch, make_module(path, reference).algorithm, reference.nll)
    released = make_module(path, reference, algorithm="erpo_released")
    with pytest.raises(ValueError, match="carries precomputed w\\(q\\), but with model.query_weight_source 'current'"):
        fit_one_batch(released, static, carry=False)
    batch_norm = make_module(path, reference, query_weight_norm="batch")
    with pytest.raises(ValueError, match="from each query's reference NLL s\\(q\\), which this RolloutBatch"):
        fit_one_batch(batch_norm, batch, carry=False)
    assert released.policy_version == batch_norm.policy_version == 0  # refused before any update


def test_current_policy_weights_released_code_option(setup):
    """query_weight_source=current, query_weight_norm=batch, no clip: w(q) = mean NLL of the step's queries / NLL(q)."""
    path, reference, batch, model = setup
    module = make_module(
        path, reference, query_weight_source="current", query_weight_norm="batch", query_weight_clip="none"
    )
    assert module.algorithm.query_weight_clip is None
    trainer = fit_one_batch(module, batch)
    with torch.no_grad():
        nll = torch.stack([-r[1:].sum() for r in ReferenceLogprobs(model, PROMPTS).rows])  # θ0 = current at step 0
    expected = nll.mean() / nll
    metrics = trainer.callback_metrics
    assert metrics["train/query_weight_mean"].item() == pytest.approx(expected.mean().item(), rel=1e-5)
    assert metrics["train/query_weight_max"].item() == pytest.approx(expected.max().item(), rel=1e-5)


def test_one_step_raises_good_responses_and_lowers_bad_ones(setup):
    """The update direction: after one step, positive-advantage responses are likelier, negative ones less likely."""
    path, reference, batch, model = setup
    module = make_module(path, reference, algorithm="grpo")
    fit_one_batch(module, batch)

    def response_logprob(policy, row):
        full = torch.tensor([PROMPTS[row // 2] + RESPONSES[row]])
        with torch.no_grad():
            logits = policy(full).logits / TEMPERATURE
        return gather_token_logprobs(logits, full)[0, -len(RESPONSES[row]) :].sum().item()

    for row, reward in enumerate(REWARDS):
        before, after = response_logprob(model, row), response_logprob(module.policy, row)
        assert (after > before) == (reward == 1.0), (row, reward, before, after)


def test_dr_grpo_divides_by_the_rollouts_response_cap_unless_loss_constant_is_set(setup, tiny_model):
    """Dr. GRPO's constant is the response cap: the batch carries rollout.max_new_tokens, which an unset
    model.loss_constant takes (one value, not two); a set one wins; with neither the step is refused."""
    path, reference, _, _ = setup
    logprobs = rollout_batch(tiny_model).sampling_logprobs
    rows = [row[: len(response)].tolist() for row, response in zip(logprobs, RESPONSES, strict=True)]

    def loss(cap, **settings):
        rewards = [1.0, 0.0, 1.0, 0.0]  # Σ advantage × length ≠ 0: the summed loss is not 0
        batch = make_rollout(PROMPTS, RESPONSES, rewards, TEMPERATURE, rows, pad_token_id=PAD, max_new_tokens=cap)
        trainer = fit_one_batch(make_module(path, reference, algorithm="dr_grpo", **settings), batch)
        return trainer.callback_metrics["train/loss"].item()

    from_batch = loss(8)
    assert from_batch == pytest.approx(-(0.5 * 4 - 0.5 * 2 + 0.5 * 3 - 0.5 * 1) / 8 / 4, rel=1e-5)  # on-policy
    assert loss(None, loss_constant=8.0) == pytest.approx(from_batch, rel=1e-6)
    assert loss(8, loss_constant=16.0) == pytest.approx(from_batch / 2, rel=1e-5)
    with pytest.raises(ValueError, match="set model.loss_constant > 0, or train on rollouts that carry"):
        loss(None)


def test_training_without_reference_scores_says_how_to_get_them(setup):
    path, _, batch, _ = setup
    module = ERPOModule(str(path))
    with pytest.raises(RuntimeError, match="QueryDataModule"):
        fit_one_batch(module, batch)


def test_the_erpo_preset_is_the_papers_form(setup):
    """Paper: sequence k3 on summed ℓ, α = 0.01, weights from the data (reference NLL over the dataset), token-mean."""
    module = ERPOModule(str(setup[0]))
    algorithm = module.algorithm
    assert (algorithm.query_kl_estimator, algorithm.query_kl_coef, algorithm.loss_aggregation) == (
        "sequence_k3",
        0.01,
        "token_mean",
    )
    assert (algorithm.query_weight_source, algorithm.query_weight_norm, algorithm.query_weight_clip) == (
        "reference",
        "dataset",
        (0.0, 2.0),
    )
    assert (algorithm.query_kl_aggregation, algorithm.dual_clip, algorithm.advantage_eps) == ("per_query", None, 1e-6)


def test_invalid_settings_are_refused_at_construction_before_any_model_load(tmp_path):
    """A path that does not exist: every check below must fire before the model would be loaded."""
    missing = str(tmp_path / "no-model-here")
    assert ERPOModule(missing, algorithm="dr_grpo", loss_constant=256).algorithm.loss_aggregation == "seq_sum_constant"
    with pytest.raises(ValueError, match="model.advantage_estimator: 'foo'"):
        ERPOModule(missing, advantage_estimator="foo")
    with pytest.raises(ValueError, match="unknown model.algorithm 'erpo_paper'"):
        ERPOModule(missing, algorithm="erpo_paper")
    with pytest.raises(ValueError, match="model.kl_clamp_mode"):
        ERPOModule(missing, kl_clamp_mode="values")
    with pytest.raises(ValueError, match="model.dual_clip must be > 1"):
        ERPOModule(missing, dual_clip=0.5)
    with pytest.raises(ValueError, match="needs model.query_kl_estimator 'token_k3'"):
        ERPOModule(missing, query_kl_aggregation="like_pg")
    with pytest.raises(ValueError, match="model.query_weight_source 'current' with query_weight_norm 'dataset'"):
        ERPOModule(missing, query_weight_source="current")
    with pytest.raises(ValueError, match="model.query_weight_clip must be"):
        ERPOModule(missing, query_weight_clip=(2.0, 1.0))
    with pytest.raises(ValueError, match="model.advantage_eps must be >= 0"):
        ERPOModule(missing, advantage_eps=-1.0)


def parity_reward(responses, golds):
    return [float(len(text) % 2 == 0) for text in responses]


def test_groups_of_one_for_a_group_estimator_fail_at_setup_before_the_model_loads(
    tiny_model_path, tmp_path, benchmarks_dir
):
    """The Python API sets the module's algorithm and the callback's group size separately: the RolloutCallback
    checks them against each other in its `setup`, before configure_model loads the policy."""
    from erpo_lightning.callbacks.rollout import RolloutCallback
    from erpo_lightning.data import QueryDataModule
    from erpo_lightning.rollout import HFEngine

    module = ERPOModule(str(tiny_model_path), algorithm="rloo")
    datamodule = QueryDataModule(
        str(tiny_model_path), train=[{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 4}], template="plain",
        batch_size=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    rollout = RolloutCallback(HFEngine(), parity_reward, group_size=1)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[rollout])
    with pytest.raises(ValueError, match="rollout.group_size must be >= 2 with the 'rloo' advantage estimator"):
        trainer.fit(module, datamodule=datamodule)
    assert module.policy is None  # no model loaded, nothing generated


def test_the_compute_dtype_has_one_owner_and_lightning_precision_cannot_go_around_it(setup):
    """Issue 38 item 5. Without FSDP2 `fsdp_mixed_precision` changes nothing: the policy computes in `dtype`, so the
    shared forward's default tolerance is float32's (it took bfloat16's 0.1 before), as the data module's reference
    dtype is. And a Lightning precision plugin is refused, naming the module's settings."""
    path, reference, batch, _ = setup
    module = make_module(path, reference, fsdp_mixed_precision="bfloat16", query_kl_scoring="shared_forward")
    fit_one_batch(module, batch)
    assert module.algorithm.query_kl_tolerance == obj.query_kl_tolerance_for(torch.float32) == 1e-3
    for precision in ("16-true", "bf16-mixed", "bf16-true"):  # (on CPU Lightning turns 16-mixed into bf16-mixed)
        with pytest.raises(ValueError, match=rf"trainer.precision '{precision}' is not used: .* model.dtype"):
            fit_one_batch(make_module(path, reference), batch, precision=precision)
