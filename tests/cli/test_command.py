"""The `erpo` command line: the installed console script as a user runs it (a subprocess: `--help`, cache then fit),
and argument handling that loads nothing, in this process (`helpers.cli_runs.run_main`). Hostile settings against
`erpo` (issue 18): each fails early, in one line, naming the field, and the owners' constructors raise the CLI's line
word for word; command-line lists replace or extend the config file's; the trainer's defaults."""

import csv
import json
import os
import re
import subprocess
import warnings

import lightning.pytorch as pl
import pytest
import yaml
from helpers.cli_runs import fails_in_one_line, run_main, tiny_config
from helpers.fit_configs import ERPO, csv_logger, fit_config, run_erpo, write_config

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.checkpoints.files import AtomicCheckpointIO
from erpo_lightning.cli.command import ERPOLightningTrainer, ERPOProgressBar, main
from erpo_lightning.common.errors import DEBUG_HINT, SettingsError, quiet_known_warnings
from erpo_lightning.data import QueryDataModule
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout import HFEngine


@pytest.mark.slow  # starts the `erpo` command (~10 s of imports)
def test_help_lists_subcommands():
    result = run_erpo("--help")
    assert result.returncode == 0, result.stderr
    for subcommand in ("fit", "validate", "cache", "erpo export --ckpt_path", "erpo plot RUN_DIR"):
        assert subcommand in result.stdout


def test_help_lists_every_subcommand_each_with_its_own_help(capsys):
    """`erpo --help` names the LightningCLI subcommands and the two the CLI runs itself (export, plot); each named
    command answers `--help`."""
    from erpo_lightning.cli.command import ERPOCLI

    assert run_main("--help") == 0
    listing = capsys.readouterr().out
    commands = [*ERPOCLI.subcommands(), "export", "plot"]
    for command in commands:
        assert re.search(rf"^\s+(erpo )?{command}\s", listing, re.MULTILINE), (command, listing)
    for command in commands:
        assert run_main(command, "--help") == 0, command
        usage = capsys.readouterr().out.splitlines()[0]  # the program's name is `erpo` only in the installed script
        assert usage.startswith("usage:") and f" {command} " in usage, (command, usage)


def test_print_config_has_every_group(capsys):
    assert run_main("fit", "--print_config") == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert {"trainer", "model", "data", "rollout"} <= set(config)
    assert config["model"]["algorithm"] == "erpo"
    # Unset: AdamW with model.learning_rate (1e-6) and a linear warm-up of model.warmup_steps (see modules/optim.py).
    assert (config["model"]["optimizer"], config["model"]["lr_scheduler"]) == (None, None)
    assert (config["model"]["learning_rate"], config["model"]["warmup_steps"]) == (None, 0)


def test_optimizer_and_schedule_from_the_command_line(capsys):
    flags = ["--model.optimizer", "SGD", "--model.optimizer.lr", "0.1", "--model.lr_scheduler", "CosineAnnealingLR"]
    assert run_main("fit", *flags, "--model.lr_scheduler.T_max", "10", "--print_config") == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert model["optimizer"]["class_path"] == "torch.optim.SGD" and model["optimizer"]["init_args"]["lr"] == 0.1
    assert model["lr_scheduler"]["class_path"] == "torch.optim.lr_scheduler.CosineAnnealingLR"
    assert model["lr_scheduler"]["init_args"]["T_max"] == 10


@pytest.fixture()
def smoke_config(tmp_path, tiny_model_path, benchmarks_dir):
    config = fit_config(
        tiny_model_path,
        [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 8}],
        tmp_path / "run",
        trainer={"logger": csv_logger(tmp_path / "run"), "enable_checkpointing": False, "log_every_n_steps": 1},
        model={"learning_rate": 1e-4},
        data={"template": "qwen25-math-cot"},
        rollout={"max_new_tokens": 8},
    )
    return write_config(tmp_path / "smoke.yaml", config)


@pytest.mark.slow  # two `erpo cache` and one `erpo fit` of the installed command
def test_cache_then_fit_end_to_end(smoke_config, tmp_path):
    cached = run_erpo("cache", "--config", str(smoke_config), cwd=tmp_path)
    assert cached.returncode == 0, cached.stderr[-3000:]
    assert "wrote reference scores" in cached.stdout + cached.stderr
    fitted = run_erpo("fit", "--config", str(smoke_config), cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    assert (
        "loaded reference scores of 8 queries" in fitted.stdout + fitted.stderr
    )  # fit reused the cache `erpo cache` wrote
    metrics_file = next((tmp_path / "run").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics_file.open()))
    query_kl = [float(r["train/query_kl"]) for r in rows if r.get("train/query_kl")]
    assert len(query_kl) == 2 and query_kl[0] < 1e-8  # at θ0 the queries have not drifted
    assert any(r.get("rollout/reward_mean") for r in rows)
    # The command that cache-mismatch errors tell users to run.
    rebuilt = run_erpo("cache", "--config", str(smoke_config), "--force", "true", cwd=tmp_path)
    assert rebuilt.returncode == 0 and "wrote reference scores" in rebuilt.stdout + rebuilt.stderr, rebuilt.stderr[
        -2000:
    ]


def test_a_setting_with_two_owners_is_refused_before_anything_loads(smoke_config, tmp_path, capsys):
    """The smoke config sets model.learning_rate; a configured optimizer owns its own (init_args.lr)."""
    assert run_main("fit", "--config", str(smoke_config), "--model.optimizer", "SGD") != 0
    err = capsys.readouterr().err
    assert "model.learning_rate is set together with model.optimizer" in err, err[-2000:]
    assert not (tmp_path / "run").exists()  # refused before the trainer, logger or cache existed


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
