"""The `erpo` command line: the installed console script as a user runs it (a subprocess: `--help`, cache then fit),
and argument handling that loads nothing, in this process (`helpers.cli_runs.run_main`)."""

import csv
import re

import pytest
import yaml
from helpers.cli_runs import run_main
from helpers.fit_configs import csv_logger, fit_config, run_erpo, write_config


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
