"""The one-line errors of `erpo`'s parser (`cli/messages.py`): a misspelt or abbreviated flag, config key or
`class_path` option named with the closest valid one, text or NaN given for a number, and what to do where the
parser's words do not say it (a missing model path, a user's module, a Python outside the environment). Every case
but one calls `erpo_lightning.cli.main` in this process and fails at parse time; the run outside the environment is
the one subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config

from erpo_lightning.cli.command import main
from erpo_lightning.toy import SHIPPED_DIR

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")


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


@pytest.fixture()
def config(tmp_path):
    return str(tiny_config(tmp_path, SHIPPED_DIR, SHIPPED_DIR / "train.jsonl"))


# --------------------------------------------------------------- issue 67 item 2: text for a number, in one line
def test_nan_for_the_cap_is_one_line_naming_the_field_and_its_values(capsys, config):
    line = fails_in_one_line(capsys, "fit", "--config", config, "--model.rollout_correction_cap", "nan")
    assert line.startswith("erpo: error: model.rollout_correction_cap must be >= 1 (.inf: no upper end), got nan")
    assert "Union subtypes" not in line


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--model.rollout_correction_cap", "inf", "model.rollout_correction_cap: 'inf' is read as text; YAML writes "
         "infinity as .inf (and -.inf): give a number or null"),
        ("--model.clip_low", "abc", "model.clip_low: 'abc' is not a number; give a number or null"),
        ("--model.micro_batch_tokens", "nan", "model.micro_batch_tokens: 'nan' is not a number (NaN is never a valid "
         "setting); give a whole number"),
        ("--model.dual_clip", "nan", "model.dual_clip must be > 1 (a multiple of -A), got nan"),
        ("--rollout.temperature", "nan", "rollout.temperature must be > 0 and finite"),
    ],
)  # fmt: skip
def test_text_for_a_number_names_the_field_and_what_it_takes(capsys, config, flag, value, expected):
    line = fails_in_one_line(capsys, "fit", "--config", config, flag, value, "--print_config")
    assert line.startswith(f"erpo: error: {expected}") and "Union subtypes" not in line


def test_yaml_infinity_is_still_a_cap(capsys, config):
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", config, "--model.rollout_correction_cap", ".inf", "--print_config"])
    assert exited.value.code in (0, None)
    assert "rollout_correction_cap: .inf" in capsys.readouterr().out


# --------------------------------------------------- issue 67 item 4: a misspelt nested key, a key of validate's
@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"model": {"learning_rat": 1e-4}}, "model: unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
        ({"rollout": {"grop_size": 8}}, "rollout: unknown key 'grop_size' (did you mean 'group_size'?)"),
        ({"data": {"max_prompt_lenght": 8}}, "data: unknown key 'max_prompt_lenght' (did you mean "
         "'max_prompt_length'?)"),
        ({"rollout": {"sampling": {"top_pp": 1}}}, "unknown key 'rollout.sampling.top_pp' (did you mean "
         "'rollout.top_p'?)"),
    ],
)  # fmt: skip
def test_a_misspelt_nested_yaml_key_names_the_closest_one(capsys, tmp_path, config, section, expected):
    """Found when the whole config is validated (no --print_config): jsonargparse's "Subcommand 'fit' does not accept
    option 'model.learning_rat'" named no valid key."""
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(section))
    line = fails_in_one_line(capsys, "fit", "--config", config, "--config", str(typo))
    assert line == f"erpo: error: {expected}; `erpo fit --help` lists every option"
