"""Every shipped config parses with the real CLI, and the paper overlays select what they claim."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
OVERLAYS = {"grpo.yaml": "grpo", "grpo_kl.yaml": "grpo_kl", "dapo.yaml": "dapo", "rloo.yaml": "rloo"}

# Parses (without instantiating anything: no model is loaded) each config as `erpo fit --print_config` does.

pytestmark = pytest.mark.slow  # every shipped config through the real CLI in a subprocess

SCRIPT = """
import contextlib, io, json, sys
from erpo_lightning.cli.command import main
results = {}
for configs in json.loads(sys.argv[1]):
    out = io.StringIO()
    args = ["fit", "--print_config"] + [a for c in configs for a in ("--config", c)]
    with contextlib.redirect_stdout(out):
        try:
            main(args)
        except SystemExit as stop:
            assert not stop.code, (configs, stop.code)
    results["+".join(configs)] = out.getvalue()
print(json.dumps(results))
"""


def test_configs_parse_and_overlays_apply():
    base = str(CONFIGS / "fsdp_qwen2.5_math_7b.yaml")
    think_format = str(CONFIGS / "think_format_example.yaml")
    runs = [[str(CONFIGS / "quickstart.yaml")], [base], [think_format]]
    runs += [[base, str(CONFIGS / "paper" / name)] for name in OVERLAYS]
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(runs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {key: yaml.safe_load(text) for key, text in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    quickstart = printed[str(CONFIGS / "quickstart.yaml")]["model"]
    assert quickstart["algorithm"] == "erpo"
    # The default AdamW + linear warm-up, configured by the model's own fields (as before they were configurable).
    assert (quickstart["optimizer"], quickstart["lr_scheduler"]) == (None, None)
    assert (quickstart["learning_rate"], quickstart["warmup_steps"]) == (1e-4, 5)
    assert printed[base]["model"]["algorithm"] == "erpo"
    for name, algorithm in OVERLAYS.items():
        config = printed[f"{base}+{CONFIGS / 'paper' / name}"]
        assert config["model"]["algorithm"] == algorithm
        assert config["data"]["batch_size"] == 64 and config["rollout"]["group_size"] == 8  # the base is kept
    dapo = printed[f"{base}+{CONFIGS / 'paper' / 'dapo.yaml'}"]["rollout"]
    assert dapo["dynamic_sampling"] is True and dapo["overlong_buffer"] == 512
    combined = printed[think_format]["rollout"]["reward"]
    assert combined["class_path"] == "erpo_lightning.rewards.CombinedReward"
    parts = combined["init_args"]
    assert [r["class_path"].rsplit(".", 1)[1] for r in parts["rewards"]] == ["MathReward", "ThinkFormatReward"]
    assert (parts["weights"], parts["names"]) == ([1.0, 0.1], ["math", "format"])
    assert printed[think_format]["data"]["template"] == "erpo-paper"


def test_the_quickstart_sweep_file_parses_as_a_validate_config(capsys):
    """docs/quickstart.md's `erpo validate` line: the shipped sweep file over the quickstart config."""
    from helpers.cli_runs import run_main

    configs = ("--config", str(CONFIGS / "quickstart.yaml"), "--config", str(CONFIGS / "quickstart_sweep.yaml"))
    assert run_main("validate", *configs, "--print_config") == 0
    sweep = yaml.safe_load(capsys.readouterr().out)["sweep"]
    assert sweep["temperatures"] == [0.1, 0.5, 1.0, 1.5] and sweep["max_problems"] == 100
    assert [b["source"]["path"] for b in sweep["benchmarks"]] == ["erpo_lightning/toy/shipped/test.jsonl"]
