"""Hostile settings, paths and kills against `erpo`: each fails early, in one line, naming the field (issue 18).

Most cases call `erpo_lightning.cli.main` in this process (the console script's own entry point, a second each);
the subprocess tests run the installed `erpo` as a user does.
"""

import json
import os
import subprocess
import warnings

import lightning.pytorch as pl
import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, run_main, tiny_config
from helpers.fit_configs import ERPO, write_config

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.checkpoints.files import AtomicCheckpointIO
from erpo_lightning.cli.command import ERPOLightningTrainer, ERPOProgressBar, main
from erpo_lightning.common.errors import DEBUG_HINT, SettingsError, one_line, quiet_known_warnings
from erpo_lightning.data import QueryDataModule
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine


@pytest.fixture()
def config(tmp_path, tiny_model_path, benchmarks_dir):
    return tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--rollout.temperature", "-1"], "rollout.temperature must be > 0"),
        (["--rollout.temperature", "0"], "rollout.temperature must be > 0"),
        (["--rollout.group_size", "0"], "rollout.group_size must be >= 1, got 0"),
        (["--rollout.group_size", "1"], "rollout.group_size must be >= 2 with the 'grpo' advantage estimator"),
        (["--model.algorithm", "rloo", "--rollout.group_size", "1"], "with the 'rloo' advantage estimator"),
        (["--rollout.max_new_tokens", "0"], "rollout.max_new_tokens must be >= 1, got 0"),
        (["--rollout.top_p", "0"], "rollout.top_p must be in (0, 1], got 0.0"),
        (["--data.batch_size", "0"], "data.batch_size must be >= 1, got 0"),
        (["--data.max_prompt_length", "0"], "data.max_prompt_length must be >= 1, got 0"),
        (["--model.micro_batch_tokens", "0"], "model.micro_batch_tokens must be >= 1, got 0"),
        (["--model.num_iterations", "0"], "model.num_iterations must be >= 1, got 0"),
        (["--model.update_batch_size", "0"], "model.update_batch_size must be >= 1 (or null), got 0"),
        (["--ckpt_path", "no_such.ckpt"], "ckpt_path: no checkpoint at no_such.ckpt"),
        (["--ckpt_path", "last"], "ckpt_path: 'last' has nothing to resume"),
        (
            ["--model.query_weight_source", "current"],
            "model.query_weight_source 'current' with query_weight_norm 'dataset'",
        ),
        (["--model.query_weight_clip", "[2.0, 1.0]"], "model.query_weight_clip must be [lo, hi] with 0 <= lo <= hi"),
        (["--model.advantage_eps", "-1"], "model.advantage_eps must be >= 0"),
        (["--model.gradient_clip_norm", "-1"], "model.gradient_clip_norm must be > 0 (null = no clipping), got -1.0"),
        (["--model.gradient_clip_norm", "0"], "model.gradient_clip_norm must be > 0 (null = no clipping), got 0.0"),
        (["--model.dtype", "float16"], "model.dtype must be float32 or bfloat16 (float16 is not supported"),
        (
            ["--model.fsdp_mixed_precision", "float16"],
            "model.fsdp_mixed_precision must be float32, bfloat16 or null (float16 is not supported",
        ),
        (["--model.weight_decay", "-0.1"], "model.weight_decay must be >= 0 (or null), got -0.1"),
        # Issue 38 item 5: Lightning's precision plugins went around the module's dtypes and the float16 refusal.
        (["--trainer.precision", "16-mixed"], "trainer.precision '16-mixed' is not used: the policy's dtype is set"),
        (["--trainer.precision", "bf16-true"], "(set model.dtype: bfloat16 (or, under FSDP2, model.fsdp_mixed_"),
        (["--model.loss_constant", "0"], "model.loss_constant must be > 0 (or null), got 0.0"),
        (["--model.max_consecutive_skips", "0"], "model.max_consecutive_skips must be >= 1, got 0"),
    ],
)
def test_bad_settings_fail_before_anything_loads(config, capsys, tmp_path, overrides, message):
    line = fails_in_one_line(capsys, "fit", "--config", str(config), *overrides)
    assert message in line
    assert not (tmp_path / "cache").exists()  # the reference cache was not built


