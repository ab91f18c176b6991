"""The SQLite ends of ``copying``: a journal read in one snapshot, and a ledger written in
one transaction whose every write is dated by the copy."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from .clock import SystemClock
from .connection import DEFAULT_BUSY_TIMEOUT_MS, connect, connect_reader, write_transaction
from .connection import ledger_time as _ledger_time
from .copy_ends import Entry
from .errors import CassetteError, ErrorCode, translate
from .worker_keys import ledger_id

# Every table the journal records on a SQLite ledger.
JOURNALED = frozenset(
    {
        "cassette_messages",
        "cassette_jobs",
        "cassette_steps",
        "cassette_receipts",
        "cassette_releases",
        "cassette_actions",
        "cassette_checkpoints",
        "cassette_seals",
        "cassette_attestations",
    }
)
_BATCH = 4096


class SqliteSource:
    def __init__(self, path: str) -> None:
        self.conn = connect_reader(path)
        self.conn.execute("BEGIN")  # one snapshot for the whole read

    def tables(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT DISTINCT tbl FROM cassette_journal")}

    def ledger_id(self) -> str:
        return ledger_id(self.conn)

    def entries(self, start: int) -> Iterator[Entry]:
        cursor = self.conn.execute(
            "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq >= ?"
            " ORDER BY seq",
            (start,),
        )
        while rows := cursor.fetchmany(_BATCH):
            for seq, body, leaf, chain in rows:
                yield Entry(seq, body, bytes(leaf), bytes(chain))

    def close(self) -> None:
        self.conn.close()


class SqliteDestination:
    tables = JOURNALED

    def __init__(self, path: str, durability: str | None, new_ledger_id: str) -> None:
        self.conn = connect(
            path,
            clock=SystemClock(),
            durability=durability,
            busy_timeout_ms=DEFAULT_BUSY_TIMEOUT_MS,
            new_ledger_id=new_ledger_id,
        )
        self.columns = {
            table: [row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")]
            for table in self.tables
        }

    def transaction(self) -> AbstractContextManager[object]:
        return write_transaction(self.conn)

    def adopt_ledger_id(self, wanted: str) -> None:
        # A file's ledger_id is fixed when it is made (append-only meta): a new file was
        # made with the source's; any other file must already be the same ledger.
        if ledger_id(self.conn) != wanted:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "the destination file is another ledger (its ledger_id differs): copy into"
                " a new file, or into an earlier copy of the same ledger",
            )

    def size(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])

    def chain_at(self, seq: int) -> bytes:
        row = self.conn.execute(
            "SELECT chain_hash FROM cassette_journal WHERE seq = ?", (seq,)
        ).fetchone()
        return bytes(row[0]) if row else b""

    def ledger_time(self) -> int:
        return _ledger_time(self.conn)

    def lease_expiry(self, step_id: int) -> int | None:
        row = self.conn.execute(
            "SELECT lease_expires_at FROM cassette_steps WHERE step_id = ?", (step_id,)
        ).fetchone()
        return None if row is None else row[0]

    def write(self, at_ms: int, op: str, table: str, row: dict[str, Any]) -> list[Entry]:
        size = self.size()
        pinned = getattr(self.conn, "transaction_time", None)
        if pinned is None:  # pragma: no cover - every package connection has one
            raise CassetteError(ErrorCode.DATABASE_ERROR, "not a package connection")
        pinned.ms = at_ms  # the time the triggers and clock guards judge this write by
        try:
            self.conn.execute(*_statement(op, table, row, self.columns.get(table)))
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        return [
            Entry(seq, body, bytes(leaf), bytes(chain))
            for seq, body, leaf, chain in self.conn.execute(
                "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq >= ?"
                " ORDER BY seq",
                (size,),
            )
        ]

    def close(self) -> None:
        self.conn.close()


def _statement(
    op: str, table: str, row: dict[str, Any], columns: list[str] | None
) -> tuple[str, list[Any]]:
    """The INSERT (every column, as journaled) or the step UPDATE a body describes. Names
    come from the destination's own schema, never from the body, which must match it."""
    columns = require_columns(table, row, columns)
    if op == "INSERT":
        names = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        return f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values())
    return (
        "UPDATE cassette_steps SET status = ?, lease_owner = ?, lease_expires_at = ?,"
        " fencing_token = ? WHERE step_id = ?",
        [
            row["status"],
            row["lease_owner"],
            row["lease_expires_at"],
            row["fencing_token"],
            row["step_id"],
        ],
    )


def require_columns(table: str, row: dict[str, Any], columns: list[str] | None) -> list[str]:
    """The destination's columns of ``table`` (its own schema's), which a journal body's
    row must hold, in order (JOURNAL_BROKEN otherwise)."""
    if columns is None or list(row) != columns:
        raise CassetteError(
            ErrorCode.JOURNAL_BROKEN, f"a journal body does not hold the columns of {table}"
        )
    return columns
