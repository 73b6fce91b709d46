"""The README's code examples run as written."""

import json
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


def test_toy_study_claims_quoted_in_the_readme_are_the_shipped_claims():
    section = README.read_text().split("## What ERPO does, measured", 1)[1].split("\n## ", 1)[0]
    report = (README.parent / "docs" / "toy_study.md").read_text()
    claims = json.loads((README.parent / "docs" / "toy_study_claims.json").read_text())["claims"]
    assert "](docs/toy_study.md)" in section
    items = [" ".join(item.split()) for item in re.split(r"\n(?=- )|\n\n", section)]  # bullets, paragraphs
    quoted = [claim for claim in claims if any(claim["text"] in item for item in items)]
    assert len(quoted) >= 4, "the section should state the study's claims in the report's words"
    for claim in quoted:  # each quoted claim carries its k of n seeds and its median paired value
        line = next(item for item in items if claim["text"] in item)
        assert f"{claim['k']} of {claim['n']} seeds" in line, (claim["key"], line)
        assert claim["median"] is None or f"{claim['median']:.3g}" in line, (claim["key"], line)
    figures = re.findall(r"\d[\d.]* ± [\d.]+", section)
    assert not [figure for figure in figures if figure not in report], "README quotes numbers the report lacks"
    minutes = re.search(r"\(([\d.]+) min on 2 CPU cores", section).group(1)
    assert f"time: {minutes} min" in report
