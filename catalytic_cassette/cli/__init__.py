"""The `cassette` click group; mount it into another click CLI with add_command."""

from . import chain_commands  # noqa: F401  (registers the causal-chain commands)
from .commands import cli, main

__all__ = ["cli", "main"]
