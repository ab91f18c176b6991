"""Open a PostgreSQL ledger: settings, migrations, one transaction per call, and the one
place where psycopg errors become CassetteError."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import CassetteError, ErrorCode, code_of
from ..redaction import SECRET_KEYWORDS, redact
from . import sqlfiles

if TYPE_CHECKING:
    from ..reasoning import Fetch

try:  # psycopg is an optional dependency: only a PostgreSQL URL needs it
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra installed
    psycopg = None  # type: ignore[assignment]

MIN_SERVER_VERSION = 150000
# One key for every migration of every ledger: two hosts opening a new ledger at once
# take turns, and the second finds it current.
_MIGRATION_LOCK = 0x636173736574  # "casset"
_SYNCHRONOUS_COMMIT = {"full": "on", "normal": "off"}
_QUOTED = re.compile(r'"[^"]*"')


def translate(exc: Exception) -> CassetteError:
    """Map a psycopg error to a CassetteError; call as ``raise translate(e) from e``."""
    if isinstance(exc, UnicodeEncodeError):
        # text that is no UTF-8 (a lone surrogate) fails while psycopg encodes a parameter,
        # before anything is sent: bad input, as SQLite's connection reports it
        return CassetteError(ErrorCode.INVALID_ARGUMENT, f"text that is not UTF-8: {exc.reason}")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return CassetteError(ErrorCode.DATABASE_ERROR, str(exc))
    diag = exc.diag
    text = diag.message_primary or str(exc)
    state = exc.sqlstate or ""
    if state == "P0001":
        coded = code_of(text)
        if coded is not None:
            error = CassetteError(*coded)
            if coded[0] is ErrorCode.IDEMPOTENCY_CONFLICT and (diag.message_detail or "").isdigit():
                error.detail["message_id"] = int(diag.message_detail or "0")
            return error
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return CassetteError(ErrorCode.PERMISSION_DENIED, text)
    if state.startswith("40") or state == "55P03":  # serialization, deadlock, lock timeout
        return CassetteError(ErrorCode.BUSY, f"the ledger is busy ({text})")
    if state.startswith("23"):
        return CassetteError(ErrorCode.CONSTRAINT_VIOLATION, text)
    if state.startswith("22") or isinstance(exc, psycopg.DataError):
        # a value the server cannot take: NUL in text (refused by psycopg before it is
        # sent, with no SQLSTATE), a number out of range, bytes that are not UTF-8
        return CassetteError(ErrorCode.INVALID_ARGUMENT, text)
    if isinstance(exc, psycopg.OperationalError) or state.startswith("08"):
        return CassetteError(ErrorCode.CANNOT_OPEN, text)
    return CassetteError(ErrorCode.DATABASE_ERROR, text)


def _require_psycopg() -> None:
    if psycopg is None:  # pragma: no cover - exercised only without the extra installed
        raise CassetteError(
            ErrorCode.CANNOT_OPEN,
            "a PostgreSQL ledger needs psycopg: pip install 'catalytic-cassette[postgresql]'",
        )


def open_connection(
    url: str, *, autocommit: bool = True, application_name: str = "catalytic-cassette"
) -> psycopg.Connection[Any]:
    """A connection to ``url``; a URL that does not parse or a server that cannot be
    reached is CANNOT_OPEN. The one place the package connects: what libpq answers is
    shown without the URL's secrets (``redaction``), and the psycopg error is not chained
    to the refusal, so no traceback or ``__cause__`` carries it either."""
    _require_psycopg()
    try:
        return psycopg.connect(url, autocommit=autocommit, application_name=application_name)
    except psycopg.Error as exc:
        problem = _connect_problem(url, exc)
    raise CassetteError(ErrorCode.CANNOT_OPEN, f"cannot connect to {redact(url)}: {problem}")


def _connect_problem(url: str, exc: psycopg.Error) -> str:
    """What libpq said, safe to show. A connection string it could not parse is echoed
    in fragments (a password's tail after a space, a bad percent-escape inside one):
    those messages lose every quoted part. Otherwise the text is redacted, the URL's own
    secret values included."""
    text = str(exc).strip()
    if isinstance(exc, psycopg.ProgrammingError):
        return _QUOTED.sub('"..."', text)
    try:
        from psycopg.conninfo import conninfo_to_dict

        parsed = conninfo_to_dict(url)
    except psycopg.Error:
        parsed = {}
    return redact(text, [str(v) for k, v in parsed.items() if k in SECRET_KEYWORDS])


def connect(
    url: str, *, durability: str, busy_timeout_ms: int, read_only: bool = False
) -> psycopg.Connection[Any]:
    """An autocommit connection (every write opens its own transaction), migrated to the
    package's schema unless ``read_only``."""
    return open_ledger(
        url, durability=durability, busy_timeout_ms=busy_timeout_ms, read_only=read_only
    )[0]


def open_ledger(
    url: str, *, durability: str, busy_timeout_ms: int, read_only: bool = False
) -> tuple[psycopg.Connection[Any], bool]:
    """``connect``, and whether this open made the ledger (the database held none)."""
    conn = open_connection(url)
    created = False
    try:
        _check_server(conn)
        conn.execute(
            sqlfiles.query("session_settings"),
            {
                "synchronous_commit": _SYNCHRONOUS_COMMIT[durability],
                "lock_timeout": f"{int(busy_timeout_ms)}ms",
            },
        )
        if read_only:
            _require_current(conn)
            conn.execute(sqlfiles.query("read_only_session"))
        else:  # (a reader may read in any session: a verify reports what it sees)
            check_session(conn)
            created = applied_version(conn) is None
            migrate(conn)
    except psycopg.Error as exc:
        conn.close()
        raise translate(exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn, created


def _check_server(conn: psycopg.Connection[Any]) -> None:
    if conn.info.server_version < MIN_SERVER_VERSION:
        raise CassetteError(
            ErrorCode.CANNOT_OPEN, "a PostgreSQL ledger needs PostgreSQL 15 or later"
        )
    encoding = conn.execute(sqlfiles.query("server_encoding")).fetchone()
    if encoding is None or encoding[0] != "UTF8":
        # the journal hashes the UTF-8 bytes of each body: another encoding cannot hold them
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "a PostgreSQL ledger's database is UTF8")


def check_session(conn: psycopg.Connection[Any]) -> None:
    """Refuse a writing session in which the ledger's triggers would not fire: with
    ``session_replication_role`` ``replica`` no ordinary trigger fires (no rule, no
    journal), and with ``local`` neither do the replica-only ones (UNSAFE_SESSION). Read
    when the connection opens, so it catches the setting from wherever it came: the
    server's configuration, ``ALTER DATABASE`` / ``ALTER ROLE ... SET``, the URL's or
    PGOPTIONS' ``options``. Only a superuser, or a role granted SET on the parameter, can
    set it at all (LAW.md 14)."""
    row = conn.execute(sqlfiles.query("session_replication_role")).fetchone()
    setting = str(row[0]) if row else ""
    if setting != "origin":
        raise CassetteError(
            ErrorCode.UNSAFE_SESSION,
            f"the session's session_replication_role is {setting!r}, not 'origin': the"
            " ledger's triggers would not fire; remove the setting (ALTER ROLE / ALTER"
            " DATABASE ... RESET session_replication_role, or the connection's options)",
        )


def applied_version(conn: psycopg.Connection[Any]) -> int | None:
    """The schema version of the ledger, or None when the database holds no ledger."""
    exists = conn.execute(sqlfiles.query("has_migrations_table")).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(sqlfiles.query("applied_version")).fetchone()
    if row is None:
        return 0
    require_released([(1, row[1])] if row[1] is not None else [])
    return int(row[0])


def require_released(recorded: list[tuple[int, str]]) -> None:
    """Refuse a ledger made by a development build before the baseline migration
    (SCHEMA_UNRELEASED): its recorded migrations are not the baseline's, and none of
    them was released, so no path leads from it to this schema. Nothing is changed."""
    shipped = {migration.version: migration.name for migration in sqlfiles.migrations()}
    if any(shipped.get(version, name) != name for version, name in recorded):
        raise CassetteError(
            ErrorCode.SCHEMA_UNRELEASED,
            "this ledger was made by a development build before the 0.1.0 baseline"
            " migration; it cannot be opened, migrated or verified by this package",
        )


def _require_current(conn: psycopg.Connection[Any]) -> None:
    version = applied_version(conn)
    latest = len(sqlfiles.migrations())
    if version is None:
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the database holds no ledger")
    if version > latest:
        raise CassetteError(ErrorCode.SCHEMA_TOO_NEW, f"schema {version} is newer than {latest}")
    if version < latest:
        raise CassetteError(ErrorCode.SCHEMA_OUTDATED, f"schema {version} is older than {latest}")


def pending_versions(url: str) -> list[int]:
    """Versions the ledger at ``url`` still needs, read without changing it; all of them
    for a database that holds no ledger yet."""
    with open_connection(url) as conn:
        try:
            version = applied_version(conn) or 0
        except psycopg.Error as exc:
            raise translate(exc) from exc
    latest = len(sqlfiles.migrations())
    if version > latest:
        raise CassetteError(ErrorCode.SCHEMA_TOO_NEW, f"schema {version} is newer than {latest}")
    return list(range(version + 1, latest + 1))


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Apply the pending migrations, all in one transaction with the version rows they
    write, as the database's owner; return the version reached. A failure anywhere
    leaves the database as it was: PostgreSQL's DDL, grants and CREATE ROLE are
    transactional, and no migration sends a statement that is not (CREATE DATABASE,
    CREATE INDEX CONCURRENTLY, VACUUM). Before anything is written, the owner's powers
    are checked (``_become_owner``: PERMISSION_DENIED). A database holding tables but no
    ledger is refused (NOT_A_CASSETTE), as is a newer schema (SCHEMA_TOO_NEW)."""
    latest = len(sqlfiles.migrations())
    if applied_version(conn) == latest:
        return latest
    with conn.transaction():
        conn.execute(sqlfiles.query("migration_lock"), {"key": _MIGRATION_LOCK})
        version = applied_version(conn)  # (again, under the lock: another host may have)
        if version is not None and version > latest:
            raise CassetteError(
                ErrorCode.SCHEMA_TOO_NEW, f"schema {version} is newer than {latest}"
            )
        if version == latest:
            return latest
        if version is None:
            others = conn.execute(sqlfiles.query("tables_in_public")).fetchone()
            if others and others[0]:
                raise CassetteError(
                    ErrorCode.NOT_A_CASSETTE, "the database holds tables but no ledger"
                )
        _become_owner(conn, version or 0)
        if version is None:
            conn.execute(sqlfiles.query("create_migrations_table"))
            conn.execute(sqlfiles.query("revoke_migrations_table"))
        for migration in sqlfiles.migrations()[version or 0 :]:
            try:
                conn.execute(migration.sql.encode("utf-8"))
            except psycopg.Error as exc:
                raise CassetteError(
                    ErrorCode.MIGRATION_FAILED,
                    f"migration {migration.version} ({migration.name}) failed: {exc}",
                ) from exc
            conn.execute(
                sqlfiles.query("record_migration"),
                {"version": migration.version, "name": migration.name},
            )
    return latest


# The first migration that creates roles (the baseline: schema/70_roles.sql): from an
# earlier version the owner needs CREATEROLE.
_ROLES_MIGRATION = 1


def _become_owner(conn: psycopg.Connection[Any], version: int) -> None:
    """Act as the database's owner for the rest of the migrations' transaction, after
    checking it has every power they use; PERMISSION_DENIED, with nothing written,
    otherwise. The ledger's objects are then the owner's whoever migrates (a superuser,
    or a member of the owner's role), which verify requires (LAW.md 10b)."""
    row = conn.execute(sqlfiles.query("migration_owner")).fetchone()
    assert row is not None
    owner, superuser, create_role, may_become, creates_in_public, schema_owner = row
    if not may_become:
        raise CassetteError(
            ErrorCode.PERMISSION_DENIED,
            f"a ledger is made by its database's owner ({owner}): migrate as that role,"
            " or as a member of it or a superuser",
        )
    if version < _ROLES_MIGRATION and not (superuser or create_role):
        raise CassetteError(
            ErrorCode.PERMISSION_DENIED,
            f"the database's owner ({owner}) needs CREATEROLE: the migrations create the"
            " roles cassette_worker, cassette_appender and cassette_auditor",
        )
    if not creates_in_public:
        raise CassetteError(
            ErrorCode.PERMISSION_DENIED,
            f"the database's owner ({owner}) may not create objects in schema public",
        )
    if schema_owner not in (owner, "pg_database_owner"):
        raise CassetteError(
            ErrorCode.PERMISSION_DENIED,
            f"schema public is owned by {schema_owner}, not by the database's owner ({owner})",
        )
    conn.execute(sqlfiles.query("become_owner"))


def statement(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """One statement as its own transaction (autocommit: the server commits when it ends),
    its rows; errors leave as CassetteError. A write that is one statement needs no
    BEGIN and COMMIT round trips, so the head's lock is not held across the network."""
    try:
        return conn.execute(sql, params).fetchall()
    except (psycopg.Error, UnicodeEncodeError) as exc:
        raise translate(exc) from exc


def connect_reader(url: str) -> psycopg.Connection[Any]:
    """A read-only connection to an existing, current ledger (never migrated or written:
    NOT_A_CASSETTE, SCHEMA_OUTDATED otherwise), with the package's default busy timeout."""
    from ..connection import DEFAULT_BUSY_TIMEOUT_MS

    return connect(url, durability="full", busy_timeout_ms=DEFAULT_BUSY_TIMEOUT_MS, read_only=True)


def batch(
    conn: psycopg.Connection[Any],
    sql: str,
    items: list[dict[str, Any]],
    *,
    index_one: bool = False,
) -> list[tuple[Any, ...]]:
    """One statement per item in the caller's transaction, pipelined (all sent before the
    first answer is read: one round trip per batch instead of one per item, the head held
    that much shorter); the first row of each. A refusal is a CassetteError naming the
    refused item (``detail["index"]``, when there are several or ``index_one``): the items
    before it have answers, those after it were never run (the server skips them), and the
    caller's transaction rolls back."""
    cursors: list[psycopg.Cursor[Any]] = []
    try:
        with conn.pipeline():
            for params in items:
                cursors.append(conn.execute(sql, params))
    except psycopg.Error as exc:
        error = translate(exc)
        if len(items) > 1 or index_one:
            error.detail["index"] = next(
                (i for i, cur in enumerate(cursors) if not _answered(cur)), len(cursors)
            )
        raise error from exc
    rows = []
    for cur in cursors:
        row = cur.fetchone()
        assert row is not None
        rows.append(tuple(row))
    return rows


def _answered(cur: psycopg.Cursor[Any]) -> bool:
    from psycopg import pq

    return cur.pgresult is not None and cur.pgresult.status == pq.ExecStatus.TUPLES_OK


@contextmanager
def snapshot(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """Several reads in one snapshot: a REPEATABLE READ READ ONLY transaction, or the
    transaction already under way (a caller's snapshot, which nested reads share). All it
    sees is durable before the block begins (``wait_durable``)."""
    if conn.info.transaction_status.name != "IDLE":
        yield conn
        return
    with transaction(conn):
        conn.execute(sqlfiles.query("read_only_snapshot"))
        flush_at_commit(conn)  # (the first query: takes the snapshot)
        yield conn


# ------------------------------------------------------------------ committing early
# At durability full a write commits early: its transaction ends (and frees the chain's
# head) once its commit record is in the WAL buffer, and the call returns only after the
# WAL is flushed past it. The head is then held for the transaction's work alone, not for
# an fsync, and the flushes of concurrent writers share one fsync. A caller is never told
# of a commit a crash could take back; a reader could see one for the moment between the
# commit and its flush, so every read that hands out evidence (a snapshot, verify, a
# follow poll, a copy's source) makes the WAL flushed past what it saw before it answers
# (``flush_at_commit``, ``flush``). LAW.md 14.

# Polling for a flush (``wait_durable``) is the fallback of a role that may not write the
# flush's message: how long it waits between looks (growing to the last), and in all. The
# WAL writer flushes an asynchronous commit within three ``wal_writer_delay`` (0.6 s by
# default), but never a WAL that ends in a record no commit follows: 30 s, then BUSY.
_FLUSH_POLL_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
_FLUSH_WAIT_SECONDS = 30.0


def commit_early(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """One write statement in its own transaction, committed early, then flushed; its
    rows. A refusal wrote nothing and leaves as CassetteError. Both statements go in one
    round trip (``one_flight``) where libpq has pipeline mode; otherwise one after the
    other."""
    from . import one_flight  # (psycopg's: imported once a PostgreSQL ledger writes)

    early = sqlfiles.query("statement_without_flush").format(statement=sql.rstrip("; \n"))
    if not one_flight.supported():
        rows = [row[1:] for row in statement(conn, early, params)]
        flush(conn)
        return rows
    try:  # the write and its flush in one round trip
        written, flushed = one_flight.write_and_flush(
            conn, early, params, sqlfiles.query("flush_commits")
        )
    except (psycopg.Error, UnicodeEncodeError) as exc:
        raise translate(exc) from exc
    if one_flight.lost_statement(flushed):
        flush(conn)  # (its statement was deallocated after it was sent: once more, apart)
    elif flushed.status == psycopg.pq.ExecStatus.FATAL_ERROR:
        _flush_refused(conn, pg_errors.error_from_result(flushed, encoding=conn.info.encoding))
    return [row[1:] for row in written]


@contextmanager
def early_transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """``transaction``, committed early and flushed before the block's caller goes on."""
    with transaction(conn):
        conn.execute(sqlfiles.query("commit_without_flush"))
        yield conn
    flush(conn)


def flush(conn: psycopg.Connection[Any]) -> None:
    """Return once the WAL is flushed past this session's last commit. A failure here
    (the connection lost) leaves the write's outcome unknown to the caller, as a failed
    COMMIT would: CANNOT_OPEN, and the caller retries idempotently or not at all."""
    try:
        conn.execute(sqlfiles.query("flush_commits"))
    except psycopg.Error as exc:
        _flush_refused(conn, exc)


def _flush_refused(conn: psycopg.Connection[Any], refused: psycopg.Error) -> None:
    """What ``flush`` does when its message was refused after the write committed."""
    # The write has committed; only its flush's message was refused (pg_logical_emit_message
    # revoked since the ledger was opened, can_flush; the server turned read-only). Never
    # a refusal code for a write that is there: wait as a reader waits for the WAL
    # writer's flush past it.
    try:
        wait_durable(conn, wal_inserted(conn))
    except (psycopg.Error, CassetteError) as exc:  # (BUSY would say nothing was written)
        raise CassetteError(
            ErrorCode.CANNOT_OPEN,
            f"the write committed, but its flush failed ({refused}) and so did the wait for"
            f" it ({exc}): whether it survives a crash is unknown",
        ) from exc


def flush_at_commit(conn: psycopg.Connection[Any]) -> None:
    """In an evidence read's transaction, after its snapshot was taken: its commit then
    flushes the WAL past everything the snapshot sees (one small record and an fsync, only
    when the WAL is not flushed that far already), so nothing it hands out, once the
    transaction committed, can be taken back by a crash. A role that may not write the
    record waits, polling, for the flush instead (``wait_durable``)."""
    needed = unflushed(conn)
    if needed is None:
        return
    lsn, may_write = needed
    if may_write:
        conn.execute(sqlfiles.query("flush_message"))
    else:
        wait_durable(conn, lsn)


def unflushed(conn: psycopg.Connection[Any]) -> tuple[str, bool] | None:
    """None when the WAL is flushed as far as it is inserted (or on a standby); else how
    far it is inserted and whether this role may write the flush's message."""
    row = conn.execute(sqlfiles.query("flush_needed")).fetchone()
    return None if row is None or row[0] is None else (str(row[0]), bool(row[1]))


def wal_inserted(conn: psycopg.Connection[Any]) -> str | None:
    """How far the server's WAL is inserted (None on a standby: nothing to wait for)."""
    row = conn.execute(sqlfiles.query("wal_inserted")).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def wait_durable(conn: psycopg.Connection[Any], lsn: str | None) -> None:
    """Return once the WAL is flushed up to ``lsn`` (read after a snapshot began, so past
    everything it sees). Polled, since a reader may not write: no fsync of its own."""
    if lsn is None:
        return
    deadline = time.monotonic() + _FLUSH_WAIT_SECONDS
    for look in itertools.count():
        row = conn.execute(sqlfiles.query("wal_flushed_past"), {"lsn": lsn}).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise CassetteError(
                ErrorCode.BUSY,
                f"the server flushed no WAL past {lsn} in {_FLUSH_WAIT_SECONDS:.0f} s",
            )
        time.sleep(_FLUSH_POLL_SECONDS[min(look, len(_FLUSH_POLL_SECONDS) - 1)])


@contextmanager
def transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """One transaction: committed on success, rolled back on any exception, which leaves
    as a CassetteError."""
    try:
        with conn.transaction():
            yield conn
    except (psycopg.Error, UnicodeEncodeError) as exc:
        raise translate(exc) from exc


def named_fetch(conn: psycopg.Connection[Any]) -> Fetch:
    """A ``reasoning.Fetch`` over this connection: the named query, its rows (inside the
    caller's transaction, if one is open)."""

    def fetch(name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return statement(conn, sqlfiles.query(name), params)

    return fetch
