"""Issue 54 items 14 and 15: the errors a newcomer meets say what to do, and one flag moves a run.

Every case but one calls `erpo_lightning.cli.main` in this process and fails at parse time (no model, data or cache is
touched); the run outside the environment is the one subprocess. Item 15 instantiates the quickstart's trainer with
`run=False`: the loggers and the checkpoint folder are read, nothing is trained.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.cli.command import ERPOCLI, ERPOArgumentParser, ERPOLightningTrainer
from erpo_lightning.data import QueryDataModule
from erpo_lightning.data.files import DataError, read_local_file
from erpo_lightning.modules.erpo_module import ERPOModule

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
# The shipped configs that set a logger: the quickstart, its logger overlays and the SmolLM2 ones.
RUN_CONFIGS = [
    CONFIGS / "quickstart.yaml",
    *sorted(CONFIGS.glob("logger_*.yaml")),
    *sorted(CONFIGS.glob("smollm2_*.yaml")),
]


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--model.learning_rat", "5", "unknown option --model.learning_rat (did you mean --model.learning_rate?)"),
        ("--trainer.max_step", "3", "(did you mean --trainer.max_steps?)"),
        ("--rollout.reward.init_args.num_work", "2", "takes no option 'num_work' (did you mean 'num_workers'?)"),
    ],
)
def test_an_abbreviated_flag_is_refused(capsys, flag, value, expected):
    # --print_config: were the flag accepted, erpo would print the config and exit 0 instead of training.
    line = fails_in_one_line(capsys, "fit", "--config", QUICKSTART, flag, value, "--print_config")
    assert expected in line


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--rollout.temprature", "unknown option --rollout.temprature (did you mean --rollout.temperature?)"),
        ("--model.peft.alph", "model.peft: no field 'alph' (did you mean 'alpha'?)"),
        ("--trainer.logger.init_args.save_di", "CSVLogger takes no option 'save_di' (did you mean 'save_dir'?)"),
    ],
)
def test_a_misspelt_nested_key_names_the_closest_one(capsys, flag, expected):
    line = fails_in_one_line(capsys, "fit", "--config", QUICKSTART, flag, "1", "--print_config")
    assert expected in line


def test_a_misspelt_key_in_a_config_file_names_the_closest_one(capsys, tmp_path):
    overlay = tmp_path / "typo.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"learning_rat": 5}}))
    line = fails_in_one_line(capsys, "fit", "--config", QUICKSTART, "--config", str(overlay), "--print_config")
    assert "model: unknown key 'learning_rat' (did you mean 'learning_rate'?)" in line


def test_a_config_without_a_model_path_says_how_to_get_one(capsys):
    line = fails_in_one_line(capsys, "fit", "--config", str(CONFIGS / "smollm2_arith.yaml"))
    assert "model.model_path is required" in line
    assert "make real-model" in line and "python -m erpo_lightning.real_model" in line
    assert "Expected a <class 'str'>" not in line


def test_a_class_path_in_a_users_module_suggests_pythonpath(capsys, tmp_path):
    overlay = tmp_path / "reward.yaml"
    overlay.write_text(yaml.safe_dump({"rollout": {"reward": {"class_path": "my_rewards_absent.Score"}}}))
    line = fails_in_one_line(capsys, "fit", "--config", QUICKSTART, "--config", str(overlay))
    assert "No module named 'my_rewards_absent'" in line
    assert "PYTHONPATH=." in line and "my_rewards_absent.py" in line


def test_outside_the_environment_one_line_says_to_use_the_venv(tmp_path):
    # A dependency that cannot be imported, as in a Python without the project's packages.
    shadow = tmp_path / "shadow" / "jsonargparse"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'jsonargparse'\", name='jsonargparse')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    erpo = Path(sys.executable).parent / "erpo"
    done = subprocess.run([str(erpo), "fit"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert ".venv/bin/erpo" in done.stderr and "make env" in done.stderr


def test_a_missing_data_file_names_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as raised:
        read_local_file(Path("data") / "train.jsonl")
    message = str(raised.value)
    assert message.startswith("data/train.jsonl: no such file")
    assert str(tmp_path / "data" / "train.jsonl") in message and f"working directory {tmp_path}" in message


def quickstart_trainer(*args: str) -> ERPOLightningTrainer:
    """The quickstart's trainer as `erpo fit` builds it from `args` (after the config), without running anything."""
    cli = ERPOCLI(
        ERPOModule,
        QueryDataModule,
        trainer_class=ERPOLightningTrainer,
        parser_class=ERPOArgumentParser,
        auto_configure_optimizers=False,
        run=False,
        args=["--config", QUICKSTART, "--model.model_path", str(ROOT / "erpo_lightning" / "toy" / "shipped"), *args],
    )
    return cli.trainer


def test_default_root_dir_moves_the_checkpoints_and_every_logger(tmp_path):
    root = tmp_path / "elsewhere"
    overlay = str(CONFIGS / "logger_tensorboard.yaml")
    trainer = quickstart_trainer("--config", overlay, "--trainer.default_root_dir", str(root))
    assert [(type(logger).__name__, Path(logger.save_dir)) for logger in trainer.loggers] == [
        ("CSVLogger", root),
        ("TensorBoardLogger", root),
    ]
    folders = [
        Path(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
    ]
    assert folders and all(root in folder.parents for folder in folders), folders


def test_one_logger_flag_for_several_loggers_is_refused(capsys, tmp_path):
    overlay = str(CONFIGS / "logger_tensorboard.yaml")
    args = ("--config", QUICKSTART, "--config", overlay, "--trainer.logger.init_args.save_dir", str(tmp_path))
    # A checkpoint that is not there: were the flag accepted, erpo would stop at it instead of training.
    args += ("--ckpt_path", str(tmp_path / "none.ckpt"))
    line = fails_in_one_line(capsys, "fit", *args)
    assert "would change only the last of the 2 configured loggers" in line and "--trainer.default_root_dir" in line


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda path: path.name)
def test_no_shipped_logger_or_checkpoint_names_a_folder_of_its_own(path):
    """What lets --trainer.default_root_dir move them: none of these settings may pin a run folder."""
    trainer = yaml.safe_load(path.read_text())["trainer"]
    loggers = trainer["logger"] if isinstance(trainer["logger"], list) else [trainer["logger"]]
    for logger in loggers:
        assert not {"save_dir", "tracking_uri"} & set(logger.get("init_args", {})), logger
    for callback in trainer.get("callbacks", []):
        assert "dirpath" not in callback.get("init_args", {}), callback
