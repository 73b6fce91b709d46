"""The GPU recipes' CPU twins (configs/twins/): each recipe with its twin overlay given after it, through the real
`erpo` command, and docs/one_gpu.md's later commands on the one-GPU twin's output.

A twin swaps in the shipped toy model, HFEngine and CPU-sized shapes and nothing else, so the recipe's features
(mixed precision, the shared prompt, the fused output layer, the mismatch correction, its checkpoints and export)
run as the recipe sets them; `test_a_twin_changes_the_model_and_the_shapes_only` holds the overlays to that.

The one-GPU twin runs the page's own `twin-commands` block (train, `erpo validate` and `erpo export` on its
last.ckpt); the 7B recipe's twin, on 2 processes, is tests/end_to_end/test_recipe_twin_fsdp.py.
"""

from __future__ import annotations

import shlex

import pytest
import torch
import yaml
from helpers.docs import example
from helpers.fit_configs import run_erpo
from helpers.twins import REPO, metrics, workspace
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import erpo_lightning.cli.command as cli

ONE_GPU, ONE_GPU_TWIN = "configs/one_gpu_qwen2.5_math_1.5b.yaml", "configs/twins/one_gpu_qwen2.5_math_1.5b_cpu.yaml"
FSDP, FSDP_TWIN = "configs/fsdp_qwen2.5_math_7b.yaml", "configs/twins/fsdp_qwen2.5_math_7b_cpu.yaml"
# What a twin may set besides the toy model: where it runs, how long, and the sizes of data, rollout and sweeps.
TWIN_FIELDS = {
    "trainer": {"accelerator", "devices", "strategy", "max_steps", "callbacks"},
    "model": {"model_path", "update_batch_size"},
    "data": {"train", "template", "suffix", "max_prompt_length", "batch_size"},
    "rollout": {"engine", "reward", "group_size", "max_new_tokens"},
}


def page_commands() -> list[list[str]]:
    """docs/one_gpu.md's `twin-commands` block, one argument list per command, `.venv/bin/erpo` as this `erpo`."""
    text = example("one_gpu.md", "twin-commands", "bash").replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]
    assert all(command[0] == ".venv/bin/erpo" for command in commands), commands
    return [command[1:] for command in commands]


@pytest.fixture(scope="module")
def one_gpu_twin(tmp_path_factory) -> dict:
    """The page's three commands, in order, in a fresh workspace: their results and the workspace."""
    root = workspace(tmp_path_factory.mktemp("one_gpu_twin"))
    results = []
    for args in page_commands():
        results.append(run_erpo(*args, cwd=root))
        assert results[-1].returncode == 0, (args, (results[-1].stdout + results[-1].stderr)[-3000:])
    return {"root": root, "fit": results[0], "validate": results[1], "export": results[2]}


@pytest.mark.parametrize(("recipe", "twin"), [(ONE_GPU, ONE_GPU_TWIN), (FSDP, FSDP_TWIN)])
def test_a_twin_changes_the_model_and_the_shapes_only(recipe, twin):
    """Its keys are within TWIN_FIELDS, its callbacks are the recipe's, in order, and it leaves the checkpoints'
    settings to the recipe; so every setting the recipe switches on stays on in the twin."""
    recipe, twin = (yaml.safe_load((REPO / path).read_text()) for path in (recipe, twin))
    assert twin["model"]["model_path"] == "erpo_lightning/toy/shipped"
    for group, values in twin.items():
        assert set(values) <= TWIN_FIELDS[group], (group, set(values) - TWIN_FIELDS[group])
    callbacks = twin["trainer"].get("callbacks")
    if callbacks is not None:
        assert [c["class_path"] for c in callbacks] == [c["class_path"] for c in recipe["trainer"]["callbacks"]]
        assert all("init_args" not in c for c in callbacks if c["class_path"].endswith("ModelCheckpoint"))


@pytest.mark.slow
def test_the_one_gpu_twin_trains_with_the_recipes_settings(one_gpu_twin):
    """2 steps with bf16 autocast, the shared prompt, checkpointed layers, the fused output layer and the sequence
    mismatch correction: Query-KL exactly 0 at θ0, the correction's ratios logged, and last.ckpt where the page says."""
    output = one_gpu_twin["fit"].stdout + one_gpu_twin["fit"].stderr
    assert "step 2/2" in output and "held-out accuracy before and after training" in output, output[-3000:]
    run = one_gpu_twin["root"] / "runs" / "one_gpu" / "erpo" / "version_0"
    config = yaml.safe_load((run / "config.yaml").read_text())["model"]
    assert (config["mixed_precision"], config["query_kl_scoring"], config["rollout_correction"]) == (
        "bfloat16", "shared_prompt", "mis"
    )  # fmt: skip
    assert config["fused_output_layer"] and config["gradient_checkpointing"]
    rows = [row for row in metrics(run) if row.get("train/query_kl")]
    assert len(rows) == 2 and float(rows[0]["train/query_kl"]) == 0.0
    assert all(0 < float(row["train/rollout_is_ratio_mean"]) < 3 for row in rows)
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "hf_model" / "config.json").is_file()


@pytest.mark.slow
def test_the_pages_validate_and_export_run_on_the_twins_checkpoint(one_gpu_twin):
    """`erpo validate --ckpt_path` sweeps the trained policy; `erpo export` of last.ckpt writes the weights the run's
    own export wrote at the same step."""
    output = one_gpu_twin["validate"].stdout + one_gpu_twin["validate"].stderr
    assert "toy_test" in output and "wrote runs/one_gpu/erpo/version_1/results.json" in output, output[-3000:]
    runs = one_gpu_twin["root"] / "runs" / "one_gpu"
    exported = AutoModelForCausalLM.from_pretrained(runs / "hf_model_last").state_dict()
    trained = load_file(runs / "erpo" / "version_0" / "hf_model" / "model.safetensors")
    assert trained and all(torch.equal(exported[name], tensor) for name, tensor in trained.items())


def test_one_flag_moves_the_recipes_logs_and_checkpoints(monkeypatch, tmp_path):
    """The recipe's logger sets no save_dir and its ModelCheckpoint no dirpath: --trainer.default_root_dir places the
    logger, and the checkpoints follow the logger's folder (the twin's run: <root>/erpo/version_0/checkpoints)."""
    monkeypatch.chdir(REPO)
    seen = {}

    def stop(self, *args, **kwargs):
        seen.update(self.config["fit"]["trainer"].as_dict())
        raise SystemExit(0)

    monkeypatch.setattr(cli.ERPOCLI, "instantiate_classes", stop)
    with pytest.raises(SystemExit):
        cli.main(["fit", "--config", ONE_GPU, "--config", ONE_GPU_TWIN, "--trainer.default_root_dir", str(tmp_path)])
    assert seen["logger"]["init_args"]["save_dir"] == str(tmp_path)
    (checkpoint,) = [c for c in seen["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert checkpoint["init_args"]["dirpath"] is None
