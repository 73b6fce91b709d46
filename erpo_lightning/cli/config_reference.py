"""docs/configuration.md's field tables of the `model:`, `data:` and `rollout:` groups, generated from the owners'
constructor docstrings (their `Args:` entries, which jsonargparse also shows in `erpo fit --help`), as
docs/loss_settings.md is generated from `Algorithm`'s; the loss fields stay there.

Each table sits between `<!-- generated: <group> ... -->` and `<!-- end generated: <group> -->` in the page; the
prose around them is hand-written. `python -m erpo_lightning.cli.config_reference --write docs/configuration.md`
(WRITE_COMMAND) rewrites the tables in place; without `--write` it prints them. tests/cli/test_config_reference.py fails
when a parameter has no entry, an entry names no parameter, or the page differs from what this module writes.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import typing
from dataclasses import fields
from pathlib import Path
from typing import Literal

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.data.datamodule import QueryDataModule
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.objectives.algorithms import Algorithm, attribute_docs, type_text, value_text

Group = Literal["model", "data", "rollout"]
OWNERS: dict[Group, type] = {"model": ERPOModule, "data": QueryDataModule, "rollout": RolloutCallback}
PAGE = "docs/configuration.md"
WRITE_COMMAND = f"python -m erpo_lightning.cli.config_reference --write {PAGE}"
LOSS_FIELDS = tuple(field.name for field in fields(Algorithm))  # `model:` parameters documented in loss_settings.md
_BLOCK = re.compile(r"<!-- generated: (\w+) .*?-->\n.*?<!-- end generated: \1 -->\n", re.DOTALL)


def group_parameters(group: Group) -> dict[str, inspect.Parameter]:
    """The constructor parameters of `group`'s owner that its table lists, in signature order: every one but the loss
    fields of `model:`."""
    parameters = dict(inspect.signature(OWNERS[group].__init__).parameters)
    parameters.pop("self")
    return {name: p for name, p in parameters.items() if not (group == "model" and name in LOSS_FIELDS)}


def group_docs(group: Group) -> dict[str, str]:
    """{parameter: description} of the `Args:` entries of `group`'s owner's docstring (the loss fields' included)."""
    return dict(attribute_docs(OWNERS[group], "Args"))


def _cell(text: str) -> str:
    """`text` inside a markdown table cell: `|` escaped (also inside code spans, as GitHub reads them)."""
    return text.replace("|", "\\|")


def group_table(group: Group) -> str:
    """The generated block of `group`: its markers and a table of each parameter's type, default (as the signature
    has it; `required` when it has none) and docstring description. ValueError naming a parameter without one."""
    owner, docs = OWNERS[group], group_docs(group)
    hints = typing.get_type_hints(owner.__init__)
    out = [
        f"<!-- generated: {group} from the `Args:` of {owner.__name__}'s docstring; edit it, not this table, then run",
        f"     {WRITE_COMMAND} -->",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, parameter in group_parameters(group).items():
        if not docs.get(name):
            raise ValueError(f"{group}.{name} has no `Args:` entry in {owner.__name__}'s docstring")
        default = "required" if parameter.default is inspect.Parameter.empty else value_text(parameter.default)
        out.append(f"| `{name}` | {_cell(type_text(hints[name]))} | {_cell(default)} | {_cell(docs[name])} |")
    if group == "model":
        loss_fields = ", ".join(f"`{name}`" for name in inspect.signature(ERPOModule).parameters if name in LOSS_FIELDS)
        out.append(
            f"| the {len(LOSS_FIELDS)} loss fields: {loss_fields} | see there | null: the preset's | override single "
            "fields of the `algorithm` preset: [docs/loss_settings.md](loss_settings.md) |"
        )
    return "\n".join([*out, "", f"<!-- end generated: {group} -->", ""])


def write_tables(page: str) -> str:
    """`page` with each generated block replaced by `group_table`'s; ValueError when a group's block is missing."""
    missing = [group for group in OWNERS if f"<!-- generated: {group} " not in page]
    if missing:
        raise ValueError(
            f"no generated block for {', '.join(missing)}: add `<!-- generated: <group> -->` and "
            "`<!-- end generated: <group> -->` lines where each table goes"
        )
    unknown = sorted({block[1] for block in _BLOCK.finditer(page)} - set(OWNERS))
    if unknown:
        raise ValueError(f"generated blocks of unknown groups {unknown}; the groups: {', '.join(OWNERS)}")
    return _BLOCK.sub(lambda block: group_table(block[1]), page)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m erpo_lightning.cli.config_reference", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", type=Path, metavar="PAGE", help=f"rewrite the tables in place (e.g. {PAGE})")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write("\n".join(group_table(group) for group in OWNERS))
    else:
        args.write.write_text(write_tables(args.write.read_text()))


if __name__ == "__main__":
    main()
