"""The real `erpo` parser rejects a mistyped choice at parse time, and the `erpo_released` overlay parses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
PAPER = str(CONFIGS / "fsdp_qwen2.5_math_7b.yaml")

# Each run is `erpo <subcommand> --print_config ...` in this one process (nothing is instantiated, no model loaded).

pytestmark = pytest.mark.slow  # the real CLI parser in a subprocess

SCRIPT = """
import contextlib, io, json, sys
from erpo_lightning.cli.command import main
results = {}
for args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([args[0], "--print_config", *args[1:]])
        except SystemExit as stop:
            code = stop.code or 0
    results[" ".join(args)] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(results))
"""

BAD = {
    "--model.algorithm=erpo_paper": "algorithm",
    "--model.advantage_estimator=foo": "advantage_estimator",
    "--model.loss_aggregation=token-mean": "loss_aggregation",
    "--model.query_kl_estimator=seq_k3": "query_kl_estimator",
    "--model.kl_clamp_mode=values": "kl_clamp_mode",
    "--model.query_kl_aggregation=like_policy": "query_kl_aggregation",
    "--model.query_weight_source=currents": "query_weight_source",
    "--model.query_weight_norm=global": "query_weight_norm",
    "--model.policy_kl_kind=k4": "policy_kl_kind",
    "--model.dtype=bf16": "dtype",
}


def parse(runs: list[list[str]]) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(runs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_mistyped_choice_is_rejected_at_parse_and_good_ones_pass():
    bad = [["fit", "--config", QUICKSTART, flag] for flag in BAD]
    released_configs = ["--config", PAPER, "--config", str(CONFIGS / "paper" / "erpo_released.yaml")]
    good = [
        ["fit", "--config", QUICKSTART, "--model.algorithm=erpo_released", "--model.kl_clamp_mode=log_ratio"],
        ["fit", *released_configs],
        ["validate", *released_configs, "--config", str(CONFIGS / "paper" / "erpo_released_validate.yaml")],
    ]
    results = parse(bad + good)
    for flag, field in BAD.items():
        result = results[f"fit --config {QUICKSTART} {flag}"]
        assert result["code"] != 0, f"{flag} was accepted"
        assert field in result["err"] and flag.split("=")[1] in result["err"], result["err"][-2000:]
        assert len(result["err"].strip().splitlines()) == 2, result["err"][-2000:]  # one line + the hint, no usage
    quick = yaml.safe_load(results[" ".join(good[0])]["out"])
    assert quick["model"]["algorithm"] == "erpo_released" and quick["model"]["kl_clamp_mode"] == "log_ratio"
    released = yaml.safe_load(results[" ".join(good[1])]["out"])
    assert released["model"]["algorithm"] == "erpo_released" and released["model"]["update_batch_size"] is None
    assert released["model"]["model_path"] == "Qwen/Qwen2.5-7B" and released["rollout"]["max_new_tokens"] == 8192
    assert released["data"]["batch_size"] * 8 == 128 and released["rollout"]["group_size"] == 8
    engine = released["rollout"]["engine"]["init_args"]
    assert engine["max_model_len"] == 9216 and engine["enable_sleep_mode"] is True  # merged with the base's engine
    assert released["model"]["fsdp_mixed_precision"] == "bfloat16"  # bf16 compute, like the released actor
    sweep = yaml.safe_load(results[" ".join(good[2])]["out"])["sweep"]
    assert (sweep["temperatures"], sweep["top_p"], sweep["max_new_tokens"]) == ([1.0], 0.95, 8192)
