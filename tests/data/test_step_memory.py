"""A step's sizes against the machine's memory (issue 43 item 7): settings that cannot fit are refused before the
model loads, and settings that may not fit are warned of; `rollout.group_size: 1000000` used to run until the kernel
killed it, with no message; now `erpo fit` refuses it in one line (issue 43 item 7)."""

import pytest
import torch
from helpers.cli_runs import fails_in_one_line, tiny_config
from transformers import AutoModelForCausalLM

from erpo_lightning.data import step_memory
from erpo_lightning.data.step_memory import ModelShape, StepSizes, check_fit_memory, memory_verdict
from erpo_lightning.scoring.logprobs import CHUNK_ELEMENTS
from erpo_lightning.toy import SHIPPED_DIR

GIB = 2**30


@pytest.mark.parametrize("model", ["shipped", "tiny"])
def test_the_shape_is_read_from_config_json_and_counts_the_models_parameters(model, tiny_model_path):
    path = SHIPPED_DIR if model == "shipped" else tiny_model_path
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    shape = ModelShape.read(str(path))
    parameters = sum(p.numel() for p in policy.parameters())
    assert 0.99 * parameters <= shape.parameters <= parameters  # the biases and norms are left out: a lower bound
    assert shape.vocab_size == policy.config.vocab_size and shape.layers == policy.config.num_hidden_layers


def test_no_shape_without_a_config_or_its_sizes(tmp_path):
    assert ModelShape.read(str(tmp_path)) is None
    assert ModelShape.from_config({"vocab_size": 10, "hidden_size": 8}) is None


def sizes(rows: int) -> StepSizes:
    return StepSizes(rows=rows, tokens=100, generated_at_once=rows, micro_batch_tokens=1000, dtype_bytes=4)


def test_refused_above_four_times_the_memory_warned_above_it():
    parts = {"rollout batch": 3 * GIB, "generation": GIB, "micro-batch": 0, "weights": 0}
    assert memory_verdict(sizes(8), parts, 4 * GIB, "of RAM available") is None
    warning = memory_verdict(sizes(8), parts, 2 * GIB, "of RAM available")
    assert warning == (
        "one step needs at least 4.0 GiB per device (rollout batch 3.0 GiB, generation 1.0 GiB) for "
        "data.batch_size × rollout.group_size = 8 rows of up to 100 tokens (data.max_prompt_length + "
        "rollout.max_new_tokens), more than the 2.0 GiB of RAM available: it may be killed for memory"
    )
    with pytest.raises(ValueError, match=r"at least 4.0 GiB .* over 4x the 921.6 MiB of RAM available: lower "
                       r"rollout.group_size, data.batch_size or the lengths$"):  # fmt: skip
        memory_verdict(sizes(8), parts, int(0.9 * GIB), "of RAM available")
    generation = {**parts, "generation": 5 * GIB}  # mostly the KV cache of every row generated at once
    with pytest.raises(ValueError, match="or the lengths or rollout.engine.init_args.micro_batch_size$"):
        memory_verdict(sizes(8), generation, GIB, "of RAM available")


def groups(group_size: int, engine: dict | None = None) -> tuple[dict, dict, dict, dict]:
    """The config groups of a run of the shipped toy model (the quickstart's sizes) with `group_size`."""
    model = {"model_path": str(SHIPPED_DIR), "micro_batch_tokens": 8192, "dtype": "float32"}
    data = {"batch_size": 16, "max_prompt_length": 64}
    rollout = {"group_size": group_size, "max_new_tokens": 48,
               "engine": engine or {"class_path": "erpo_lightning.rollout.HFEngine"}}  # fmt: skip
    return model, data, rollout, {"accelerator": "cpu", "devices": 1}


def test_fit_settings_are_judged_against_the_machine(monkeypatch, capsys):
    check_fit_memory(*groups(8))  # the quickstart fits any machine
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="= 1600000000 rows of up to 112 tokens"):
        check_fit_memory(*groups(100_000_000))  # 341 TiB of KV cache alone: over 4x any machine's memory
    # What the machine has is read from it: here a machine with 1 GiB of RAM free, for a step of 1.4 GiB.
    monkeypatch.setattr(step_memory, "available_memory", lambda accelerator: (GIB, f"of RAM available ({accelerator})"))
    check_fit_memory(*groups(400))
    err = capsys.readouterr().err
    assert err.startswith("[erpo] warning: one step needs at least 1.4 GiB per device (rollout batch 10.9 MiB, ")
    assert err.endswith("more than the 1.0 GiB of RAM available (cpu): it may be killed for memory\n"), err
    # vLLM sizes its own KV cache: only the rollout batch, the micro-batch and the weights count.
    check_fit_memory(*groups(400, {"class_path": "erpo_lightning.rollout.VLLMEngine"}))
    assert capsys.readouterr().err == ""


