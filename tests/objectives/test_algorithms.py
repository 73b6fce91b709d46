"""The loss settings are written once: `Algorithm`'s fields and their docstrings. The module's keyword arguments,
the CLI's `--model.<field>` options with their help, and docs/loss_settings.md must follow them. A Query-KL tolerance
so wide that it switches the loss off is refused, by `resolve_algorithm` and by `erpo fit` before anything loads."""

import inspect
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Literal

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line
from helpers.fit_configs import fit_config, write_config
from lightning.pytorch.cli import LightningArgumentParser

from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.objectives import MAX_QUERY_KL_TOLERANCE, LossSettings
from erpo_lightning.objectives.algorithms import (
    NO_CLIP,
    REFERENCE_COMMAND,
    Algorithm,
    attribute_docs,
    loss_setting_docs,
    loss_settings_markdown,
    resolve_algorithm,
)
from erpo_lightning.toy import SHIPPED_DIR

FIELDS = [f.name for f in fields(Algorithm)]
# Config values that a module argument takes besides its field's type and None (None keeps the preset's value).
SENTINELS = {"query_weight_clip": {Literal[NO_CLIP]}}


def members(hint) -> set:
    """The members of a union type, or {hint}."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return set(typing.get_args(hint)) if union else {hint}


def test_every_field_is_documented_exactly_once():
    documented = [name for cls in (LossSettings, Algorithm) for name, _ in attribute_docs(cls)]
    assert sorted(documented) == sorted(FIELDS)  # no field missing, none twice, none that is not a field
    assert all(len(doc) > 20 for doc in loss_setting_docs().values())


def test_the_module_takes_every_field_as_an_override_of_the_preset():
    parameters = inspect.signature(ERPOModule.__init__).parameters
    module_hints = typing.get_type_hints(ERPOModule.__init__)
    field_hints = typing.get_type_hints(Algorithm)
    for name in FIELDS:
        assert name in parameters, f"ERPOModule has no argument {name}, a field of Algorithm"
        assert parameters[name].default is None, f"ERPOModule's {name} must default to None (= the preset's)"
        expected = members(field_hints[name]) | {type(None)} | SENTINELS.get(name, set())
        assert members(module_hints[name]) == expected, f"ERPOModule's {name}: {module_hints[name]} vs the field's"


def test_the_cli_offers_every_field_with_its_type_and_its_docstring_as_help():
    parser = LightningArgumentParser()
    parser.add_lightning_class_args(ERPOModule, "model")
    actions = {action.dest: action for action in parser._actions}
    for name, doc in loss_setting_docs().items():
        action = actions[f"model.{name}"]
        assert " ".join(action.help.split()).startswith(doc), name
    assert parser.parse_args(["--model.model_path", "m", "--model.clip_high", "0.28"]).model.clip_high == 0.28
    assert parser.parse_args(["--model.model_path", "m", "--model.query_weight_clip", "none"]).model.query_weight_clip
    assert parser.parse_args(["--model.model_path", "m"]).model.query_kl_coef is None


def test_the_reference_is_generated_from_the_docstrings():
    text = (Path(__file__).parents[2] / "docs" / "loss_settings.md").read_text()
    assert REFERENCE_COMMAND in text
    assert text == loss_settings_markdown(), f"docs/loss_settings.md is stale: run `{REFERENCE_COMMAND}`"
    for name, doc in loss_setting_docs().items():
        assert f"## `{name}`" in text and " ".join(doc.split()[1:6]) in " ".join(text.split()), name
    assert re.search(r"## `clip_high`\n\n`float` or null\. `erpo`: `null`; `dapo`, `dapo_erpo`: `0.28`\.", text)


def config_file(tmp_path, **changes) -> str:
    """A valid 2-step config of the shipped toy model, as YAML text (`changes` by section)."""
    train = [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 8}]
    return yaml.safe_dump(fit_config(SHIPPED_DIR, train, tmp_path / "run", **changes), sort_keys=False)


# ------------------------------------------------------------------- issue 54 item 9: a tolerance too wide to mean
@pytest.mark.parametrize("tolerance", [1e9, float("inf"), 1.5])
def test_a_query_kl_tolerance_beyond_any_noise_is_refused_by_the_owner(tolerance):
    with pytest.raises(ValueError, match=r"model.query_kl_tolerance must be at most 1 nat per query token") as error:
        resolve_algorithm("erpo", query_kl_tolerance=tolerance)
    assert "switch the Query-KL loss off" in str(error.value) and "query_kl_coef 0" in str(error.value)


@pytest.mark.parametrize("tolerance", [None, 0.0, 1e-3, 0.1, MAX_QUERY_KL_TOLERANCE])
def test_tolerances_up_to_one_nat_are_kept(tolerance):
    assert resolve_algorithm("erpo", query_kl_tolerance=tolerance).query_kl_tolerance == tolerance


def test_erpo_fit_refuses_it_before_anything_loads(tmp_path, capsys):
    path = write_config(tmp_path / "fit.yaml", yaml.safe_load(config_file(tmp_path)))
    line = fails_in_one_line(capsys, "fit", "--config", str(path), "--model.query_kl_tolerance", "1e9")
    assert line.startswith("erpo: error: model.query_kl_tolerance must be at most 1 nat per query token, got 1e+09")
