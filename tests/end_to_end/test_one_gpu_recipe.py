"""docs/one_gpu.md's recipe: configs/one_gpu_qwen2.5_math_1.5b.yaml and its 24 GiB variants checked with no GPU and
no network (its CPU twin trains in tests/end_to_end/test_recipe_twins.py).

Checked here: the config parses as `erpo fit --print_config` does; it passes every check `erpo fit` runs before a
model is loaded (`cli.checks.check_settings`: the model path, the rollout, data and module settings, the group size and
the step-memory plan), with Qwen2.5-Math-1.5B's config.json written to a local folder in place of the Hub id; the
memory plan the page quotes is what the planner prints for it; and on what a 24 GiB card has beside vLLM, the plan
warns for the recipe and not for its LoRA variant or with the optimizer offloaded.

Not checked (they need the network or a GPU): that the Hub id resolves and its weights and tokenizer load, that
openai/gsm8k downloads and its prompts fit `data.max_prompt_length`, that vLLM builds in `max_model_len` and
`gpu_memory_utilization`, and the step time and peak memory on a GPU. The memory check runs against a GPU's free
memory given by hand (the test machine has no `nvidia-smi`).
"""

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import run_main
from helpers.docs import example

import erpo_lightning.cli.command as cli
import erpo_lightning.data.step_memory as step_memory
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.modules.lora import adapter_parameters_before_loading

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "one_gpu_qwen2.5_math_1.5b.yaml"
LORA = REPO / "configs" / "one_gpu_qwen2.5_math_1.5b_lora.yaml"
PAGE = REPO / "docs" / "one_gpu.md"
GIB = 2**30
# Qwen/Qwen2.5-Math-1.5B's config.json, the fields the planner and the settings checks read (as on the Hub).
QWEN25_MATH_15B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


class _Checked(Exception):
    """Raised where `erpo fit` would instantiate the model: every check before it has passed."""


def test_the_recipe_parses_as_print_config_shows_it(capsys):
    assert run_main("fit", "--print_config", "--config", str(CONFIG)) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    trainer, model, rollout = printed["trainer"], printed["model"], printed["rollout"]
    assert (trainer["accelerator"], trainer["devices"], trainer.get("strategy", "auto")) == ("gpu", 1, "auto")
    assert (model["model_path"], model["algorithm"], model["dtype"]) == ("Qwen/Qwen2.5-Math-1.5B", "erpo", "float32")
    engine = rollout["engine"]
    assert engine["class_path"] == "erpo_lightning.rollout.VLLMEngine"
    assert engine["init_args"]["dtype"] == "bfloat16"
    # vLLM's context holds the longest prompt and response, and fits the model's 4,096 positions.
    tokens = printed["data"]["max_prompt_length"] + rollout["max_new_tokens"]
    assert tokens <= engine["init_args"]["max_model_len"] <= QWEN25_MATH_15B["max_position_embeddings"]
    (source,) = printed["data"]["train"]
    assert (source["hub_id"], source["split"], source["answer_transform"]) == ("openai/gsm8k", "train", "after_hash")


def settings_check(monkeypatch, tmp_path, gpu_free_gib: float, *args: str) -> str:
    """`erpo fit --config CONFIG ARGS` up to the point where it would load the model, with Qwen2.5-Math-1.5B's
    config.json in a local folder and `gpu_free_gib` GiB free on a pretend GPU; returns what it printed on stderr."""
    model_dir = tmp_path / "Qwen2.5-Math-1.5B"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(QWEN25_MATH_15B))
    monkeypatch.setattr(
        step_memory, "available_memory", lambda accelerator: (int(gpu_free_gib * GIB), "free on the GPU")
    )

    def stop(self, *args, **kwargs):
        raise _Checked

    monkeypatch.setattr(cli.ERPOCLI, "instantiate_classes", stop)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(_Checked):
        cli.main(["fit", "--config", str(CONFIG), *args, "--model.model_path", str(model_dir), "--debug"])
    return err.getvalue()


def test_the_recipe_passes_the_settings_checks_and_fits_an_80_gib_gpu(monkeypatch, tmp_path):
    err = settings_check(monkeypatch, tmp_path, gpu_free_gib=79.0)
    assert "one step needs at least" not in err, err


# What a 24 GiB card has for training beside vLLM's share (the recipe's gpu_memory_utilization, 0.35).
BESIDE_VLLM_ON_24_GIB = 24 * (1 - 0.35)


def test_the_memory_plan_runs_on_the_recipe(monkeypatch, tmp_path):
    """The plan is not skipped for this config: what a 24 GiB card has beside vLLM draws its warning, 5 GiB (under a
    quarter of the 23.1 GiB lower bound) its refusal, before any model loads."""
    err = settings_check(monkeypatch, tmp_path, BESIDE_VLLM_ON_24_GIB)
    assert "warning: one step needs at least 23.1 GiB per device" in err, err
    warning = next(line for line in err.splitlines() if "warning: one step" in line)
    assert warning in PAGE.read_text(), "docs/one_gpu.md should quote the warning as erpo fit prints it"
    with pytest.raises(SettingsError, match=r"one step needs at least 23\.1 GiB per device .*over 4x the 5\.0 GiB"):
        settings_check(monkeypatch, tmp_path, gpu_free_gib=5.0)


@pytest.mark.parametrize("variant", [("--config", str(LORA)), ("--model.offload_optimizer", "true")])
def test_the_24_gib_variants_pass_the_checks_and_the_plan(monkeypatch, tmp_path, variant):
    """The LoRA variant (its adapters checked against the model's layers, counted by the plan) and the offloaded
    optimizer: no warning on what a 24 GiB card has beside vLLM."""
    err = settings_check(monkeypatch, tmp_path, BESIDE_VLLM_ON_24_GIB, *variant)
    assert "one step needs at least" not in err, err


def test_the_page_quotes_what_the_planner_prints(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    namespace = {}
    exec(compile(example("one_gpu.md", "memory-plan"), "docs/one_gpu.md", "exec"), namespace)
    printed = capsys.readouterr().out
    quoted = example("one_gpu.md", "memory-plan-output", "text")
    assert printed.strip() == quoted.strip(), printed
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_MATH_15B))
    peft = yaml.safe_load(LORA.read_text())["model"]["peft"]
    assert namespace["ADAPTERS"] == adapter_parameters_before_loading(peft, str(tmp_path))
