"""The `erpo` command: its subcommands, the checks it runs before anything is built, its errors, `erpo plot`."""

from erpo_lightning.cli.command import main

__all__ = ["main"]
