"""A write committed early and its flush, sent to the server in one flight (LAW.md 14).

Committing early (``connection.commit_early``) takes two statements: the write, in its own
transaction committed without waiting for the WAL, then the flush, a synchronous commit
of one WAL message that returns once the WAL is flushed past the write. Sent one after
the other, each is a round trip, and the client and its server process wake twice per
write. Here both go out together in libpq's pipeline mode, each followed by its own Sync
(so each is its own transaction, exactly as when sent apart: the write commits before the
flush begins), and the answers are read back together: one round trip.

Each statement is prepared once per connection under a name of its own (a statement the
server plans at every call costs it more than the round trip saves: docs/BENCHMARKS.md),
its parameters are sent as text for the server to type from the statement (as psycopg's
own text parameters are), and its rows are loaded by psycopg's own loaders, so a caller
gets the values psycopg's ``execute`` gives. A refused write is the same psycopg error,
translated at the same place; the flush runs after it all the same (it then flushes
nothing, or one small message). Waiting for the answers releases the interpreter (a
selector on the socket, never a blocking libpq call).
"""

from __future__ import annotations

import itertools
import re
import selectors
import weakref
from typing import Any

import psycopg
import psycopg.abc
from psycopg import adapt, pq
from psycopg import errors as pg_errors
from psycopg.adapt import PyFormat

# A named query's placeholders, %(name)s; the same name is the same parameter.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class _Prepared:
    """A statement prepared on one connection: its name there, its parameters' names."""

    __slots__ = ("name", "params")

    def __init__(self, name: bytes, params: list[str]) -> None:
        self.name = name
        self.params = params


# Per connection (a connection's prepared statements die with it): the SQL text each
# statement was prepared from, and its name there.
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[str, _Prepared]] = (
    weakref.WeakKeyDictionary()
)


_NAMES = itertools.count()


def supported() -> bool:
    """Whether this libpq has pipeline mode (14 and later)."""
    return bool(psycopg.Pipeline.is_supported())


def _prepare(conn: psycopg.Connection[Any], sql: str) -> _Prepared:
    statements = _PREPARED.setdefault(conn, {})
    prepared = statements.get(sql)
    if prepared is None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        text = _PLACEHOLDER.sub(number, sql).replace("%%", "%")
        # A name never used before on any connection: one forgotten here (after psycopg's
        # DEALLOCATE ALL, below) may still exist on the server.
        prepared = _Prepared(f"cassette_one_flight_{next(_NAMES)}".encode(), names)
        result = conn.pgconn.prepare(prepared.name, text.encode("utf-8"))
        _raise_if_failed(conn, result)
        statements[sql] = prepared
    return prepared


def _raise_if_failed(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> None:
    if result.status != pq.ExecStatus.FATAL_ERROR:
        return
    if conn.pgconn.status == pq.ConnStatus.BAD:  # the answer is libpq's: the server is gone
        message = (result.error_message or conn.pgconn.error_message).decode("utf-8", "replace")
        conn.close()
        raise psycopg.OperationalError(message.strip())
    raise pg_errors.error_from_result(result, encoding=conn.info.encoding)


def write_and_flush(
    conn: psycopg.Connection[Any], write_sql: str, params: dict[str, Any], flush_sql: str
) -> tuple[list[tuple[Any, ...]], pq.abc.PGresult]:
    """Send ``write_sql`` and ``flush_sql`` (no parameters) together, each its own
    transaction; the write's rows and the flush's result (its failure is the caller's to
    judge: the write has committed; ``lost_statement`` says to flush again). A refused
    write raises its psycopg error; so does a lost connection. The connection is idle
    again either way, out of pipeline mode."""
    transformer = adapt.Transformer(conn)
    for attempt in (1, 2):
        written, flushed = _flight(conn, transformer, write_sql, params, flush_sql)
        if not lost_statement(written) or attempt == 2:
            break
        # The session lost the write's statement under this cache: psycopg deallocates
        # every prepared statement of the connection when it drops its own (DEALLOCATE
        # ALL, after a failed transaction that prepared one), as do DISCARD ALL and a
        # pooler's reset. The write never ran (it failed where it was bound): prepare both
        # again and resend, once.
        _PREPARED.pop(conn, None)
    if lost_statement(flushed):
        _PREPARED.pop(conn, None)
    _raise_if_failed(conn, written)
    transformer.set_pgresult(written)
    return transformer.load_rows(0, written.ntuples, tuple), flushed


def lost_statement(result: pq.abc.PGresult) -> bool:
    """Whether ``result`` failed because its prepared statement no longer exists."""
    return bool(
        result.status == pq.ExecStatus.FATAL_ERROR
        and result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
    )


def _flight(
    conn: psycopg.Connection[Any],
    transformer: psycopg.abc.Transformer,
    write_sql: str,
    params: dict[str, Any],
    flush_sql: str,
) -> tuple[pq.abc.PGresult, pq.abc.PGresult]:
    pgconn = conn.pgconn
    # Every use of the connection under psycopg's lock, as its execute does: preparing
    # too (a PQprepare beside another thread's query would interleave their messages).
    with conn.lock:
        write = _prepare(conn, write_sql)
        flush = _prepare(conn, flush_sql)
        values = transformer.dump_sequence(
            [params[name] for name in write.params], [PyFormat.TEXT] * len(write.params)
        )
        pgconn.enter_pipeline_mode()
        try:
            pgconn.send_query_prepared(write.name, values, param_formats=[0] * len(values))
            pgconn.pipeline_sync()
            pgconn.send_query_prepared(flush.name, [])
            pgconn.pipeline_sync()
            written, flushed = _results(pgconn, syncs=2)
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Interrupted with answers unread (a lost connection, ^C): the protocol is
            # mid-flight, so the connection is of no further use, and says so.
            conn.close()
            raise
    return written, flushed


def _results(pgconn: pq.abc.PGconn, *, syncs: int) -> list[pq.abc.PGresult]:
    """Every query's result up to the ``syncs``-th Sync, in order (one per query: the
    statements here return one result each), waiting on the socket, never in libpq."""
    results: list[pq.abc.PGresult] = []
    seen = 0
    while True:
        while pgconn.flush():  # what the socket would not take yet
            _wait(pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
            pgconn.consume_input()
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one query's results
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                seen += 1
                if seen == syncs:
                    return results
            elif result.status != pq.ExecStatus.PIPELINE_ABORTED:
                results.append(result)
        _wait(pgconn.socket, selectors.EVENT_READ)


# poll() where there is one: no descriptor of its own to make and close at every wait, as
# epoll's would be (DefaultSelector).
_SELECTOR = getattr(selectors, "PollSelector", selectors.DefaultSelector)


def _wait(socket: int, events: int) -> None:
    """Until ``socket`` is ready for ``events``. A selector, not ``select()``, which
    cannot watch a descriptor numbered past FD_SETSIZE (1024): a process holding that many
    files got a ValueError after its write was sent."""
    with _SELECTOR() as selector:
        selector.register(socket, events)
        selector.select()
