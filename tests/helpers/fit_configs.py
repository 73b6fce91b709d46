"""The `erpo fit` config that command-line tests start from, and the installed `erpo` command to run it with.

`fit_config` returns the smallest run the CLI accepts (2 steps of 2 queries x 2 rollouts, HF engine, math reward,
`plain` template); a test passes only the sections it is about, which are merged into it key by key.
"""

import os
import subprocess
import sys
from pathlib import Path

import yaml

ERPO = str(Path(sys.executable).with_name("erpo"))


def merged(base: dict, changes: dict) -> dict:
    """`base` with `changes` applied: nested dicts merge key by key; anything else (lists, and a component given by
    its `class_path`, whose init_args belong to it) replaces."""
    out = dict(base)
    for key, value in changes.items():
        nested = isinstance(value, dict) and "class_path" not in value and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if nested else value
    return out


def fit_config(model_path, train: list[dict], root: Path, **changes) -> dict:
    """A 2-step `erpo fit` config of `model_path` on the `train` sources under `root`; `changes` by section."""
    base = {
        "seed_everything": 0,
        "trainer": {"max_steps": 2, "accelerator": "cpu", "default_root_dir": str(root), "logger": False},
        "model": {"model_path": str(model_path), "algorithm": "erpo"},
        "data": {
            "train": train,
            "template": "plain",
            "max_prompt_length": 1024,
            "batch_size": 2,
            "cache_dir": str(root / "cache"),
        },
        "rollout": {
            "engine": {"class_path": "erpo_lightning.rollout.HFEngine"},
            "reward": {"class_path": "erpo_lightning.rewards.MathReward", "init_args": {"num_workers": 0}},
            "group_size": 2,
            "max_new_tokens": 6,
            "seed": 0,
        },
    }
    return merged(base, changes)


def csv_logger(save_dir: Path) -> dict:
    """A `trainer.logger` value: Lightning's CSVLogger writing metrics.csv under `save_dir`."""
    return {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(save_dir)}}


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def run_erpo(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The installed `erpo ARGS`, output captured; its cache home is `cwd`/erpo-cache unless `env` names one."""
    env = {**os.environ, "ERPO_CACHE_HOME": str(Path(cwd or ".") / "erpo-cache"), **(env or {})}
    return subprocess.run([ERPO, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
