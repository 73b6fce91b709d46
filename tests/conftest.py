"""Shared fixtures: a tiny Qwen2 model built locally (no hub), the packaged benchmark files, one healthy toy run and
the scale-out runs of several processes; and how `make test` splits the suite between its two pytest-xdist workers
(`pytest_collection_modifyitems`)."""

import os
from pathlib import Path

import pytest

from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.toy.tiny_qwen2 import load_tiny_model, save_tiny_model


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
    lines and checkpoint the tests that only read an artifact share. Read it; copy before changing anything.

    Under pytest-xdist the workers of a session share it: it lives beside their own temporary folders, and the first
    worker to ask trains it (`shared_healthy_run`)."""
    from helpers.healthy_run import run_healthy, shared_healthy_run

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return run_healthy(tmp_path_factory.mktemp("healthy_toy_run"))
    return shared_healthy_run(tmp_path_factory.getbasetemp().parent / "healthy_toy_run")


@pytest.fixture(scope="session")
def scaleout_runs(tmp_path_factory):
    """`tests/scaleout_run.py`'s runs of the tiny model (seed 0) on 1 process, DDP and FSDP2, each strategy launched
    once for every config the files of the `processes` group compare (helpers/scaleout.py, `ScaleoutRuns`), so
    test_distributed.py, test_lora.py and test_multinode.py share them on their one worker."""
    from helpers.scaleout import ScaleoutRuns

    root = tmp_path_factory.mktemp("scaleout")
    return ScaleoutRuns(root, save_tiny_model(root / "model", seed=0))


# Files with a test that starts a vLLM engine or several processes over gloo: they run one after another on one
# worker, never beside each other (their engines and ranks each want both cores, and their memory), while the other
# worker takes the in-process and single-`erpo` tests.
PROCESS_MARKERS = ("vllm", "distributed")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the workers' test ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`), keep each test file on one worker, so its module-scoped fixtures (a
    trained run, a started engine) are built once; and the files of PROCESS_MARKERS all on the same worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    process_files = {item.path for item in items if any(item.get_closest_marker(m) for m in PROCESS_MARKERS)}
    for item in items:
        group = "processes" if item.path in process_files else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group))