def test_lora_adapters_count_their_weights_gradients_and_adam_moments():
    from erpo_lightning.modules.lora import adapter_parameters_before_loading

    adapters = adapter_parameters_before_loading({"r": 8, "target_modules": ["q_proj"]}, str(SHIPPED_DIR))
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    q_proj = [m for name, m in model.named_modules() if name.endswith("q_proj")]
    assert adapters == sum(8 * (m.in_features + m.out_features) for m in q_proj)  # A is r × in, B is out × r
    shape = ModelShape.read(str(SHIPPED_DIR))
    with_adapters = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, 2, adapters), shape)
    assert with_adapters["LoRA adapters"] == adapters * 4 * 4 // 2  # float32 weight, gradient, 2 moments; 2 devices
    assert step_memory.step_memory(sizes(8), shape)["LoRA adapters"] == 0
    doubled = adapter_parameters_before_loading({"r": 16, "target_modules": ["q_proj"]}, str(SHIPPED_DIR))
    assert doubled == 2 * adapters


def test_the_fused_output_layer_holds_one_chunk_of_logits_not_the_micro_batch_s():
    """`model.fused_output_layer`: the lower bound's micro-batch part is one chunk's logits, not t × V; a vocabulary
    small enough that one chunk covers the whole forward changes nothing."""
    wide = ModelShape(vocab_size=151_936, hidden_size=1536, layers=28, kv_width=256, parameters=1_500_000_000)
    plain = step_memory.step_memory(sizes(8), wide)["micro-batch"]
    fused = step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, fused_output=True), wide)["micro-batch"]
    assert plain == 1000 * 151_936 * 8
    assert fused == (CHUNK_ELEMENTS // 151_936) * 151_936 * 8 < plain
    shipped = ModelShape.read(str(SHIPPED_DIR))
    assert step_memory.step_memory(StepSizes(8, 100, 8, 1000, 4, fused_output=True), shipped) == (
        step_memory.step_memory(sizes(8), shipped)
    )


def test_under_the_shared_prompt_a_row_forwards_its_response_alone():
    """With a micro-batch budget below one row, the micro-batch part is one row's forward: prompt and response, or
    under `query_kl_scoring: shared_prompt` the response alone (`update.microbatch.forwarded_lengths`)."""
    wide = ModelShape(vocab_size=151_936, hidden_size=1536, layers=28, kv_width=256, parameters=1_500_000_000)
    model = {"micro_batch_tokens": 16, "query_kl_scoring": "exact"}
    data, rollout = {"batch_size": 2, "max_prompt_length": 300}, {"group_size": 4, "max_new_tokens": 100}
    exact = step_memory.fit_step_sizes(model, data, rollout, {})
    shared = step_memory.fit_step_sizes({**model, "query_kl_scoring": "shared_prompt"}, data, rollout, {})
    assert step_memory.step_memory(exact, wide)["micro-batch"] == 400 * 151_936 * 8
    assert step_memory.step_memory(shared, wide)["micro-batch"] == 100 * 151_936 * 8
    roomy = step_memory.fit_step_sizes({**model, "micro_batch_tokens": 1000}, data, rollout, {})
    assert step_memory.step_memory(roomy, wide)["micro-batch"] == 1000 * 151_936 * 8


@pytest.fixture()
def config(tmp_path, tiny_model_path, benchmarks_dir):
    return tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")


def test_sizes_that_cannot_fit_are_refused_before_the_model_loads(config, capsys, tmp_path):
    """Issue 43 item 7: `rollout.group_size: 1000000` ran until the kernel killed it (325 s, no message). 10^8
    responses to each of 2 queries need 192 TiB of KV cache alone: over 4x any machine's memory."""
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--rollout.group_size", "100000000")
    assert line.startswith(
        "erpo: error: one step needs at least 195.1 TiB per device (rollout batch 3.0 TiB, generation 192.1 TiB, "
        "micro-batch 40.0 MiB, weights 1.3 MiB, gradients 1.3 MiB, optimizer state 2.6 MiB) for data.batch_size × "
        "rollout.group_size = 200000000 rows of up to "
        "1030 tokens (data.max_prompt_length + rollout.max_new_tokens), over 4x the "
    ), line
    assert line.endswith(": lower rollout.group_size, data.batch_size or the lengths or "
                         "rollout.engine.init_args.micro_batch_size")  # fmt: skip
    assert not (tmp_path / "cache").exists()
