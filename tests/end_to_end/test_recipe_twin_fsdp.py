"""The 7B recipe's CPU twin (configs/twins/fsdp_qwen2.5_math_7b_cpu.yaml given after configs/fsdp_qwen2.5_math_7b.yaml)
through the real `erpo` command, then `erpo export` of its sharded checkpoint.

It runs on 2 processes (FSDP2 over gloo; ~30 s alone): the recipe's sharded checkpoints and FSDP2's bf16 compute need
them. The shared scale-out launches of tests/scaleout_run.py build their module in Python, not from a config file, so
they cannot carry a recipe; this launch replaces the plain-config FSDP2 `erpo fit` the suite had instead.
"""

import pytest
from helpers.fit_configs import run_erpo
from helpers.twins import metrics, workspace
from transformers import AutoModelForCausalLM

FSDP, FSDP_TWIN = "configs/fsdp_qwen2.5_math_7b.yaml", "configs/twins/fsdp_qwen2.5_math_7b_cpu.yaml"


@pytest.mark.distributed
def test_the_fsdp_twin_trains_on_two_processes_then_exports(tmp_path):
    """`erpo fit` of the 7B recipe's twin as its header runs it: FSDP2 on 2 processes with bf16 compute, HF generate
    with synced_gpus, the cache built on 2 ranks; then `erpo export` of its sharded last.ckpt."""
    root = workspace(tmp_path)
    result = run_erpo("fit", "--config", FSDP, "--config", FSDP_TWIN, cwd=root)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    run = root / "runs" / "paper" / "erpo" / "erpo" / "version_0"
    query_kl = [float(row["train/query_kl"]) for row in metrics(run) if row.get("train/query_kl")]
    # The cache built on 2 ranks along the bf16 path, the step's queries scored by the sharded policy sharing each
    # prompt with its responses: equal at θ0 to the bit.
    assert len(query_kl) == 2 and query_kl[0] == 0.0 < query_kl[1]
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir() and (checkpoint / "__1_0.distcp").is_file()
    exported = run_erpo("export", "--ckpt_path", str(checkpoint), "--out", str(tmp_path / "hf"), cwd=root)
    assert exported.returncode == 0, (exported.stdout + exported.stderr)[-3000:]
    AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
