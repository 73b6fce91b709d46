"""A resume continues the same run (issue 30): a flag given with `--ckpt_path` either applies (RESUMABLE_FIELDS) or
is refused before anything loads, naming the field; `erpo validate` refuses a checkpoint of another model."""

import pytest
import torch
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.resume_runs import run_main

from erpo_lightning.checkpoints.resume_config import CONFIG_KEY, check_resume_config
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.toy.tiny_qwen2 import save_tiny_model


@pytest.fixture()
def one_step(tmp_path, tiny_model_path, benchmarks_dir):
    """A 1-step `erpo fit` run (lr 1e-3) with `last.ckpt`; (its config file, the checkpoint)."""
    folder = tmp_path / "ckpt"
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(folder), "save_last": True},
    }
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", callbacks=[checkpoint], max_steps=1)
    assert run_main("fit", "--config", str(config)) == 0
    return config, folder / "last.ckpt"


@pytest.mark.slow  # `erpo fit` runs
def test_a_resume_refuses_changed_settings_and_applies_the_allowed_ones(one_step, tmp_path, capsys):
    config, last = one_step
    resume = ("fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "2")
    capsys.readouterr()
    line = fails_in_one_line(capsys, *resume, "--model.learning_rate", "0.01")
    assert f"ckpt_path: this run differs from the run that wrote {last} in model.learning_rate: 0.001 -> 0.01." in line
    assert "may change only seed_everything, trainer.max_steps, " in line
    line = fails_in_one_line(capsys, *resume, "--model.algorithm", "grpo")
    assert "in model.algorithm: 'erpo' -> 'grpo'." in line, line
    line = fails_in_one_line(capsys, *resume, "--model.learning_rate", "null", "--model.optimizer", "SGD")
    # not KeyError 'momentum'
    assert "in model.learning_rate: 0.001 -> None; model.optimizer: None -> {'class_path': 'torch.optim.SGD'" in line
    assert torch.load(last, weights_only=False)["global_step"] == 1  # nothing ran
    assert run_main(*resume) == 0  # max_steps may change: applied ...
    assert torch.load(last, weights_only=False)["global_step"] == 2
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["trainer"]["max_steps"] == 2 and recorded["ckpt_path"] == "last"  # ... and recorded


@pytest.mark.slow  # `erpo fit` runs
def test_a_resume_accepts_the_same_settings_written_otherwise(one_step, tiny_model_path, monkeypatch, capsys):
    """The model folder as a relative path, and erpo's own clip_low written out, are the run's settings; a changed
    grader preset is named alone, not as both rewards' whole init_args."""
    config, last = one_step
    resume = ("fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "2")
    capsys.readouterr()
    line = fails_in_one_line(capsys, *resume, "--rollout.reward.init_args.preset", "lenient")
    assert "in rollout.reward.init_args.preset: 'strict' -> 'lenient'. A resume" in line, line
    monkeypatch.chdir(tiny_model_path.parent)
    assert run_main(*resume, "--model.model_path", tiny_model_path.name, "--model.clip_low", "0.2") == 0
    assert torch.load(last, weights_only=False)["global_step"] == 2


@pytest.mark.slow  # an `erpo fit` run
def test_a_fresh_run_in_a_finished_runs_folder_is_refused_before_the_model_loads(one_step, capsys):
    config, last = one_step
    names = sorted(path.name for path in last.parent.iterdir())
    capsys.readouterr()
    line = fails_in_one_line(capsys, "fit", "--config", str(config))
    assert f"{last.parent} already holds checkpoints of an earlier run (epoch=0-step=1.ckpt, last.ckpt): " in line
    assert "to continue that run, add --ckpt_path last; to start over, give this run another folder" in line
    assert sorted(path.name for path in last.parent.iterdir()) == names  # no last-v1.ckpt


@pytest.mark.slow  # `erpo fit` runs
def test_validate_refuses_a_checkpoint_of_another_model(one_step, tmp_path, tiny_model_path, capsys):
    config, last = one_step
    other = save_tiny_model(tmp_path / "other_model", seed=1)  # same architecture: the weights would load
    capsys.readouterr()
    line = fails_in_one_line(
        capsys, "validate", "--config", str(config), "--model.model_path", str(other), "--ckpt_path", str(last)
    )
    assert f"was trained from model_path {tiny_model_path}, but model.model_path is {other}" in line, line


def test_a_checkpoint_without_the_cli_config_is_compared_by_its_module_settings():
    checkpoint = {
        "hyper_parameters": {
            "learning_rate": 1e-3,
            "algorithm": "erpo",
            "query_weight_clip": (0.5, 2.0),
            "temperature": 1.0,
        }
    }  # temperature: a module hyperparameter until the rollout batch carried it; today's model group has none
    same = {"model": {"learning_rate": 1e-3, "algorithm": "erpo", "query_weight_clip": [0.5, 2.0]}}
    check_resume_config(checkpoint, {**same, "trainer": {"max_steps": 9}}, "old.ckpt")
    with pytest.raises(SettingsError, match="wrote old.ckpt in model.learning_rate: 0.001 -> 0.1. A resume"):
        check_resume_config(checkpoint, {"model": {**same["model"], "learning_rate": 0.1}}, "old.ckpt")


def test_a_sharded_checkpoint_folder_is_checked_through_its_metadata(tmp_path):
    from erpo_lightning.checkpoints.files import read_checkpoint
    from erpo_lightning.checkpoints.resume_config import check_checkpoint_model

    folder = tmp_path / "last.ckpt"  # what ModelParallelStrategy writes: tensor shards plus meta.pt
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"")
    torch.save(
        {"erpo_config": {"model": {"algorithm": "erpo"}}, "hyper_parameters": {"model_path": "a"}}, folder / "meta.pt"
    )
    with pytest.raises(SettingsError, match="model.algorithm: 'erpo' -> 'grpo'"):
        check_resume_config(read_checkpoint(folder), {"model": {"algorithm": "grpo"}}, str(folder))
    with pytest.raises(SettingsError, match="was trained from model_path a, but model.model_path is b"):
        check_checkpoint_model(read_checkpoint(folder), "b", str(folder))
    assert read_checkpoint(tmp_path) == {}  # a folder without meta.pt: nothing to compare


def test_a_checkpoint_whose_module_still_had_a_temperature_loads_and_resumes(tmp_path, tiny_model_path):
    """Checkpoints written while the module held `temperature` (linked to rollout.temperature) carry it in their
    hyperparameters and, when written by `erpo fit`, `rollout.temperature` in their config: both still load."""
    import lightning

    from erpo_lightning.modules.erpo_module import ERPOModule

    module = ERPOModule(str(tiny_model_path), learning_rate=1e-3)
    module.configure_model()
    old_config = {"model": {"model_path": str(tiny_model_path), "learning_rate": 1e-3}, "rollout": {"temperature": 0.7}}
    path = tmp_path / "old.ckpt"
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": {**module.hparams, "temperature": 0.7},
            "erpo_config": old_config,
            "pytorch-lightning_version": lightning.__version__,
        },
        path,
    )
    loaded = ERPOModule.load_from_checkpoint(path)
    assert "temperature" not in loaded.hparams and loaded.hparams.learning_rate == 1e-3
    for name, tensor in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    checkpoint = torch.load(path, weights_only=True)
    check_resume_config(checkpoint, old_config, str(path))  # the same run's settings: resumable
    with pytest.raises(SettingsError, match=r"rollout.temperature: 0.7 -> 1.0"):
        check_resume_config(checkpoint, {**old_config, "rollout": {"temperature": 1.0}}, str(path))


