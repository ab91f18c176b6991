"""Schema migrations: each one and its bookkeeping commit together, or nothing does."""

from __future__ import annotations

import sqlite3

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
    """0 for an empty file; refuses a file that is not a cassette."""
    app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    if app_id == APPLICATION_ID:
        row = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()
        return int(row[0] or 0)
    has_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app_id == 0 and not has_tables:
        return 0
    raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the database is not a catalytic-cassette ledger")


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


def reference_objects(version: int | None = None) -> list[tuple[str, str, str, str | None]]:
    """(type, name, tbl_name, sql) of every schema object the first ``version`` migrations
    create (all of them by default), SQLite's own included, in the order SQLite stores them.

    Built in a private in-memory database with the package's functions registered, so it
    is what an honest migration produced, whatever a file claims.
    """
    from .clock import SystemClock
    from .connection import register_functions

    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        memory.execute("PRAGMA recursive_triggers = ON")
        register_functions(memory, SystemClock())
        for migration in sqlfiles.migrations()[:version]:
            for statement in sqlfiles.statements(migration.sql):
                memory.execute(statement)
        rows = memory.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid")
        return [(str(a), str(b), str(c), None if d is None else str(d)) for a, b, c, d in rows]
    finally:
        memory.close()


SCHEMA_FILE_HEADER = """\
-- The current full schema of a cassette ledger: every migration applied, as SQLite
-- stores it. Generated, never edited:
--   python -m catalytic_cassette.migrate > catalytic_cassette/sql/sqlite/schema/cassette.sql
-- (tests/test_migrations.py fails when it differs from what the migrations create).
-- migrations/ beside it is the authority and carries the comments that explain each rule.
"""


def full_schema_sql() -> str:
    """The text of sql/sqlite/schema/cassette.sql: the SQL of every object the migrations
    create."""
    statements = [sql + ";" for _, _, _, sql in reference_objects() if sql is not None]
    return SCHEMA_FILE_HEADER + "\n" + "\n\n".join(statements) + "\n"


def pending_versions(path: str) -> list[int]:
    """Versions a file still needs, read without changing it; all of them for a new file."""
    import os

    from .connection import connect_readonly

    if path == ":memory:" or not os.path.exists(path):
        return [m.version for m in sqlfiles.migrations()]
    conn = connect_readonly(path)
    try:
        version = schema_version(conn)
    finally:
        conn.close()
    latest = current_version()
    if version > latest:
        raise CassetteError(
            ErrorCode.SCHEMA_TOO_NEW,
            f"schema version {version} is newer than this package ({latest})",
        )
    return list(range(version + 1, latest + 1))


if __name__ == "__main__":
    import sys

    sys.stdout.write(full_schema_sql())
