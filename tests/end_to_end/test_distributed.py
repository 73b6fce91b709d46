"""Scale-out: the same global rollout batches trained on 2 CPU processes (DDP, FSDP2) equal 1 process.

Each run is `tests/scaleout_run.py` in a subprocess (Lightning launches the second rank itself, gloo); the configs
of one strategy train in one launch (the session's `scaleout_runs`, shared with test_lora.py and test_multinode.py),
the resumed run in one of its own. Compared per
batch: every logged `train/` metric (loss, PG loss, Query-KL, Policy-KL, clip fractions, weights, ...), and the final
weights. The runs use several optimizer steps and uneven micro-batch counts per rank, active gradient clipping, and
(second config) the batch-global REINFORCE baseline, batch-normalised weights, a sharded reference model and
activation checkpointing. Resuming from an FSDP2 distributed checkpoint and exporting it to Hugging Face are checked
against the uninterrupted run.
"""

from __future__ import annotations

import pytest
import torch
from helpers.scaleout import assert_same_run, train
from transformers import AutoModelForCausalLM

from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.export.hf_model import export_checkpoint

pytestmark = pytest.mark.distributed  # several processes over gloo: `make test-fast` leaves them out


@pytest.fixture(scope="module")
def erpo_runs(scaleout_runs, tmp_path_factory) -> dict[str, dict]:
    """The erpo config on 1 process, DDP and FSDP2 (the session's `scaleout_runs`), and the FSDP2 run resumed from
    its first epoch's distributed checkpoint in a launch of its own (fresh processes, as a resume is)."""
    runs = {strategy: scaleout_runs(strategy)["erpo"] for strategy in ("single", "ddp", "fsdp")}
    runs["checkpoints"] = scaleout_runs.checkpoints("erpo")
    resume = ["--resume", str(runs["checkpoints"] / "epoch=0.ckpt")]
    runs["resumed"] = train(scaleout_runs.model_dir, tmp_path_factory.mktemp("resumed"), "fsdp", "erpo", *resume)
    return runs


def test_training_moved_the_policy_and_query_kl(erpo_runs, scaleout_runs):
    """Guards the comparisons below against a trivial pass (nothing trained, Query-KL zero)."""
    single = erpo_runs["single"]
    initial = AutoModelForCausalLM.from_pretrained(scaleout_runs.model_dir).state_dict()
    assert max((single["weights"][k] - initial[k]).abs().max().item() for k in initial) > 1e-3
    assert all(record["train/query_kl"] > 1e-3 for record in single["records"])
    assert [record["train/policy_version"] for record in single["records"]] == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_equal_one(erpo_runs, strategy):
    assert erpo_runs[strategy]["sharded"] == (strategy == "fsdp")
    assert_same_run(erpo_runs["single"], erpo_runs[strategy])


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_the_shared_prompt_on_two_processes_equals_the_exact_step_on_one(erpo_runs, scaleout_runs, strategy):
    """`query_kl_scoring: shared_prompt` (the responses on their prompt's keys and values, the prompt's backward last)
    trains as exact scoring does, on one process and under DDP and FSDP2, with uneven micro-batch counts per rank."""
    shared = scaleout_runs(strategy)["shared_prompt"]
    assert shared["sharded"] == (strategy == "fsdp")
    assert_same_run(erpo_runs["single"], shared)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_fused_output_layer_on_two_processes_equals_one_process(erpo_runs, scaleout_runs, strategy):
    """`model.fused_output_layer` reads the output layer's weight after the model's forward (FSDP2 leaves the root's
    weights gathered until backward) and hands it its gradient: DDP and FSDP2 train as one unfused process does."""
    fused = scaleout_runs(strategy)["fused_output"]
    assert fused["sharded"] == (strategy == "fsdp")
    assert_same_run(erpo_runs["single"], fused)


def test_resume_from_fsdp2_checkpoint_continues_identically(erpo_runs):
    resumed = erpo_runs["resumed"]
    assert [record["epoch"] for record in resumed["records"]] == [1, 2]
    files = {p.name for p in (erpo_runs["checkpoints"] / "epoch=0.ckpt").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= files  # one shard per rank
    assert_same_run(erpo_runs["fsdp"], resumed, weight_tolerance=0.0)


def test_export_hugging_face_directory_from_shards(erpo_runs, scaleout_runs, tmp_path):
    checkpoint = erpo_runs["checkpoints"] / "epoch=2.ckpt"
    exported = export_checkpoint(checkpoint, tmp_path / "hf", str(scaleout_runs.model_dir))
    state = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    assert state.keys() == erpo_runs["fsdp"]["weights"].keys()
    for name, tensor in erpo_runs["fsdp"]["weights"].items():
        assert torch.equal(state[name], tensor), name


def test_validate_reads_a_sharded_checkpoint_in_one_process(erpo_runs, scaleout_runs, tmp_path):
    policy = AutoModelForCausalLM.from_pretrained(scaleout_runs.model_dir)
    load_policy_weights(policy, str(erpo_runs["checkpoints"] / "epoch=2.ckpt"))
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, erpo_runs["fsdp"]["weights"][name]), name
    config = {**policy.config.to_dict(), "num_hidden_layers": 3}
    config.pop("layer_types", None)  # derived from num_hidden_layers again
    bigger = AutoModelForCausalLM.from_config(policy.config.__class__(**config))
    with pytest.raises(
        ValueError, match="Missing key .*layers.2"
    ):  # a weight the checkpoint lacks: refused, not left as is
        load_policy_weights(bigger, str(erpo_runs["checkpoints"] / "epoch=2.ckpt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a checkpoint file nor a sharded checkpoint directory"):
        load_policy_weights(policy, str(tmp_path / "empty"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_global_baseline_weights_and_reference_model_equal_one_process(scaleout_runs, strategy):
    single = scaleout_runs("single")["reinforce"]
    distributed = scaleout_runs(strategy)["reinforce"]
    assert distributed["activation_checkpointing"] and distributed["sharded"] == (strategy == "fsdp")
    assert all(record["train/policy_kl"] > 0 for record in single["records"])
    assert_same_run(single, distributed)
