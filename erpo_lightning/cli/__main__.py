"""`python -m erpo_lightning.cli` (and `torchrun -m erpo_lightning.cli`): the `erpo` command."""

from erpo_lightning.cli.command import main

main()
