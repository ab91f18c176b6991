"""The CLI's one boundary: every exception becomes one stderr line and a documented exit.

The rule is written once, in README.md, "Exit status": 0 success, 1 refused, 2 usage
(anything wrong before the ledger is asked; cli/params.py checks paths, sets and numbers
while parsing), 3 cannot verify, 130 interrupted, 141 reader went away. Commands never
pick an exit status for an error; they raise, and this module maps.
"""

from __future__ import annotations

import io
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import IO, Any

import click

# (errors, terminal and orjson are imported where used: `cassette --help` needs none)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_CANNOT_VERIFY = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: `cassette actions --nl | head -1`

# Commands whose refusal means "the evidence could not be checked", not "refused".
VERIFYING_COMMANDS = frozenset({"verify", "verify-proof", "verify-bundle"})
_COMMAND_KEY = "cassette.command"


class Refusal(click.ClickException):
    """A coded answer: shown as ``error: CODE: message`` and exited with its status."""

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        from ..redaction import redact

        super().__init__(redact(message))  # (a path or URL echoed: no password shown)
        self.code = code
        # click declares exit_code on the class; each refusal carries its own.
        vars(self)["exit_code"] = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        from ..terminal import printable

        click.echo(f"error: {self.code}: {printable(self.message)}", err=True)


def refusal(exc: BaseException, command: str | None) -> Refusal | None:
    """The coded answer for an exception, or None when it is not ours to map."""
    from ..errors import CassetteError, ErrorCode, translate

    verifying = command in VERIFYING_COMMANDS
    refused = EXIT_CANNOT_VERIFY if verifying else EXIT_REFUSED
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, CassetteError):
        cannot_check = exc.detail.get("unverifiable") is True
        status = EXIT_CANNOT_VERIFY if cannot_check else refused
        return Refusal(exc.code.value, exc.message, status)
    if isinstance(exc, (KeyboardInterrupt, click.Abort)):
        return Refusal(
            ErrorCode.INTERRUPTED.value,
            "interrupted (an unfinished transaction is rolled back)",
            EXIT_INTERRUPTED,
        )
    if isinstance(exc, click.ClickException):
        help_hint = " (see --help)" if isinstance(exc, click.UsageError) else ""
        return Refusal(ErrorCode.USAGE.value, exc.format_message() + help_hint, EXIT_USAGE)
    if isinstance(exc, sqlite3.Error):  # met while streaming rows: a forged, undecodable text
        return refusal(translate(exc), command)
    if isinstance(exc, UnicodeError):
        return Refusal(ErrorCode.INVALID_ARGUMENT.value, f"not valid UTF-8 text: {exc}", refused)
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename is not None else ""
        text = f"{exc.strerror or exc}{where}"
        return Refusal(ErrorCode.CANNOT_OPEN.value, text, refused)
    return None


def _silence_stdout() -> None:
    """The reader closed the pipe: drop what is left, so the final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


class _WholeWrites(io.FileIO):
    """stdout's file, written whole or not at all: a pipe whose reader leaves while a
    write blocks returns a short count (SIGPIPE is ignored in Python), and the buffered
    layers above drop the rest without an error; writing the rest raises EPIPE."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            written = super().write(view[done:])
            if written is None:  # a non-blocking descriptor: leave it to the caller
                break
            done += written
        return done


def _stdout_written_whole() -> None:
    """Put stdout on ``_WholeWrites`` when it is a real descriptor (not under a test
    runner's capture), keeping its encoding and line buffering."""
    current = sys.stdout
    try:
        fd = current.fileno()
        current.flush()
    except (AttributeError, OSError, ValueError):
        return
    if not isinstance(current, io.TextIOWrapper):
        return
    raw = _WholeWrites(fd, "w", closefd=False)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=current.encoding,
        errors=current.errors,
        line_buffering=current.line_buffering,
    )


class CassetteGroup(click.Group):
    """The root group: maps every exception of its commands at one point.

    ``invoke`` covers the commands (also when the group is mounted into another click
    CLI, whose ``main`` then shows our Refusal); ``main`` also covers the parsing of the
    root options, so the standalone ``cassette`` answers every usage error on one line.
    """

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_COMMAND_KEY] = name
        return name, command, rest

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        if parent is None or parent.terminal_width is None:
            # (the max width as the context will take it: given, set, or the parent's)
            widest = extra.get("max_content_width", self.context_settings.get("max_content_width"))
            if widest is None and parent is not None:
                widest = parent.max_content_width
            extra.setdefault("terminal_width", help_width(widest))
        # The root's own output while parsing (--help, --version): click's main would
        # answer a closed pipe there with exit 1.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            _silence_stdout()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from .lazy import LazyCommands  # (the table of commands: listed without importing)

        if not isinstance(self.commands, LazyCommands):
            return super().format_commands(ctx, formatter)
        with self.commands.listing():
            return super().format_commands(ctx, formatter)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(EXIT_BROKEN_PIPE)
        except (Exception, KeyboardInterrupt) as exc:
            mapped = refusal(exc, ctx.meta.get(_COMMAND_KEY))
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        _stdout_written_whole()
        try:
            status = super().main(args, prog_name, complete_var, False, **extra)
        except BrokenPipeError:
            _silence_stdout()
            sys.exit(EXIT_BROKEN_PIPE)
        except (Exception, KeyboardInterrupt) as exc:
            mapped = refusal(exc, None)
            if mapped is None:
                raise
            mapped.show()
            sys.exit(mapped.exit_code)
        sys.exit(status if isinstance(status, int) else EXIT_OK)


def help_width(max_width: int | None) -> int | None:
    """The width click's help formatter takes when given none, worked out without
    ``shutil`` (whose import, with ``fnmatch``, ``bz2`` and ``lzma``, cost `cassette
    --help` 2.2 ms): the root context carries it, and every command's context inherits it.
    click's rule: the terminal's columns, at most ``max_width`` (80), less 2, at least 50.
    The columns as ``shutil.get_terminal_size`` finds them: ``COLUMNS`` when a positive
    integer, else the size of the terminal on the interpreter's stdout, else 80. None
    (click works it out) while click's ``FORCED_WIDTH`` is set. tests/test_cli_startup.py
    compares it with click's own at several sizes."""
    from click import formatting

    if formatting.FORCED_WIDTH is not None:
        return None
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return max(min(columns, 80 if max_width is None else max_width) - 2, 50)


def emit_plain(value: Any) -> None:
    """``emit`` of a document holding only text, integers, booleans, null, arrays and
    objects (e.g. counts), through the standard library's encoder: the same bytes as
    orjson's for these values (tests/test_cli_startup.py), without loading orjson and the
    modules it imports (about 1.2 ms of each call: docs/BENCHMARKS.md)."""
    import json

    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def emit(value: Any) -> None:
    """Write one JSON document to stdout."""
    import orjson

    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode("utf-8")
    except TypeError:
        # A path from the command line with undecodable bytes (a lone surrogate): orjson
        # refuses it; the standard encoder writes it as a JSON escape, "\udcff".
        import json

        text = json.dumps(value, indent=2, ensure_ascii=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
