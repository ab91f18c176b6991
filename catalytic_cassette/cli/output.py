"""How rows reach stdout: streamed, in constant memory, as JSON, --nl, --csv or -t.

Every format writes each row as it is read from the database, so the first row of a
long listing shows at once and ``| head`` stops the query early.
"""

from __future__ import annotations

import csv
import functools
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any, TypeVar

import click
import orjson

from ..terminal import printable

F = TypeVar("F", bound=Callable[..., Any])

TABLE_PAGE_ROWS = 100  # -t sizes its columns on the first page, then streams
PROGRESS_MIN_ENTRIES = 50_000  # shorter work finishes before a bar is worth drawing


def _plain(row: Any) -> dict[str, Any]:
    if hasattr(row, "to_dict"):
        return row.to_dict()  # type: ignore[no-any-return]
    return dict(row)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode("utf-8")


def write_json_array(rows: Iterable[dict[str, Any]], out: IO[str]) -> None:
    """The same bytes as one indented JSON array, written one element at a time."""
    first = True
    for row in rows:
        item = orjson.dumps(row, option=orjson.OPT_INDENT_2).decode("utf-8")
        # Inside an element a newline only separates tokens (strings escape theirs).
        out.write(("[\n  " if first else ",\n  ") + item.replace("\n", "\n  "))
        first = False
    out.write("[]\n" if first else "\n]\n")


def write_nl(rows: Iterable[dict[str, Any]], out: IO[str]) -> None:
    for row in rows:
        out.write(orjson.dumps(row).decode("utf-8") + "\n")


def write_csv(rows: Iterable[dict[str, Any]], out: IO[str]) -> None:
    """A header from the first row; nested values as compact JSON."""
    writer = None
    for row in rows:
        if writer is None:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(list(row))
        writer.writerow([_cell(v) for v in row.values()])


def write_table(rows: Iterable[dict[str, Any]], out: IO[str]) -> None:
    """A plain table for people: columns sized on the first page of rows, then streamed
    (a later, wider cell widens its own line only). Control characters are escaped."""
    iterator = iter(rows)
    page = list(itertools.islice(iterator, TABLE_PAGE_ROWS))
    if not page:
        return
    headers = list(page[0])
    texts = [[printable(_cell(v)) for v in row.values()] for row in page]
    widths = [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() + "\n"

    out.write(line(headers))
    out.write(line(["-" * w for w in widths]))
    for cells in texts:
        out.write(line(cells))
    for row in iterator:
        out.write(line([printable(_cell(v)) for v in row.values()]))


FORMAT_FLAGS = {"nl": "--nl", "csv": "--csv", "table": "-t/--table"}
_WRITERS = {"json": write_json_array, "nl": write_nl, "csv": write_csv, "table": write_table}


def render(rows: Iterable[Any], fmt: str = "json") -> None:
    out = sys.stdout
    _WRITERS[fmt]((_plain(row) for row in rows), out)
    out.flush()


def output_options(command: F) -> F:
    """Add --nl, --csv and -t/--table; the command returns (an iterator of) its rows."""

    @click.option("--nl", "as_nl", is_flag=True, help="One JSON object per line.")
    @click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")
    @click.option("-t", "--table", "as_table", is_flag=True, help="A table for people.")
    @functools.wraps(command)
    def wrapper(*args: Any, as_nl: bool, as_csv: bool, as_table: bool, **kwargs: Any) -> None:
        chosen = [f for f, on in (("nl", as_nl), ("csv", as_csv), ("table", as_table)) if on]
        if len(chosen) > 1:  # never let one of them win silently
            flags = " and ".join(FORMAT_FLAGS[f] for f in chosen)
            raise click.UsageError(f"{flags} are different output formats: give one")
        render(command(*args, **kwargs), chosen[0] if chosen else "json")

    return wrapper  # type: ignore[return-value]


@contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A bar on stderr only when stderr is a terminal and the work is long; else None."""
    if total < PROGRESS_MIN_ENTRIES or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        yield bar.update
