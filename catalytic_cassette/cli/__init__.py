"""The `cassette` click group; mount it into another click CLI with add_command."""

from . import (  # noqa: F401  (register their commands)
    anchor_commands,
    chain_commands,
    live_commands,
    reasoning_commands,
)
from .commands import cli, main

__all__ = ["cli", "main"]
