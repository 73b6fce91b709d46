"""The one-line errors of `erpo`'s parser: a misspelt flag, config key or `class_path` option named with the closest
valid one, and what to do added where the parser's words do not say it (`cli.ERPOArgumentParser` uses them)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import re

from jsonargparse._util import import_object


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every `--flag` of `parser` and of its subcommands' parsers (a misspelt flag is reported by the top parser)."""
    found = []
    for action in parser._actions:
        found += [option for option in action.option_strings if option.startswith("--")]
        for subparser in (getattr(action, "choices", None) or {}).values():
            if isinstance(subparser, argparse.ArgumentParser):
                found += option_strings(subparser)
    return found


def unknown_flag_line(message: str, known: list[str]) -> str | None:
    """`unrecognized arguments: --rollout.temprature 0.5` with the closest flag for each unknown one, or None for
    another message."""
    if not message.startswith("unrecognized arguments:"):
        return None
    unknown = [arg.split("=", 1)[0] for arg in message.split(":", 1)[1].split() if arg.startswith("--")]
    if not unknown:
        return None
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag, sorted(set(known)), n=1, cutoff=0.75)
        hints.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
    return f"unknown option {', '.join(hints)}; `erpo <subcommand> --help` lists every option"


_GROUP_KEY = re.compile(r"Group '(?P<group>[\w.]+)' does not accept option '(?P<key>[^']+)'")


