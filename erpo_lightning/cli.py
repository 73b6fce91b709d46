"""`erpo`: the command line (a LightningCLI), with the subcommands fit, validate and cache, plus `erpo export`
(`erpo_lightning.export`: a checkpoint as a Hugging Face folder) and `erpo plot` (`erpo_lightning.plot`: a run's
curves from its metrics.csv).

    erpo fit --config configs/quickstart.yaml
    erpo cache --config configs/erpo_qwen2.5_math_7b.yaml      # compute the reference score cache only
    erpo fit --print_config                                   # every field, with its default

The config has the usual LightningCLI groups (`trainer`, `model`, `data`) plus `rollout` (the RolloutCallback:
engine, reward, group size, sampling). `model.model_path` also sets `data.model_path`; the sampling temperature is
`rollout.temperature` alone (each rollout batch carries it to the module). The optimizer and its schedule are
`model.optimizer` and `model.lr_scheduler` (`class_path` + `init_args`; unset = AdamW with `model.learning_rate` and a
linear warm-up of `model.warmup_steps`; see `erpo_lightning/modules/optim.py` for which setting wins).

Settings are checked before anything is loaded (`check_settings`, which runs the owners' own checks, the ones their
constructors run): a value outside its range, a misspelt top-level key, a key given twice in a config file (YAML
would keep the last), a model path without a model or a checkpoint that is not there is a one-line error naming the
field. The CLI also wires the components together: a
`TemperatureSweepCallback` and `validate`'s sweep sample with the `rollout:` group's sampler and render prompts in the
`data:` group's `prompt_format()`.
A list given on the command line (`--data.train "[{path: x.jsonl}]"`) replaces the config file's list.
Errors print as one line plus a hint, parse errors (a choice typo) included; `ERPO_DEBUG=1` or `--debug` shows the
traceback (`erpo_lightning.errors`).

Flags must be written in full (no argparse prefixes); a misspelt flag or `class_path` option is named with the
closest valid one. A logger that sets no `save_dir` writes under `trainer.default_root_dir`
(`place_loggers_under_root_dir`), so that one flag moves a run's logs and checkpoints.

`fit` also: resolves `--ckpt_path last / last_or_none` (`checkpointing.resolve_resume_path`); refuses a resume whose
settings differ from the checkpoint's run except `resume_config.RESUMABLE_FIELDS` (each checkpoint holds its run's
config); refuses a fresh run in a checkpoint folder that holds an earlier run's checkpoints
(`checkpointing.check_fresh_run_folders`); locks the run's folders against a second run
(`checkpointing.RunDirectoryLock`); and, through the trainer's `PreemptionCheckpoint`, saves the last finished step
on SIGTERM / SIGUSR1 and exits 128 + the signal (Ctrl-C: 130).
`validate` refuses a checkpoint trained from another `model.model_path`.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

# Colocated vLLM must run in this process (weights are pushed into its worker in place); set before vLLM loads.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def report_outside_environment(error: ModuleNotFoundError) -> None:
    """Exit with one line when `erpo` runs in a Python that lacks the project's dependencies (outside `.venv`): the
    import traceback says which module, not what to do. Imported as a library, the error is raised as it is."""
    running_cli = __name__ == "__main__" or Path(sys.argv[0]).name == "erpo"
    if not running_cli or (error.name or "").startswith("erpo_lightning"):
        raise error
    print(
        f"erpo: error: {error} in {sys.executable}: erpo runs in the project's environment; use .venv/bin/erpo (or "
        "activate .venv), or create the environment with `make env`",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(1)


try:
    import yaml  # noqa: E402
    from jsonargparse import Namespace  # noqa: E402
    from jsonargparse._common import debug_mode_active  # noqa: E402
    from jsonargparse._util import import_object  # noqa: E402
    from lightning.fabric.plugins import CheckpointIO  # noqa: E402
    from lightning.pytorch import Trainer  # noqa: E402
    from lightning.pytorch.callbacks import ProgressBar  # noqa: E402
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE  # noqa: E402

    from erpo_lightning.algorithms import Algorithm, resolve_algorithm  # noqa: E402
    from erpo_lightning.callbacks.completions import SampledCompletions  # noqa: E402
    from erpo_lightning.callbacks.final_checkpoint import FinalStepCheckpoint  # noqa: E402
    from erpo_lightning.callbacks.preemption import PreemptionCheckpoint  # noqa: E402
    from erpo_lightning.callbacks.progress import ERPOProgressBar, ProgressLines, stderr_is_terminal  # noqa: E402
    from erpo_lightning.callbacks.rollout import RolloutCallback, check_rollout_settings  # noqa: E402
    from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback  # noqa: E402
    from erpo_lightning.checkpointing import (  # noqa: E402
        AtomicCheckpointIO,
        RunDirectoryLock,
        check_fresh_run_folders,
        read_checkpoint,
        resolve_resume_path,
        run_folders,
    )
    from erpo_lightning.cli_messages import (  # noqa: E402
        option_strings,
        unknown_flag_line,
        unknown_group_key_line,
        unknown_option_line,
        with_newcomer_hint,
    )
    from erpo_lightning.data import QueryDataModule, build_or_load_cache  # noqa: E402
    from erpo_lightning.data.datamodule import check_data_settings  # noqa: E402
    from erpo_lightning.data.prepare import carried_columns  # noqa: E402
    from erpo_lightning.data.sources import parser_unknown_key_line, resolve_spec  # noqa: E402
    from erpo_lightning.data.step_memory import check_fit_memory  # noqa: E402
    from erpo_lightning.errors import (  # noqa: E402
        SettingsError,
        debug_requested,
        parser_error_line,
        quiet_known_warnings,
        run_reporting_errors,
    )
    from erpo_lightning.evaluation import Sweep, SweepConfig, run_validate  # noqa: E402
    from erpo_lightning.gguf import is_gguf, resolve_model_path  # noqa: E402
    from erpo_lightning.modules.erpo_module import ERPOModule  # noqa: E402
    from erpo_lightning.modules.lora import adapter_parameters_before_loading  # noqa: E402
    from erpo_lightning.modules.settings import check_module_settings, check_trainer_precision  # noqa: E402
    from erpo_lightning.objectives import check_group_size  # noqa: E402
    from erpo_lightning.resume_config import RunConfigRecorder, check_checkpoint_model, check_resume_config  # noqa: E402
    from erpo_lightning.rewards.combined import check_reward_inputs  # noqa: E402
    from erpo_lightning.rollout.sampler import RolloutSampler  # noqa: E402
except ModuleNotFoundError as missing:
    report_outside_environment(missing)

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


class ERPOArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors (a choice typo, a value of the wrong type) are one line, not the usage.

    The error is raised as a SettingsError, which `run_reporting_errors` prints as `erpo: error: <line>` plus the
    hint, exit status 2 as before; `erpo <subcommand> --help` still lists every option.
    Abbreviated flags are refused: argparse would read `--model.learning_rat 5` as `--model.learning_rate 5`, and a
    typo of a longer key would silently set it. The subcommand parsers and the nested parsers jsonargparse builds for
    `class_path` values are of this class too, so the rule holds at every depth.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or debug_mode_active():  # jsonargparse's own callers expect its exception
            return super().error(message, ex)
        line = (
            unknown_flag_line(message, option_strings(self))
            or parser_unknown_key_line(message)  # a source's keys: before the generic group and class lines
            or unknown_group_key_line(message, option_strings(self))
            or unknown_option_line(message)
            or parser_error_line(message)
        )
        raise SettingsError(with_newcomer_hint(line))


class ERPOLightningTrainer(Trainer):
    """Lightning's Trainer plus the `cache` subcommand; `validate` is the temperature sweep.

    `use_distributed_sampler` defaults to False: the datamodule's `QueryBatchSampler` already gives each rank its
    share of every global batch, and resumes mid-epoch. Checkpoint files are written atomically
    (`AtomicCheckpointIO`) unless `plugins` or the strategy bring their own CheckpointIO, SIGTERM / SIGUSR1 save the
    last finished step and stop the run (`PreemptionCheckpoint`), the step training ends on is saved whatever the
    checkpoint interval (`FinalStepCheckpoint`: `last.ckpt` holds it), sampled completions go to the log folder
    (`SampledCompletions`, unless one is configured), and the default progress bar is `ERPOProgressBar`
    on a terminal, `ProgressLines` (a plain line every N steps) when stderr is a file or a pipe.
    """

    def __init__(self, *args, use_distributed_sampler: bool = False, **kwargs) -> None:
        plugins = kwargs.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        strategy_io = getattr(kwargs.get("strategy"), "_checkpoint_io", None)
        if strategy_io is None and not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        callbacks = kwargs.get("callbacks")
        callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]
        if not any(isinstance(c, PreemptionCheckpoint) for c in callbacks):
            callbacks.append(PreemptionCheckpoint())
        if not any(isinstance(c, FinalStepCheckpoint) for c in callbacks):
            callbacks.append(FinalStepCheckpoint())
        if not any(isinstance(c, SampledCompletions) for c in callbacks):
            callbacks.append(SampledCompletions())
        if kwargs.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            # A bar redrawn with carriage returns is unreadable in a log file: plain lines there.
            terminal = stderr_is_terminal() and _RICH_AVAILABLE
            callbacks.append(ERPOProgressBar() if terminal else ProgressLines())
        kwargs.update(plugins=plugins, callbacks=callbacks)
        super().__init__(*args, use_distributed_sampler=use_distributed_sampler, **kwargs)

    def cache(self, model: ERPOModule, datamodule: QueryDataModule, force: bool = False) -> None:
        """Compute (or check and load) the frozen-reference query score cache of the configured training data.

        On several devices or nodes the trainer's ranks share the computation, as at fit start: Lightning's launcher
        starts the other processes (torchrun and srun have started them already), and the strategy's process group
        is set up before the scores are computed.

        Args:
            force: recompute even when a matching cache exists.
        """

        def build() -> None:
            if self.world_size > 1:
                self.strategy.connect(model)  # ModelParallelStrategy hands its device mesh to the module
                self.strategy.setup_environment()
            build_or_load_cache(datamodule, force=force, strategy=self.strategy, module=model)

        if self.world_size > 1 and self.strategy.launcher is not None:
            self.strategy.launcher.launch(build, trainer=self)
        else:
            build()

    def validate(
        self,
        model: ERPOModule,
        datamodule: QueryDataModule | None = None,
        ckpt_path: str | None = None,
        sweep: SweepConfig | None = None,
        compare_ckpt_paths: list[str] | None = None,
        include_base: bool = False,
        sampler: RolloutSampler | None = None,
    ) -> list[dict[str, float]]:
        """Temperature sweep: Avg@k / Pass@1 / Pass@k per benchmark and temperature, table, results files, plot.

        Without a checkpoint the weights of `model.model_path` are evaluated (the "Base" row). See
        docs/evaluation.md.

        Args:
            ckpt_path: a Lightning checkpoint whose policy weights are evaluated.
            sweep: benchmarks, temperatures, k, ... (`SweepConfig`).
            compare_ckpt_paths: more checkpoints, each evaluated and shown beside the first.
            include_base: also evaluate `model.model_path` itself, first.
            sampler: samples and grades (engine, reward): a RolloutCallback's `sampler`; the CLI passes the
                `rollout:` group's (no option of its own). The prompts take the datamodule's `prompt_format()`.
        """
        if sampler is None:
            raise ValueError("validate needs a sampler (engine and reward): pass sampler=<RolloutCallback>.sampler")
        prompts = datamodule.prompt_format() if datamodule is not None else None
        checkpoints = [path for path in (ckpt_path, *(compare_ckpt_paths or [])) if path]
        return run_validate(self, model, Sweep(sweep or SweepConfig(), sampler, prompts), checkpoints, include_base)


class ERPOCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        lightning_subcommands = LightningCLI.subcommands()  # test/predict have no meaning for RL training
        return {
            "fit": lightning_subcommands["fit"],
            "validate": lightning_subcommands["validate"] | {"sampler"},  # given by `ERPOCLI.validate`, not an option
            "cache": {"model", "datamodule"},
        }

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RolloutCallback, "rollout")
        parser.link_arguments("model.model_path", "data.model_path")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Check the config files (no key given twice, every top-level key known), then parse with command-line
        lists replacing the files' lists."""
        args = list(sys.argv[1:] if args is None else args)
        parsers = getattr(self, "_subcommand_parsers", {})  # none with run=False: one parser, no subcommand
        subcommand = next((arg for arg in args if arg in parsers), None)
        if subcommand is not None:
            known = {action.dest.split(".")[0] for action in parsers[subcommand]._actions}
            for path in _config_files(args[args.index(subcommand) + 1 :]):
                check_repeated_keys(path)
                check_top_level_keys(path, known)
            check_moved_keys(args[args.index(subcommand) + 1 :])
        # Validated after the loggers are placed: a logger left without a save_dir is valid once it follows the root.
        self.config = parser.parse_args(_replacing_lists(_joined_negative_numbers(args)), _skip_validation=True)
        config = self.config if subcommand is None else self.config[subcommand]
        check_logger_flags(args, config)
        place_loggers_under_root_dir(config)
        try:
            parser.validate(self.config)
        except (TypeError, KeyError, ValueError) as error:
            parser.error(str(error), error)

    def validate(self, **kwargs: Any) -> list[dict[str, float]]:
        """`erpo validate`: `ERPOLightningTrainer.validate`, sampling with the `rollout:` group's sampler."""
        return self.trainer.validate(**kwargs, sampler=self._get(self.config_init, "rollout").sampler)

    def _parse_ckpt_path(self) -> None:
        """Nothing: LightningCLI would replace the whole `model:` group with a checkpoint's hyperparameters, silently
        dropping the flags given with `--ckpt_path`. Here a resume must match its checkpoint's run instead
        (`resume_config.check_resume_config`, in `before_fit`), and `validate` the checkpoint's initial model
        (`check_settings`)."""

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        if subcommand is not None:
            check_settings(self.config[subcommand], subcommand)
            use_converted_gguf(self.config[subcommand])
            if subcommand == "validate":
                check_validated_checkpoints(self.config[subcommand])

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the subcommand; the run folders' lock (taken in `before_fit`) is released however it ends, and a
        Ctrl-C during fit is re-raised as the KeyboardInterrupt that `run_reporting_errors` reports (exit 130)."""
        self.run_lock: RunDirectoryLock | None = None
        try:
            super()._run_subcommand(subcommand)
        except SystemExit:  # Lightning's exit(1) after a KeyboardInterrupt in fit: report it as one (exit 130)
            if any(getattr(c, "interrupted", False) for c in self.trainer.callbacks):
                signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignored further Ctrl-Cs
                raise KeyboardInterrupt from None
            raise
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def before_fit(self) -> None:
        """Resolve `--ckpt_path last / last_or_none`, refuse a resume whose settings differ from its checkpoint's run
        beyond `RESUMABLE_FIELDS`, bind the configured sweep callbacks, then lock the run's folders (the first
        process only)."""
        fit = self.config_init["fit"]
        fit["ckpt_path"] = ckpt_path = resolve_resume_path(self.trainer, fit.get("ckpt_path"))
        if ckpt_path is None:
            check_fresh_run_folders(self.trainer)
        # The run's settings as plain data (what config.yaml holds): compared with a resumed checkpoint's run, and
        # written into every checkpoint of this one.
        config = yaml.safe_load(self._parser("fit").dump(self.config["fit"], skip_none=False))
        if ckpt_path is not None and Path(ckpt_path).exists():  # a file, or a sharded checkpoint folder
            check_resume_config(read_checkpoint(ckpt_path), config, ckpt_path)
        rollout: RolloutCallback = self._get(self.config_init, "rollout")
        check_reward_data(rollout.sampler.reward, self.datamodule.sources)
        for callback in self.trainer.callbacks:  # a sweep samples with the rollout's sampler, in the data's format
            if isinstance(callback, TemperatureSweepCallback):
                callback.bind(rollout.sampler, self.datamodule.prompt_format(), self.datamodule.prepare_queries)
        self.trainer.callbacks.append(RunConfigRecorder(config))
        if first_process():
            self.run_lock = RunDirectoryLock(run_folders(self.trainer)).acquire()
            for stale in self.run_lock.taken_over:
                print(f"[erpo] took over the stale lock of {stale}: that run is no longer running", flush=True)


def check_reward_data(reward: Any, sources: list) -> None:
    """SettingsError when the reward requires a keyword input the training data does not carry (a column no source
    names): said before the reference cache is built, not after."""
    if not sources:
        return
    try:
        check_reward_inputs(reward, carried_columns([resolve_spec(source) for source in sources]))
    except ValueError as error:
        raise SettingsError(str(error)) from None


def first_process() -> bool:
    """Whether this is the first process of the job (rank 0 of node 0), from the launchers' variables: Lightning's
    own launcher, torchrun and SLURM give every other process a non-zero LOCAL_RANK, NODE_RANK, RANK or SLURM_PROCID."""
    return all(int(os.environ.get(name, "0") or 0) == 0 for name in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID"))


def _config_files(args: list[str]) -> list[str]:
    """The values of `--config X`, `-c X` and `--config=X` in `args`."""
    files = []
    for index, arg in enumerate(args):
        if arg in ("--config", "-c") and index + 1 < len(args):
            files.append(args[index + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def _replacing_lists(args: list[str]) -> list[str]:
    """`args` with `<flag>=[]` before every flag of REPLACED_LISTS, so that its list replaces the earlier one."""
    out = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in REPLACED_LISTS:
            out.append(f"{flag}=[]")
        out.append(arg)
    return out


def _joined_negative_numbers(args: list[str]) -> list[str]:
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


def check_top_level_keys(path: str, known: set[str]) -> None:
    """A SettingsError naming a top-level key of the config file `path` that the parser does not know."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return  # not a readable YAML file: the parser reports it
    if not isinstance(content, dict):
        return
    for key in content:
        if key not in known:
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
    for path in _config_files(args):
        try:
            content = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue  # not a readable YAML file: the parser reports it
        for group, section in content.items() if isinstance(content, dict) else ():
            given += [f"{group}.{key}" for key in section] if isinstance(section, dict) else []
    for key in given:
        if key in MOVED_KEYS:
            raise SettingsError(f"{key} has moved: w(q) is the algorithm's, set {MOVED_KEYS[key]}")


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
        algorithm = resolve_algorithm(model.algorithm, **{f.name: model.get(f.name) for f in fields(Algorithm)})
        if subcommand == "fit":  # what RolloutCallback.setup checks against the module's algorithm
            check_group_size(algorithm.advantage_estimator, config.rollout.group_size)
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
MAIN_HELP = """RL post-training with verifiable rewards: ERPO, GRPO, DAPO, RLOO, Dr. GRPO, REINFORCE.

also:
  erpo export --ckpt_path CKPT --out DIR   a checkpoint as a Hugging Face model folder (erpo export --help)
  erpo plot RUN_DIR                        a run's reward, accuracy, Query-KL and length curves (erpo plot --help)"""


def main(args: list[str] | None = None) -> None:
    debug, args = debug_requested(list(sys.argv[1:] if args is None else args))
    quiet_known_warnings()
    if args[:1] == ["export"]:  # a checkpoint to a Hugging Face folder: no trainer, model or data to configure
        from erpo_lightning.export import main as export

        run_reporting_errors(lambda: export(args[1:]), debug)
        return
    if args[:1] == ["plot"]:  # a run's curves from its metrics.csv
        from erpo_lightning.plot import main as plot

        run_reporting_errors(lambda: plot(args[1:]), debug)
        return
    run_reporting_errors(
        lambda: ERPOCLI(
            ERPOModule,
            QueryDataModule,
            trainer_class=ERPOLightningTrainer,
            parser_class=ERPOArgumentParser,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": MAIN_HELP, "formatter_class": argparse.RawDescriptionHelpFormatter},
            # Not LightningCLI's top-level `optimizer:` groups: they build the optimizer over the module's parameters
            # before configure_model has loaded the policy; `model.optimizer` is called in configure_optimizers.
            auto_configure_optimizers=False,
            args=args,
        ),
        debug,
    )


if __name__ == "__main__":
    main()
