"""One ledger of either backend, opened the way the API tests open it: for the tests
that hold the SQLite and the PostgreSQL ledger to the same behaviour.

A test asks for the ``backend`` fixture (tests/conftest.py) and is marked
``both_backends`` (or its module is): it then runs once on a SQLite file and once on a
fresh PostgreSQL ledger. The ``cassette``, ``clock`` and ``db_path`` fixtures follow the
backend, so a test written against them adopts both with its marker alone.

Time: SQLite ledgers are written with a ``ManualClock``; a PostgreSQL ledger keeps the
server's time and takes no client clock, so its ``clock`` is a ``ServerClock`` whose
``advance`` moves the server's offset (``cassette_advance_clock``, the owner's only say
over time). Either way ``advance(ms)`` makes at least ``ms`` pass on the ledger's clock
and ``now_ms()`` reads it; a PostgreSQL ledger's time also moves by itself, so a test
that needs an exact timestamp compares against ``now_ms()`` with a margin, or is SQLite's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.clock import SystemClock
from catalytic_cassette.errors import translate as translate_sqlite

if TYPE_CHECKING:
    from catalytic_cassette.proofs import ProofSource

BACKENDS = ("sqlite", "postgresql")
POSTGRESQL_SCHEMES = ("postgresql://", "postgres://")


def is_postgresql(target: object) -> bool:
    """Whether a ledger target (a path or a URL) names a PostgreSQL ledger."""
    return str(target).startswith(POSTGRESQL_SCHEMES)


def _pg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def pg_sql(statement: str) -> str:
    """A statement written with SQLite's ``?`` placeholders, in psycopg's ``%s``."""
    return statement.replace("%", "%%").replace("?", "%s")


class ServerClock(SystemClock):
    """The time of a PostgreSQL ledger, as tests drive it: ``advance`` moves the server's
    offset as the owner. A ``SystemClock`` because the PostgreSQL ledger takes no other
    (it ignores it and keeps the server's time), so ``MessageCassette(url, clock=clock)``
    opens on both backends."""

    def __init__(self, url: str) -> None:
        self.url = url

    def now_ms(self) -> int:
        with _pg_connect(self.url) as conn:
            row = conn.execute(
                "SELECT greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))"
                "::bigint + clock_offset_ms) FROM cassette_head"
            ).fetchone()
        return int(row[0])

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("a clock never goes back")
        with _pg_connect(self.url) as conn:
            conn.execute("SELECT cassette_advance_clock(%s)", (ms,))
        return self.now_ms()


@dataclass
class Ledger:
    kind: str
    target: str  # a file path or a postgresql:// URL
    clock: ManualClock | ServerClock = field(default_factory=ManualClock)

    def __post_init__(self) -> None:
        if self.kind == "postgresql" and not isinstance(self.clock, ServerClock):
            self.clock = ServerClock(self.target)

    @property
    def postgresql(self) -> bool:
        return self.kind == "postgresql"

    def open(self, **options: Any) -> MessageCassette:
        if self.kind == "sqlite":
            options.setdefault("clock", self.clock)
        return MessageCassette(self.target, **options)

    def advance(self, ms: int) -> None:
        """Move the ledger's time forward by ``ms``: the test clock, or the server's
        offset (which only the database owner may move)."""
        self.clock.advance(ms)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    # ------------------------------------------------------------- raw access

    def rows(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """A read with ``?`` placeholders, through a raw connection (the owner's on
        PostgreSQL): what the test sees, not what the package's connection sees."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.target)
            try:
                return [tuple(row) for row in conn.execute(statement, params)]
            finally:
                conn.close()
        with _pg_connect(self.target) as pg:
            return [tuple(row) for row in pg.execute(pg_sql(statement), params)]

    def scalar(self, statement: str, *params: Any) -> Any:
        return self.rows(statement, *params)[0][0]

    def count(self, table: str, where: str = "1 = 1", *params: Any) -> int:
        return int(self.scalar(f"SELECT count(*) FROM {table} WHERE {where}", *params))

    def raw_sql(self, statement: str, *params: Any) -> ErrorCode | None:
        """Run one statement as an attacker with a shell would: sqlite3 with default
        settings (none of the package's functions), or psql as the database owner (every
        table privilege; only the triggers in the way). Committed when it succeeds;
        returns None then, else the code the package would report for the refusal."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.target, isolation_level=None)
            try:
                conn.execute(statement, params)
            except sqlite3.Error as exc:
                return translate_sqlite(exc).code
            finally:
                conn.close()
            return None
        import psycopg

        from catalytic_cassette.postgresql.connection import translate

        with _pg_connect(self.target) as pg:
            try:
                pg.execute(pg_sql(statement) if params else statement, params or None)
            except psycopg.Error as exc:
                return translate(exc).code
        return None

    def journal(self) -> list[tuple[int, str, bytes, bytes]]:
        """Every entry: (seq, body, leaf_hash, chain_hash), in order."""
        query = "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal ORDER BY seq"
        return [(s, b, bytes(lh), bytes(ch)) for s, b, lh, ch in self.rows(query)]

    def leaves(self) -> list[bytes]:
        """Every entry's stored leaf hash, in order."""
        return [leaf for _, _, leaf, _ in self.journal()]

    def ledger_id(self) -> str:
        return str(self.scalar("SELECT value FROM cassette_meta WHERE key = 'ledger_id'"))

    def dump(self) -> list[str]:
        """Every schema object and row of the ledger as text, to show nothing changed."""
        return dump(self.target)


def dump(target: str | Path) -> list[str]:
    """Every schema object and row of a ledger of either backend, as text: SQLite's
    ``iterdump``; on PostgreSQL every row of every table of the schema (as JSON, sorted)
    and every trigger with whether it is enabled."""
    if not is_postgresql(target):
        conn = sqlite3.connect(target)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()
    with _pg_connect(str(target)) as pg:
        tables = [
            name
            for (name,) in pg.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " ORDER BY tablename"
            )
        ]
        lines = [
            f"TRIGGER {table}.{name} {enabled}"
            for table, name, enabled in pg.execute(
                "SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger"
                " WHERE NOT tgisinternal ORDER BY 1, 2"
            )
        ]
        for table in tables:
            # The head's clock (its time, the transaction that took it, the owner's offset)
            # is the ledger's time, which SQLite keeps in no row; a call that writes
            # nothing still takes it (an idempotent post, a requeue with nothing due).
            clock = " - 'time_ms' - 'tx' - 'clock_offset_ms'" if table == "cassette_head" else ""
            rows = pg.execute(f'SELECT (to_jsonb(t){clock})::text FROM "{table}" AS t').fetchall()
            lines.extend(sorted(f"{table} {text}" for (text,) in rows))
        return lines


