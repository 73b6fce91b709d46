"""A resume continues the same run: its settings are compared with the config its checkpoint holds.

Every checkpoint of `erpo fit` holds its run's full config (`RunConfigRecorder`); `check_resume_config` refuses a
`--ckpt_path` run whose settings differ, except RESUMABLE_FIELDS, naming each changed key with both values. Values are
compared as they take effect, not as they are written: two paths naming the same file or folder are the same, a
`model:` loss field restated with its preset's value (`--model.clip_low 0.2` under `erpo`) is no change, and a
MathReward's grading settings are compared after its preset is applied. Inside a component (`class_path` +
`init_args`) only the changed arguments are named.
"""

from __future__ import annotations

import importlib
from dataclasses import fields
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from erpo_lightning.checkpoints.adapters_only import check_adapters_base
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.objectives.algorithms import Algorithm, resolve_algorithm
from erpo_lightning.rewards import MathReward

CONFIG_KEY = "erpo_config"  # the checkpoint entry holding the run's full `erpo fit` config
# What a resume may change: how long the run goes on, and where and what it records (`model.peft.checkpoint`: what
# a checkpoint holds of a LoRA policy; its load reads the checkpoint, not the setting); and the start-up seed, which
# the checkpoint's RNG states replace (`seed_everything: true` draws a new one at every start). Anything else would
# train on with other settings than the checkpoint's optimizer state, data position and metrics were made with.
RESUMABLE_FIELDS = (
    "seed_everything",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time",
    "trainer.callbacks",
    "trainer.logger",
    "trainer.enable_checkpointing",
    "trainer.default_root_dir",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "data.num_workers",
    "model.peft.checkpoint",
)
_NOT_SETTINGS = ("config", "ckpt_path")  # the config files' names, and the checkpoint itself
_ALGORITHM_FIELDS = tuple(field.name for field in fields(Algorithm))
# MathReward arguments that only feed its GraderSettings (`rewards.conventions.make_settings`).
_GRADING_ARGS = ("preset", "conventions", "accept_approximations", "rel_tol", "float_rounding")
_NO_RULE = object()  # `_effective`'s answer for a key whose value takes effect as written

Key = tuple[str | int, ...]  # a setting's place in the config: dict keys and list indices


