"""Typed path parameters: a wrong path is a usage error (exit 2) before any work starts."""

from __future__ import annotations

from typing import Any

import click

# An input that must exist and be a readable file: keys, seals, proofs, backups.
INPUT_FILE = click.Path(exists=True, dir_okay=False, readable=True)
# A seal file or a directory of *.seal files.
INPUT_FILE_OR_DIR = click.Path(exists=True, readable=True)
# A directory that must exist (automatic seals are written into it).
EXISTING_DIR = click.Path(exists=True, file_okay=False, writable=True)


class OutputPath(click.Path):
    """A path to write: its directory must exist; with ``dir_okay``, an existing directory
    (or a path ending in ``/``) means "write a file named for the content in it"."""

    def __init__(self, *, dir_okay: bool = False, database_ok: bool = False) -> None:
        super().__init__(dir_okay=dir_okay)
        self.database_ok = database_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if self.database_ok and text.startswith(("postgresql://", "postgres://")):
            return text  # a ledger in a database: the open checks it
        from pathlib import Path  # (here, not at import: every command imports this module)

        target = Path(text)
        wants_dir = text.endswith(("/", "\\")) or target.is_dir()
        if wants_dir and not self.dir_okay:
            self.fail(f"{text!r} is a directory; give a file name", param, ctx)
        if wants_dir and not target.is_dir():
            self.fail(f"directory {text!r} does not exist", param, ctx)
        if not wants_dir and not target.parent.is_dir():
            self.fail(f"directory {str(target.parent)!r} does not exist", param, ctx)
        return text


OUTPUT_FILE = OutputPath()
OUTPUT_FILE_OR_DIR = OutputPath(dir_okay=True)
# Where a ledger is written: a new file, or a postgresql:// URL.
OUTPUT_LEDGER = OutputPath(database_ok=True)