@contextmanager
def proof_source(target: str | Path) -> Iterator[ProofSource]:
    """What proofs of the ledger at ``target`` are built from, read-only, opened as
    ``cassette prove`` opens it: SQLite's stored tree, or PostgreSQL's tree rebuilt from
    the journal's bodies."""
    if is_postgresql(target):
        from catalytic_cassette.postgresql import connection
        from catalytic_cassette.postgresql.anchors import PgProofSource

        pg = connection.connect_reader(str(target))
        try:
            yield PgProofSource(pg)
        finally:
            pg.close()
        return
    from catalytic_cassette.connection import connect_reader
    from catalytic_cassette.proofs import SqliteProofSource

    conn = connect_reader(str(target))
    try:
        yield SqliteProofSource(conn)
    finally:
        conn.close()


def sql_literal(text: str) -> str:
    """``text`` as a string literal both SQLite and PostgreSQL read back unchanged."""
    return "'" + text.replace("'", "''") + "'"


def refusal_code(call: Any, *args: Any, **kwargs: Any) -> ErrorCode:
    """The code a package call is refused with (it must be refused)."""
    try:
        call(*args, **kwargs)
    except CassetteError as error:
        return error.code
    raise AssertionError(f"{call} was not refused")


def sqlite_ledger(tmp_path: Path) -> Ledger:
    return Ledger("sqlite", str(tmp_path / "ledger.db"))


def _database_errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the test extra installs it
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


# What a refusal by the database keeps as its cause, on either backend.
DATABASE_ERRORS = _database_errors()


def rows(target: str | Path, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """A read with ``?`` placeholders on the ledger at ``target`` (a raw connection)."""
    kind = "postgresql" if is_postgresql(target) else "sqlite"
    return Ledger(kind, str(target)).rows(statement, *params)


def package_idle(cassette: MessageCassette) -> bool:
    """Whether the package's connection holds no open transaction (after a refusal)."""
    pg = getattr(cassette, "pg", None)
    if pg is not None:
        from psycopg.pq import TransactionStatus

        return bool(pg.info.transaction_status == TransactionStatus.IDLE)
    return not cassette.conn.in_transaction


def raw_script(target: str | Path, *statements: str) -> bool:
    """Run ``statements`` in one transaction as ``Ledger.raw_sql``'s attacker; True when
    every one was taken (and committed), False when one was refused (nothing kept)."""
    if not is_postgresql(target):
        conn = sqlite3.connect(target, isolation_level=None)
        try:
            conn.execute("BEGIN")
            for statement in statements:
                conn.execute(statement)
            conn.execute("COMMIT")
        except sqlite3.Error:
            return False
        finally:
            conn.close()
        return True
    import psycopg

    with _pg_connect(str(target)) as pg:
        try:
            with pg.transaction():
                for statement in statements:
                    pg.execute(statement)
        except psycopg.Error:
            return False
    return True


def exists(target: str | Path) -> bool:
    """Whether a ledger has been made at ``target`` (a file; a migrated database)."""
    if not is_postgresql(target):
        return Path(target).exists()
    (made,) = rows(target, "SELECT to_regclass('cassette_migrations') IS NOT NULL")[0]
    return bool(made)


def schema_version(target: str | Path) -> int:
    """The schema version this package writes on the backend of ``target``."""
    if is_postgresql(target):
        from catalytic_cassette.postgresql import sqlfiles

        return len(sqlfiles.migrations())
    from catalytic_cassette.migrate import current_version

    return current_version()


def past_the_temp_check(conn: Any) -> None:
    """A hostile client on a package connection: it controls its own process, so it skips
    the package's check of the connection's TEMP schema (LAW.md section 9) by recording
    its own TEMP objects as the package's. What it then leaves behind is verify's to find."""
    from catalytic_cassette.temp_objects import TempSchema

    conn.temp_schema = TempSchema(conn)
