"""docs/one_gpu.md's recipe: configs/one_gpu_qwen2.5_math_1.5b.yaml checked with no GPU and no network, and its CPU
twin trained.

Checked here: the config parses as `erpo fit --print_config` does; it passes every check `erpo fit` runs before a
model is loaded (`cli.checks.check_settings`: the model path, the rollout, data and module settings, the group size and
the step-memory plan), with Qwen2.5-Math-1.5B's config.json written to a local folder in place of the Hub id; the
memory plan the page quotes is what the planner prints for it; and the same config, with the page's CPU overlay on
the shipped toy model and HFEngine, trains 2 steps through the real `erpo` command.

Not checked (they need the network or a GPU): that the Hub id resolves and its weights and tokenizer load, that
openai/gsm8k downloads and its prompts fit `data.max_prompt_length`, that vLLM builds in `max_model_len` and
`gpu_memory_utilization`, and the step time and peak memory on a GPU. The memory check runs against a GPU's free
memory given by hand (the test machine has no `nvidia-smi`).
"""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.cli_runs import run_main
from helpers.docs import example
from helpers.fit_configs import run_erpo

import erpo_lightning.cli.command as cli
import erpo_lightning.data.step_memory as step_memory
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.toy import SHIPPED_DIR

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "one_gpu_qwen2.5_math_1.5b.yaml"
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


def settings_check(monkeypatch, tmp_path, gpu_free_gib: float) -> str:
    """`erpo fit --config CONFIG` up to the point where it would load the model, with Qwen2.5-Math-1.5B's config.json
    in a local folder and `gpu_free_gib` GiB free on a pretend GPU; returns what it printed on stderr."""
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
        cli.main(["fit", "--config", str(CONFIG), "--model.model_path", str(model_dir), "--debug"])
    return err.getvalue()


def test_the_recipe_passes_the_settings_checks_and_fits_an_80_gib_gpu(monkeypatch, tmp_path):
    err = settings_check(monkeypatch, tmp_path, gpu_free_gib=79.0)
    assert "one step needs at least" not in err, err


def test_the_memory_plan_runs_on_the_recipe(monkeypatch, tmp_path):
    """The plan is not skipped for this config: a GPU with 10 GiB free draws its warning, one with 3 GiB (under a
    quarter of the 32.3 GiB lower bound) its refusal, before any model loads."""
    err = settings_check(monkeypatch, tmp_path, gpu_free_gib=10.0)
    assert "warning: one step needs at least 32.3 GiB per device" in err, err
    warning = next(line for line in err.splitlines() if "warning: one step" in line)
    assert warning in PAGE.read_text(), "docs/one_gpu.md should quote the warning as erpo fit prints it"
    with pytest.raises(SettingsError, match=r"one step needs at least 32\.3 GiB per device .*over 4x the 3\.0 GiB"):
        settings_check(monkeypatch, tmp_path, gpu_free_gib=3.0)


def test_the_page_quotes_what_the_planner_prints(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    exec(compile(example("one_gpu.md", "memory-plan"), "docs/one_gpu.md", "exec"), {})
    printed = capsys.readouterr().out
    quoted = example("one_gpu.md", "memory-plan-output", "text")
    assert printed.strip() == quoted.strip(), printed


@pytest.mark.slow
def test_the_cpu_twin_trains(tmp_path):
    """The recipe with the page's CPU overlay: the shipped toy model, HFEngine, 2 steps of 4 queries x 4 responses,
    a sweep of 20 held-out problems before and after; ~30 s on 2 cores."""
    shipped = tmp_path / SHIPPED_DIR.relative_to(REPO)
    shutil.copytree(SHIPPED_DIR, shipped)
    (tmp_path / "configs").mkdir()
    shutil.copy(CONFIG, tmp_path / "configs" / CONFIG.name)
    (tmp_path / "cpu_twin.yaml").write_text(example("one_gpu.md", "cpu-twin", "yaml"))
    result = run_erpo("fit", "--config", f"configs/{CONFIG.name}", "--config", "cpu_twin.yaml", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "step 2/2" in output and "held-out accuracy before and after training" in output, output[-3000:]
    (run,) = (tmp_path / "runs" / "one_gpu" / "erpo").glob("version_*")
    summary = json.loads((run / "sweep_summary.json").read_text())
    assert (summary["first_step"], summary["last_step"]) == (0, 2)
    assert (run / "hf_model" / "config.json").is_file()
    rows = [line for line in (run / "metrics.csv").read_text().splitlines()[1:] if line]
    assert rows, "no metrics logged"
