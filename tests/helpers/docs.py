"""The code examples of docs/ pages, found by the `<!-- example: NAME -->` comment right above each block."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def example(page: str, name: str, language: str = "python") -> str:
    """The one `language` code block of docs/`page` marked `<!-- example: name -->`; fails when there is not one."""
    text = (DOCS / page).read_text()
    blocks = re.findall(rf"<!-- example: {re.escape(name)} -->\s*```{language}\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"docs/{page} has {len(blocks)} examples marked {name!r}, not one"
    return blocks[0]
