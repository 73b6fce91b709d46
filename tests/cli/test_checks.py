"""What `erpo` checks of its command line and config files before anything is built (`cli/checks.py`): a key given
twice, a misspelt top-level key, a setting that moved, a negative number after a flag, model paths, the loggers'
folders (one flag moves a run: `--trainer.default_root_dir`) and a sweep given to `fit`; each refused in one line
naming the field. The `erpo` runs are in this process."""

from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.fit_configs import fit_config
from lightning.pytorch.callbacks import ModelCheckpoint

from erpo_lightning.cli.checks import repeated_key
from erpo_lightning.cli.command import ERPOCLI, ERPOArgumentParser, ERPOLightningTrainer
from erpo_lightning.data import QueryDataModule
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.toy import SHIPPED_DIR


@pytest.fixture()
def config(tmp_path, tiny_model_path, benchmarks_dir):
    return tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--model.learning_rate", "-1e-3"], "model.learning_rate must be >= 0 (or null), got -0.001"),
        (["--rollout.temperature", "-1E-2"], "rollout.temperature must be > 0"),
        (["--model.weight_decay", "-.5e1", "--model.learning_rate", "1e-3"], "model.weight_decay must be >= 0"),
    ],
)
def test_a_negative_number_after_a_space_is_the_flags_value(config, capsys, overrides, message):
    """Issue 43 item 12: `--model.learning_rate -1e-3` was "expected one argument" (argparse took the value for an
    option); now the value is parsed and the setting's own rule refuses it."""
    assert message in fails_in_one_line(capsys, "fit", "--config", str(config), *overrides)


def test_bad_model_paths_are_named(config, capsys, tmp_path, monkeypatch):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--model.model_path", str(empty))
    assert line.endswith(f"model.model_path: no model at {empty} (no config.json)")
    missing = tmp_path / "missing_model"
    line = fails_in_one_line(capsys, "cache", "--config", str(config), "--model.model_path", str(missing))
    assert f"no model at {missing} (no config.json; the directory does not exist)" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # an empty Hugging Face cache
    line = fails_in_one_line(capsys, "validate", "--config", str(config), "--model.model_path", "someorg/some-model")
    assert "model.model_path: someorg/some-model is not a local path and no hub access" in line


def test_misspelt_top_level_key_is_named_with_the_closest_one(config, capsys, tmp_path):
    content = yaml.safe_load(config.read_text())
    content["modle"] = content.pop("model")
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(yaml.safe_dump(content))
    line = fails_in_one_line(capsys, "fit", "--config", str(misspelt))
    assert line == f"erpo: error: {misspelt}: unknown top-level key 'modle'; did you mean 'model'?"


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("weight_source", "current", "model.query_weight_source (reference | current"),
        ("weight_norm", "batch", "model.query_weight_norm (dataset | batch)"),
        ("weight_clip", None, "model.query_weight_clip ([lo, hi] or none)"),
    ],
)
def test_a_moved_weight_setting_names_its_new_place(config, capsys, tmp_path, old, value, new):
    """w(q)'s settings moved from `data` to the algorithm (`model`): an old config file or flag says where."""
    content = yaml.safe_load(config.read_text())
    content["data"][old] = value
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump(content))
    line = fails_in_one_line(capsys, "fit", "--config", str(legacy))
    assert line.startswith(f"erpo: error: data.{old} has moved: w(q) is the algorithm's, set {new}"), line
    flag = fails_in_one_line(capsys, "fit", "--config", str(config), f"--data.{old}={value}")
    assert flag == line


def config_file(tmp_path, **changes) -> str:
    """A valid 2-step config of the shipped toy model, as YAML text (`changes` by section)."""
    train = [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 8}]
    return yaml.safe_dump(fit_config(SHIPPED_DIR, train, tmp_path / "run", **changes), sort_keys=False)


# --------------------------------------------------------------------------- issue 54 item 8: a key given twice
@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("a: 1\nb: 2\na: 3\n", ("a", 1, 3)),
        ("model:\n  learning_rate: 1\n  algorithm: erpo\n  learning_rate: 5\n", ("model.learning_rate", 2, 4)),
        ("data:\n  train:\n    - {path: x, limit: 1, limit: 2}\n", ("data.train[0].limit", 3, 3)),
        ("a: 1\nb: {a: 1}\n", None),  # the same name in two mappings is not a repetition
        ("base: &base {x: 1}\none: {<<: *base, y: 2}\ntwo: {<<: *base, z: 3}\n", None),
    ],
    ids=["top level", "nested", "in a list", "two mappings", "merge keys"],
)
def test_repeated_keys_are_found_at_any_depth_with_their_lines(text, found):
    assert repeated_key(yaml.compose(text, Loader=yaml.SafeLoader)) == found


def test_a_config_file_giving_a_key_twice_is_refused_naming_the_key_the_lines_and_the_file(tmp_path, capsys):
    text = config_file(tmp_path).replace("  algorithm: erpo\n", "  algorithm: erpo\n  algorithm: grpo\n")
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    lines = [number for number, line in enumerate(text.splitlines(), 1) if line == "  algorithm: grpo"]
    line = fails_in_one_line(capsys, "fit", "--config", str(path))
    assert line == (
        f"erpo: error: {path}: key 'model.algorithm' is given twice (lines {lines[0] - 1} and {lines[0]}); YAML would "
        "silently keep the second: remove one of them"
    )


def test_a_config_file_without_repeated_keys_still_parses(tmp_path, capsys):
    path = tmp_path / "once.yaml"
    path.write_text(config_file(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        from erpo_lightning.cli.command import main

        main(["fit", "--config", str(path), "--print_config"])
    assert stopped.value.code in (0, None)
    assert "algorithm: erpo" in capsys.readouterr().out


ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
# The shipped configs that set a logger: the quickstart, its logger overlays and the SmolLM2 ones.
RUN_CONFIGS = [
    CONFIGS / "quickstart.yaml",
    *sorted(CONFIGS.glob("logger_*.yaml")),
    *sorted(CONFIGS.glob("smollm2_*.yaml")),
]


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


def test_a_sweep_given_to_fit_is_said_to_be_validates(capsys):
    sweep = str(CONFIGS / "quickstart_sweep.yaml")
    line = fails_in_one_line(capsys, "fit", "--config", sweep)
    assert line == (
        f"erpo: error: {sweep}: top-level key 'sweep' is a setting of `erpo validate`, not of `erpo fit`: run "
        f"`erpo validate --config <the run's config> --config {sweep}`, or remove 'sweep:' from the file"
    )
