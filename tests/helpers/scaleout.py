"""Running `tests/scaleout_run.py` in subprocesses (one or several launchers at once) and comparing runs: shared by
test_distributed.py and test_multinode.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "scaleout_run.py"
# The ranks' all-reduce sums in another order than one process, so logged metrics differ in float32 rounding, and the
# differences grow over the optimizer steps: the grad norm of the third step differed by 1e-6 relative on one 2-core
# machine and by more than 2e-6 on another. 2e-5 is 10x that and still far below what a wrong normaliser or a rank
# sampling other tokens would move (percents).
METRIC_TOLERANCE = dict(abs=2e-6, rel=2e-5)
RUN_TIMEOUT_S = 120
WEIGHT_TOLERANCE = 2e-5  # after 6 AdamW steps at lr 1e-3; weights move by ~5e-3


def run_commands(*runs: tuple[list[str], dict]) -> None:
    """Start every (command, Popen keyword arguments) at once (e.g. one launcher per simulated node), wait for all and
    assert that each succeeded; past RUN_TIMEOUT_S all are killed and the test fails."""
    processes = []
    for command, popen_kwargs in runs:
        # Output to a file, not a pipe that fills while the other command is waited for. A new session: if ranks
        # deadlock, a launcher and the ranks it started are killed together.
        output = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                   **popen_kwargs)  # fmt: skip
        processes.append((process, output))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for process, _ in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        for process, _ in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        processes[0][1].seek(0)
        tail = processes[0][1].read()[-2000:]
        pytest.fail(f"{runs[0][0][:3]} did not finish in {RUN_TIMEOUT_S} s (ranks out of step?); its output:\n{tail}")
    for process, output in processes:
        output.seek(0)
        assert process.returncode == 0, output.read()[-4000:]


def run_command(command: list[str], **popen_kwargs) -> None:
    """Run to completion and assert success; a run past RUN_TIMEOUT_S fails the test."""
    run_commands((command, popen_kwargs))


def train_each(model_dir: Path, out_dir: Path, strategy: str, configs: list[str], *extra: str) -> dict[str, dict]:
    """Run the script once for all `configs` (one after another in the same processes); returns per config what
    rank 0 wrote: {"records", "sharded", "activation_checkpointing", "weights"}."""
    command = [sys.executable, str(SCRIPT), str(model_dir), str(out_dir), "--strategy", strategy, "--config", *configs]
    run_command([*command, *extra])
    return {config: read_run(out_dir / config) for config in configs}


def train(model_dir: Path, out_dir: Path, strategy: str, config: str, *extra: str) -> dict:
    """Run the script for one config; returns rank 0's {"records", "sharded", "activation_checkpointing", "weights"}."""
    return train_each(model_dir, out_dir, strategy, [config], *extra)[config]


def read_run(out_dir: Path) -> dict:
    """What rank 0 of a `scaleout_run.py` run wrote: {"records", "sharded", "activation_checkpointing", "weights"}."""
    run = json.loads((out_dir / "run.json").read_text())
    run["weights"] = torch.load(out_dir / "weights.pt")
    return run


def assert_same_run(expected: dict, actual: dict, weight_tolerance: float = WEIGHT_TOLERANCE) -> None:
    by_epoch = {record["epoch"]: record for record in expected["records"]}
    assert actual["records"], "no batch was trained"
    for record in actual["records"]:
        reference = by_epoch[record["epoch"]]
        assert record.keys() == reference.keys()
        for name, value in record.items():
            assert value == pytest.approx(reference[name], **METRIC_TOLERANCE), f"{name} at epoch {record['epoch']}"
    for name, tensor in expected["weights"].items():
        torch.testing.assert_close(actual["weights"][name], tensor, atol=weight_tolerance, rtol=0, msg=name)


# The configs each strategy trains for the test files (the `scaleout_runs` fixture): test_distributed.py compares
# erpo, shared_prompt, fused_output and reinforce across strategies, test_lora.py lora, test_multinode.py erpo on one
# process. fused_output is compared with the unfused single run, so one process does not train it.
SHARED_CONFIGS = {
    "single": ["erpo", "shared_prompt", "reinforce", "lora"],
    "ddp": ["erpo", "shared_prompt", "fused_output", "reinforce", "lora"],
    "fsdp": ["erpo", "shared_prompt", "fused_output", "reinforce", "lora"],
}


class ScaleoutRuns:
    """The `scaleout_run.py` runs that test_distributed.py, test_lora.py and test_multinode.py read, one launch per
    strategy (SHARED_CONFIGS, in one processes' lifetime: a launch is seconds of imports per rank, each tiny run a
    fraction of that), started when a test first asks for its strategy and kept for the session. The FSDP2 launch
    saves its checkpoints (the resume and export tests read erpo's). `runs(strategy)[config]` is what `train`
    returns."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        self.root, self.model_dir, self._runs = root, model_dir, {}

    def __call__(self, strategy: str) -> dict[str, dict]:
        if strategy not in self._runs:
            extra = ["--save-checkpoints"] if strategy == "fsdp" else []
            self._runs[strategy] = train_each(
                self.model_dir, self.root / strategy, strategy, SHARED_CONFIGS[strategy], *extra
            )
        return self._runs[strategy]

    def checkpoints(self, config: str) -> Path:
        """The end-of-epoch checkpoints (`epoch=0.ckpt`, ...) of `config`'s FSDP2 run."""
        self("fsdp")
        return self.root / "fsdp" / config / "checkpoints"
