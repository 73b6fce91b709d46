"""Two nodes on one machine (issue 30, item 13): two `torchrun --nnodes 2` launchers of one process each, and two
simulated SLURM tasks of one job, rendezvous on 127.0.0.1 (gloo, CPU) and train like the runs they stand for.

- `scaleout_run.py` on two torchrun nodes equals one process (the fixed global batches of test_distributed.py).
- `erpo fit` of the shipped toy model (FSDP2, HF engine, real rollouts and grading, `trainer.num_nodes: 2`) under
  torchrun, and as SLURM tasks with the variables srun gives them plus those configs/multinode_slurm.sh exports,
  logs the same metrics and ends with the same weights as `erpo fit` on 2 local ranks (Lightning's own launcher):
  same global batches, same per-rank rollout seeds. Each rank records the cluster environment Lightning chose and the
  ranks it read from it.
- `erpo cache` of a 2-rank config computes on 2 ranks, and equals the cache that `erpo fit` builds on 2 nodes.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers.fit_configs import ERPO, csv_logger, fit_config, write_config
from helpers.scaleout import METRIC_TOLERANCE, SCRIPT, WEIGHT_TOLERANCE, assert_same_run, read_run, run_commands
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.toy import SHIPPED_DIR

pytestmark = pytest.mark.distributed  # several processes over gloo: `make test-fast` leaves them out

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TESTS = os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])])
TIMING = {"rollout/tokens_per_s", "rollout/weight_sync_ms"}  # wall-clock measurements, not training results


def free_port(low: int = 0, high: int = 0) -> int:
    """A TCP port of 127.0.0.1 that nothing listens on: any (the default), or the first free one in [low, high)."""
    for port in range(low, high) if low else [0]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise RuntimeError(f"no free port in [{low}, {high})")


def torchrun_node(*command: str) -> list[str]:
    """One of two `torchrun --nnodes 2` launchers (one process each) that meet at a c10d rendezvous on 127.0.0.1,
    as docs/scaling.md runs them on each node; both get the same command."""
    endpoint = f"127.0.0.1:{free_port()}"
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    return [TORCHRUN, *rendezvous, *command]


def slurm_task(task: int, job_id: int) -> dict[str, str]:
    """What srun gives task `task` of a job of 2 nodes × 1 task, and what configs/multinode_slurm.sh exports from it.
    No MASTER_ADDR / MASTER_PORT: Lightning takes them from SLURM_NODELIST and the job id (port 15000 + its last 4
    digits)."""
    return {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "erpo-two-nodes", "SLURM_NODELIST": "localhost",
        "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_PROCID": str(task), "SLURM_LOCALID": "0", "SLURM_NODEID": str(task),
        "RANK": str(task), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
    }  # fmt: skip


class RecordRanks(pl.Callback):
    """Writes `<folder>/rank<global rank>.json`: the cluster environment the trainer chose and the ranks it read."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        environment = trainer.strategy.cluster_environment
        ranks = {
            "environment": type(environment).__name__, "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank, "node_rank": trainer.node_rank, "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
        }  # fmt: skip
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(ranks))


def toy_config(root: Path, devices: int, num_nodes: int) -> Path:
    """`erpo fit` of the shipped toy model on 2 ranks (FSDP2, HF generate): 2 steps of 4 queries × 4 responses per
    rank, long enough for answers to be graded right and wrong; metrics in `root/logs`, ranks in `root`."""
    strategy = {
        "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
        "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1},
    }
    callbacks = [{"class_path": "test_multinode.RecordRanks", "init_args": {"folder": str(root)}}]
    config = fit_config(
        SHIPPED_DIR, [{"path": str(SHIPPED_DIR / "train.jsonl"), "label": "toy_train"}], root,
        trainer={"devices": devices, "num_nodes": num_nodes, "strategy": strategy, "logger": csv_logger(root / "logs"),
                 "log_every_n_steps": 1, "enable_progress_bar": False, "callbacks": callbacks},
        model={"learning_rate": 1e-4},
        data={"batch_size": 4, "max_prompt_length": 64, "suffix": "\n"},
        rollout={"engine": {"class_path": "erpo_lightning.rollout.HFEngine", "init_args": {"synced_gpus": True}},
                 "group_size": 4, "max_new_tokens": 48},
    )  # fmt: skip
    root.mkdir(parents=True)
    return write_config(root / "fit.yaml", config)


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory) -> dict[str, Path]:
    """The run folders of `erpo cache` + `erpo fit` on 2 local ranks, and `erpo fit` on 2 torchrun nodes and as 2
    SLURM tasks. One thread per process, so that every run sums in the same order."""
    root = tmp_path_factory.mktemp("toy_runs")
    pythonpath = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))  # for RecordRanks
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ERPO_CACHE_HOME": str(root / "home"), "PYTHONPATH": pythonpath}
    local = toy_config(root / "local", devices=2, num_nodes=1)
    run_commands(([ERPO, "cache", "--config", str(local)], {"env": env}))
    run_commands(([ERPO, "fit", "--config", str(local)], {"env": env}))
    nodes = toy_config(root / "nodes", devices=1, num_nodes=2)
    launcher = torchrun_node("-m", "erpo_lightning.cli", "fit", "--config", str(nodes))
    run_commands((launcher, {"env": env}), (launcher, {"env": env}))
    slurm = toy_config(root / "slurm", devices=1, num_nodes=2)
    job_id = 700000 + free_port(15000, 25000) - 15000  # Lightning's port for this job id is free
    tasks = [([ERPO, "fit", "--config", str(slurm)], {"env": {**env, **slurm_task(task, job_id)}}) for task in (0, 1)]
    run_commands(*tasks)
    return {"local": root / "local", "nodes": root / "nodes", "slurm": root / "slurm"}


