"""The PostgreSQL ends of ``copying``: a journal read in one REPEATABLE READ snapshot,
and a ledger written in one transaction by its owner, each write dated by the copy.

Dating a write is the owner's say over the head (``cassette_head.time_ms`` moves only
forward; LAW.md, PostgreSQL): the roles cannot do it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..connection import DEFAULT_BUSY_TIMEOUT_MS, resolve_durability
from ..copy_ends import Entry
from ..copying_sqlite import require_columns
from ..errors import CassetteError, ErrorCode
from ..redaction import shown
from . import connection
from .anchors import journal_size, ledger_id
from .sqlfiles import query

if TYPE_CHECKING:
    from psycopg import sql

_BATCH = 4096


class PgSource:
    def __init__(self, url: str) -> None:
        self.conn = connection.connect_reader(url)
        self._snapshot = self.conn.transaction()
        self._snapshot.__enter__()
        self.conn.execute(query("read_only_snapshot"))
        # The first query takes the snapshot; if the WAL is not flushed past all it sees,
        # a flush on a second session makes it so before anything is copied (this one
        # stays in its snapshot, which commits only when the copy is done).
        if connection.unflushed(self.conn) is not None:
            flusher = connection.connect_reader(url)
            try:
                connection.flush(flusher)
            finally:
                flusher.close()

    def tables(self) -> set[str]:
        return {row[0] for row in self.conn.execute(query("journal_tables"))}

    def ledger_id(self) -> str:
        return ledger_id(self.conn)

    def entries(self, start: int) -> Iterator[Entry]:
        with self.conn.cursor(name="cassette_copy") as cursor:
            cursor.itersize = _BATCH
            cursor.execute(query("journal_from"), {"start": start})
            for seq, body, leaf, chain in cursor:
                yield Entry(seq, body, bytes(leaf), bytes(chain))

    def close(self) -> None:
        try:
            self._snapshot.__exit__(None, None, None)
        finally:
            self.conn.close()


class PgDestination:
    def __init__(self, url: str, durability: str | None) -> None:
        self.conn = connection.connect(
            url,
            durability=resolve_durability(durability),
            busy_timeout_ms=DEFAULT_BUSY_TIMEOUT_MS,
        )
        journaled = self.conn.execute(query("journaled_tables")).fetchall()
        self.tables = frozenset(row[0] for row in journaled)
        self.columns = {
            table: [row[0] for row in self.conn.execute(query("table_columns"), {"table": table})]
            for table in self.tables
        }

    def transaction(self) -> AbstractContextManager[object]:
        return connection.transaction(self.conn)

    def adopt_ledger_id(self, wanted: str) -> None:
        if ledger_id(self.conn) == wanted:
            return
        if self.size() > 0:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "the destination database holds another ledger (its ledger_id differs): copy"
                " into an empty ledger, or into an earlier copy of the same ledger",
            )
        # an empty ledger takes its identity from its first entry's source (the meta
        # guard's rule, schema/10_ledger.sql)
        self.conn.execute(query("adopt_ledger_id"), {"ledger_id": wanted})

    def size(self) -> int:
        return journal_size(self.conn)

    def chain_at(self, seq: int) -> bytes:
        row = self.conn.execute(query("chain_hash_at"), {"seq": seq}).fetchone()
        return bytes(row[0]) if row else b""

    def ledger_time(self) -> int:
        row = self.conn.execute(query("head_time")).fetchone()
        return int(row[0]) if row else 0

    def lease_expiry(self, step_id: int) -> int | None:
        row = self.conn.execute(query("lease_expiry"), {"step_id": step_id}).fetchone()
        return None if row is None else row[0]

    def write(self, at_ms: int, op: str, table: str, row: dict[str, Any]) -> list[Entry]:
        size = self.size()
        # this transaction's time is at_ms: cassette_tx_ms() keeps a time its transaction set
        self.conn.execute(query("date_transaction"), {"at_ms": at_ms})
        self.conn.execute(_statement(op, table, row, self.columns.get(table)), row)
        return [
            Entry(seq, body, bytes(leaf), bytes(chain))
            for seq, body, leaf, chain in self.conn.execute(query("journal_from"), {"start": size})
        ]

    def close(self) -> None:
        self.conn.close()


def _statement(
    op: str, table: str, row: dict[str, Any], columns: list[str] | None
) -> str | sql.Composed:
    """The INSERT (every column, as journaled) or the step UPDATE a body describes, its
    parameters the row's own names. Names come from the destination's own schema, never
    from the body, which must match it (as ``copying_sqlite``'s)."""
    from psycopg import sql

    columns = require_columns(table, row, columns)
    if op != "INSERT":  # (copying lets through no other write than a step's UPDATE)
        return query("copy_step_update")
    return sql.SQL(query("copy_insert")).format(
        table=sql.Identifier(table),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        values=sql.SQL(", ").join(sql.Placeholder(c) for c in columns),
    )


def require_no_journal(url: str) -> None:
    """A restore never overwrites: a PostgreSQL destination holds no journal entry yet
    (a database without a ledger is migrated by the copy)."""
    try:
        conn = connection.connect_reader(url)
    except CassetteError as error:
        if error.code is ErrorCode.NOT_A_CASSETTE and "no ledger" in error.message:
            return
        raise
    try:
        if journal_size(conn) > 0:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                f"{shown(url)} holds a ledger; restore never overwrites",
            )
    finally:
        conn.close()
