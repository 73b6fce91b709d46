"""What a user of `erpo` sees when something goes wrong: one line naming the problem, and how to get the traceback.

`run_reporting_errors` wraps the command line: an exception becomes `erpo: error: <message>` plus a hint line, exit
status 1 (2 for a setting outside its range, like the parser's own errors). A run that stopped on purpose and says
how (an exception with an `exit_status`: `callbacks.preemption.Preempted` after a signal) prints its message and
exits with that status; an interrupted one (Ctrl-C) exits 130. `ERPO_DEBUG=1` or `--debug` re-raises instead, with
the full traceback. `quiet_known_warnings` silences, by message and category, library notices known not to apply to
this project.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable

DEBUG_FLAG = "--debug"
DEBUG_HINT = "(run again with ERPO_DEBUG=1 or --debug for the full traceback)"
MAX_MESSAGE_CHARS = 2000
# The logger of vLLM's weight reloading (`reload_weights`), which the VLLMEngine's weight sync calls.
VLLM_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"

# Messages whose own text says what went wrong; other exception types are prefixed with their name.
_SELF_EXPLANATORY = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


class SettingsError(ValueError):
    """A setting outside its allowed range; the message names the field (`rollout.temperature`) and the range."""


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether the traceback was asked for, argv without `--debug`)."""
    wanted = os.environ.get("ERPO_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return wanted or DEBUG_FLAG in argv, [arg for arg in argv if arg != DEBUG_FLAG]


def one_line(error: BaseException) -> str:
    """The error as a single line: its message with whitespace runs collapsed, its type named when not obvious."""
    message = " ".join(str(error).split())
    if len(message) > MAX_MESSAGE_CHARS:  # e.g. an error quoting a whole model output
        message = message[:MAX_MESSAGE_CHARS] + " [...]"
    if isinstance(error, KeyError) and len(error.args) == 1:
        message = f"missing key {error.args[0]!r}"
    if not message:
        return type(error).__name__
    return message if isinstance(error, _SELF_EXPLANATORY) else f"{type(error).__name__}: {message}"


def parser_error_line(message: str) -> str:
    """One line for a command-line parser error (jsonargparse's are several, with every union member's failure).

    A value outside a `Literal` field's choices becomes `<field>: '<value>' is not one of a, b, c; did you mean 'x'?`;
    a field a settings dataclass does not have (peft's `lora_alpha` under `model.peft`) becomes `<setting>: no field
    'lora_alpha' (did you mean 'alpha'?); fields: ...`; any other message has its whitespace collapsed and its
    `Parser key "<field>":` prefix shortened to `<field>:`.
    """
    key = re.search(r'Parser key "([^"]+)":', message)
    unknown_field = _unknown_field_line(key.group(1) if key else "", message)
    if unknown_field is not None:
        return unknown_field
    choices = re.search(r"Literal\[([^\]]*)\]", message)
    value = re.search(r"(?:Got|Given) value: (.*)", message)
    if key and choices and value:
        options = [str(option) for option in ast.literal_eval(f"[{choices.group(1)}]")]
        given = value.group(1).strip()
        close = difflib.get_close_matches(given, options, n=1)
        null = " (or null)" if "NoneType" in message else ""
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{key.group(1)}: {given!r} is not one of {', '.join(options)}{null}{hint}"
    line = " ".join(message.split())
    return re.sub(r'^Parser key "([^"]+)":', r"\1:", line)


_OPTION_NOT_ACCEPTED = re.compile(r"class_path '(?P<owner>[\w.]+)':\s+Option '(?P<option>[^']+)' is not accepted")


def _unknown_field_line(setting: str, message: str) -> str | None:
    """The line for jsonargparse's "Option 'x' is not accepted" by a dataclass it has imported; None otherwise."""
    found = _OPTION_NOT_ACCEPTED.search(message)
    module_name, _, class_name = found["owner"].rpartition(".") if found else ("", "", "")
    owner = getattr(sys.modules.get(module_name), class_name, None)
    if found is None or not dataclasses.is_dataclass(owner):
        return None
    names = [f.name for f in dataclasses.fields(owner)]
    close = difflib.get_close_matches(found["option"], names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{setting or class_name}: no field {found['option']!r}{hint}; fields: {', '.join(names)}"


def run_reporting_errors(command: Callable[[], object], debug: bool) -> None:
    """Run `command`; an exception is printed as one line plus the debug hint and exits (re-raised when `debug`)."""
    try:
        command()
    except KeyboardInterrupt:
        if debug:
            raise
        print("erpo: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Exception as error:
        status = getattr(error, "exit_status", None)
        if status is not None:  # a run that stopped on purpose and says how (`Preempted`): not an error
            print(f"erpo: {error}", file=sys.stderr, flush=True)
            raise SystemExit(status) from None
        if debug:
            raise
        print(f"erpo: error: {one_line(error)}\n{DEBUG_HINT}", file=sys.stderr, flush=True)
        raise SystemExit(2 if isinstance(error, SettingsError) else 1) from None


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def quiet_known_warnings() -> None:
    """Silence library notices that do not apply to an `erpo` run, each matched by its message and category.

    - Lightning's advice on ModelCheckpoint under manual optimization: ERPOModule saves after its own optimizer
      steps, so a checkpoint holds the weights, optimizer state and step counter of the same moment.
    - torch's deprecation of `LeafSpec`, triggered inside Lightning, not by this project.
    - Lightning's litlogger advertisement (an info log line).
    - vLLM's "RotaryEmbedding: Failed to load weights" at every weight sync: the rotary layer's cos/sin table is
      computed from the config, not a weight, so no checkpoint or policy state dict holds it and vLLM keeps the
      table it has (the engine-trainer log-prob gap after a sync shows the weights arrived). The same notice for
      any other layer still shows.
    """
    for message, category in (
        (r"Using ModelCheckpoint with manual optimization and every_n_train_steps", UserWarning),
        (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    ):
        warnings.filterwarnings("ignore", message=message, category=category)
    tip = ("💡 Tip: For seamless cloud logging",)
    for name, prefixes in (
        ("lightning.pytorch.utilities.rank_zero", tip),
        ("lightning.fabric.utilities.rank_zero", tip),
        (VLLM_RELOAD_LOGGER, ("RotaryEmbedding: Failed to load weights",)),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _DropMessages) for existing in logger.filters):
            logger.addFilter(_DropMessages(prefixes))
