"""The `cassette` click group; mount it into another click CLI with add_command."""

from .commands import cli, main

__all__ = ["cli", "main"]