def _reward(responses, golds):
    return [0.0] * len(responses)


def _module_with_groups(model_path, group_size, **settings):
    """What the RolloutCallback checks against the module's algorithm at fit setup (before any model loads)."""
    RolloutCallback(HFEngine(), _reward, group_size).setup(None, ERPOModule(str(model_path), **settings), "fit")


# (erpo flags, the same bad value given to the owner's constructor): the owner raises the CLI's line, word for word.
OWNER_CASES = [
    (["--rollout.group_size", "0"], lambda path: RolloutCallback(HFEngine(), _reward, group_size=0)),
    (["--rollout.max_new_tokens", "0"], lambda path: RolloutCallback(HFEngine(), _reward, max_new_tokens=0)),
    (["--rollout.top_p", "0"], lambda path: RolloutCallback(HFEngine(), _reward, top_p=0.0)),
    (["--rollout.group_size", "1"], lambda path: _module_with_groups(path, 1)),
    (
        ["--model.algorithm", "rloo", "--rollout.group_size", "1"],
        lambda path: _module_with_groups(path, 1, algorithm="rloo"),
    ),
    (["--data.batch_size", "0"], lambda path: QueryDataModule(str(path), batch_size=0)),
    (["--data.max_prompt_length", "0"], lambda path: QueryDataModule(str(path), max_prompt_length=0)),
    (["--data.num_workers", "-1"], lambda path: QueryDataModule(str(path), num_workers=-1)),
    (["--data.cache_max_tokens", "0"], lambda path: QueryDataModule(str(path), cache_max_tokens=0)),
    (["--data.cache_batch_size", "0"], lambda path: QueryDataModule(str(path), cache_batch_size=0)),
    (["--data.cache_chunk_size", "0"], lambda path: QueryDataModule(str(path), cache_chunk_size=0)),
    (["--model.micro_batch_tokens", "0"], lambda path: ERPOModule(str(path), micro_batch_tokens=0)),
    (["--model.num_iterations", "0"], lambda path: ERPOModule(str(path), num_iterations=0)),
    (["--model.update_batch_size", "0"], lambda path: ERPOModule(str(path), update_batch_size=0)),
    (["--model.warmup_steps", "-1"], lambda path: ERPOModule(str(path), warmup_steps=-1)),
    (["--model.weight_decay", "-0.1"], lambda path: ERPOModule(str(path), weight_decay=-0.1)),
    (["--model.gradient_clip_norm", "0"], lambda path: ERPOModule(str(path), gradient_clip_norm=0.0)),
    (["--model.loss_constant", "0"], lambda path: ERPOModule(str(path), loss_constant=0.0)),
    (["--model.max_consecutive_skips", "0"], lambda path: ERPOModule(str(path), max_consecutive_skips=0)),
    (["--model.dtype", "float16"], lambda path: ERPOModule(str(path), dtype="float16")),
    (["--model.advantage_eps", "-1"], lambda path: ERPOModule(str(path), advantage_eps=-1.0)),
    (["--model.query_weight_source", "current"], lambda path: ERPOModule(str(path), query_weight_source="current")),
    (["--model.query_weight_clip", "[2.0, 1.0]"], lambda path: ERPOModule(str(path), query_weight_clip=(2.0, 1.0))),
]


@pytest.mark.parametrize(("overrides", "construct"), OWNER_CASES, ids=[" ".join(case[0]) for case in OWNER_CASES])
def test_owners_constructors_raise_the_clis_line(config, capsys, tiny_model_path, overrides, construct):
    """The Python API gets the checks `erpo` runs, from the same rule: the constructor's message is the CLI's line."""
    line = fails_in_one_line(capsys, "fit", "--config", str(config), *overrides)
    with pytest.raises(ValueError) as raised:
        construct(tiny_model_path)
    assert f"erpo: error: {raised.value}" == line