class RunConfigRecorder(pl.Callback):
    """Writes the run's full config (plain YAML data) into every checkpoint, as `checkpoint["erpo_config"]`, for
    `check_resume_config` to compare a resume with."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        checkpoint[CONFIG_KEY] = self.config


def check_resume_config(checkpoint: dict[str, Any], config: dict[str, Any], ckpt_path: str) -> None:
    """SettingsError naming every setting of `config` (this run's, as plain data) that differs from the run that
    wrote `checkpoint`, other than RESUMABLE_FIELDS, with both values as written.

    A checkpoint written without the CLI has no full config: its module hyperparameters are compared with the
    fields of `model:` that this run's config holds: a hyperparameter the module no longer has (`temperature`, before
    the rollout batch carried it) is not compared. A checkpoint of LoRA adapters alone must also find the base they
    were trained on at `model.model_path` (`adapters_only.check_adapters_base`: same weight files), before it loads.
    """
    model_path = (config.get("model") or {}).get("model_path")
    saved = checkpoint.get(CONFIG_KEY)
    if saved is None:
        model = config.get("model", {})
        hparams = checkpoint.get("hyper_parameters", {})
        saved = {"model": {key: value for key, value in hparams.items() if key in model}}
        config = {"model": {key: model[key] for key in saved["model"]}}
    changed = [
        f"{key_text(key)}: {before!r} -> {now!r}"
        for key, before, now in differences(_settings(saved), _settings(config))
        if _effective(saved, key) is _NO_RULE or _effective(saved, key) != _effective(config, key)
    ]
    if changed:
        raise SettingsError(
            f"ckpt_path: this run differs from the run that wrote {ckpt_path} in {'; '.join(changed)}. A resume "
            f"continues the same run and may change only {', '.join(RESUMABLE_FIELDS)}; start a new run (without "
            "--ckpt_path) to change anything else"
        )
    if model_path:
        check_adapters_base(checkpoint, str(model_path), ckpt_path)


def differences(before: Any, now: Any, key: Key = ()) -> list[tuple[Key, Any, Any]]:
    """(key, before, now) of every setting where `before` and `now` differ, in key order: dicts key by key, lists of
    dicts of one length item by item, a component (`class_path` + `init_args`) argument by argument unless its class
    changed (then only `class_path`). Other lists, and values of different kinds, are compared whole (`_same_value`)."""
    before, now = _plain(before), _plain(now)
    if isinstance(before, dict) and isinstance(now, dict):
        if ("class_path" in before or "class_path" in now) and before.get("class_path") != now.get("class_path"):
            return [((*key, "class_path"), before.get("class_path"), now.get("class_path"))]
        names = sorted(before.keys() | now.keys(), key=str)
        return [change for name in names for change in differences(before.get(name), now.get(name), (*key, name))]
    if _list_of_dicts(before) and _list_of_dicts(now) and len(before) == len(now):
        pairs = enumerate(zip(before, now, strict=True))
        return [change for index, (old, new) in pairs for change in differences(old, new, (*key, index))]
    return [] if _same_value(before, now) else [(key, before, now)]


def key_text(key: Key) -> str:
    """`("data", "train", 0, "path")` → `data.train[0].path`."""
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _plain(value: Any) -> Any:
    """Tuples as lists (a checkpoint's hyperparameters keep tuples, YAML has lists)."""
    return list(value) if isinstance(value, tuple) else value


def _list_of_dicts(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _same_value(a: Any, b: Any) -> bool:
    """Equal values, or two strings naming the same existing file or folder, or lists of such values."""
    a, b = _plain(a), _plain(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, str) and isinstance(b, str) and _same_path(a, b))


def _settings(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`config` without the entries a resume may change (RESUMABLE_FIELDS) and those that are no settings."""
    return {
        key: _settings(value, f"{prefix}{key}.") if isinstance(value, dict) else value
        for key, value in config.items()
        if f"{prefix}{key}" not in RESUMABLE_FIELDS and not (not prefix and key in _NOT_SETTINGS)
    }


def _effective(config: dict[str, Any], key: Key) -> Any:
    """The value in effect of setting `key` of `config` where a rule resolves it, else _NO_RULE.

    - A loss field of `model:` (`algorithms.Algorithm`; null keeps the preset's): the field of
      `resolve_algorithm(model.algorithm, **model's overrides)`.
    - A grading argument of a MathReward (`preset`, `conventions`, ...): the reward's GraderSettings.
    """
    if len(key) == 2 and key[0] == "model" and key[1] in _ALGORITHM_FIELDS:
        model = config.get("model") or {}
        try:
            overrides = {name: model.get(name) for name in _ALGORITHM_FIELDS}
            algorithm = resolve_algorithm(model.get("algorithm"), **overrides)
        except (ValueError, TypeError):
            return _NO_RULE
        return getattr(algorithm, key[1])
    if len(key) >= 3 and key[-2] == "init_args" and key[-1] in _GRADING_ARGS:
        component = _at(config, key[:-2])
        if isinstance(component, dict) and _is_math_reward(component.get("class_path")):
            try:
                return MathReward(**(component.get("init_args") or {})).settings
            except (ValueError, TypeError):
                return _NO_RULE
    return _NO_RULE


def _at(config: Any, key: Key) -> Any:
    for part in key:
        if isinstance(part, str) and isinstance(config, dict):
            config = config.get(part)
        elif isinstance(part, int) and isinstance(config, list) and part < len(config):
            config = config[part]
        else:
            return None
    return config


def _is_math_reward(class_path: Any) -> bool:
    """Whether `class_path` names MathReward or a subclass of it."""
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, MathReward)


def check_checkpoint_model(checkpoint: dict[str, Any], model_path: str, ckpt_path: str) -> None:
    """SettingsError when `checkpoint` was trained from another initial model than `model_path` (`erpo validate`
    evaluates the checkpoint's weights in `model_path`'s architecture, with its tokenizer and template), or holds LoRA
    adapters alone and the weight files at `model_path` are not their base's (`adapters_only.check_adapters_base`)."""
    trained_from = checkpoint.get("hyper_parameters", {}).get("model_path")
    if trained_from is None or trained_from == model_path or _same_path(str(trained_from), model_path):
        check_adapters_base(checkpoint, model_path, ckpt_path)
        return
    raise SettingsError(
        f"ckpt_path: {ckpt_path} was trained from model_path {trained_from}, but model.model_path is {model_path}; "
        f"set --model.model_path {trained_from} (the model the checkpoint's weights belong to)"
    )


def _same_path(a: str, b: str) -> bool:
    """Whether two strings name the same existing local file or folder."""
    first, second = Path(a).expanduser(), Path(b).expanduser()
    try:
        return first.exists() and second.exists() and first.resolve() == second.resolve()
    except (OSError, ValueError):  # a name too long or with a NUL byte is no path
        return False