def fit_settings(model_path: str, **model) -> dict:
    """The parts of an `erpo fit` config (as config.yaml holds it) that the resume comparisons below are about."""
    reward = {
        "class_path": "erpo_lightning.rewards.MathReward",
        "init_args": {"num_workers": 0, "preset": "strict", "conventions": None, "accept_approximations": None},
    }
    return {
        "model": {"model_path": model_path, "algorithm": "erpo", "clip_low": None, "query_kl_coef": None, **model},
        "data": {"model_path": model_path, "train": [{"path": "train.jsonl", "limit": 8}]},
        "rollout": {"reward": reward, "group_size": 2},
    }


def test_a_resume_compares_paths_by_the_folder_they_name(tmp_path, monkeypatch, tiny_model_path):
    monkeypatch.chdir(tiny_model_path.parent)
    (tiny_model_path.parent / "train.jsonl").write_text("")
    written = {CONFIG_KEY: fit_settings(tiny_model_path.name)}  # relative, as the first run was given it
    absolute = fit_settings(str(tiny_model_path))
    absolute["data"]["train"][0]["path"] = str(tiny_model_path.parent / "train.jsonl")
    check_resume_config(written, absolute, "last.ckpt")  # the same folder and file: no change
    other = save_tiny_model(tmp_path / "other", seed=1)
    with pytest.raises(SettingsError, match=f"in data.model_path: 'model' -> '{other}'; model.model_path: "):
        check_resume_config(written, fit_settings(str(other)), "last.ckpt")


def test_a_resume_compares_loss_fields_by_their_value_in_effect():
    written = {CONFIG_KEY: fit_settings("m")}
    check_resume_config(written, fit_settings("m", clip_low=0.2, query_kl_coef=0.01), "last.ckpt")  # erpo's own
    with pytest.raises(SettingsError, match=r"in model\.clip_low: None -> 0\.3\. A resume"):
        check_resume_config(written, fit_settings("m", clip_low=0.3), "last.ckpt")
    with pytest.raises(SettingsError, match=r"in model\.algorithm: 'erpo' -> 'grpo'\. A resume"):  # only the preset
        check_resume_config(written, fit_settings("m", algorithm="grpo", query_kl_coef=0.01), "last.ckpt")


def test_a_changed_reward_names_only_the_changed_argument():
    written = {CONFIG_KEY: fit_settings("m")}
    lenient = fit_settings("m")
    lenient["rollout"]["reward"]["init_args"]["preset"] = "lenient"
    with pytest.raises(SettingsError) as refused:
        check_resume_config(written, lenient, "last.ckpt")
    changes = str(refused.value).partition(" in ")[2].partition(". A resume")[0]
    assert changes == "rollout.reward.init_args.preset: 'strict' -> 'lenient'", changes  # not both init_args dicts
    restated = fit_settings("m")  # strict's own value of a convention, written out: no change in grading
    restated["rollout"]["reward"]["init_args"].update(
        accept_approximations=False, conventions={"unevaluated_arithmetic": False}
    )
    check_resume_config(written, restated, "last.ckpt")
    other = fit_settings("m")
    other["rollout"]["reward"] = {"class_path": "tests.Reward", "init_args": {}}
    with pytest.raises(SettingsError, match=r"in rollout\.reward\.class_path: 'erpo_lightning.rewards.MathReward' -> "):
        check_resume_config(written, other, "last.ckpt")
