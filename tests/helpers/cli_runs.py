"""`erpo` in this process on a tiny config: its exit status (`run_main`: it must exit), and its error as one line."""

from pathlib import Path

import pytest

from erpo_lightning.cli.command import main
from erpo_lightning.common.errors import DEBUG_HINT
from helpers.fit_configs import fit_config, write_config


def tiny_config(tmp_path, model_path, data_file, *, callbacks=(), max_steps=2, limit=8) -> Path:
    config = fit_config(
        model_path,
        [{"path": str(data_file), "limit": limit, "label": "config_file", "problem_field": "problem"}],
        tmp_path / "run",
        trainer={"max_steps": max_steps, "enable_model_summary": False, "callbacks": list(callbacks)},
        model={"learning_rate": 1e-3},
        data={"cache_dir": str(tmp_path / "cache")},
    )
    return write_config(tmp_path / "config.yaml", config)


def run_main(*args) -> int:
    """`erpo ARGS` in this process; its exit status."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    return exited.value.code


def fails_in_one_line(capsys, *args) -> str:
    """Run `erpo ARGS`; assert exit status 2, nothing loaded, and the error as one line plus the hint; return it."""
    code = run_main(*args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert lines[-1] == DEBUG_HINT and lines[-2].startswith("erpo: error: "), err
    assert "Traceback" not in err and "[erpo data]" not in err and "Loading weights" not in err, err
    return lines[-2]
