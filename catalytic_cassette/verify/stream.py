"""State and time checked while the journal is walked, for a ledger that holds the law.

Every append-only table gains rows in journal order (ids are dense and in order, a rule
of the SQL), so its rows read by rowid, rendered as the body the journaling trigger
writes, must equal its journal entries in seq order, byte for byte: a merge of two
streams, one pass, no sort, no JSON parsing. The walk pairs each entry with its row
(the next one of its table, read by rowid with its key and date: the stored key and
table name are compared and the date judged at once). Rows are rendered by SQLite in
blocks of 4,096 ids: the walk's own connection renders one block in ``shares`` and
compares it as it reads it; the other blocks' bodies are compared with their rendered
rows inside SQLite, a run of pairs at a time (``RowsCheck``), which the caller hands to
whichever connection reading the same snapshot is free (GIL-free work beside the walk's
hashing). The dates the time check judges come from the rows, which equal the bodies
when every comparison held. Steps change after they are written, so their entries
(the only ones parsed here) are replayed into the private history table, and the final
rows compared with it as ``state.py`` does.

This is a fast path, never a judge of tampering: the first entry that is not as an
honest ledger writes it (another table, an unexpected body, a row left over, a body
rendered differently by another SQLite) makes ``finish`` answer False, and the caller
runs the full replay and time checks, whose findings are precise.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable
from typing import Any

import orjson

from .findings import Collector
from .history import JUDGED, HistoryJudge
from .state import HISTORY, create_history, drop_history, rendered, report_differences
from .tables import MUTABLE_TABLES, TABLES
from .timeline import TimeJudge

_STEPS = "cassette_steps"
_STEPS_NAME = _STEPS.encode()  # as the journal stores it, read as bytes
_BATCH = 1024
# Pairs of (entry, row) per body comparison handed out (about 0.1 s of SQLite's time),
# in at most RUN_COUNT runs (memory: a few tens of KiB a comparison).
RUN_ROWS = 32_768
RUN_COUNT = 1024
# Rows are shared out in blocks of 2**SHARE_SHIFT ids.
SHARE_SHIFT = 12
_UPSERT = (
    f"INSERT INTO {HISTORY} (tbl, rid, k, seq, n, inserts, first_seq, first_insert)"
    " VALUES (?, ?, ?, ?, 1, ?, ?, ?)"
    " ON CONFLICT (tbl, rid) DO UPDATE SET k = excluded.k, seq = excluded.seq, n = n + 1,"
    " inserts = inserts + excluded.inserts,"
    " first_insert = coalesce(first_insert, excluded.first_insert)"
)


class RowsCheck:
    """Runs of (journal entry, row) pairs of one table whose bodies must equal the rows
    rendered as the journaling trigger writes them; ``run`` on any connection that reads
    the same snapshot. Reads the journal and the table by rowid only."""

    def __init__(self, stream: StateStream, table: str, runs: list[tuple[int, int, int]]) -> None:
        self.stream = stream
        self.table = table
        self.runs = runs

    def run(self, conn: sqlite3.Connection) -> None:
        expected = sum(count for _, _, count in self.runs)
        spec = TABLES[self.table]
        (matched,) = conn.execute(
            # (the runs materialized: read once each, not once per pair)
            "WITH p(s, r, n) AS MATERIALIZED (SELECT json_extract(value, '$[0]'),"
            " json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(?))"
            " SELECT count(*) FROM p CROSS JOIN main.cassette_journal AS j NOT INDEXED"
            f" CROSS JOIN main.{self.table} AS t NOT INDEXED"
            f" WHERE j.seq >= p.s AND j.seq < p.s + p.n AND t.{spec.rowid} = p.r + (j.seq - p.s)"
            f" AND j.body = {rendered(self.table, spec.key, spec.columns, 'INSERT')}",
            (orjson.dumps(self.runs).decode(),),
        ).fetchone()
        if matched != expected:
            self.stream.held = False  # a body differs from its row: the full checks name it


class StateStream:
    """Fed every journal entry in seq order by the chain walk (``see``).

    ``defer`` takes each ``RowsCheck`` as it is made (to run it on any connection before
    ``finish``), for all blocks of rows but one in ``shares`` (the connections that share
    the comparisons); without it, every row is rendered and compared here, as it comes.
    ``end_walk`` hands out the last checks.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        now_ms: int,
        skew_ms: int,
        jump_ms: int,
        defer: Callable[[RowsCheck], None] | None = None,
        shares: int = 1,
    ) -> None:
        self.conn = conn
        self.rows = Collector()
        self.time = Collector()
        self.judge = TimeJudge(self.time, now_ms, skew_ms, jump_ms)
        self.lawful = Collector()  # history's findings (``history.py``)
        self.history = HistoryJudge(self.lawful, now_ms, skew_ms)
        self.held = True  # every entry so far is as an honest writer makes it
        self._defer = defer
        self._steps: list[tuple[Any, ...]] = []
        create_history(conn)
        # b'{"table":"T","op":"INSERT","key":' -> the table's rows (rendered or, for a
        # block handed out, NULL; rowid, date, key) in rowid order, its name, its name as
        # stored, its runs not yet handed out
        shares = max(1, shares) if defer is not None else 1
        self._streams: dict[bytes, tuple[sqlite3.Cursor, str, bytes, _Runs]] = {}
        for name, spec in TABLES.items():
            if name in MUTABLE_TABLES:
                continue
            body = rendered(name, spec.key, spec.columns, "INSERT")
            cursor = conn.execute(
                f"SELECT CASE WHEN (t.{spec.rowid} >> {SHARE_SHIFT}) % {shares} = 0"
                f" THEN {body} END,"
                f" t.{spec.rowid}, t.{spec.dated_by}, t.{spec.key}"
                f" FROM main.{name} AS t NOT INDEXED ORDER BY t.{spec.rowid}"
            )
            self._streams[_prefix(name, "INSERT")] = (cursor, name, name.encode(), _Runs())
        self._step_ops = {_prefix(_STEPS, "INSERT"): 1, _prefix(_STEPS, "UPDATE"): 0}

    def see(self, seqs: list[int], bodies: list[bytes], tables: list[Any], keys: list[Any]) -> None:
        """A batch of consecutive journal entries, with the table name and key each entry
        stores beside its body (schema/50_journal.sql). Entries of one append-only table in a row
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
            named = i == 0 and tables.count(name) == count
            if named:
                j = count  # the common case: the whole batch is this table's
            else:
                j = i + 1
                while j < count and bodies[j].startswith(prefix):
                    j += 1
            rows = stream[0].fetchmany(j - i)
            if len(rows) != j - i:
                self.held = False  # an entry without a row: the full checks name it
                return
            texts, rowids, dates, row_keys = zip(*rows, strict=True)
            if list(row_keys) != keys[i:j] or (not named and tables[i:j] != [name] * (j - i)):
                self.held = False  # a stored name or key differs: the full checks name it
                return
            handed = texts.count(None)
            if handed == 0:  # all rendered here
                if list(texts) != bodies[i:j]:
                    self.held = False  # a row differs: the full checks name it
                    return
            elif handed == j - i:  # all handed out
                self._paired(stream[3], stream[1], seqs[i:j], rowids)
            else:  # (at the edge of a block)
                if any(t is not None and t != b for t, b in zip(texts, bodies[i:j], strict=True)):
                    self.held = False
                    return
                out = [k for k, text in enumerate(texts) if text is None]
                self._paired(
                    stream[3],
                    stream[1],
                    [seqs[i + k] for k in out],
                    tuple(rowids[k] for k in out),
                )
            self._dated(seqs[i:j], dates, row_keys, stream[1])
            history = self.history
            if stream[1] in JUDGED:  # (receipts, releases, attestations: few)
                for k in range(i, j):
                    history.body(seqs[k], bodies[k])
            elif history.requeues:
                history.dated(seqs[i], dates[0])
            i = j

    def _paired(self, runs: _Runs, table: str, seqs: list[int], rowids: tuple[Any, ...]) -> None:
        """Entries ``seqs`` hold the rows ``rowids``: their bodies are compared in runs
        where both step by one."""
        count = len(seqs)
        first_seq, first_rowid = seqs[0], rowids[0]
        if (
            type(first_rowid) is int
            and seqs[-1] - first_seq == count - 1
            and rowids[-1] - first_rowid == count - 1
            and rowids == tuple(range(first_rowid, first_rowid + count))
            and seqs == list(range(first_seq, first_seq + count))
        ):
            runs.add(first_seq, first_rowid, count)  # the common case: one run
        else:
            for seq, rowid in zip(seqs, rowids, strict=True):
                if type(rowid) is not int:
                    self.held = False  # (a rowid is an integer: the full checks name it)
                    return
                runs.add(seq, rowid, 1)
        if runs.rows >= RUN_ROWS or len(runs.runs) >= RUN_COUNT:
            self._hand_out(table, runs)

    def _hand_out(self, table: str, runs: _Runs) -> None:
        check = RowsCheck(self, table, runs.take())
        if self._defer is not None:
            self._defer(check)
        else:
            check.run(self.conn)

    def end_walk(self) -> None:
        """The walk is over: hand out the runs not yet compared. Nothing is handed out
        after this (the other threads may have stopped taking work): a later call
        compares here."""
        for _, table, _, runs in self._streams.values():
            if runs.rows:
                self._hand_out(table, runs)
        self._defer = None

    def _dated(
        self, seqs: list[int], dates: tuple[Any, ...], keys: tuple[Any, ...], table: str
    ) -> None:
        """The dates of a run of rows (and their keys), judged in journal order."""
        judge = self.judge
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
        for seq, date, key in zip(seqs, dates, keys, strict=True):
            if date is not None:
                judge.dated(seq, table, key, date)

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
        if type(row) is dict:
            self.history.entry(seq, _STEPS, "INSERT" if insert else "UPDATE", key, row)
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
        check's findings. False: the caller runs the full checks instead.

        Every ``RowsCheck`` handed to ``defer`` must have run by now (the rest run here)."""
        try:
            if self.held:
                self.end_walk()
            if not self.held:
                return False
            for cursor, _, _, _ in self._streams.values():
                if cursor.fetchone() is not None:  # a row without an entry
                    return False
            self._flush()
            self.judge.finish()
            self.history.finish()
            report_differences(self.conn, self.rows, _STEPS, None)
        finally:
            self._streams.clear()  # (finalizes the cursors)
            drop_history(self.conn)
        for finding in self.time.report.findings:  # keys read while the walk read bytes
            if isinstance(finding.key, bytes):
                finding.key = finding.key.decode("utf-8", "replace")
        return True


class _Runs:
    """(first seq, first rowid, count) runs of one table's pairs, not yet handed out."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, int]] = []
        self.rows = 0

    def add(self, seq: int, rowid: int, count: int) -> None:
        runs = self.runs
        if runs:
            last_seq, last_rowid, last_count = runs[-1]
            if seq == last_seq + last_count and rowid == last_rowid + last_count:
                runs[-1] = (last_seq, last_rowid, last_count + count)
                self.rows += count
                return
        runs.append((seq, rowid, count))
        self.rows += count

    def take(self) -> list[tuple[int, int, int]]:
        runs, self.runs, self.rows = self.runs, [], 0
        return runs


def _prefix(table: str, op: str) -> bytes:
    return orjson.dumps({"table": table, "op": op})[:-1] + b',"key":'
