"""The CLI's one error boundary: CassetteError -> one stderr line and exit 1."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

EXIT_REFUSED = 1
EXIT_CANNOT_VERIFY = 3


class CassetteGroup(click.Group):
    """A click group whose commands turn CassetteError into a coded refusal."""

    def invoke(self, ctx: click.Context) -> Any:
        from ..errors import CassetteError

        try:
            return super().invoke(ctx)
        except CassetteError as error:
            click.echo(f"error: {error.code.value}: {error.message}", err=True)
            ctx.exit(error.exit_code)


def emit(value: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode("utf-8") + "\n")
    sys.stdout.flush()
