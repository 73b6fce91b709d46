"""The optimizer and its schedule: AdamW + linear warm-up by default, any pair from the config, one owner each."""

from functools import partial

import pytest
import torch
import yaml
from helpers.fit_configs import fit_config, run_erpo, write_config
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau, StepLR

from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.optim import LinearWarmup, NonFiniteGuard, NonFiniteLossError, build_optimizer


def lr_sequence(optimizer, schedule, steps):
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_default_is_adamw_with_the_linear_warmup_of_before():
    parameter = torch.nn.Parameter(torch.zeros(3))
    optimizer, schedule = build_optimizer([parameter], None, None, 1e-4, 0.01, warmup_steps=3)
    assert type(optimizer) is torch.optim.AdamW and type(schedule) is LinearWarmup
    assert optimizer.param_groups[0]["weight_decay"] == 0.01
    lrs = lr_sequence(optimizer, schedule, 6)
    assert lrs == pytest.approx([0.25e-4, 0.5e-4, 0.75e-4, 1e-4, 1e-4, 1e-4], rel=1e-12, abs=0)  # by hand: (s+1)/4
    # Bit for bit the schedule the module built before optimizers were configurable.
    reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=1e-4, weight_decay=0.01)
    assert lrs == lr_sequence(reference, LambdaLR(reference, lambda step: min(1.0, (step + 1) / 4)), 6)


def test_learning_rate_default_and_weight_decay_owner(tmp_path):
    missing = str(tmp_path / "no-model-here")  # nothing below loads a model
    for kwargs, weight_decay in (({}, 0.0), ({"algorithm": "erpo_released"}, 0.01), ({"weight_decay": 0.05}, 0.05)):
        module = ERPOModule(missing, **kwargs)
        module.policy = torch.nn.Linear(2, 2)  # stands in for the loaded policy: only its parameters are used
        optimizer = module.configure_optimizers()["optimizer"]
        assert type(optimizer) is torch.optim.AdamW
        assert optimizer.param_groups[0]["lr"] == 1e-6  # warm-up 0: the full rate from the first step
        assert optimizer.param_groups[0]["weight_decay"] == weight_decay


def test_a_configured_optimizer_owns_its_settings(tmp_path):
    missing = str(tmp_path / "no-model-here")
    sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"model.learning_rate is set together with model.optimizer.*init_args.lr"):
        ERPOModule(missing, optimizer=sgd, learning_rate=1e-3)
    with pytest.raises(ValueError, match="model.weight_decay is set together with model.optimizer"):
        ERPOModule(missing, algorithm="erpo_released", optimizer=sgd, weight_decay=0.01)
    with pytest.raises(ValueError, match="model.warmup_steps is set together with model.lr_scheduler"):
        ERPOModule(missing, lr_scheduler=partial(StepLR, step_size=1), warmup_steps=2)
    # The preset's weight decay configures the default AdamW only; the default warm-up applies to any optimizer.
    module = ERPOModule(missing, algorithm="erpo_released", optimizer=sgd, warmup_steps=1)
    module.policy = torch.nn.Linear(2, 2)
    configured = module.configure_optimizers()
    optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["weight_decay"] == 0
    assert lr_sequence(optimizer, schedule, 3) == pytest.approx([0.05, 0.1, 0.1], rel=1e-12)


def test_a_schedule_that_needs_a_metric_is_refused():
    with pytest.raises(ValueError, match="ReduceLROnPlateau needs a monitored metric"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], None, ReduceLROnPlateau, None, 0.0, 0)


def test_non_finite_guard_counts_and_stops():
    guard = NonFiniteGuard("skip", max_consecutive_skips=2)
    assert guard.finite("loss", torch.tensor(1.0), "step 0")
    assert not guard.finite("loss", torch.tensor(float("nan")), "step 1")
    guard.record(stepped=False)
    guard.record(stepped=True)
    guard.record(stepped=False)
    assert (guard.skipped_steps, guard.consecutive_skips) == (2, 1)
    with pytest.raises(NonFiniteLossError, match="2 optimizer steps in a row"):
        guard.record(stepped=False)
    with pytest.raises(NonFiniteLossError, match="non-finite gradient norm at step 3; set model.nan_policy=skip"):
        NonFiniteGuard("stop").finite("gradient norm", torch.tensor(float("inf")), "step 3")
    with pytest.raises(ValueError, match="model.max_consecutive_skips must be >= 1"):
        NonFiniteGuard("skip", max_consecutive_skips=0)


PARITY_REWARD = '''
class ParityReward:
    """A reward the untrained tiny model earns about half the time, so advantages (and updates) are not zero."""

    def __call__(self, responses, golds):
        return [float(sum(map(ord, text)) % 2 == 0) for text in responses]
'''


def fit(tmp_path, config_path, run, *args):
    checkpoints = tmp_path / run / "checkpoints"
    callback = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(checkpoints), "every_n_train_steps": 1, "save_top_k": -1, "filename": "{step}"},
    }
    callbacks = yaml.safe_dump([callback], default_flow_style=True).strip()
    args = ("--trainer.default_root_dir", str(tmp_path / run), "--trainer.callbacks", callbacks, *args)
    done = run_erpo("fit", "--config", str(config_path), *args, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    return checkpoints


@pytest.mark.slow
def test_sgd_with_step_schedule_from_yaml_trains_and_resumes(tmp_path, tiny_model_path, benchmarks_dir):
    (tmp_path / "parity_reward.py").write_text(PARITY_REWARD)
    optimizer = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05, "momentum": 0.9}}
    schedule = {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 1, "gamma": 0.5}}
    config = fit_config(
        tiny_model_path,
        [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 8}],
        tmp_path,
        trainer={"enable_progress_bar": False},
        model={"optimizer": optimizer, "lr_scheduler": schedule},
        data={"cache_dir": str(tmp_path / "reference")},
        rollout={"reward": {"class_path": "parity_reward.ParityReward"}, "group_size": 4},
    )
    config_path = write_config(tmp_path / "sgd.yaml", config)
    full = fit(tmp_path, config_path, "full")
    resumed = fit(tmp_path, config_path, "resumed", "--ckpt_path", str(full / "step=1.ckpt"))
    assert sorted(path.name for path in resumed.iterdir()) == ["step=2.ckpt"]  # it continued from step 1
    load = partial(torch.load, map_location="cpu", weights_only=True)
    first, last, last_resumed = load(full / "step=1.ckpt"), load(full / "step=2.ckpt"), load(resumed / "step=2.ckpt")
    group = last["optimizer_states"][0]["param_groups"][0]
    assert "betas" not in group and group["momentum"] == 0.9  # SGD, not the default AdamW
    assert group["lr"] == pytest.approx(0.05 * 0.5**2, rel=1e-12)  # StepLR stepped once per optimizer step
    assert last["lr_schedulers"][0]["last_epoch"] == 2
    weights = last["state_dict"]
    assert any(not torch.equal(weights[key], first["state_dict"][key]) for key in weights)  # the second step moved it
    for key in weights:
        torch.testing.assert_close(last_resumed["state_dict"][key], weights[key], atol=1e-7, rtol=0)
    momentum, resumed_momentum = last["optimizer_states"][0]["state"], last_resumed["optimizer_states"][0]["state"]
    assert momentum.keys() == resumed_momentum.keys() and momentum
    for index in momentum:
        torch.testing.assert_close(resumed_momentum[index]["momentum_buffer"], momentum[index]["momentum_buffer"])
