"""Find and split the SQLite ledger's SQL files, shipped inside the package.

One folder per backend: ``catalytic_cassette/sql/sqlite/`` (``migrations/``, ``schema/``)
here, ``catalytic_cassette/sql/postgresql/`` for PostgreSQL (``postgresql/sqlfiles.py``).
Plain paths (not importlib.resources): the wheel installs them as files, and startup stays
fast.
"""

from __future__ import annotations

import os
import re
import sqlite3
from functools import cache

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


# (os.path, not pathlib: every ledger open reads here, and pathlib costs its import)
SQLITE_SQL = os.path.join(os.path.dirname(os.path.realpath(__file__)), "sql", "sqlite")


def _folder(name: str) -> str:
    folder = os.path.join(SQLITE_SQL, name)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"catalytic_cassette: SQL folder {name!r} is not installed")
    return folder


class Migration:
    """One migration: its version, its name and its SQL, read from its file when first
    asked for (opening a ledger counts the migrations at each open and reads none of the
    264 KB unless it migrates: 0.4 ms per command)."""

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


@cache
def schema_sql(name: str) -> str:
    return _read(_folder("schema"), name)


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
    return tuple(statements(schema_sql("connection.sql")))
