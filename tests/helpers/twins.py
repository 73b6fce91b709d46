"""The GPU recipes' CPU twins (configs/twins/) run by the real `erpo` command in a folder of their own."""

import csv
import shutil
from pathlib import Path

from erpo_lightning.toy import SHIPPED_DIR

REPO = Path(__file__).resolve().parents[2]


def workspace(root: Path) -> Path:
    """`root` holding the repository's configs/ and the shipped toy model at their paths, where a run writes its
    runs/ (and its reference cache, `fit_configs.run_erpo`'s ERPO_CACHE_HOME)."""
    shutil.copytree(REPO / "configs", root / "configs")
    shutil.copytree(SHIPPED_DIR, root / SHIPPED_DIR.relative_to(REPO))
    return root


def metrics(run: Path) -> list[dict[str, str]]:
    """The rows of a run folder's metrics.csv."""
    return list(csv.DictReader((run / "metrics.csv").open()))
