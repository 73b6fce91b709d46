"""Shared fixtures: a tiny Qwen2 model built locally (no hub) and the packaged benchmark files."""

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
