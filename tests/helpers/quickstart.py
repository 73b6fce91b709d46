"""The quickstart's inputs (its config, the shipped model and task) copied into a work directory."""

import shutil
from pathlib import Path

from erpo_lightning.toy import SHIPPED_DIR

REPO = Path(__file__).resolve().parents[2]


def copy_quickstart_inputs(workdir: Path, test_problems: int | None = None) -> None:
    """The configs and the shipped toy model, at the repository-relative paths the quickstart config names; with
    `test_problems`, the copy's test split keeps only its first that many problems (the sweeps read the first 200)."""
    shutil.copytree(REPO / "configs", workdir / "configs")
    shipped = workdir / SHIPPED_DIR.relative_to(REPO)
    shutil.copytree(SHIPPED_DIR, shipped)
    if test_problems is not None:
        lines = (shipped / "test.jsonl").read_text().splitlines(keepends=True)
        (shipped / "test.jsonl").write_text("".join(lines[:test_problems]))
