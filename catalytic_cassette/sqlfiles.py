"""Find and split the SQLite ledger's SQL files, shipped inside the package.

One folder per backend: ``catalytic_cassette/sql/sqlite/`` (``migrations/``, ``schema/``)
here, ``catalytic_cassette/sql/postgresql/`` for PostgreSQL (``postgresql/sqlfiles.py``).
Plain paths (not importlib.resources): the wheel installs them as files, and startup stays
fast.
"""

from __future__ import annotations

import re
import sqlite3
from functools import cache
from pathlib import Path
from typing import NamedTuple

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


SQLITE_SQL = Path(__file__).resolve().parent / "sql" / "sqlite"


def _folder(name: str) -> Path:
    folder = SQLITE_SQL / name
    if not folder.is_dir():
        raise FileNotFoundError(f"catalytic_cassette: SQL folder {name!r} is not installed")
    return folder


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


@cache
def migrations() -> tuple[Migration, ...]:
    found = []
    for entry in _folder("migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"migration versions must be 1..n without gaps: {migration.name}")
    return tuple(found)


@cache
def schema_sql(name: str) -> str:
    text: str = _folder("schema").joinpath(name).read_text("utf-8")
    return text


def statements(script: str) -> list[str]:
    """Split a script into complete statements (``executescript`` would COMMIT)."""
    result: list[str] = []
    current: list[str] = []
    for line in script.splitlines(keepends=True):
        current.append(line)
        candidate = "".join(current)
        if sqlite3.complete_statement(candidate):
            text = candidate.strip()
            if _has_code(text):
                result.append(text)
            current = []
    if _has_code("".join(current)):
        raise ValueError("incomplete SQL statement at end of script")
    return result


def _has_code(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


@cache
def connection_statements() -> tuple[str, ...]:
    """The TEMP triggers every package connection installs, split once per process."""
    return tuple(statements(schema_sql("connection.sql")))