def unknown_group_key_line(message: str, known: list[str]) -> str | None:
    """jsonargparse's `Group 'model' does not accept option 'learning_rat'` (a misspelt key in a config file) with the
    closest key of that group, or None for another message."""
    found = _GROUP_KEY.search(message)
    if found is None:
        return None
    prefix = f"--{found['group']}."
    keys = sorted({flag.removeprefix(prefix) for flag in known if flag.startswith(prefix)})
    close = difflib.get_close_matches(found["key"], keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{found['group']}: unknown key {found['key']!r}{hint}; `erpo <subcommand> --help` lists every option"


_SUBCOMMAND_KEY = re.compile(r"Subcommand '(?P<subcommand>[\w-]+)' does not accept option '(?P<key>[^']+)'")


def unknown_subcommand_key_line(message: str, parser: argparse.ArgumentParser) -> str | None:
    """jsonargparse's `Subcommand 'fit' does not accept option 'model.learning_rat'` (a misspelt nested key of a config
    file, found when the whole config is validated) with the closest key: first among the keys of the same group
    (`model.`), then among all of the subcommand's; None for another message."""
    found = _SUBCOMMAND_KEY.search(message)
    if found is None:
        return None
    subcommand, key = found["subcommand"], found["key"]
    subparsers = [
        action.choices[subcommand]
        for action in parser._actions
        if isinstance(getattr(action, "choices", None), dict) and subcommand in action.choices
    ]
    keys = sorted({flag.removeprefix("--") for flag in option_strings(subparsers[0] if subparsers else parser)})
    group, _, leaf = key.rpartition(".")
    siblings = [name.removeprefix(f"{group}.") for name in keys if group and name.startswith(f"{group}.")]
    close = difflib.get_close_matches(leaf, siblings, n=1) if siblings else []
    where, name = (group, leaf) if close else ("", key)
    if not close:
        close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    prefix = f"{where}: unknown key" if where else "unknown key"
    return f"{prefix} {name!r}{hint}; `erpo {subcommand} --help` lists every option"


_CLASS_OPTION = re.compile(r"Option '(?P<option>[^']+)' is not accepted")
# jsonargparse names the class as `class_path 'x.Y':` in a union's errors, as `class_path='x.Y'` in the given value.
_CLASS_PATH = re.compile(r"class_path\s?[=]?\s?'(?P<owner>[\w.]+)'")


def unknown_option_line(message: str) -> str | None:
    """One line for an init argument a `class_path` class does not take (`--rollout.reward.init_args.num_work`),
    naming the closest one it takes; None for another message."""
    found, owner_name = _CLASS_OPTION.search(message), _CLASS_PATH.search(message)
    if found is None or owner_name is None:
        return None
    try:
        owner = import_object(owner_name["owner"])
        if dataclasses.is_dataclass(owner):  # a settings dataclass (model.peft): `parser_error_line` names its fields
            return None
        names = [name for name in inspect.signature(owner).parameters if name not in ("args", "kwargs")]
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    key = re.search(r'Parser key "([^"]+)":', message)
    where = f"{key.group(1)}: " if key else ""
    close = difflib.get_close_matches(found["option"], names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}{owner_name['owner']} takes no option {found['option']!r}{hint}; options: {', '.join(names)}"


_EXPECTED_TYPE = re.compile(r"Expected a <class '(\w+)'>")
_GIVEN_VALUE = re.compile(r"(?:Got|Given) value: (?P<value>.*)$")


def non_number_line(message: str) -> str | None:
    """One line for a number setting given text (`--model.rollout_correction_cap nan`), instead of jsonargparse's
    paragraph on every member of the field's union; None for another message.

    A value Python reads as a float (`nan`, `inf`) is put to the field's owner, whose refusal names the allowed
    values (`owner_refusal`); one the owner takes (`inf` where there is no upper end) is written `.inf` in YAML.
    """
    text = " ".join(message.split())
    key, value = re.search(r'Parser key "([^"]+)":', text), _GIVEN_VALUE.search(text)
    expected = set(_EXPECTED_TYPE.findall(text))
    if key is None or value is None or not expected & {"float", "int"} or not expected <= {"float", "int", "NoneType"}:
        return None
    field, given = key.group(1), value["value"].strip()
    refusal = owner_refusal(field, given) if "float" in expected else None
    if refusal is not None:
        return refusal
    allowed = ("a number" if "float" in expected else "a whole number") + (" or null" if "NoneType" in expected else "")
    if "float" in expected and given.lower().lstrip("+-") in ("inf", "infinity"):
        return f"{field}: {given!r} is read as text; YAML writes infinity as .inf (and -.inf): give {allowed}"
    nan = " (NaN is never a valid setting)" if given.lower() == "nan" else ""
    return f"{field}: {given!r} is not a number{nan}; give {allowed}"


def owner_refusal(field: str, given: str) -> str | None:
    """The refusal of `given` read as a float (`nan`, `inf`, `1e9`) by the check that owns `field` (`model.`,
    `rollout.` or `data.` settings: `check_module_settings`, `algorithms.Algorithm`, `check_rollout_settings`,
    `check_data_settings`), which names the field and its allowed values; None when `given` is no float or the
    owner takes it."""
    from erpo_lightning.callbacks.rollout import check_rollout_settings
    from erpo_lightning.data.datamodule import check_data_settings
    from erpo_lightning.modules.settings import check_module_settings
    from erpo_lightning.objectives.algorithms import Algorithm

    group, _, name = field.partition(".")
    try:
        value = float(given)
    except ValueError:
        return None
    try:
        if group == "model" and name in {f.name for f in dataclasses.fields(Algorithm)}:
            Algorithm(**{name: value})
        elif group == "model":
            check_module_settings({name: value})
        elif group == "rollout":
            check_rollout_settings({name: value})
        elif group == "data":
            check_data_settings({name: value})
    except (ValueError, TypeError) as error:
        return " ".join(str(error).split()) if str(error).startswith(field) else None
    return None


# Packages of this project's environment: a missing module among them is a broken install, not a user's module.
_INSTALLED_TOP_LEVEL = {"erpo_lightning", "lightning", "torch", "transformers", "vllm", "peft", "datasets"}


# The command that prepares SmolLM2 and prints its folder (configs/smollm2_*.yaml leave model.model_path unset).
REAL_MODEL_PATH = '--model.model_path "$(.venv/bin/python -m erpo_lightning.real_model)"'


def with_newcomer_hint(line: str) -> str:
    """`line` with what to do added where the parser's words do not say it: an unset model path, a class_path whose
    module cannot be imported."""
    if re.match(r"model\.model_path: Expected a <class 'str'>\. Got value: None", line):
        return (
            "model.model_path is required: this config names no model; add --model.model_path <model folder or Hub "
            f"id>. For configs/smollm2_*.yaml, `make real-model` prints the folder, or add {REAL_MODEL_PATH}"
        )
    missing = re.search(r"No module named '([\w.]+)'", line)
    if missing and missing.group(1).split(".")[0] not in _INSTALLED_TOP_LEVEL:
        class_path = _CLASS_PATH.search(line)
        if class_path is not None:  # the key and the class, not the union's paragraph
            line = f"{line.split(':', 1)[0]}: class_path {class_path['owner']!r}: {missing.group(0)}"
        return (
            f"{line}; a class_path naming a module of your own needs it importable: run from the folder that holds "
            f"{missing.group(1).split('.')[0]}.py with PYTHONPATH=. (e.g. `PYTHONPATH=. .venv/bin/erpo fit ...`), or "
            "install it into the environment"
        )
    return line
