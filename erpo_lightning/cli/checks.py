"""What `erpo` checks of its command line and config files before anything is built: config files read as YAML
(a misspelt top-level key, a key given twice, a setting that moved), the loggers' folders, every owner's own settings
check (`check_settings`), the checkpoints `validate` reads and the model path. Each failure is one line naming the
field (`errors.SettingsError`)."""

from __future__ import annotations

import difflib
import inspect
import os
import re
from dataclasses import fields
from pathlib import Path

import yaml
from jsonargparse import Namespace
from jsonargparse._util import import_object

from erpo_lightning.callbacks.rollout import check_rollout_settings
from erpo_lightning.checkpoints.files import read_checkpoint
from erpo_lightning.checkpoints.resume_config import check_checkpoint_model
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.data.datamodule import check_data_settings
from erpo_lightning.data.step_memory import check_fit_memory
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.modules.lora import adapter_parameters_before_loading
from erpo_lightning.modules.settings import (
    check_module_settings,
    check_offload_strategy,
    check_scoring_cache_engine,
    check_trainer_precision,
)
from erpo_lightning.objectives import check_group_size
from erpo_lightning.objectives.algorithms import Algorithm, resolve_algorithm
from erpo_lightning.weights.gguf import is_gguf, resolve_model_path

# Lists of dataclasses that jsonargparse would merge item by item with the config file's list; on the command line
# they replace it instead (each such flag is preceded by `<flag>=[]`).
REPLACED_LISTS = ("--data.train", "--sweep.benchmarks")
RESUME_KEYWORDS = ("last", "last_or_none", "best", "hpc")
# Settings that moved to another group: an old config naming one gets an error that says where it went.
MOVED_KEYS = {
    "data.weight_source": "model.query_weight_source (reference | current; for 'none' set model.use_query_weights "
    "false)",
    "data.weight_norm": "model.query_weight_norm (dataset | batch)",
    "data.weight_clip": "model.query_weight_clip ([lo, hi] or none)",
}


