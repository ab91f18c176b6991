"""Find and split the SQLite ledger's SQL files, shipped inside the package.

One folder per backend: ``catalytic_cassette/sql/sqlite/`` (``schema/``, ``migrations/``)
here, ``catalytic_cassette/sql/postgresql/`` for PostgreSQL (``postgresql/sqlfiles.py``).
Plain paths (not importlib.resources): the wheel installs them as files, and startup stays
fast.

``schema/NN_<concern>.sql`` is the law, one file per concern. Each file holds the objects
the ledger file keeps, then, after the line ``TEMP_SECTION``, the TEMP triggers every package
connection installs for that concern (they call the package's SQL functions, so they cannot
live in the file). ``migrations/0001_baseline.sql`` is made from the files' first parts
(``python -m catalytic_cassette.migrate baseline``); later migrations go beside it.
"""

from __future__ import annotations

import os
import re
import sqlite3
from functools import cache
from typing import NamedTuple

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_SCHEMA_NAME = re.compile(r"^\d{2}_[a-z0-9_]+\.sql$")

# The line of a schema file after which its TEMP (per-connection) triggers stand.
TEMP_SECTION = "-- ==== TEMP: installed on every package connection, not kept in the file ===="


# (os.path, not pathlib: every ledger open reads here, and pathlib costs its import)
SQLITE_SQL = os.path.join(os.path.dirname(os.path.realpath(__file__)), "sql", "sqlite")


def _folder(name: str) -> str:
    folder = os.path.join(SQLITE_SQL, name)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"catalytic_cassette: SQL folder {name!r} is not installed")
    return folder


class Migration:
    """One migration: its version, its name and its SQL, read from its file when first
    asked for (to migrate, or to compare its digest with a ledger's row)."""

    __slots__ = ("_path", "_sql", "name", "version")

    def __init__(self, version: int, name: str, sql: str | None = None, *, path: str = "") -> None:
        self.version = version
        self.name = name
        self._sql = sql
        self._path = path

    @property
    def sql(self) -> str:
        if self._sql is None:
            self._sql = _read(*os.path.split(self._path))
        return self._sql

    def __repr__(self) -> str:
        return f"Migration({self.version}, {self.name!r})"


@cache
def migrations() -> tuple[Migration, ...]:
    found = []
    folder = _folder("migrations")
    for name in os.listdir(folder):
        match = _MIGRATION_NAME.match(name)
        if match:
            path = os.path.join(folder, name)
            found.append(Migration(int(match.group(1)), match.group(2), path=path))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"migration versions must be 1..n without gaps: {migration.name}")
    return tuple(found)


class SchemaFile(NamedTuple):
    name: str
    kept: str  # the objects the ledger file keeps: what the baseline migration is made of
    temp: str  # the TEMP triggers a package connection installs


@cache
def schema_files() -> tuple[SchemaFile, ...]:
    """The concern files of schema/, in the order of their numbers."""
    folder = _folder("schema")
    found = []
    for name in sorted(n for n in os.listdir(folder) if _SCHEMA_NAME.match(n)):
        kept, marker, temp = _read(folder, name).partition(TEMP_SECTION + "\n")
        found.append(SchemaFile(name, kept, temp if marker else ""))
    return tuple(found)


def connection_sql() -> str:
    """Every concern's TEMP section, in the order of the files."""
    return "".join(schema.temp for schema in schema_files())


def _read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name), encoding="utf-8") as handle:
        return handle.read()


def statements(script: str) -> list[str]:
    """Split a script into complete statements (``executescript`` would COMMIT)."""
    result: list[str] = []
    current: list[str] = []
    for line in script.splitlines(keepends=True):
        current.append(line)
        # A statement can only end on a line holding its ";" (or closing a comment after
        # it): the other lines are not checked, which makes splitting linear, not square.
        if ";" not in line and "*/" not in line:
            continue
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
    return tuple(statements(connection_sql()))
