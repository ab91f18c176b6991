"""State and time checked while the journal is walked, for a ledger that holds the law.

Every append-only table gains rows in journal order (ids are dense and in order, a rule
of the SQL), so its rows read by rowid, rendered as the body the journaling trigger
writes, must equal its journal entries in seq order, byte for byte: a merge of two
streams, one pass, no sort, no JSON parsing. The dates the time check judges come from
the rendered rows, which equal the bodies. Steps change after they are written, so
their entries (the only ones parsed here) are replayed into the private history table,
and the final rows compared with it as ``state.py`` does.

This is a fast path, never a judge of tampering: the first entry that is not as an
honest ledger writes it (another table, an unexpected body, a row left over, a body
rendered differently by another SQLite) makes ``finish`` answer False, and the caller
runs the full replay and time checks, whose findings are precise.
"""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Iterator
from typing import Any

import orjson

from .findings import Collector
from .state import HISTORY, create_history, drop_history, rendered, report_differences
from .tables import MUTABLE_TABLES, TABLES
from .timeline import TimeJudge

_STEPS = "cassette_steps"
_STEPS_NAME = _STEPS.encode()  # as the journal stores it, read as bytes
_BATCH = 1024
# The columns of a rendered row: the body the journal should hold, its date, its key.
_BODY, _DATE, _KEY = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)
_UPSERT = (
    f"INSERT INTO {HISTORY} (tbl, rid, k, seq, n, inserts, first_seq, first_insert)"
    " VALUES (?, ?, ?, ?, 1, ?, ?, ?)"
    " ON CONFLICT (tbl, rid) DO UPDATE SET k = excluded.k, seq = excluded.seq, n = n + 1,"
    " inserts = inserts + excluded.inserts,"
    " first_insert = coalesce(first_insert, excluded.first_insert)"
)


def _rows(cursor: sqlite3.Cursor) -> Iterator[Any]:
    """A cursor's rows fetched in batches (fewer calls per row than iterating it)."""
    return itertools.chain.from_iterable(iter(lambda: cursor.fetchmany(_BATCH), []))


class StateStream:
    """Fed every journal entry in seq order by the chain walk (``see``)."""

    def __init__(self, conn: sqlite3.Connection, now_ms: int, skew_ms: int, jump_ms: int) -> None:
        self.conn = conn
        self.rows = Collector()
        self.time = Collector()
        self.judge = TimeJudge(self.time, now_ms, skew_ms, jump_ms)
        self.held = True  # every entry so far is as an honest writer makes it
        self._steps: list[tuple[Any, ...]] = []
        create_history(conn)
        # b'{"table":"T","op":"INSERT","key":' -> the table's rows, rendered, in rowid order
        self._streams: dict[bytes, tuple[Iterator[Any], str, bytes]] = {}
        for name, spec in TABLES.items():
            if name in MUTABLE_TABLES:
                continue
            cursor = conn.execute(
                f"SELECT {rendered(name, spec.key, spec.columns, 'INSERT')}, t.{spec.dated_by},"
                f" t.{spec.key} FROM main.{name} AS t NOT INDEXED ORDER BY t.{spec.rowid}"
            )
            self._streams[_prefix(name, "INSERT")] = (_rows(cursor), name, name.encode())
        self._step_ops = {_prefix(_STEPS, "INSERT"): 1, _prefix(_STEPS, "UPDATE"): 0}

    def see(self, seqs: list[int], bodies: list[bytes], tables: list[Any], keys: list[Any]) -> None:
        """A batch of consecutive journal entries, with the table name and key each entry
        stores beside its body (migration 0008). Entries of one append-only table in a row
        (the common case: a batch of appends) are compared as one list, and their dates
        judged at once when none needs a finding."""
        count, i = len(bodies), 0
        while i < count and self.held:
            body = bodies[i]
            prefix = body[: body.find(b'"key":', 0, 80) + 6]
            stream = self._streams.get(prefix)
            if stream is None:
                insert = self._step_ops.get(prefix)
                if insert is None:
                    self.held = False  # an unknown table or operation: the full checks name it
                    return
                self._step(seqs[i], body, insert, tables[i], keys[i])
                i += 1
                continue
            name = stream[2]
            if i == 0 and tables.count(name) == count:
                j = count  # the common case: the whole batch is this table's
            else:
                j = i + 1
                while j < count and bodies[j].startswith(prefix):
                    j += 1
            rendered = list(itertools.islice(stream[0], j - i))
            if (
                list(map(_BODY, rendered)) != bodies[i:j]
                or list(map(_KEY, rendered)) != keys[i:j]
                or tables[i:j] != [name] * (j - i)
            ):
                self.held = False  # a row, or a stored name or key, differs: the full checks
                return  # name it
            self._dated(seqs[i:j], rendered, stream[1])
            i = j

    def _dated(self, seqs: list[int], rendered: list[Any], table: str) -> None:
        """The dates of a run of rendered rows (column 1), judged in journal order."""
        judge = self.judge
        dates = list(map(_DATE, rendered))
        latest = judge.latest
        if (
            not judge.waiting
            and latest is not None
            and set(map(type, dates)) == {int}
            and dates[0] >= latest
            and max(dates) <= judge.now_ms + judge.skew_ms
            and dates[0] - latest <= judge.jump_ms
        ):
            steps = list(map(operator.sub, dates[1:], dates[:-1]))
            if not steps or (min(steps) >= 0 and max(steps) <= judge.jump_ms):
                judge.latest = dates[-1]  # nothing to report: the common case
                return
        for seq, row in zip(seqs, rendered, strict=True):
            if row[1] is not None:
                judge.dated(seq, table, row[2], row[1])

    def _step(self, seq: int, body: bytes, insert: int, table: Any, stored_key: Any) -> None:
        try:
            entry = orjson.loads(body)
            key, row = entry["key"], entry["row"]
            created, status, lease = row["created_at"], row["status"], row["lease_expires_at"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self.held = False
            return
        if table != _STEPS_NAME or stored_key != key or type(key) is not int:
            self.held = False
            return
        self._steps.append((_STEPS, key, key, seq, insert, seq, seq if insert else None))
        if len(self._steps) >= _BATCH:
            self._flush()
        if not insert and status == "LEASED" and lease is not None:
            self.judge.claimed(seq, _STEPS, key, lease)
        if insert and created is not None:
            self.judge.dated(seq, _STEPS, key, created)

    def _flush(self) -> None:
        self.conn.executemany(_UPSERT, self._steps)
        self._steps.clear()

    def finish(self) -> bool:
        """True when the fast path held to the end: ``rows`` and ``time`` then hold this
        check's findings. False: the caller runs the full checks instead."""
        try:
            if not self.held:
                return False
            for rows, _, _ in self._streams.values():
                if next(rows, None) is not None:  # a row without an entry
                    return False
            self._flush()
            self.judge.finish()
            report_differences(self.conn, self.rows, _STEPS, None)
        finally:
            self._streams.clear()  # (finalizes the cursors)
            drop_history(self.conn)
        for finding in self.time.report.findings:  # keys read while the walk read bytes
            if isinstance(finding.key, bytes):
                finding.key = finding.key.decode("utf-8", "replace")
        return True


def _prefix(table: str, op: str) -> bytes:
    return orjson.dumps({"table": table, "op": op})[:-1] + b',"key":'
