"""`model.compile`: the policy's decoder layers under `torch.compile`, the reference cache computed through the same
compiled layers (`+compiled` in its compute path, the cache fingerprint's `dtype`), so Query-KL is exactly 0 at θ0;
refused with the shared prompt, whose prompt forward carries a key/value cache the compiled layers do not take."""

import lightning as L
import pytest
import torch
from helpers.batches import carrying_scores, rollout_loader
from helpers.module_steps import PROMPTS, fit_one_batch, rollout_batch

from erpo_lightning.data.cache import ReferenceLogprobCache
from erpo_lightning.data.cache_build import ComputePath, load_reference_model, policy_compute_dtype
from erpo_lightning.data.reference_logprobs import batch_query_logprobs
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.scoring.layers import decoder_layers
from erpo_lightning.scoring.queries import QueryScoringLayout


def test_the_compiled_path_is_named_in_the_cache_fingerprint(tiny_model_path):
    path = ComputePath("float32", "bfloat16", False, True)
    assert path.name == "float32+autocast_bfloat16+compiled" and ComputePath.parse(path.name) == path
    assert ComputePath.parse("float32") == ComputePath("float32")  # caches before the setting read as uncompiled
    module = ERPOModule(str(tiny_model_path), compile=True, query_kl_scoring="exact")
    assert policy_compute_dtype(module) == "float32+compiled"
    assert policy_compute_dtype(ERPOModule(str(tiny_model_path))) == "float32"


def test_compile_is_refused_with_the_shared_prompt(tiny_model_path):
    for scoring in ({}, {"query_kl_scoring": "shared_prompt"}):  # the shared prompt is the default
        with pytest.raises(
            ValueError, match="model.compile cannot be used with model.query_kl_scoring 'shared_prompt'"
        ):
            ERPOModule(str(tiny_model_path), compile=True, **scoring)


@pytest.mark.slow  # inductor compiles the layers' inference and training graphs: about a minute on 2 loaded cores
def test_query_kl_is_exactly_zero_at_theta0_with_compiled_layers(tiny_model_path):
    """The cache built as `erpo cache` builds it (the reference model loaded along the policy's compute path, its
    layers compiled, no grad) against the step's exact query pass (the policy's compiled layers, with grad): every
    query's log-likelihood change is exactly 0 at θ0, so the logged Query-KL is exactly 0."""
    module = ERPOModule(str(tiny_model_path), compile=True, query_kl_scoring="exact", learning_rate=1e-3)
    module.configure_model()
    assert all(getattr(layer.forward, "erpo_compiled", None) for layer in decoder_layers(module.policy))
    module.reference_cache = compiled_cache(tiny_model_path, module)
    trainer = fit_one_batch(module, rollout_batch(module.policy))
    assert trainer.callback_metrics["train/query_kl"].item() == 0.0
    assert trainer.callback_metrics["train/query_loglik_change"].item() == 0.0


def compiled_cache(model_path, module):
    """θ0's query scores as `erpo cache` computes them for `module` (its compute path, its layers compiled)."""
    reference = load_reference_model(str(model_path), policy_compute_dtype(module), "cpu")
    layout = QueryScoringLayout()
    with torch.no_grad():
        return ReferenceLogprobCache.from_rows(batch_query_logprobs(reference, PROMPTS, layout), layout)


@pytest.mark.slow  # three short fits with compiled layers (the compiled graphs are reused from the first)
def test_a_compiled_run_resumes_bit_exactly(tiny_model_path, tmp_path):
    """Two steps in one run, or one step, a checkpoint, and the second step in a new process-like module and
    trainer: the same weights to the bit (the compiled kernels are as deterministic as the eager ones on CPU)."""

    def fit(steps, ckpt_path=None, save=None):
        built = ERPOModule(str(tiny_model_path), compile=True, query_kl_scoring="exact", learning_rate=1e-2)
        built.configure_model()
        built.reference_cache = cache
        if ckpt_path is not None:  # weights the checkpoint must replace: a resume that read nothing would differ
            with torch.no_grad():
                for parameter in built.policy.parameters():
                    parameter.add_(0.01)
        trainer = L.Trainer(
            max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(built, train_dataloaders=rollout_loader([batch] * 2), ckpt_path=ckpt_path)
        if save is not None:
            trainer.save_checkpoint(save)
        return {name: value.clone() for name, value in built.policy.state_dict().items()}

    first = ERPOModule(str(tiny_model_path), compile=True, query_kl_scoring="exact")
    cache = compiled_cache(tiny_model_path, first)
    first.configure_model()
    batch = carrying_scores(rollout_batch(first.policy), first.algorithm, cache.nll)
    whole = fit(2)
    fit(1, save=tmp_path / "step1.ckpt")
    resumed = fit(2, ckpt_path=tmp_path / "step1.ckpt")
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
    theta0 = first.policy.state_dict()
    assert any(not torch.equal(whole[name], theta0[name]) for name in whole)  # the two steps did move the weights