def config_files(args: list[str]) -> list[str]:
    """The values of `--config X`, `-c X` and `--config=X` in `args`."""
    files = []
    for index, arg in enumerate(args):
        if arg in ("--config", "-c") and index + 1 < len(args):
            files.append(args[index + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def replacing_lists(args: list[str]) -> list[str]:
    """`args` with `<flag>=[]` before every flag of REPLACED_LISTS, so that its list replaces the earlier one."""
    out = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in REPLACED_LISTS:
            out.append(f"{flag}=[]")
        out.append(arg)
    return out


def joined_negative_numbers(args: list[str]) -> list[str]:
    """`args` with `--flag -1e-3` written `--flag=-1e-3`: argparse takes a negative number in scientific notation
    after a flag for an option of its own and says "expected one argument"."""
    out: list[str] = []
    for arg in args:
        previous = out[-1] if out else ""
        if previous.startswith("--") and "=" not in previous and arg.startswith("-") and _is_number(arg):
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_top_level_keys(
    path: str, known: set[str], subcommand: str | None = None, elsewhere: dict[str, str] | None = None
) -> None:
    """A SettingsError naming a top-level key of the config file `path` that the parser does not know; one that
    another subcommand takes (`elsewhere`: key -> that subcommand, e.g. `sweep` -> validate) is said to be its."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return  # not a readable YAML file: the parser reports it
    if not isinstance(content, dict):
        return
    for key in content:
        if key in known:
            continue
        owner = (elsewhere or {}).get(key)
        if owner is not None:
            raise SettingsError(
                f"{path}: top-level key '{key}' is a setting of `erpo {owner}`, not of `erpo {subcommand}`: run "
                f"`erpo {owner} --config <the run's config> --config {path}`, or remove '{key}:' from the file"
            )
        close = difflib.get_close_matches(str(key), sorted(known), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"
        raise SettingsError(f"{path}: unknown top-level key '{key}'; {hint}")


def repeated_key(node: yaml.Node, prefix: str = "") -> tuple[str, int, int] | None:
    """The first mapping key given twice in the composed YAML `node` (any depth): (its dotted path, the 1-based lines
    of its first and second appearance), or None. Merge keys (`<<`) and keys that are not plain scalars are left to
    the loader."""
    if isinstance(node, yaml.SequenceNode):
        items = [(f"{prefix}[{index}]", child) for index, child in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        items, seen = [], {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            dotted = f"{prefix}.{key.value}" if prefix else key.value
            if key.value in seen:
                return dotted, seen[key.value], key.start_mark.line + 1
            seen[key.value] = key.start_mark.line + 1
            items.append((dotted, value))
    else:
        return None
    return next((found for path, child in items if (found := repeated_key(child, path)) is not None), None)


def check_repeated_keys(path: str) -> None:
    """A SettingsError naming a key that the config file `path` gives twice in one mapping: YAML loaders keep the
    last value without a word, so one of the two settings would be dropped silently."""
    try:
        node = yaml.compose(Path(path).read_text(), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # not a readable YAML file: the parser reports it
    try:
        found = repeated_key(node) if node is not None else None
    except RecursionError:  # an anchor that contains itself: the parser reports it
        return
    if found is not None:
        key, first, second = found
        raise SettingsError(
            f"{path}: key '{key}' is given twice (lines {first} and {second}); YAML would silently keep the second: "
            "remove one of them"
        )


def check_moved_keys(args: list[str]) -> None:
    """A SettingsError naming the new place of a MOVED_KEYS setting given in `args` or in one of its config files."""
    given = [arg.split("=", 1)[0].removeprefix("--") for arg in args if arg.startswith("--")]
    for path in config_files(args):
        try:
            content = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue  # not a readable YAML file: the parser reports it
        for group, section in content.items() if isinstance(content, dict) else ():
            given += [f"{group}.{key}" for key in section] if isinstance(section, dict) else []
    for key in given:
        if key in MOVED_KEYS:
            raise SettingsError(f"{key} has moved: w(q) is the algorithm's, set {MOVED_KEYS[key]}")


# Where a source lives: a later config file's item naming another one than the item it lands on is another source.
_SOURCE_LOCATION = ("name", "path", "hub_id", "label")


def _train_items(value: object) -> list[dict] | None:
    """`value` as a list of source mappings, or None when it is not one (the parser reports what it is)."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    return None


def check_source_merges(args: list[str]) -> None:
    """A SettingsError naming a `data.train` item of a later config file that would inherit another source's fields.

    jsonargparse merges a later config file's `data.train` into the earlier list key by key, item by item, when both
    lists have the same length (a list of another length replaces it). An item that names another source (another
    `name`, `path`, `hub_id` or `label`) than the item at its position would silently keep that item's other keys
    (its `limit`, `hub_id`, `config`, `answer_transform`...). An item that names no other source (`{limit: 32}`)
    changes the earlier one on purpose and is let through. `args`: the arguments after the subcommand.
    """
    current: list[tuple[dict, str]] | None = None  # the list so far: each item and the file (or flag) it came from
    for index, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        if flag == "--data.train":  # on the command line a list replaces the earlier one (`replacing_lists`)
            text = inline if inline else (args[index + 1] if index + 1 < len(args) else "")
            try:
                items = _train_items(yaml.safe_load(text))
            except yaml.YAMLError:
                items = None
            current = None if items is None else [(item, arg) for item in items]
            continue
        if arg not in ("--config", "-c") and flag != "--config":
            continue
        path = inline if flag == "--config" and inline else (args[index + 1] if index + 1 < len(args) else "")
        try:
            content = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not a readable YAML file: the parser reports it
        data = content.get("data") if isinstance(content, dict) else None
        items = _train_items(data.get("train")) if isinstance(data, dict) else None
        if items is None:
            continue
        if current is None or len(current) != len(items):
            current = [(item, path) for item in items]
            continue
        for position, (item, (earlier, origin)) in enumerate(zip(items, current, strict=True)):
            named = {key: item[key] for key in _SOURCE_LOCATION if item.get(key) is not None}
            other = any(earlier.get(key) != value for key, value in named.items())
            inherited = {key: value for key, value in earlier.items() if key not in item and value is not None}
            if other and inherited:
                kept = ", ".join(f"{key}: {value}" for key, value in inherited.items())
                raise SettingsError(
                    f"{path}: data.train[{position}] ({', '.join(f'{k}: {v}' for k, v in named.items())}) would be "
                    f"merged key by key into data.train[{position}] of {origin}, a list of the same length, and "
                    f"silently inherit {kept}. Start the list afresh with --data.train=[] before --config {path}, give "
                    "the whole list in one file, or write the item in full"
                )
        current = [({**earlier, **item}, path) for item, (earlier, _) in zip(items, current, strict=True)]


def logger_entries(config: Namespace) -> list[Namespace]:
    """The configured loggers of `trainer.logger` (one or a list) as `class_path` / `init_args` namespaces; none when
    it is a bool (True: Lightning's own CSV logger, already under default_root_dir) or unset."""
    value = config.get("trainer", Namespace()).get("logger")
    entries = value if isinstance(value, list) else [value]
    return [entry for entry in entries if isinstance(entry, Namespace) and entry.get("class_path")]


def place_loggers_under_root_dir(config: Namespace) -> None:
    """Point every logger whose `save_dir` is not set (null, or left at its class's default) at
    `trainer.default_root_dir`, so that one flag, `--trainer.default_root_dir`, moves a run's logs with its
    checkpoints. MLflow's goes to `<root>/mlruns` unless a `tracking_uri` is given (which it would use instead)."""
    root = config.get("trainer", Namespace()).get("default_root_dir") or "."
    for entry in logger_entries(config):
        try:
            parameters = inspect.signature(import_object(entry.class_path)).parameters
        except (ImportError, AttributeError, TypeError, ValueError):
            continue  # the class cannot be imported: instantiating it will say so
        if "save_dir" not in parameters:
            continue
        init_args = entry.get("init_args") or Namespace()
        given, default = init_args.get("save_dir"), parameters["save_dir"].default
        if given is not None and given != default:
            continue
        if "tracking_uri" in parameters:  # MLFlowLogger: its save_dir is a store only when no tracking_uri is given
            if init_args.get("tracking_uri"):
                continue
            init_args.save_dir = str(Path(root) / "mlruns")
        else:
            init_args.save_dir = str(root)
        entry.init_args = init_args


def check_logger_flags(args: list[str], config: Namespace) -> None:
    """A SettingsError for `--trainer.logger.init_args.X` when several loggers are configured: jsonargparse applies it
    to the last one alone, so the others would silently keep their folders."""
    flags = [arg.split("=", 1)[0] for arg in args if arg.startswith("--trainer.logger.init_args.")]
    if flags and len(logger_entries(config)) > 1:
        raise SettingsError(
            f"{flags[0]} would change only the last of the {len(logger_entries(config))} configured loggers; to move "
            "every logger (and the checkpoints), give --trainer.default_root_dir instead: a logger without a "
            "save_dir of its own writes under it"
        )


def check_settings(config: Namespace, subcommand: str) -> None:
    """Every check that needs no model, data or network beyond the model path's existence; SettingsError if one fails.

    Runs before any class is instantiated: a bad value fails in a second, not after the reference cache is built. The
    range rules are the owners' own, the ones their constructors run (no rule is restated here).
    """
    check_model_path(str(config.model.model_path))
    model = config.model
    try:
        check_rollout_settings(config.rollout.as_dict())
        check_data_settings(config.data.as_dict())
        # The module's fields, the optimizer's and nan_policy's, then the algorithm's (e.g. query_weight_source
        # 'current' with query_weight_norm 'dataset').
        check_module_settings(model.as_dict())
        check_trainer_precision(config.trainer.get("precision"))
        check_offload_strategy(bool(model.get("offload_optimizer")), config.trainer.as_dict().get("strategy"))
        algorithm = resolve_algorithm(model.algorithm, **{f.name: model.get(f.name) for f in fields(Algorithm)})
        if subcommand == "fit":  # what RolloutCallback.setup checks against the module's algorithm
            check_group_size(algorithm.advantage_estimator, config.rollout.group_size)
            check_scoring_cache_engine(model.get("query_kl_scoring"), config.data.get("cache_engine"))
            adapters = adapter_parameters_before_loading(
                model.get("peft"), str(model.model_path), bool(model.get("trust_remote_code"))
            )
            check_fit_memory(
                model.as_dict(), config.data.as_dict(), config.rollout.as_dict(), config.trainer.as_dict(), adapters
            )
        if config.get("sweep") is not None:  # `validate`'s: SweepConfig's own checks, on the parsed values
            SweepConfig(**config.sweep.as_dict())
    except ValueError as error:
        raise SettingsError(str(error)) from None
    keywords = RESUME_KEYWORDS if subcommand == "fit" else ()  # `validate` reads the files it is given
    for field in ("ckpt_path", "compare_ckpt_paths"):
        values = config.get(field) or []
        for value in [values] if isinstance(values, str) else values:
            if value not in keywords and "://" not in str(value) and not Path(value).exists():
                raise SettingsError(f"{field}: no checkpoint at {value}")


def check_validated_checkpoints(config: Namespace) -> None:
    """A SettingsError when a checkpoint `erpo validate` is given (a file or a sharded folder) was trained from another
    model than `model.model_path` (after a `.gguf` path is resolved)."""
    values = [config.get("ckpt_path"), *(config.get("compare_ckpt_paths") or [])]
    for value in values:
        if value and Path(value).exists():
            check_checkpoint_model(read_checkpoint(value), str(config.model.model_path), value)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def use_converted_gguf(config: Namespace) -> None:
    """Point model.model_path and data.model_path at the cached HF conversion when the model is a `.gguf` file.

    The one place a `.gguf` path is resolved for the CLI: the policy, the reference cache's fingerprint and the
    engines then all read the same converted directory (named by the file's sha256).
    """
    if is_gguf(str(config.model.model_path)):
        converted = resolve_model_path(str(config.model.model_path))
        config.model.model_path = converted
        if config.get("data") is not None and config.data.get("model_path") is not None:
            config.data.model_path = converted


def check_model_path(model_path: str, field: str = "model.model_path") -> None:
    """A SettingsError unless `model_path` is a `.gguf` file, a directory with a `config.json`, or a Hub id that can be
    fetched."""
    path = Path(model_path).expanduser()
    if is_gguf(model_path):
        if not path.is_file():
            raise SettingsError(f"{field}: no model at {model_path} (no such .gguf file)")
        return
    if path.exists() or not _HUB_ID.match(model_path) or ".." in model_path:
        if not (path / "config.json").is_file():
            missing = "" if path.exists() else "; the directory does not exist"
            raise SettingsError(f"{field}: no model at {model_path} (no config.json{missing})")
        return
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    offline = any(
        os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if offline:
        if not isinstance(try_to_load_from_cache(model_path, "config.json"), str):
            raise SettingsError(
                f"{field}: {model_path} is not a local path and no hub access (HF_HUB_OFFLINE is set and the Hugging "
                "Face cache has no copy); download it on a machine with access and point model_path at the directory"
            )
        return
    try:
        hf_hub_download(model_path, "config.json", etag_timeout=10)
    except RepositoryNotFoundError:
        raise SettingsError(f"{field}: {model_path} is not a local path and no Hub model has that name") from None
    except Exception as error:  # connection refused, DNS, proxy, timeout: all mean the same to the user
        raise SettingsError(
            f"{field}: {model_path} is not a local path and no hub access ({type(error).__name__}); download it on a "
            "machine with access and point model_path at the directory"
        ) from None


# `erpo --help`: the two subcommands that are not LightningCLI's are listed too.
