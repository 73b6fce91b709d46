"""`model.peft.target_modules` checked against the model's layers before any weight loads (issue 54, items 1 and 5):
LoRA on the LM head of a model that ties it to its input embeddings, and entries that match nothing, a container
or an embedding, are refused in one line naming the entry, from the command line, the module and TRL alike."""

from __future__ import annotations

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, tiny_config
from helpers.fit_configs import write_config
from helpers.trl_setup import make_trainer, requires_trl
from transformers import AutoConfig, AutoModelForCausalLM

import erpo_lightning.rollout.vllm_engine as vllm_engine
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora_files import check_lora_targets_before_loading

VLLM_ENGINE = {
    "class_path": "erpo_lightning.rollout.VLLMEngine",
    "init_args": {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 32 * 2**20},
}
LINEAR_LAYERS = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"  # the tiny Qwen2's, in model order


@pytest.fixture()
def nothing_loads(monkeypatch):
    """Any weight load or vLLM import fails the test: the refusals come from the model's config.json alone."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the settings were refused")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(vllm_engine, "import_vllm", refuse)


def refused_fit(tmp_path, tiny_model_path, benchmarks_dir, capsys, targets: str, engine: dict | None = None) -> str:
    """`erpo fit` of the tiny config with `--model.peft.target_modules TARGETS`: its one error line, after checking
    that no reference cache or run folder was made."""
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    if engine is not None:
        settings = yaml.safe_load(config.read_text())
        write_config(config, {**settings, "rollout": {**settings["rollout"], "engine": engine}})
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--model.peft.target_modules", targets)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()
    return line


# ------------------------------------------------------------------------------------- item 1: a tied LM head
def test_lora_on_a_tied_lm_head_is_refused_before_the_vllm_engine_or_weights_load(
    tmp_path, tiny_model_path, benchmarks_dir, capsys, nothing_loads
):
    line = refused_fit(tmp_path, tiny_model_path, benchmarks_dir, capsys, "[q_proj, lm_head]", VLLM_ENGINE)
    assert line.startswith("erpo: error: model.peft.target_modules entry 'lm_head': lm_head is the LM head"), line
    assert f"tie_word_embeddings: true in {tiny_model_path}/config.json" in line
    assert "Drop lm_head from target_modules, or use all-linear (which excludes the head)" in line


def test_the_module_refuses_a_tied_lm_head_and_accepts_the_head_of_an_untied_model(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"entry 'lm_head': .*tie_word_embeddings: true"):
        ERPOModule(str(tiny_model_path), peft={"target_modules": ["lm_head"]})
    untied = AutoConfig.from_pretrained(tiny_model_path)
    untied.tie_word_embeddings = False
    untied.save_pretrained(tmp_path / "untied")  # config.json alone: the check reads nothing else
    check_lora_targets_before_loading({"target_modules": ["q_proj", "lm_head"]}, str(tmp_path / "untied"))


@requires_trl
def test_trl_erpo_trainer_refuses_a_peft_config_on_the_tied_head(tiny_model_path, tmp_path):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"^ERPOTrainer: peft_config.target_modules .*tie_word_embeddings: true in"):
        make_trainer(tiny_model_path, tmp_path / "run", inputs={"peft_config": config})
    assert not (tmp_path / "run" / "erpo_reference").exists()  # refused before θ0 was scored


# ------------------------------------------------------------- item 5: entries that adapt no linear layer
@pytest.mark.parametrize(
    "entry, refusal",
    [
        ("q_prj", "matches no layer of {model}; its linear layers: {linear}"),
        ("layers", "matches model.layers (ModuleList), a container of layers"),
        ("self_attn", "matches model.layers.0.self_attn (Qwen2Attention), a container of layers"),
        ("mlp", "matches model.layers.0.mlp (Qwen2MLP), a container of layers"),
        ("embed_tokens", "matches model.embed_tokens (Embedding), not a linear layer"),
    ],
)
def test_entries_that_adapt_no_linear_layer_are_refused_before_anything_loads(
    entry, refusal, tmp_path, tiny_model_path, benchmarks_dir, capsys, nothing_loads
):
    line = refused_fit(tmp_path, tiny_model_path, benchmarks_dir, capsys, f"[q_proj, {entry}]")
    expected = refusal.format(model=tiny_model_path, linear=LINEAR_LAYERS)
    assert line.startswith(f"erpo: error: model.peft.target_modules entry {entry!r} {expected}"), line
    assert line.endswith(LINEAR_LAYERS), line  # what to write instead


# ------------------------------------------------------------------- item 6: a rank no layer can use, peft's names
@pytest.mark.parametrize("targets", ["all-linear", "[q_proj, v_proj]"])
def test_a_rank_above_every_adapted_layer_is_refused_before_anything_loads(
    targets, tmp_path, tiny_model_path, benchmarks_dir, capsys, nothing_loads
):
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    width = AutoConfig.from_pretrained(tiny_model_path).hidden_size  # q_proj and v_proj are at most width wide
    line = fails_in_one_line(
        capsys, "fit", "--config", str(config), "--model.peft.r", "100000", "--model.peft.target_modules", targets
    )
    assert line.startswith(f"erpo: error: model.peft.r 100000 is above the rank any adapted layer of {tiny_model_path}")
    assert line.endswith(f"Use r <= {width}"), line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_the_largest_usable_rank_is_accepted_and_one_above_it_refused(tiny_model_path):
    skeleton_width = AutoConfig.from_pretrained(tiny_model_path).hidden_size
    check_lora_targets_before_loading({"r": skeleton_width, "target_modules": ["q_proj"]}, str(tiny_model_path))
    with pytest.raises(ValueError, match=rf"model.peft.r {skeleton_width + 1} is above .* Use r <= {skeleton_width}$"):
        check_lora_targets_before_loading({"r": skeleton_width + 1, "target_modules": ["q_proj"]}, str(tiny_model_path))


@pytest.mark.parametrize("peft_name, ours", [("lora_alpha", "alpha"), ("lora_dropout", "dropout")])
def test_peft_field_names_are_answered_with_ours(peft_name, ours, tmp_path, tiny_model_path, benchmarks_dir, capsys):
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")
    line = fails_in_one_line(capsys, "fit", "--config", str(config), f"--model.peft.{peft_name}", "0.5")
    assert line == (
        f"erpo: error: model.peft: no field {peft_name!r} (did you mean {ours!r}?); fields: r, alpha, dropout, "
        "target_modules, seed, adapter_path, checkpoint"
    )
    with pytest.raises(ValueError, match=rf"^model.peft has no field '{peft_name}' \(did you mean '{ours}'\?\)"):
        ERPOModule(str(tiny_model_path), peft={peft_name: 0.5})
