"""The PostgreSQL ends of ``copying``: a journal read in one REPEATABLE READ snapshot,
and a ledger written in one transaction by its owner, each write dated by the copy.

Dating a write is the owner's say over the head (``cassette_head.time_ms`` moves only
forward; LAW.md, PostgreSQL): the roles cannot do it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..connection import DEFAULT_BUSY_TIMEOUT_MS, resolve_durability
from ..copying import Entry
from ..copying_sqlite import _statement
from ..errors import CassetteError, ErrorCode
from . import connection
from .anchors import journal_size, ledger_id

_BATCH = 4096


class PgSource:
    def __init__(self, url: str) -> None:
        self.conn = connection.connect_reader(url)
        self._snapshot = self.conn.transaction()
        self._snapshot.__enter__()
        self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # (the first query takes the snapshot: all a copy carries is durable)
        connection.wait_durable(self.conn, connection.wal_inserted(self.conn))

    def tables(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT DISTINCT tbl FROM cassette_journal")}

    def ledger_id(self) -> str:
        return ledger_id(self.conn)

    def entries(self, start: int) -> Iterator[Entry]:
        with self.conn.cursor(name="cassette_copy") as cursor:
            cursor.itersize = _BATCH
            cursor.execute(
                "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal"
                " WHERE seq >= %s ORDER BY seq",
                (start,),
            )
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
        journaled = self.conn.execute(
            "SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE NOT t.tgisinternal AND t.tgname LIKE '%%journal'"
            " AND c.relname LIKE 'cassette%%'"
        ).fetchall()
        self.tables = frozenset(row[0] for row in journaled)
        self.columns = {
            table: [
                row[0]
                for row in self.conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    (table,),
                )
            ]
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
        # an empty ledger takes its identity from its first entry's source (0001's rule)
        self.conn.execute("UPDATE cassette_meta SET value = %s WHERE key = 'ledger_id'", (wanted,))

    def size(self) -> int:
        return journal_size(self.conn)

    def chain_at(self, seq: int) -> bytes:
        row = self.conn.execute(
            "SELECT chain_hash FROM cassette_journal WHERE seq = %s", (seq,)
        ).fetchone()
        return bytes(row[0]) if row else b""

    def ledger_time(self) -> int:
        row = self.conn.execute("SELECT time_ms FROM cassette_head").fetchone()
        return int(row[0]) if row else 0

    def lease_expiry(self, step_id: int) -> int | None:
        row = self.conn.execute(
            "SELECT lease_expires_at FROM cassette_steps WHERE step_id = %s", (step_id,)
        ).fetchone()
        return None if row is None else row[0]

    def write(self, at_ms: int, op: str, table: str, row: dict[str, Any]) -> list[Entry]:
        size = self.size()
        # this transaction's time is at_ms: cassette_tx_ms() keeps a time its transaction set
        self.conn.execute(
            "UPDATE cassette_head SET time_ms = %s, tx = pg_current_xact_id()", (at_ms,)
        )
        sql, params = _statement(op, table, row, self.columns.get(table))
        self.conn.execute(sql.replace("?", "%s"), params)
        return [
            Entry(seq, body, bytes(leaf), bytes(chain))
            for seq, body, leaf, chain in self.conn.execute(
                "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal"
                " WHERE seq >= %s ORDER BY seq",
                (size,),
            )
        ]

    def close(self) -> None:
        self.conn.close()
