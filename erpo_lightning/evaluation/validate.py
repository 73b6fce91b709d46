"""`erpo validate`: the temperature sweep of a Hugging Face model directory and/or Lightning checkpoints.

The policy is the training config's (`model:`); the `Sweep` samples and grades through the `rollout:` group's
`RolloutSampler` (set up here on the policy, no training hooks run) and renders the prompts in the training data's
`PromptFormat` (`data:`), so "Base" rows and trained rows are measured the same way; the erpo CLI wires both in.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console

from erpo_lightning.checkpoints.files import check_tensor_digest, read_checkpoint
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.evaluation.report import PLOT_PNG, SweepRun, plot_accuracy, print_tables, result_rows, write_results
from erpo_lightning.evaluation.sweep import Sweep
from erpo_lightning.modules.lora_files import check_adapters_base, fill_frozen_weights, trainable_state_names
from erpo_lightning.modules.sharding import is_sharded_checkpoint, load_sharded_policy

BASE = "base"


def load_policy_weights(policy: torch.nn.Module, ckpt_path: str) -> None:
    """Load the `policy.*` weights of a Lightning checkpoint into `policy` (strict: every weight must match).

    `ckpt_path` is a checkpoint file (single device, DDP) or a sharded checkpoint directory (FSDP2), read in one
    process without a process group. A file of LoRA adapters alone (`model.peft.checkpoint: adapters`) loads into the
    adapters of `policy`, whose base must be the one they were trained on: its weight files, at `policy.name_or_path`,
    hash as the checkpoint records (`lora_files.check_adapters_base`). A file's tensors must hash as its digest records
    (`checkpoints.files.check_tensor_digest`: CheckpointDigestError naming the file and the tensor; a file without a digest
    loads with a warning line).
    """
    path = Path(ckpt_path)
    if is_sharded_checkpoint(path):
        load_sharded_policy(policy, path)
        return
    if not path.is_file():
        raise FileNotFoundError(
            f"{ckpt_path}: neither a checkpoint file nor a sharded checkpoint directory (one with a .metadata file)"
        )
    checkpoint = read_checkpoint(path)  # memory-mapped; an unreadable file is named
    check_tensor_digest(checkpoint, path)  # a changed byte in a weight is refused, naming the tensor
    state = checkpoint.get("state_dict", {})
    weights = {key.removeprefix("policy."): value for key, value in state.items() if key.startswith("policy.")}
    if not weights:
        raise ValueError(f"{ckpt_path}: its state_dict has no `policy.*` weights (not an ERPOModule checkpoint?)")
    if check_adapters_base(checkpoint, str(getattr(policy, "name_or_path", "")), ckpt_path):
        fill_frozen_weights(weights, policy.state_dict(), trainable_state_names(policy))
    check_weight_names(checkpoint, weights, policy.state_dict().keys(), ckpt_path)
    policy.load_state_dict(weights)


LORA_WEIGHT = (".lora_A.", ".lora_B.")  # in the names of a LoRA policy's adapter weights
LORA_SHAPING_FIELDS = ("r", "alpha", "target_modules")  # what a checkpoint's adapters were trained with and need


def peft_flag(peft: dict[str, Any]) -> str:
    """The LoRA settings of a checkpoint's run as a command-line value, `{r: 4, alpha: 8.0, ...}` (adapter_path
    null: the checkpoint's weights replace whatever the adapters start at)."""
    return yaml.safe_dump({**peft, "adapter_path": None}, default_flow_style=True, width=10**6).strip()


def lora_mismatch(checkpoint: dict[str, Any], peft: dict[str, Any] | None, ckpt_path: str | Path) -> str | None:
    """Why a policy built with the LoRA settings `peft` (None: none) cannot take the weights of `checkpoint`, whose
    run's settings its hyper-parameters hold, in one line naming `model.peft`; None when they agree (or the
    checkpoint does not say)."""
    settings = checkpoint.get("hyper_parameters") or {}
    if "peft" not in settings:
        return None
    trained = settings["peft"]
    if trained is not None and peft is None:
        return (
            f"model.peft: {ckpt_path} is a LoRA run's checkpoint (its model.peft: {peft_flag(trained)}), but this "
            "config has no model.peft, so the policy has no adapters to load it into; validate with the run's config, "
            f"or add --model.peft '{peft_flag(trained)}'"
        )
    if trained is None and peft is not None:
        return (
            f"model.peft: {ckpt_path} is a full fine-tuning checkpoint (its run's model.peft is null), but this config "
            "sets model.peft, so the policy has adapters the checkpoint does not hold; drop it (--model.peft null)"
        )
    if trained is not None:
        for name in LORA_SHAPING_FIELDS:
            ours, theirs = peft.get(name), trained.get(name)
            if (list(ours) if isinstance(ours, tuple) else ours) != (
                list(theirs) if isinstance(theirs, tuple) else theirs
            ):
                return (
                    f"model.peft.{name}: {ckpt_path} was trained with {name} {theirs!r}, but this config has {ours!r}; "
                    f"set --model.peft.{name} to the run's value (its model.peft: {peft_flag(trained)})"
                )
    return None


