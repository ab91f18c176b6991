"""One output-options decorator shared by every list command: JSON, --nl or -t/--table."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click
import orjson

F = TypeVar("F", bound=Callable[..., Any])


def _plain(row: Any) -> Any:
    if hasattr(row, "to_dict"):
        return row.to_dict()
    return row


def render(rows: Iterable[Any], *, nl: bool = False, table: bool = False) -> None:
    items = [_plain(row) for row in rows]
    out = sys.stdout
    if table:
        from tabulate import tabulate  # type: ignore[import-untyped]

        headers = list(items[0]) if items else []
        cells = [
            [
                v if isinstance(v, (str, int, float)) or v is None else orjson.dumps(v).decode()
                for v in item.values()
            ]
            for item in items
        ]
        out.write(tabulate(cells, headers=headers) + "\n")
    elif nl:
        for item in items:
            out.write(orjson.dumps(item).decode("utf-8") + "\n")
    else:
        out.write(orjson.dumps(items, option=orjson.OPT_INDENT_2).decode("utf-8") + "\n")
    out.flush()


def output_options(command: F) -> F:
    """Add --nl and -t/--table; the command returns its rows and this prints them."""

    @click.option("--nl", is_flag=True, help="One JSON object per line.")
    @click.option("-t", "--table", "as_table", is_flag=True, help="A table for people.")
    @functools.wraps(command)
    def wrapper(*args: Any, nl: bool, as_table: bool, **kwargs: Any) -> None:
        render(command(*args, **kwargs), nl=nl, table=as_table)

    return wrapper  # type: ignore[return-value]
