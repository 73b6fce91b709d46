"""Imports point up (docs/architecture.md, "Layers"): nothing below the callbacks imports callbacks/ or the CLI."""

import subprocess
from pathlib import Path

import pytest
from helpers.imports import PACKAGE, imported_modules

BELOW_CALLBACKS = ("modules", "update", "data", "rollout", "evaluation", "objectives", "rewards")


def test_no_module_below_the_callbacks_imports_callbacks_or_the_cli():
    files = [path for layer in BELOW_CALLBACKS for path in sorted((PACKAGE / layer).rglob("*.py"))]
    assert len(files) > 30
    upward = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.startswith(("erpo_lightning.callbacks", "erpo_lightning.cli"))
    }
    assert not upward, sorted(upward)


WHOLE_FOLDERS = ("objectives", "rewards", "toy")  # the Layers table describes these folders, not each file


def layers_section() -> str:
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    return text.split("## Layers", 1)[1].split("\n## ", 1)[0]


def test_the_layer_table_names_every_module():
    """docs/architecture.md's Layers table names each tracked module (by file name), or the folder it belongs to."""
    tracked = subprocess.run(["git", "-C", str(PACKAGE.parent), "ls-files", "erpo_lightning/*.py"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    if not tracked:
        pytest.skip("not a git checkout")
    table = layers_section()
    unnamed = [
        path
        for path in tracked
        if Path(path).name not in ("__init__.py", "__main__.py")
        and f"`{Path(path).name}`" not in table
        and not any(f"`{folder}/`" in table for folder in Path(path).parent.parts[1:2] if folder in WHOLE_FOLDERS)
    ]
    assert unnamed == [], f"docs/architecture.md's Layers table does not name {unnamed}"
