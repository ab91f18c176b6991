"""Schema migrations: each one and its bookkeeping commit together, or nothing does."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import cache

from . import sqlfiles
from .errors import CassetteError, ErrorCode
from .hashing import sha256

APPLICATION_ID = 0x43535454  # "CSTT": marks a file as a catalytic-cassette ledger


FORMAT = "catalytic-cassette"


def migration_digest(sql: str) -> str:
    return sha256(sql.encode("utf-8")).hexdigest()


def current_version() -> int:
    return len(sqlfiles.migrations())


def schema_version(conn: sqlite3.Connection) -> int:
    """0 for an empty file; refuses a file that is not a cassette, and one made by a
    development build before the baseline (``refuse_unreleased``)."""
    app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    if app_id == APPLICATION_ID:
        recorded = conn.execute(
            "SELECT version, name, sha256 FROM cassette_migrations ORDER BY version"
        ).fetchall()
        refuse_unreleased(recorded)
        return int(recorded[-1][0]) if recorded else 0
    has_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app_id == 0 and not has_tables:
        return 0
    raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the database is not a catalytic-cassette ledger")


@cache
def shipped_migrations() -> tuple[tuple[int, str, str], ...]:
    """(version, name, sha256) of every migration this package ships, as a ledger records them."""
    return tuple((m.version, m.name, migration_digest(m.sql)) for m in sqlfiles.migrations())


def refuse_unreleased(recorded: Sequence[Sequence[object]]) -> None:
    """SCHEMA_UNRELEASED unless the recorded migrations the package knows are the ones it
    ships. Nothing was released before the baseline: a file whose rows name another first
    migration, or another text of one, was made by a development build, and no path leads
    from it to this schema. Versions beyond the package's are left to SCHEMA_TOO_NEW."""
    shipped = shipped_migrations()
    known = [tuple(row) for row in recorded if int(str(row[0])) <= len(shipped)]
    if tuple(known) != shipped[: len(known)]:
        raise CassetteError(
            ErrorCode.SCHEMA_UNRELEASED,
            "the ledger was made by a development build before the 0.1.0 baseline migration;"
            " it cannot be opened, migrated or verified by this package",
        )


def apply_pending(conn: sqlite3.Connection) -> list[int]:
    """Apply every pending migration in one IMMEDIATE transaction; return the versions."""
    applied: list[int] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)  # re-read under the write lock
        for migration in sqlfiles.migrations()[version:]:
            for statement in sqlfiles.statements(migration.sql):
                conn.execute(statement)
            digest = migration_digest(migration.sql)
            conn.execute(
                "INSERT INTO cassette_migrations (version, name, sha256) VALUES (?, ?, ?)",
                (migration.version, migration.name, digest),
            )
            if migration.version == 1:
                conn.execute(
                    "INSERT INTO cassette_meta (key, value) VALUES ('format', ?)", (FORMAT,)
                )
            applied.append(migration.version)
        if applied:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {applied[-1]}")
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, CassetteError):
            raise
        if isinstance(exc, sqlite3.Error):
            raise CassetteError(
                ErrorCode.MIGRATION_FAILED, f"migration failed, nothing was changed: {exc}"
            ) from exc
        raise
    return applied


SchemaObject = tuple[str, str, str, "str | None"]


def reference_objects(version: int | None = None) -> list[SchemaObject]:
    """(type, name, tbl_name, sql) of every schema object the first ``version`` migrations
    create (all of them by default), SQLite's own included, in the order SQLite stores them.

    Built in a private in-memory database with the package's functions registered, so it
    is what an honest migration produced, whatever a file claims.
    """
    return objects_made_by([m.sql for m in sqlfiles.migrations()[:version]])


def schema_objects() -> list[SchemaObject]:
    """The same rows, made from the concern files of schema/ (the law as written)."""
    return objects_made_by([schema.kept for schema in sqlfiles.schema_files()])


def objects_made_by(scripts: Sequence[str]) -> list[SchemaObject]:
    """sqlite_master, in rowid order, of a private in-memory database after ``scripts``."""
    # No SQL function of the package is registered: creating a trigger does not resolve the
    # functions its body calls, and the kept schema calls none (the TEMP triggers do).
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        memory.execute("PRAGMA recursive_triggers = ON")
        for script in scripts:
            for statement in sqlfiles.statements(script):
                memory.execute(statement)
        rows = memory.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid")
        return [(str(a), str(b), str(c), None if d is None else str(d)) for a, b, c, d in rows]
    finally:
        memory.close()


BASELINE_NAME = "0001_baseline.sql"

BASELINE_HEADER = """\
-- Migration 0001, the baseline of release 0.1.0: every object a ledger file keeps.
-- Generated from the concern files of schema/, never edited:
--   python -m catalytic_cassette.migrate baseline
-- (tests/test_schema_files.py fails when it differs from them). schema/ is the authority
-- and carries the reasons; a later migration changes a ledger from the baseline on, and
-- the concern files change with it.
"""


def baseline_sql() -> str:
    """The text of migrations/0001_baseline.sql: the kept part of every concern file."""
    parts = [
        f"\n-- {'-' * 20} schema/{s.name}\n\n{s.kept.strip()}\n" for s in sqlfiles.schema_files()
    ]
    return BASELINE_HEADER + "".join(parts)


def write_baseline() -> str:
    """Write migrations/0001_baseline.sql from the concern files; return its path."""
    import os

    path = os.path.join(sqlfiles.SQLITE_SQL, "migrations", BASELINE_NAME)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(baseline_sql())
    return path


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["baseline"]:
        sys.exit("usage: python -m catalytic_cassette.migrate baseline")
    print(write_baseline())
