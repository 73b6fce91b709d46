"""Imports point up (docs/architecture.md, "Layers"): nothing below the callbacks imports callbacks/ or the CLI."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "erpo_lightning"
BELOW_CALLBACKS = ("modules", "data", "rollout", "evaluation", "objectives", "rewards")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


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
