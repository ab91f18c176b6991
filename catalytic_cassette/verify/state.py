"""State against history: replaying the journal in seq order gives exactly the tables.

The journal is read once, in full, through the table itself (never an index), into a
private TEMP table with one row per journaled row: its latest entry and counts. Every
ledger table is then scanned (never an index) and compared with it in both directions:
a row without history, history without a row, a duplicate, a changed value. The only
lookups are into that private table and by rowid, so neither a rewritten index nor
planner statistics can hide a row from this check.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable

from .findings import Collector, Finding, FindingKind
from .tables import MUTABLE_TABLES, TABLES

HISTORY = "temp.cassette_verify_history"


def _rowid_of_body() -> str:
    cases = " ".join(
        f"WHEN '{name}' THEN json_extract(body, '$.row.{table.rowid}')"
        for name, table in TABLES.items()
        if table.rowid != table.key
    )
    return f"CASE json_extract(body, '$.table') {cases} ELSE json_extract(body, '$.key') END"


def create_history(conn: sqlite3.Connection) -> None:
    """The private history table, empty: one row per journaled row (its latest entry,
    how many entries and inserts it has, its first entry and first insert)."""
    conn.execute(f"DROP TABLE IF EXISTS {HISTORY}")
    conn.execute(
        f"CREATE TABLE {HISTORY} (tbl ANY, rid ANY, k ANY, seq INTEGER, n INTEGER,"
        " inserts INTEGER, first_seq INTEGER, first_insert INTEGER,"
        " PRIMARY KEY (tbl, rid)) WITHOUT ROWID"
    )


def drop_history(conn: sqlite3.Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {HISTORY}")


def replay(conn: sqlite3.Connection) -> None:
    """Fill the private history table from one pass over the journal, in seq order.

    Each entry is applied as it comes (an upsert keyed by table and rowid), so the last
    entry of a row is its state; no sort is needed, as ids grow with the journal.
    """
    create_history(conn)
    conn.execute(
        f"INSERT INTO {HISTORY} (tbl, rid, k, seq, n, inserts, first_seq, first_insert)"
        " SELECT coalesce(tbl, ''), coalesce(rid, ''), k, seq, 1, op IS 'INSERT', seq,"
        "        CASE WHEN op IS 'INSERT' THEN seq END"
        " FROM (SELECT seq, json_extract(body, '$.table') AS tbl, json_extract(body, '$.op') AS op,"
        f"             json_extract(body, '$.key') AS k, {_rowid_of_body()} AS rid"
        "       FROM main.cassette_journal NOT INDEXED WHERE json_valid(body) ORDER BY seq)"
        " WHERE 1"  # (an upsert after a SELECT needs a WHERE to parse)
        " ON CONFLICT (tbl, rid) DO UPDATE SET k = excluded.k, seq = excluded.seq, n = n + 1,"
        " inserts = inserts + excluded.inserts,"
        " first_insert = coalesce(first_insert, excluded.first_insert)"
    )


def rendered(table: str, key: str, columns: Iterable[str], op: str) -> str:
    row = "json_object(" + ", ".join(f"'{c}', t.{c}" for c in columns) + ")"
    return f"json_object('table', '{table}', 'op', '{op}', 'key', t.{key}, 'row', {row})"


def _differing_rows(table: str, run_filter: str) -> str:
    """The rows that have no history, or differ from their latest journal entry.

    The fast path renders the body the journaling trigger would write for the row and
    compares text inside SQLite; only when the text differs (another SQLite version may
    escape a string differently) are the columns compared one by one as values, which is
    what decides. Matching rows never reach Python.
    """
    spec = TABLES[table]
    ops = ("INSERT", "UPDATE") if table in MUTABLE_TABLES else ("INSERT",)
    bodies = " OR ".join(f"l.body = {rendered(table, spec.key, spec.columns, op)}" for op in ops)
    by_value = " AND ".join(f"json_extract(l.body, '$.row.{c}') IS t.{c}" for c in spec.columns)
    return (
        f"SELECT t.{spec.key}, h.seq FROM main.{table} AS t NOT INDEXED"
        f" LEFT JOIN {HISTORY} AS h ON h.tbl = '{table}' AND h.rid = t.{spec.rowid}"
        " LEFT JOIN main.cassette_journal AS l NOT INDEXED ON l.seq = h.seq"
        f" WHERE (l.seq IS NULL OR NOT ({bodies}) AND NOT coalesce(CASE WHEN json_valid(l.body)"
        f" THEN json_extract(l.body, '$.key') IS t.{spec.key} AND {by_value} END, 0)){run_filter}"
    )


def check_state(
    conn: sqlite3.Connection,
    out: Collector,
    run_id: str | None,
    journal_columns: Callable[[sqlite3.Connection, Collector], None] | None = None,
) -> None:
    """Replay the journal into the private history table and compare every ledger table
    with it. ``journal_columns`` checks the table name and key each entry stores beside
    its body (``check_journal_columns``, the SQLite ledger's encoding, by default)."""
    replay(conn)
    try:
        for table, spec in TABLES.items():
            if run_id is not None and "run_id" not in spec.columns:
                continue  # a run-scoped verify covers the tables that belong to runs
            report_differences(conn, out, table, run_id)
        unknown = (
            f"SELECT seq, tbl FROM {HISTORY} WHERE tbl IS NULL OR tbl NOT IN ("
            + ", ".join(f"'{t}'" for t in TABLES)
            + ") ORDER BY seq"
        )
        for seq, tbl in conn.execute(unknown):
            out.add(
                Finding(
                    FindingKind.JOURNAL_UNKNOWN_TABLE,
                    f"journal entry names table {tbl!r}",
                    seq,
                    tbl,
                )
            )
        (journal_columns or check_journal_columns)(conn, out)
    finally:
        drop_history(conn)


def check_journal_columns(conn: sqlite3.Connection, out: Collector) -> None:
    """The table name and key each entry stores beside its body (schema/50_journal.sql, read by
    the by-row index) are the body's: someone with writable_schema could change them
    without touching the body, hiding an entry from readers that look it up."""
    rows = conn.execute(
        "SELECT seq, tbl, row_key FROM main.cassette_journal NOT INDEXED WHERE json_valid(body)"
        " AND (tbl IS NOT json_extract(body, '$.table')"
        "      OR row_key IS NOT json_extract(body, '$.key')) ORDER BY seq"
    )
    for seq, tbl, key in rows:
        out.add(
            Finding(
                FindingKind.JOURNAL_COLUMNS,
                "the table or key stored beside the body is not the body's",
                seq,
                tbl,
                key,
            )
        )


def report_differences(
    conn: sqlite3.Connection, out: Collector, table: str, run_id: str | None
) -> None:
    """One table against the history table, both ways."""
    run_filter = "" if run_id is None else " AND t.run_id = :run"
    for key, seq in conn.execute(_differing_rows(table, run_filter), {"run": run_id}):
        if seq is None:
            out.add(
                Finding(
                    FindingKind.UNJOURNALED_ROW,
                    "row has no journal entry",
                    None,
                    table,
                    key,
                )
            )
        else:
            out.add(
                Finding(
                    FindingKind.STATE_MISMATCH,
                    "row differs from its latest journal entry",
                    seq,
                    table,
                    key,
                )
            )
    _check_history(conn, out, table, run_id)


def _check_history(
    conn: sqlite3.Connection, out: Collector, table: str, run_id: str | None
) -> None:
    """History without a row, and histories that a replay could not have produced."""
    spec = TABLES[table]
    missing = (
        f"SELECT h.k, h.seq FROM {HISTORY} AS h WHERE h.tbl = '{table}' AND NOT EXISTS"
        f" (SELECT 1 FROM main.{table} AS t NOT INDEXED WHERE t.{spec.rowid} = h.rid)"
        " ORDER BY h.seq"
    )
    for key, seq in conn.execute(missing):
        if run_id is None or _journal_run(conn, seq) == run_id:
            out.add(
                Finding(
                    FindingKind.ROW_MISSING,
                    "journaled row is missing from its table",
                    seq,
                    table,
                    key,
                )
            )
    if table in MUTABLE_TABLES:
        order = (
            f"SELECT h.k, h.seq, h.inserts FROM {HISTORY} AS h WHERE h.tbl = '{table}'"
            " AND (h.inserts IS NOT 1 OR h.first_insert IS NOT h.first_seq) ORDER BY h.seq"
        )
        for key, seq, inserts in conn.execute(order):
            out.add(
                Finding(
                    FindingKind.REPLAY_ORDER,
                    f"the row's history has {inserts} inserts or changes it before its insert",
                    seq,
                    table,
                    key,
                )
            )
    else:
        dup = (
            f"SELECT h.k, h.seq, h.n FROM {HISTORY} AS h WHERE h.tbl = '{table}' AND h.n > 1"
            " ORDER BY h.seq"
        )
        for key, seq, count in conn.execute(dup):
            out.add(
                Finding(
                    FindingKind.JOURNAL_DUPLICATE,
                    f"{count} journal entries for an append-only row",
                    seq,
                    table,
                    key,
                )
            )


def _journal_run(conn: sqlite3.Connection, seq: int) -> object:
    return conn.execute(
        "SELECT json_extract(body, '$.row.run_id') FROM main.cassette_journal NOT INDEXED"
        " WHERE seq = ?",
        (seq,),
    ).fetchone()[0]