@pytest.mark.parametrize(
    ("flag", "value", "settings"),
    [("--sweep.top_p", "0", {"top_p": 0.0}), ("--sweep.batch_size", "0", {"batch_size": 0})],
)
def test_sweep_config_raises_the_clis_line(config, capsys, tmp_path, flag, value, settings):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"sweep": {"benchmarks": [{"source": {"name": "math500"}}]}}))
    line = fails_in_one_line(capsys, "validate", "--config", str(config), "--config", str(sweep), flag, value)
    with pytest.raises(ValueError) as raised:
        SweepConfig(**settings)
    assert line.endswith(str(raised.value)), (line, raised.value)


def test_constructing_the_datamodule_loads_nothing(tmp_path, tiny_model_path):
    """Settings are checked in the constructor; the tokenizer loads on first use (a missing model is not read yet)."""
    absent = QueryDataModule(str(tmp_path / "no_model_here"))
    assert "tokenizer" not in vars(absent)
    datamodule = QueryDataModule(str(tiny_model_path), template="plain", max_prompt_length=77)
    prompts = datamodule.prompt_format()
    assert prompts.tokenizer is datamodule.tokenizer and prompts.max_prompt_length == 77
    assert prompts.template == datamodule.template


def test_reinforce_accepts_one_response_per_query(config, capsys):
    # The batch-mean baseline needs no group: G = 1 passes the checks (the missing checkpoint is what fails).
    line = fails_in_one_line(
        capsys, "fit", "--config", str(config), "--model.algorithm", "reinforce", "--rollout.group_size", "1",
        "--ckpt_path", "absent.ckpt",
    )  # fmt: skip
    assert "ckpt_path: no checkpoint at absent.ckpt" in line


def test_gradient_clip_norm_null_is_off_and_the_module_checks_its_own_settings(config, capsys, tiny_model_path):
    line = fails_in_one_line(
        capsys, "fit", "--config", str(config), "--model.gradient_clip_norm", "null", "--ckpt_path", "absent.ckpt"
    )
    assert "ckpt_path: no checkpoint at absent.ckpt" in line  # null passed the checks
    from erpo_lightning.modules.erpo_module import ERPOModule

    for settings, message in (
        ({"gradient_clip_norm": -1.0}, "model.gradient_clip_norm must be > 0"),
        ({"dtype": "float16"}, "use|bfloat16 has float32's range"),
        ({"micro_batch_tokens": 0}, "model.micro_batch_tokens must be >= 1, got 0"),
    ):
        with pytest.raises(ValueError, match=message):
            ERPOModule(str(tiny_model_path), **settings)


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        (
            "--model.algorithm", "erpoo", "model.algorithm: 'erpoo' is not one of erpo, erpo_released, grpo, grpo_kl, "
            "dapo, dapo_erpo, rloo, rloo_erpo, dr_grpo, reinforce, gspo, gspo_erpo, cispo, cispo_erpo; did you mean "
            "'erpo'?",
        ),
        (
            "--model.loss_aggregation", "tokn_mean", "model.loss_aggregation: 'tokn_mean' is not one of token_mean, "
            "seq_mean_token_mean, seq_mean_token_sum, seq_sum_constant (or null); did you mean 'token_mean'?",
        ),
        ("--trainer.max_steps", "abc", "trainer.max_steps: 'abc' is not a number; give a whole number"),
    ],
)  # fmt: skip
def test_a_parse_error_is_one_line_not_the_usage(config, capsys, flag, value, expected):
    code = run_main("fit", "--config", str(config), flag, value)
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [f"erpo: error: {expected}", DEBUG_HINT], err[-3000:]


