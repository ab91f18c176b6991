"""The `cassette` click group; mount it into another click CLI with add_command."""

from . import anchor_commands, chain_commands, commands, live_commands, reasoning_commands
from .commands import cli, main

for _module in (commands, chain_commands, reasoning_commands, anchor_commands, live_commands):
    _module.register(cli)

__all__ = ["cli", "main"]
