"""The README's code examples run as written."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(marker: str) -> list[str]:
    """Python code blocks that directly follow an HTML comment `<!-- marker -->` in the README."""
    pattern = re.compile(rf"<!-- {re.escape(marker)} -->\s*```python\n(.*?)```", re.S)
    return pattern.findall(README.read_text())


def test_objectives_example_runs():
    blocks = python_blocks("example: objectives")
    assert len(blocks) == 1, "the README lost its objectives example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md:objectives", "exec"), namespace)
    assert namespace["loss"].ndim == 0 and torch.isfinite(namespace["loss"])  # a scalar loss
    assert namespace["loss"].requires_grad


def test_readme_has_exactly_two_commands_in_its_quickstart():
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [line for block in commands for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == ["make quickstart", "make test"]