SOURCE_KEYS = "valid keys: name, path, hub_id, config, split, data_files, problem_field, answer_field, id_field, "
SOURCE_KEYS += "answer_transform, limit, label, hub, columns, weight"


def test_a_misspelt_source_key_is_one_line_naming_it_and_the_valid_keys(config, capsys, tmp_path):
    """Issue 43 item 12: a misspelt key of a training source or of a sweep benchmark's source, in the config file or
    on the command line, was jsonargparse's paragraph about every member of a union."""
    content = yaml.safe_load(config.read_text())
    content["data"]["train"][0]["pth"] = content["data"]["train"][0].pop("path")
    misspelt = write_config(tmp_path / "misspelt.yaml", content)
    expected = f"erpo: error: data.train: unknown source keys ['pth'] (did you mean 'path'?); {SOURCE_KEYS}"
    assert fails_in_one_line(capsys, "fit", "--config", str(misspelt)) == expected
    assert fails_in_one_line(capsys, "fit", "--config", str(config), "--data.train", "[{pth: x.jsonl}]") == expected
    line = fails_in_one_line(capsys, "validate", "--config", str(config), "--sweep.benchmarks", "[{source: {nme: a}}]")
    sweep = "erpo: error: sweep.benchmarks.source: unknown source keys ['nme'] (did you mean 'name'?); "
    assert line == sweep + SOURCE_KEYS


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--model.learning_rate", "-1e-3"], "model.learning_rate must be >= 0 (or null), got -0.001"),
        (["--rollout.temperature", "-1E-2"], "rollout.temperature must be > 0"),
        (["--model.weight_decay", "-.5e1", "--model.learning_rate", "1e-3"], "model.weight_decay must be >= 0"),
    ],
)
def test_a_negative_number_after_a_space_is_the_flags_value(config, capsys, overrides, message):
    """Issue 43 item 12: `--model.learning_rate -1e-3` was "expected one argument" (argparse took the value for an
    option); now the value is parsed and the setting's own rule refuses it."""
    assert message in fails_in_one_line(capsys, "fit", "--config", str(config), *overrides)


def test_sizes_that_cannot_fit_are_refused_before_the_model_loads(config, capsys, tmp_path):
    """Issue 43 item 7: `rollout.group_size: 1000000` ran until the kernel killed it (325 s, no message). 10^8
    responses to each of 2 queries need 192 TiB of KV cache alone: over 4x any machine's memory."""
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--rollout.group_size", "100000000")
    assert line.startswith(
        "erpo: error: one step needs at least 195.1 TiB per device (rollout batch 3.0 TiB, generation 192.1 TiB, "
        "micro-batch 40.0 MiB, weights 1.3 MiB) for data.batch_size × rollout.group_size = 200000000 rows of up to "
        "1030 tokens (data.max_prompt_length + rollout.max_new_tokens), over 4x the "
    ), line
    assert line.endswith(": lower rollout.group_size, data.batch_size or the lengths or "
                         "rollout.engine.init_args.micro_batch_size")  # fmt: skip
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("name", "bad", "good"), [("top_p", 0.0, 1.0), ("top_p", 1.5, 0.5), ("top_k", -1, 0),
                                                   ("max_new_tokens", 0, 1)])  # fmt: skip
def test_the_rollout_and_the_sweep_check_a_sampling_setting_by_one_rule(name, bad, good):
    """top_p, top_k and max_new_tokens are checked by one entry of `rollout.engine.SAMPLING_RULES` in both owners:
    the same values pass, and a refused one is refused with the same range (the sweep's max_new_tokens may also
    be null: the RolloutCallback's)."""
    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    RolloutCallback(HFEngine(), reward, **{name: good})
    SweepConfig(**{name: good})
    with pytest.raises(ValueError) as rollout:
        RolloutCallback(HFEngine(), reward, **{name: bad})
    with pytest.raises(ValueError) as sweep:
        SweepConfig(**{name: bad})
    allowed = str(rollout.value).removeprefix(f"rollout.{name} must be ").removesuffix(f", got {bad!r}")
    assert str(rollout.value) == f"rollout.{name} must be {allowed}, got {bad!r}"
    null = " (or null)" if name == "max_new_tokens" else ""
    assert str(sweep.value) == f"sweep.{name} must be {allowed}{null}, got {bad!r}"