def read_fit(folder: Path) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """(the logged rows of every step without TIMING, the policy weights of the run's last checkpoint)."""
    rows = list(csv.DictReader(next((folder / "logs").rglob("metrics.csv")).open()))
    metrics = [{k: float(v) for k, v in row.items() if v != "" and k not in TIMING} for row in rows]
    policy = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    load_policy_weights(policy, str(next((folder / "logs").rglob("*.ckpt"))))
    return metrics, policy.state_dict()


def assert_same_fit(expected: Path, actual: Path) -> None:
    expected_metrics, expected_weights = read_fit(expected)
    actual_metrics, actual_weights = read_fit(actual)
    assert len(actual_metrics) == len(expected_metrics) == 2
    for reference, row in zip(expected_metrics, actual_metrics, strict=True):
        assert row.keys() == reference.keys()
        for name, value in row.items():
            assert value == pytest.approx(reference[name], **METRIC_TOLERANCE), f"{name} at step {row['step']}"
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(actual_weights[name], tensor, atol=WEIGHT_TOLERANCE, rtol=0, msg=name)


def ranks(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_the_local_run_learned_something(toy_runs):
    """Guards the comparisons below against a trivial pass: graded answers vary, and the weights moved."""
    metrics, weights = read_fit(toy_runs["local"])
    assert all(row["rollout/reward_std"] > 0 for row in metrics)
    initial = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR).state_dict()
    assert max((weights[k] - initial[k]).abs().max().item() for k in initial) > 1e-5
    assert [r["environment"] for r in ranks(toy_runs["local"])] == ["LightningEnvironment"] * 2


def test_erpo_fit_on_two_torchrun_nodes_equals_two_local_ranks(toy_runs):
    for rank, found in enumerate(ranks(toy_runs["nodes"])):
        assert found["environment"] == "TorchElasticEnvironment"
        assert (found["global_rank"], found["node_rank"], found["local_rank"]) == (rank, rank, 0)
        assert (found["world_size"], found["num_nodes"]) == (2, 2)
    assert_same_fit(toy_runs["local"], toy_runs["nodes"])


def test_erpo_fit_as_two_slurm_tasks_equals_two_local_ranks(toy_runs):
    for rank, found in enumerate(ranks(toy_runs["slurm"])):
        assert found["environment"] == "SLURMEnvironment"
        assert (found["global_rank"], found["node_rank"], found["local_rank"]) == (rank, rank, 0)
        assert (found["world_size"], found["num_nodes"]) == (2, 2)
    assert_same_fit(toy_runs["local"], toy_runs["slurm"])


def test_erpo_cache_on_two_ranks_equals_the_cache_fit_builds_on_two_nodes(toy_runs):
    cached = load_file(str(toy_runs["local"] / "cache" / "scores.safetensors"))  # `erpo cache`; fit loaded it
    built = load_file(str(toy_runs["nodes"] / "cache" / "scores.safetensors"))  # computed at fit start
    assert cached.keys() == built.keys()
    for name, tensor in cached.items():
        assert torch.equal(built[name], tensor), name


def test_scaleout_run_on_two_torchrun_nodes_equals_one_process(scaleout_runs, tmp_path):
    single = scaleout_runs("single")["erpo"]
    command = [sys.executable, str(SCRIPT), str(scaleout_runs.model_dir), str(tmp_path / "nodes"), "--strategy",
               "fsdp", "--config", "erpo", "--num-nodes", "2"]  # fmt: skip
    launcher = torchrun_node(*command[1:])
    run_commands((launcher, {}), (launcher, {}))
    nodes = read_run(tmp_path / "nodes" / "erpo")
    assert nodes["sharded"]
    assert_same_run(single, nodes)
