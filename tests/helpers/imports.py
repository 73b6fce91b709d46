"""What the package's files import, read from their source (nothing is imported)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "erpo_lightning"


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names