def test_bad_model_paths_are_named(config, capsys, tmp_path, monkeypatch):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--model.model_path", str(empty))
    assert line.endswith(f"model.model_path: no model at {empty} (no config.json)")
    missing = tmp_path / "missing_model"
    line = fails_in_one_line(capsys, "cache", "--config", str(config), "--model.model_path", str(missing))
    assert f"no model at {missing} (no config.json; the directory does not exist)" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # an empty Hugging Face cache
    line = fails_in_one_line(capsys, "validate", "--config", str(config), "--model.model_path", "someorg/some-model")
    assert "model.model_path: someorg/some-model is not a local path and no hub access" in line


def test_misspelt_top_level_key_is_named_with_the_closest_one(config, capsys, tmp_path):
    content = yaml.safe_load(config.read_text())
    content["modle"] = content.pop("model")
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(yaml.safe_dump(content))
    line = fails_in_one_line(capsys, "fit", "--config", str(misspelt))
    assert line == f"erpo: error: {misspelt}: unknown top-level key 'modle'; did you mean 'model'?"


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("weight_source", "current", "model.query_weight_source (reference | current"),
        ("weight_norm", "batch", "model.query_weight_norm (dataset | batch)"),
        ("weight_clip", None, "model.query_weight_clip ([lo, hi] or none)"),
    ],
)
def test_a_moved_weight_setting_names_its_new_place(config, capsys, tmp_path, old, value, new):
    """w(q)'s settings moved from `data` to the algorithm (`model`): an old config file or flag says where."""
    content = yaml.safe_load(config.read_text())
    content["data"][old] = value
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump(content))
    line = fails_in_one_line(capsys, "fit", "--config", str(legacy))
    assert line.startswith(f"erpo: error: data.{old} has moved: w(q) is the algorithm's, set {new}"), line
    flag = fails_in_one_line(capsys, "fit", "--config", str(config), f"--data.{old}={value}")
    assert flag == line


def test_debug_shows_the_traceback(config, monkeypatch):
    with pytest.raises(SettingsError, match="rollout.temperature must be > 0"):
        main(["fit", "--config", str(config), "--rollout.temperature", "-1", "--debug"])
    monkeypatch.setenv("ERPO_DEBUG", "1")
    with pytest.raises(SettingsError, match="data.batch_size must be >= 1"):
        main(["fit", "--config", str(config), "--data.batch_size", "0"])


