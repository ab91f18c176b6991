"""The `cassette` click group; mount it into another click CLI with add_command."""

from . import anchor_commands, chain_commands, reasoning_commands  # noqa: F401  (register their commands)
from .commands import cli, main

__all__ = ["cli", "main"]
