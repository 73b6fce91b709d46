"""`erpo validate`: the temperature sweep of a Hugging Face model directory and/or Lightning checkpoints.

The policy is the training config's (`model:`); the `Sweep` samples and grades through the `rollout:` group's
`RolloutSampler` (set up here on the policy, no training hooks run) and renders the prompts in the training data's
`PromptFormat` (`data:`), so "Base" rows and trained rows are measured the same way; the erpo CLI wires both in.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from erpo_lightning.checkpoints.files import read_checkpoint
from erpo_lightning.checkpoints.policy_weights import is_sharded_checkpoint, load_policy_weights, lora_mismatch
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.evaluation.report import PLOT_PNG, SweepRun, plot_accuracy, print_tables, result_rows, write_results
from erpo_lightning.evaluation.sweep import Sweep

BASE = "base"


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