def check_weight_names(
    checkpoint: dict[str, Any], weights: dict[str, Any], names: Iterable[str], ckpt_path: str | Path
) -> None:
    """SettingsError, in one line, when the checkpoint's `policy.*` `weights` and the policy's state-dict `names` differ
    (torch's own error lists every layer): naming `model.peft` and the run's LoRA settings when adapters are on one
    side only, else the counts and the first name missing on each side."""
    names = set(names)
    missing, unexpected = sorted(names - weights.keys()), sorted(weights.keys() - names)
    if not missing and not unexpected:
        return
    has_adapters = any(marker in name for name in names for marker in LORA_WEIGHT)
    holds_adapters = any(marker in name for name in weights for marker in LORA_WEIGHT)
    if has_adapters != holds_adapters:
        settings = checkpoint.get("hyper_parameters") or {}
        trained = settings.get("peft") if holds_adapters else None
        said = lora_mismatch({"hyper_parameters": {"peft": trained}}, {} if has_adapters else None, ckpt_path)
        if said is None:  # the checkpoint holds adapters and does not say with which settings
            said = f"model.peft: {ckpt_path} holds LoRA adapter weights, but this config has no model.peft"
        raise SettingsError(said)
    parts = [f"{len(missing)} of the policy's weights are not in it (first: {missing[0]})"] if missing else []
    parts += [f"{len(unexpected)} of its weights are not the policy's (first: {unexpected[0]})"] if unexpected else []
    raise SettingsError(
        f"{ckpt_path}: its policy weights do not fit the model built from model.model_path: {'; '.join(parts)}; "
        "validate with the config of the run that wrote it"
    )


def grader_settings(reward: Any) -> dict[str, Any]:
    """The reward's settings as results files record them: its own `describe()`, else its class name."""
    describe = getattr(reward, "describe", None)
    if callable(describe):
        return describe()
    name = getattr(reward, "__qualname__", type(reward).__qualname__)  # a function names itself
    return {"class": f"{getattr(reward, '__module__', type(reward).__module__)}.{name}"}


def grader_summary(grader: dict[str, Any]) -> str:
    """One line: class, backend, preset and the conventions that are on."""
    parts = [str(grader.get("class", "?"))]
    parts += [f"{key}={grader[key]}" for key in ("backend", "preset", "rel_tol", "float_rounding") if key in grader]
    if "conventions_on" in grader:
        parts.append("conventions: " + (", ".join(grader["conventions_on"]) or "none"))
    return "; ".join(parts)


def run_labels(ckpt_paths: list[str], include_base: bool) -> list[tuple[str, str | None]]:
    """(label, checkpoint) of each run: the model directory itself ("base") first when asked or alone."""
    runs: list[tuple[str, str | None]] = [(BASE, None)] if include_base or not ckpt_paths else []
    for path in ckpt_paths:
        label = Path(path).stem
        taken = {name for name, _ in runs}
        runs.append((label if label not in taken else f"{label}-{len(runs)}", path))
    return runs


def run_validate(
    trainer: Any,
    model: Any,
    sweep: Sweep,
    ckpt_paths: list[str],
    include_base: bool = False,
    console: Console | None = None,
) -> list[dict[str, float]]:
    """Sweep every run (base and/or checkpoints), print the tables, write results.json / .csv and the plot.

    Args:
        trainer: gives the device and the default output folder (its log directory); one device only.
        model: an ERPOModule: its policy is loaded here and each checkpoint's weights are loaded into it.
        sweep: the sweep, with its sampler (not yet set up) and prompt format.
    Returns:
        one dict of metric values per run (names as logged, see docs/evaluation.md).
    """
    if trainer.world_size > 1:
        raise ValueError("erpo validate runs on one device (trainer.devices: 1); vLLM batches the sweep on it")
    config, sampler = sweep.config, sweep.sampler
    for ckpt_path in ckpt_paths:  # before the policy and the engine load: a LoRA run's checkpoint needs its settings
        if not is_sharded_checkpoint(Path(ckpt_path)) and Path(ckpt_path).is_file():
            problem = lora_mismatch(read_checkpoint(ckpt_path), model.hparams.get("peft"), ckpt_path)
            if problem is not None:
                raise SettingsError(problem)
    model.configure_model()
    policy = model.policy.to(trainer.strategy.root_device)
    sweep.declare_context()
    sampler.setup(policy)  # loads the tokenizer and sets the engine up on the policy
    benchmarks = sweep.prepare()

    runs = []
    for label, ckpt_path in run_labels(ckpt_paths, include_base):
        if ckpt_path is not None:
            load_policy_weights(policy, ckpt_path)
        result = sweep.run(policy)
        values = {name: value.item() for name, value in result.values.items()}
        runs.append(
            SweepRun(label, model.hparams.model_path, ckpt_path, values, result.timing.summary(), result.grader)
        )

    rows = [row for run in runs for row in result_rows(run, benchmarks, config.temperatures)]
    output_dir = Path(config.output_dir or trainer.log_dir or trainer.default_root_dir)
    grader = grader_settings(sampler.reward)
    paths = write_results(output_dir, config, runs, rows, grader)
    paths["png"] = plot_accuracy(output_dir / PLOT_PNG, rows)
    # Piped output gets a wide fixed width: the table has a column per temperature.
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    print_tables(rows, console)
    for run in runs:
        timing = run.timing
        console.print(
            f"[bold]{run.label}[/]: {timing['problems']} problem-temperature pairs, {timing['samples']} samples in "
            f"{timing['wall_s']:.1f} s: {timing['problems_per_s']:.2f} problems/s, "
            f"{timing['samples_per_s']:.1f} samples/s, {timing['tokens_per_s']:.0f} generated tokens/s"
        )
    console.print(f"grader: {grader_summary(grader)}")
    console.print("wrote " + ", ".join(str(path) for path in paths.values()))
    return [run.values for run in runs]
