"""Build once, then locate: the toy model and its train / held-out test splits (the quickstart and the toy study use
the shipped copy of one such build, `erpo_lightning/toy/ship.py`; this module is how it is rebuilt).

`ensure_toy_assets()` draws the problems, pre-trains the model (a few minutes on two CPU cores) and writes

    <root>/model/          save_pretrained model + tokenizer
    <root>/train.jsonl     RL training problems, {"id", "problem", "answer"} per line
    <root>/test.jsonl      held-out problems, same format
    <root>/manifest.json   the build's settings and measured accuracies, written last

into a temporary sibling directory that replaces `root` only when complete, so an interrupted build is never
reused. Later calls with the same settings return at once.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from erpo_lightning.common.file_hashes import cache_home
from erpo_lightning.rewards import MathReward
from erpo_lightning.toy.pretrain import MAX_NEW_TOKENS, PretrainConfig, pretrain, sample_correct
from erpo_lightning.toy.task import NUM_PROBLEMS, TOY_TEMPLATE_SUFFIX, make_problems
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

TOY_NAME = "toy-arith-v1"
MANIFEST = "manifest.json"
# Everything a build writes into root: a directory holding anything else is not replaced.
BUILD_ENTRIES = {"model", "train.jsonl", "test.jsonl", MANIFEST}


@dataclass(frozen=True)
class ToyConfig:
    """What to build: split sizes, the data seed and the pre-training settings.

    All problems, shuffled with `data_seed`, are cut into the held-out test split, a validation split (the
    pre-training stopping rule looks only at it) and the training split (the rest, pre-trained on and then the
    RL training set), so no problem is in two of them.
    """

    num_test: int = 500
    num_val: int = 200
    eval_samples: int = 8
    data_seed: int = 1234
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ToyAssets:
    """Paths of a completed build, and its manifest (settings and held-out accuracies)."""

    model_dir: Path
    train_file: Path
    test_file: Path
    manifest: dict


def default_root() -> Path:
    """`$ERPO_CACHE_HOME/toy-arith-v1`, `ERPO_CACHE_HOME` defaulting to `~/.cache/erpo_lightning`."""
    return cache_home() / TOY_NAME


def _assets(root: Path, manifest: dict) -> ToyAssets:
    return ToyAssets(root / "model", root / "train.jsonl", root / "test.jsonl", manifest)


def _completed(root: Path, config: ToyConfig) -> ToyAssets | None:
    """The assets in `root` when a build with `config` completed there, else None."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("name") != TOY_NAME or manifest.get("config") != config.to_dict():
        return None
    assets = _assets(root, manifest)
    paths = (
        assets.model_dir / "config.json",
        assets.model_dir / "model.safetensors",
        assets.train_file,
        assets.test_file,
    )
    return assets if all(path.is_file() for path in paths) else None


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as handle:
        for row in rows:
            handle.write(json.dumps({"id": row["id"], "problem": row["problem"], "answer": row["answer"]}) + "\n")


def build_toy_assets(directory: Path, config: ToyConfig, console: Console) -> dict:
    """Draw the splits, pre-train and evaluate the model, and write everything into `directory`.

    Returns:
        the manifest: name, config, template suffix, max_new_tokens and the measured `metrics`.
    """
    start = time.perf_counter()
    settings = config.pretrain
    rows = make_problems(NUM_PROBLEMS, config.data_seed)
    val_end = config.num_test + config.num_val
    test, val, train = rows[: config.num_test], rows[config.num_test : val_end], rows[val_end:]

    tokenizer = build_byte_tokenizer()
    progress = Progress(
        TextColumn("pre-training toy model"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("", total=settings.max_steps, status="")
    accuracy_text = ""

    def on_step(step: int, loss: float, accuracy: float | None) -> None:
        nonlocal accuracy_text
        if accuracy is not None:
            accuracy_text = f" val T=1 acc {accuracy:.0%}"
        progress.update(task, completed=step, status=f"loss {loss:.3f}{accuracy_text}")

    # In-process grading, no worker pool to start: gold answers are small integers, which the exact rules decide
    # for any well-formed response; only malformed ones reach sympy.
    grader = MathReward(num_workers=0)
    with progress:
        result = pretrain(tokenizer, train, val, settings, grader, on_step)
    greedy = sample_correct(result.model, tokenizer, test, grader, temperature=0.0)
    sampled = sample_correct(result.model, tokenizer, test, grader, num_samples=config.eval_samples, seed=settings.seed)

    model_dir = directory / "model"
    result.model.generation_config.eos_token_id = tokenizer.eos_token_id
    result.model.generation_config.pad_token_id = tokenizer.pad_token_id
    result.model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    _write_jsonl(directory / "train.jsonl", train)
    _write_jsonl(directory / "test.jsonl", test)
    metrics = {
        "params": sum(parameter.numel() for parameter in result.model.parameters()),
        "steps": result.steps,
        "final_loss": result.losses[-1],
        "seconds": round(time.perf_counter() - start, 1),
        "test_greedy_accuracy": round(greedy.float().mean().item(), 4),
        "test_pass@1": round(sampled.float().mean().item(), 4),
        f"test_pass@{config.eval_samples}": round(sampled.any(dim=1).float().mean().item(), 4),
    }
    manifest = {
        "name": TOY_NAME,
        "config": config.to_dict(),
        "template_suffix": TOY_TEMPLATE_SUFFIX,
        "max_new_tokens": MAX_NEW_TOKENS,
        "metrics": metrics,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _replace_directory(built: Path, root: Path) -> None:
    """Move the finished build `built` to `root`, removing an earlier (stale or partial) build there."""
    if root.exists():
        foreign = {entry.name for entry in root.iterdir()} - BUILD_ENTRIES
        if foreign:
            raise FileExistsError(
                f"{root} holds files a toy build did not write ({sorted(foreign)}); choose another root or empty it"
            )
        shutil.rmtree(root)
    os.replace(built, root)


def ensure_toy_assets(
    root: str | Path | None = None,
    *,
    force: bool = False,
    config: ToyConfig | None = None,
    console: Console | None = None,
) -> ToyAssets:
    """The toy model and splits in `root` (default `default_root()`), building them first when needed.

    A build happens when `root` holds no completed build with the same `config`, or when `force` is set. It uses
    `config.pretrain.num_threads` torch threads and restores the caller's thread count afterwards.
    """
    root = Path(root).expanduser() if root is not None else default_root()
    config = config or ToyConfig()
    console = console or Console(stderr=True)
    if not force and (assets := _completed(root, config)) is not None:
        return assets
    root.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    building.chmod(0o755)  # mkdtemp makes it private; the cache is not secret
    threads = torch.get_num_threads()
    torch.set_num_threads(config.pretrain.num_threads)
    try:
        manifest = build_toy_assets(building, config, console)
        _replace_directory(building, root)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(building, ignore_errors=True)
    metrics = manifest["metrics"]
    console.print(
        f"toy model: {metrics['params'] / 1e6:.2f}M params, {metrics['steps']} steps, {metrics['seconds']:.0f}s; "
        f"held-out accuracy greedy {metrics['test_greedy_accuracy']:.1%}, T=1 pass@1 {metrics['test_pass@1']:.1%}, "
        f"pass@{config.eval_samples} {metrics[f'test_pass@{config.eval_samples}']:.1%} -> {root}",
        soft_wrap=True,
    )
    return _assets(root, manifest)
