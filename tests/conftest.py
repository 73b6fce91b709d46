"""Shared fixtures: a tiny Qwen2 model built locally (no hub), the packaged benchmark files, and one healthy toy run."""

from pathlib import Path

import pytest

from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.tiny_qwen2 import load_tiny_model, save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """Directory of a randomly initialised tiny Qwen2ForCausalLM + byte-level tokenizer (save_pretrained format)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture()
def tiny_model(tiny_model_path):
    return load_tiny_model(tiny_model_path)


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """The benchmark files packaged with erpo_lightning (erpo_lightning/benchmarks)."""
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def healthy_toy_run(tmp_path_factory):
    """A healthy toy run (tests/helpers/healthy_run.py): one 12-step `erpo fit` whose logs, completions, progress
    lines and checkpoint the tests that only read an artifact share. Read it; copy before changing anything."""
    from helpers.healthy_run import run_healthy

    return run_healthy(tmp_path_factory.mktemp("healthy_toy_run"))
