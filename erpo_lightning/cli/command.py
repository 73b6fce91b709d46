"""`erpo`: the command line (a LightningCLI), with the subcommands fit, validate and cache, plus `erpo export`
(`erpo_lightning.export.hf_model`: a checkpoint as a Hugging Face folder) and `erpo plot`
(`erpo_lightning.cli.plot`: a run's curves from its metrics.csv).

    erpo fit --config configs/quickstart.yaml
    erpo cache --config configs/erpo_qwen2.5_math_7b.yaml      # compute the reference score cache only
    erpo fit --print_config                                   # every field, with its default

The config has the usual LightningCLI groups (`trainer`, `model`, `data`) plus `rollout` (the RolloutCallback:
engine, reward, group size, sampling). `model.model_path` also sets `data.model_path`; the sampling temperature is
`rollout.temperature` alone (each rollout batch carries it to the module). The optimizer and its schedule are
`model.optimizer` and `model.lr_scheduler` (`class_path` + `init_args`; unset = AdamW with `model.learning_rate` and a
linear warm-up of `model.warmup_steps`; see `erpo_lightning/modules/optim.py` for which setting wins).

Settings are checked before anything is loaded (`cli.checks.check_settings`, which runs the owners' own checks, the
ones their constructors run): a value outside its range, a misspelt top-level key, a key given twice in a config file
(YAML would keep the last), a model path without a model or a checkpoint that is not there is a one-line error naming
the field. The CLI also wires the components together: a
`TemperatureSweepCallback` and `validate`'s sweep sample with the `rollout:` group's sampler and render prompts in the
`data:` group's `prompt_format()`.
A list given on the command line (`--data.train "[{path: x.jsonl}]"`) replaces the config file's list.
Errors print as one line plus a hint, parse errors (a choice typo) included; `ERPO_DEBUG=1` or `--debug` shows the
traceback (`erpo_lightning.common.errors`).

Flags must be written in full (no argparse prefixes); a misspelt flag or `class_path` option is named with the
closest valid one. A logger that sets no `save_dir` writes under `trainer.default_root_dir`
(`cli.checks.place_loggers_under_root_dir`), so that one flag moves a run's logs and checkpoints.

`fit` also: resolves `--ckpt_path last / last_or_none` (`checkpoints.files.resolve_resume_path`); refuses a resume whose
settings differ from the checkpoint's run except `resume_config.RESUMABLE_FIELDS` (each checkpoint holds its run's
config); refuses a fresh run in a checkpoint folder that holds an earlier run's checkpoints
(`checkpoints.files.check_fresh_run_folders`); locks the run's folders against a second run
(`checkpoints.files.RunDirectoryLock`); and, through the trainer's `PreemptionCheckpoint`, saves the last finished step
on SIGTERM / SIGUSR1 and exits 128 + the signal (Ctrl-C: 130).
`validate` refuses a checkpoint trained from another `model.model_path`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

# Colocated vLLM must run in this process (weights are pushed into its worker in place); set before vLLM loads.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def report_outside_environment(error: ModuleNotFoundError) -> None:
    """Exit with one line when `erpo` runs in a Python that lacks the project's dependencies (outside `.venv`): the
    import traceback says which module, not what to do. Imported as a library, the error is raised as it is."""
    launched = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)  # python -m
    running_cli = Path(sys.argv[0]).name == "erpo" or launched == "erpo_lightning.cli.__main__"
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
    from jsonargparse._common import debug_mode_active  # noqa: E402
    from lightning.fabric.plugins import CheckpointIO  # noqa: E402
    from lightning.pytorch import Trainer  # noqa: E402
    from lightning.pytorch.callbacks import ProgressBar  # noqa: E402
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE  # noqa: E402

    from erpo_lightning.callbacks.completions import SampledCompletions  # noqa: E402
    from erpo_lightning.callbacks.final_checkpoint import FinalStepCheckpoint  # noqa: E402
    from erpo_lightning.callbacks.preemption import PreemptionCheckpoint  # noqa: E402
    from erpo_lightning.callbacks.progress import (  # noqa: E402
        ERPOProgressBar,
        ProgressLines,
        RunFilesReport,
        stderr_is_terminal,
    )
    from erpo_lightning.callbacks.rollout import RolloutCallback  # noqa: E402
    from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback  # noqa: E402
    from erpo_lightning.checkpoints.files import (  # noqa: E402
        AtomicCheckpointIO,
        RunDirectoryLock,
        check_fresh_run_folders,
        read_checkpoint,
        resolve_resume_path,
        run_folders,
    )
    from erpo_lightning.checkpoints.resume_config import RunConfigRecorder, check_resume_config  # noqa: E402
    from erpo_lightning.cli.checks import (  # noqa: E402
        check_logger_flags,
        check_moved_keys,
        check_repeated_keys,
        check_settings,
        check_source_merges,
        check_top_level_keys,
        check_validated_checkpoints,
        config_files,
        joined_negative_numbers,
        place_loggers_under_root_dir,
        replacing_lists,
        use_converted_gguf,
    )
    from erpo_lightning.cli.messages import (  # noqa: E402
        non_number_line,
        option_strings,
        unknown_flag_line,
        unknown_group_key_line,
        unknown_option_line,
        unknown_subcommand_key_line,
        with_newcomer_hint,
    )
    from erpo_lightning.common.errors import (  # noqa: E402
        SettingsError,
        debug_requested,
        parser_error_line,
        quiet_known_warnings,
        run_reporting_errors,
    )
    from erpo_lightning.data import QueryDataModule, build_or_load_cache  # noqa: E402
    from erpo_lightning.data.prepare import carried_columns  # noqa: E402
    from erpo_lightning.data.sources import parser_unknown_key_line, resolve_spec  # noqa: E402
    from erpo_lightning.evaluation import Sweep, SweepConfig, run_validate  # noqa: E402
    from erpo_lightning.modules.erpo_module import ERPOModule  # noqa: E402
    from erpo_lightning.rewards.combined import check_reward_inputs  # noqa: E402
    from erpo_lightning.rollout.sampler import RolloutSampler  # noqa: E402
except ModuleNotFoundError as missing:
    report_outside_environment(missing)


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
            or unknown_subcommand_key_line(message, self)
            or unknown_option_line(message)
            or non_number_line(message)
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
    (`SampledCompletions`, unless one is configured), the end of a fit says where its files are (`RunFilesReport`),
    and the default progress bar is `ERPOProgressBar` on a terminal (the bar, with the step lines printed above it),
    `ProgressLines` (a plain line every N steps) when stderr is a file or a pipe.
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
        if not any(isinstance(c, RunFilesReport) for c in callbacks):
            callbacks.append(RunFilesReport())
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
            top_level = {name: {action.dest.split(".")[0] for action in p._actions} for name, p in parsers.items()}
            known = top_level[subcommand]
            # A key only another subcommand takes (validate's `sweep`) is said to be that subcommand's.
            elsewhere = {key: name for name, keys in top_level.items() for key in keys - known}
            for path in config_files(args[args.index(subcommand) + 1 :]):
                check_repeated_keys(path)
                check_top_level_keys(path, known, subcommand, elsewhere)
            check_moved_keys(args[args.index(subcommand) + 1 :])
            check_source_merges(args[args.index(subcommand) + 1 :])
        # Validated after the loggers are placed: a logger left without a save_dir is valid once it follows the root.
        self.config = parser.parse_args(replacing_lists(joined_negative_numbers(args)), _skip_validation=True)
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


MAIN_HELP = """RL post-training with verifiable rewards: ERPO, GRPO, DAPO, RLOO, Dr. GRPO, REINFORCE.

also:
  erpo export --ckpt_path CKPT --out DIR   a checkpoint as a Hugging Face model folder (erpo export --help)
  erpo plot RUN_DIR                        a run's reward, accuracy, Query-KL and length curves (erpo plot --help)"""


def main(args: list[str] | None = None) -> None:
    debug, args = debug_requested(list(sys.argv[1:] if args is None else args))
    quiet_known_warnings()
    if args[:1] == ["export"]:  # a checkpoint to a Hugging Face folder: no trainer, model or data to configure
        from erpo_lightning.export.hf_model import main as export

        run_reporting_errors(lambda: export(args[1:]), debug)
        return
    if args[:1] == ["plot"]:  # a run's curves from its metrics.csv
        from erpo_lightning.cli.plot import main as plot

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