def test_trainer_defaults_progress_label_and_quiet_warnings(tmp_path, monkeypatch):
    monkeypatch.setattr("erpo_lightning.cli.command.stderr_is_terminal", lambda: True)  # the bar of a terminal
    trainer = ERPOLightningTrainer(accelerator="cpu", logger=False, max_steps=5, default_root_dir=tmp_path)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, ERPOProgressBar)
    bar.setup(trainer, pl.LightningModule(), "fit")
    trainer.fit_loop.max_epochs = -1  # what `fit` sets when only max_steps bounds the run
    assert bar._get_train_description(4).strip() == "Epoch 4"  # not "Epoch 4/-2"
    bounded = ERPOLightningTrainer(accelerator="cpu", logger=False, max_epochs=3, default_root_dir=tmp_path)
    bounded.progress_bar_callback.setup(bounded, pl.LightningModule(), "fit")
    assert bounded.progress_bar_callback._get_train_description(1).strip() == "Epoch 1/2"
    quiet_known_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_warnings()  # re-applied inside this block: catch_warnings resets the filters
        checkpoint_advice = "Using ModelCheckpoint with manual optimization and every_n_train_steps"
        for message, category in (
            (checkpoint_advice + ", but no pre-optimization state was saved.", UserWarning),
            ("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning),
            (checkpoint_advice, FutureWarning),  # the same text in another category is not the known notice
            ("an unrelated warning", UserWarning),
        ):
            warnings.warn(message, category, stacklevel=1)
    assert [str(w.message)[:20] for w in caught] == ["Using ModelCheckpoin", "an unrelated warning"]


@pytest.mark.slow
def test_command_line_list_replaces_the_config_files_list(tmp_path, tiny_model_path, benchmarks_dir):
    """`--data.train "[{path: x}]"` trains on x alone, keeping no `limit`, `label` or field of the file's source."""
    config = tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl", limit=3)
    other = tmp_path / "other.jsonl"
    rows = [json.loads(line) for line in (benchmarks_dir / "gsm8k.jsonl").read_text().splitlines()[100:105]]
    other.write_text("".join(json.dumps({"question": r["problem"], "answer": r["answer"]}) + "\n" for r in rows))
    override = f"[{{path: {other}, problem_field: question}}]"
    result = subprocess.run(
        [ERPO, "cache", "--config", str(config), "--data.train", override],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"[erpo data] 5 training queries ({other}: 5)" in output  # not 3: the file's `limit: 3` is gone


@pytest.mark.slow
def test_errors_are_one_line_from_the_installed_command(tmp_path, config):
    bad = tmp_path / "bad.yaml"
    bad.write_text(config.read_text().replace("max_new_tokens: 6", "max_new_tokens: 0"))
    result = subprocess.run([ERPO, "fit", "--config", str(bad)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-2:] == [
        "erpo: error: rollout.max_new_tokens must be >= 1, got 0",
        DEBUG_HINT,
    ], result.stderr
    assert "Traceback" not in result.stderr
    debug = subprocess.run(
        [ERPO, "fit", "--config", str(bad)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "ERPO_DEBUG": "1"},
    )  # fmt: skip
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].endswith("rollout.max_new_tokens must be >= 1, got 0")


def test_command_line_lists_replace_and_append(config, capsys, tmp_path):
    content = yaml.safe_load(config.read_text())
    content["sweep"] = {"benchmarks": [{"source": {"path": "a.jsonl", "limit": 3, "label": "file_bench"}, "k": 2}]}
    with_sweep = tmp_path / "with_sweep.yaml"
    with_sweep.write_text(yaml.safe_dump(content))
    args = ("--config", str(with_sweep), "--print_config")
    assert run_main("validate", *args, "--sweep.benchmarks", "[{source: {path: b.jsonl}}]") == 0
    benchmarks = yaml.safe_load(capsys.readouterr().out)["sweep"]["benchmarks"]
    assert [(b["source"]["path"], b["source"]["limit"], b["source"]["label"], b["k"]) for b in benchmarks] == [
        ("b.jsonl", None, None, 4)
    ]
    # `+` appends to the file's list; `sweep` is no key of `fit`, so its own config file is used
    assert run_main("fit", "--config", str(config), "--print_config", "--data.train+", "{path: more.jsonl}") == 0
    train = yaml.safe_load(capsys.readouterr().out)["data"]["train"]
    assert [(source["path"].rsplit("/", 1)[-1], source["limit"]) for source in train] == [
        ("gsm8k.jsonl", 8),
        ("more.jsonl", None),
    ]


def test_one_line_messages():
    assert one_line(ValueError("data.train:\n  row 3:   bad")) == "data.train: row 3: bad"
    assert one_line(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert one_line(StopIteration()) == "StopIteration"
    assert one_line(KeyError("prompt_ids")) == "KeyError: missing key 'prompt_ids'"
    assert one_line(RuntimeError("x" * 5000)).endswith("x [...]") and len(one_line(RuntimeError("x" * 5000))) < 2100
