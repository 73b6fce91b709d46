"""The `model:`, `data:` and `rollout:` settings are written once: each constructor parameter's `Args:` entry in its
owner's docstring. `erpo fit --help` and docs/configuration.md's generated tables must follow them (the loss fields:
tests/objectives/test_algorithms.py)."""

import inspect
import re
from collections import Counter
from pathlib import Path

import pytest
from lightning.pytorch.cli import LightningArgumentParser

from erpo_lightning.cli.config_reference import (
    LOSS_FIELDS,
    OWNERS,
    WRITE_COMMAND,
    group_docs,
    group_parameters,
    group_table,
    write_tables,
)
from erpo_lightning.objectives.algorithms import attribute_docs

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("group", OWNERS)
def test_every_parameter_has_one_docstring_entry_and_every_entry_a_parameter(group):
    owner = OWNERS[group]
    parameters = set(inspect.signature(owner.__init__).parameters) - {"self"}
    entries = Counter(name for name, _ in attribute_docs(owner, "Args"))
    missing = sorted(parameters - set(entries))
    assert not missing, f"{owner.__name__}'s docstring has no `Args:` entry for {group}.{', '.join(missing)}"
    gone = sorted(set(entries) - parameters)
    assert not gone, f"{owner.__name__}'s docstring documents {gone}, which are not parameters of its constructor"
    twice = sorted(name for name, count in entries.items() if count > 1)
    assert not twice, f"{owner.__name__}'s docstring documents {twice} more than once"


@pytest.mark.parametrize("group", OWNERS)
def test_no_description_is_empty(group):
    short = [name for name in group_parameters(group) if len(group_docs(group).get(name, "")) < 10]
    assert not short, f"{group}: the `Args:` entries of {short} say nothing"


def table_fields(page: str, group: str) -> list[str]:
    """The field names of the rows of `group`'s generated block in `page`."""
    block = re.search(rf"<!-- generated: {group} .*?<!-- end generated: {group} -->", page, re.DOTALL)
    assert block, f"docs/configuration.md has no generated block for {group}: run `{WRITE_COMMAND}`"
    return re.findall(r"^\| `(\w+)` \|", block[0], re.MULTILINE)


@pytest.mark.parametrize("group", OWNERS)
def test_the_page_lists_every_field_of_the_group_and_no_other(group):
    rows = table_fields(PAGE.read_text(), group)
    missing = [name for name in group_parameters(group) if name not in rows]
    assert not missing, f"docs/configuration.md's {group}: table lacks {missing}: run `{WRITE_COMMAND}`"
    gone = [name for name in rows if name not in group_parameters(group)]
    assert not gone, f"docs/configuration.md's {group}: table lists {gone}, no longer fields: run `{WRITE_COMMAND}`"


def test_the_page_tables_are_generated_from_the_docstrings():
    page = PAGE.read_text()
    assert WRITE_COMMAND in page
    assert page == write_tables(page), f"docs/configuration.md's generated tables are stale: run `{WRITE_COMMAND}`"
    model = group_table("model")
    assert "| `micro_batch_tokens` | `int` | `16384` | token budget of one forward, in tokens" in model
    assert "| `nan_policy` | `stop` \\| `skip` | `stop` |" in model  # a `|` of a choice does not split the cell
    assert all(f"`{name}`" in model for name in LOSS_FIELDS)  # each loss field named, pointing at its reference
    assert "[docs/loss_settings.md](loss_settings.md)" in model and "| `clip_high` |" not in model
    assert "| `engine` | `RolloutEngine` | required |" in group_table("rollout")


def test_a_page_without_a_groups_block_is_refused():
    page = PAGE.read_text()
    start, end = page.index("<!-- generated: rollout "), page.index("<!-- end generated: rollout -->\n")
    with pytest.raises(ValueError, match="no generated block for rollout"):
        write_tables(page[:start] + page[end + len("<!-- end generated: rollout -->\n") :])


def test_the_cli_help_of_each_field_is_its_docstring_entry():
    parser = LightningArgumentParser()
    parser.add_lightning_class_args(OWNERS["model"], "model")
    parser.add_lightning_class_args(OWNERS["data"], "data")
    parser.add_lightning_class_args(OWNERS["rollout"], "rollout")  # as `erpo` adds it (cli/command.py)
    helps = {action.dest: action.help for action in parser._actions}
    for group in OWNERS:
        for name in group_parameters(group):
            assert words(helps[f"{group}.{name}"] or "").startswith(words(group_docs(group)[name])), f"{group}.{name}"
    assert words(helps["model.micro_batch_tokens"]).startswith("token budget of one forward, in tokens")
    assert words(helps["data.seed"]).startswith("seed of that shuffle")  # once a shared `a, b:` entry, no help
    assert words(helps["rollout.tokenizer"]).startswith("tokenizer path or Hub id")
