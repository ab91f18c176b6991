"""Typed parameters: whatever is wrong on the command line is a usage error (exit 2)
before any work starts (README, "Exit status")."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import click

from .boundary import EXIT_USAGE, Refusal

if TYPE_CHECKING:  # generic in the click this is checked with; plain classes at run time
    from ..errors import CassetteError

    _ParamType = click.ParamType[Any, Any]
    _Choice = click.Choice[str]
else:
    _ParamType = click.ParamType
    _Choice = click.Choice


class InputFile(_ParamType):
    """A file the command reads, checked by name as ``safe_files`` will read it: it
    exists, is a regular file (never a link, unless ``follow_link``: a ledger, which
    SQLite opens through links too), fits its cap and may be read. Otherwise its coded
    refusal (NOT_FOUND, UNSAFE_PATH, FILE_TOO_LARGE, CANNOT_OPEN) with exit 2.

    ``cap`` names the cap in ``safe_files`` (imported only when a value is given).
    """

    name = "file"

    def __init__(
        self, what: str, cap: str = "NO_CAP", *, follow_link: bool = False, dir_ok: bool = False
    ) -> None:
        self.what = what
        self.cap = cap
        self.follow_link = follow_link
        self.dir_ok = dir_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from .. import safe_files
        from ..errors import CassetteError

        text = str(value)
        try:
            if self.dir_ok and safe_files.is_directory(text):
                safe_files.check_directory(text, what="directory")
            else:
                safe_files.check_named(
                    text,
                    what=self.what,
                    max_bytes=getattr(safe_files, self.cap),
                    follow_link=self.follow_link,
                )
        except CassetteError as error:
            raise _usage(error, param) from error
        return text

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        return _complete_paths("file", incomplete)


def _complete_paths(kind: str, incomplete: str) -> list[Any]:
    """What click.Path offers a shell: let the shell complete file or directory names."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type=kind)]


class InputDirectory(_ParamType):
    """A directory named as such (seals, worker keys): a real one, not a link to one."""

    name = "directory"

    def __init__(self, what: str, *, writable: bool = False) -> None:
        self.what = what
        self.writable = writable

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from .. import safe_files
        from ..errors import CassetteError, ErrorCode

        text = str(value)
        try:
            safe_files.check_directory(text, what=self.what)
            if self.writable and not os.access(text, os.W_OK):
                raise CassetteError(
                    ErrorCode.CANNOT_OPEN, f"{self.what} {text} may not be written", path=text
                )
        except CassetteError as error:
            raise _usage(error, param) from error
        return text

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        return _complete_paths("dir", incomplete)


class InputLedger(InputFile):
    """A ledger to read: a postgresql:// URL (its server answers), or an existing file."""

    def __init__(self) -> None:
        super().__init__("ledger", follow_link=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ..targets import names_file  # (here: converting is when a ledger is named)

        text = str(value)
        if not names_file(text):
            return text
        return super().convert(value, param, ctx)


def _usage(error: CassetteError, param: click.Parameter | None) -> Refusal:
    """A path's refusal as the usage error it is: the option named, exit 2."""
    return Refusal(error.code.value, f"{_option_name(param)}{error.message}", EXIT_USAGE)


def _option_name(param: click.Parameter | None) -> str:
    if param is None:
        return ""
    names = getattr(param, "opts", None) or [param.human_readable_name]
    return f"{names[-1] if isinstance(param, click.Option) else names[0].upper()}: "


class ChoiceOf(_Choice):
    """A click.Choice whose names are loaded when a value is checked, not at import:
    ``names`` imports the module that owns the list (one place for each list)."""

    def __init__(self, names: Callable[[], Collection[str]]) -> None:
        super().__init__([])
        self._names = names

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not self.choices:
            self.choices = tuple(sorted(self._names()))
        return super().convert(value, param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME"  # the list is not loaded for --help


class TimeParam(_ParamType):
    """ISO 8601 (UTC without an offset) or integer epoch milliseconds."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from ..errors import CassetteError
        from ..timeline import parse_time

        try:
            return parse_time(value)
        except CassetteError as error:
            self.fail(error.message, param, ctx)


TIME = TimeParam()
# Files read by name (keys, seals, proofs, bundles, backups): checked before any work.
PRIVATE_KEY = InputFile("private key", "KEY_MAX_BYTES")
PUBLIC_KEY = InputFile("public key", "KEY_MAX_BYTES")
SEAL_FILE = InputFile("seal file", "SEAL_MAX_BYTES")
SEAL_FILE_OR_DIR = InputFile("seal file", "SEAL_MAX_BYTES", dir_ok=True)
PROOF_FILE = InputFile("proof file", "PROOF_MAX_BYTES")
BUNDLE_FILE = InputFile("bundle", "BUNDLE_MAX_BYTES")
BACKUP_FILE = InputFile("backup")
INPUT_LEDGER = InputLedger()
SEAL_DIRECTORY = InputDirectory("seal directory", writable=True)  # automatic seals go there
KEY_DIRECTORY = InputDirectory("worker key directory")


class OutputPath(click.Path):
    """A path to write: its directory must exist; with ``dir_okay``, an existing directory
    (or a path ending in ``/``) means "write a file named for the content in it"."""

    def __init__(self, *, dir_okay: bool = False, database_ok: bool = False) -> None:
        super().__init__(dir_okay=dir_okay)
        self.database_ok = database_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ..targets import names_file

        text = str(value)
        if self.database_ok and not names_file(text):
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


def renamed(old: str, new: str) -> Callable[[Any], Any]:
    """An option's earlier name, answered with its new one (usage, exit 2) instead of
    click's bare "No such option": scripts written against the old name learn the fix."""

    def refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            raise click.UsageError(f"{old} was renamed {new}", ctx)

    return click.option(
        old, hidden=True, expose_value=False, is_eager=True, default=None, callback=refuse
    )
