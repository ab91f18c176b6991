"""Follow the journal as it grows: entries after a seq, in seq order, polled with short
read statements so that no read transaction stays open between polls (a WAL checkpoint
is never starved by a follower)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import CassetteError, ErrorCode, translate
from .payloads import loads_object

DEFAULT_POLL_SECONDS = 0.2
BATCH = 1000  # entries per read statement: bounded memory, and each read ends quickly

# seq is the journal's INTEGER PRIMARY KEY: a range read on the table itself. The body is
# read as bytes and decoded per entry, so a body edited to bytes that are not UTF-8 is
# answered at its own seq, after every entry before it was printed.
_AFTER = (
    "SELECT seq, CAST(body AS BLOB), chain_hash FROM cassette_journal"
    " WHERE seq > ? ORDER BY seq LIMIT ?"
)


def entry(seq: int, body: str | bytes, chain_hash: bytes) -> dict[str, Any]:
    """A journal entry as printed: its seq, what changed, and its chain hash.

    A body edited by hand (not JSON, too deep, fields of the wrong types) is
    ``UNREADABLE_ROW`` naming its seq; verify reports the same entry as a finding."""
    what = f"the journal body at seq {seq}"
    parsed = loads_object(body, what)
    table, op, key, row = (parsed.get(field) for field in ("table", "op", "key", "row"))
    if (
        not isinstance(table, str)
        or not isinstance(op, str)
        or isinstance(key, bool)
        or not isinstance(key, (int, str))
        or not isinstance(row, dict)
    ):
        raise CassetteError(
            ErrorCode.UNREADABLE_ROW,
            f"{what} is not a journal entry (a table, an op, a key and a row)",
        )
    return {
        "seq": seq,
        "table": table,
        "op": op,
        "key": key,
        "row": row,
        "chain_hash": bytes(chain_hash).hex(),
    }


def read_after(conn: sqlite3.Connection, since_seq: int, limit: int = BATCH) -> list[Any]:
    """One poll: up to ``limit`` raw entries after ``since_seq``; the statement runs to
    completion (fetchall) so its implicit read transaction ends before this returns."""
    if conn.in_transaction:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT, "follow needs a connection outside a transaction"
        )
    try:
        return conn.execute(_AFTER, (since_seq, limit)).fetchall()
    except sqlite3.Error as exc:
        raise translate(exc) from exc


# One poll of a ledger's journal (SQLite: ``read_after``; PostgreSQL:
# ``postgresql/anchors.journal_reader``): up to ``limit`` (seq, body, chain_hash) rows after
# ``since_seq``, in seq order, read by one short statement.
JournalReader = Callable[[int, int], list[Any]]


def follow(
    conn: sqlite3.Connection, since_seq: int = -1, **options: Any
) -> Iterator[dict[str, Any]]:
    """``follow_reader`` of a SQLite ledger's connection."""
    return follow_reader(lambda since, limit: read_after(conn, since, limit), since_seq, **options)


def follow_reader(
    read: JournalReader,
    since_seq: int = -1,
    *,
    table: str | None = None,
    keep_following: bool = True,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    timeout_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[dict[str, Any]]:
    """Every journal entry with seq > ``since_seq`` in seq order (of ``table`` only, if
    given), then, with ``keep_following``, each new one as it commits.

    Restarting from the last seq received gives no gap and no duplicate: seq is gapless
    and a commit is atomic, so a reader that sees entry n sees every entry before it.
    ``timeout_seconds`` ends the iteration after that long (tests, bounded scripts).
    """
    if isinstance(since_seq, bool) or not isinstance(since_seq, int) or since_seq < -1:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "since_seq must be an integer >= -1")
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    last = since_seq
    while True:
        rows = read(last, BATCH)
        for seq, body, chain_hash in rows:
            last = seq
            item = entry(seq, body, chain_hash)
            if table is None or item["table"] == table:
                yield item
        if len(rows) == BATCH:
            continue  # more is already committed: read on without waiting
        if not keep_following or (deadline is not None and time.monotonic() >= deadline):
            return
        sleep(poll_seconds)
