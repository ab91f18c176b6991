"""The PostgreSQL backend's SQL: versioned migrations and the named queries.

Both live inside the package (``catalytic_cassette/sql/postgresql``), loaded once per
process. A query is a block of ``queries.sql`` (or of another ``.sql`` file of that
folder: ``verify.sql``, ``opening.sql``) headed by ``-- name: NAME``, up to its last
line that is not a comment; names are unique across the files.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from ..sqlfiles import Migration

_FOLDER = Path(__file__).resolve().parent.parent / "sql" / "postgresql"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_QUERY_HEAD = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
# Comment lines after a query's statement introduce what follows (a section, the next
# query): they are not sent with it.
_TRAILING_COMMENTS = re.compile(r"(?:\n[ \t]*(?:--[^\n]*)?)+\s*\Z")


@cache
def migrations() -> tuple[Migration, ...]:
    found = []
    for entry in (_FOLDER / "migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"migration versions must be 1..n without gaps: {migration.name}")
    return tuple(found)


@cache
def queries() -> dict[str, str]:
    named: dict[str, str] = {}
    for path in sorted(_FOLDER.glob("*.sql")):
        text = path.read_text("utf-8")
        heads = list(_QUERY_HEAD.finditer(text))
        for index, head in enumerate(heads):
            end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
            body = _TRAILING_COMMENTS.sub("", text[head.end() : end]).strip()
            if head.group(1) in named or not body:
                raise RuntimeError(f"{path.name}: query {head.group(1)!r} is empty or named twice")
            named[head.group(1)] = body
    return named


def query(name: str) -> str:
    return queries()[name]
