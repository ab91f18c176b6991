"""History is lawful, for the inserts of the append-only tables: each row judged against
the rows of lower id by the rules of its insert (``law.INSERT_RULES``, ``law.DENSE``),
by SQL over the final tables once the journal is walked.

Append-only rows never change, and the state check proves the tables equal the journal's
last image of each row, so a rule that compares a row only with rows of lower id holds of
the final tables exactly when it held at the insert: one query per group of rules (read
through the tables' own indexes), instead of a map of every row in Python during the walk.
Each broken row is reported at its insert's journal seq (read through the journal's by-row
index), as ``unlawful_history`` with the code the write path refuses it with, unless an
earlier revision of the same row is reported already (the first unlawful seq per key).

Time is the time check's (``timeline.py``): it judges each date against the ledger's time
at its seq, across tables, and its ``time_backwards`` at a seq is the finding that names
TIME_BACKWARDS (not repeated here). Its ``lease_over_cap`` at a claim is also named here as
the claim's first unlawful revision (INVALID_TTL), as the write path refuses that claim:
the step's history then starts being unlawful there, not at the next claim.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from .. import law
from ..errors import ErrorCode
from .findings import Collector, Finding, FindingKind
from .history import MAX_KEYS
from .tables import TABLES

# Time findings that are also a revision's first unlawful one, by the write path's code.
_TIME_RULES = {FindingKind.LEASE_OVER_CAP: ErrorCode.INVALID_TTL}
# Each broken row's first entry, in one query (through the journal's by-row index where
# the ledger has it; a private mirror may not: then one scan of the journal).
_FIRST_ENTRIES = (
    "WITH w(t, k) AS MATERIALIZED (SELECT json_extract(value, '$[0]'),"
    " json_extract(value, '$[1]') FROM json_each(?))"
    " SELECT j.tbl, j.row_key, min(j.seq) FROM w JOIN main.cassette_journal AS j"
    " ON j.tbl = w.t AND j.row_key = w.k GROUP BY j.tbl, j.row_key"
)


def check_inserts(
    conn: sqlite3.Connection,
    lawful: Collector,
    time: Collector,
    run_id: str | None = None,
    broken: list[tuple[str, Any, ErrorCode, str]] | None = None,
) -> bool:
    """Judge every append-only table's inserts into ``lawful`` (beside the findings of the
    walk's judge already there); True when lawful. ``broken``: ``broken_inserts`` of the
    same snapshot, if already read (by another connection, during the walk)."""
    found: dict[tuple[str, Any], Finding] = {
        (f.table or "", _hashable(f.key)): f
        for f in lawful.report.findings
        if f.kind is FindingKind.UNLAWFUL_HISTORY
    }
    fresh: list[Finding] = []

    def report(seq: int | None, table: str, key: Any, code: ErrorCode, text: str) -> None:
        if seq is None:
            return  # a row without an entry: the state check names it
        held = found.get((table, _hashable(key)))
        if held is not None and held.seq is not None and held.seq <= seq:
            return
        detail = f"{code.value}: {text}"
        if held is not None:  # an earlier revision of the row: the first unlawful one
            held.seq, held.detail = seq, detail
            return
        if len(found) >= MAX_KEYS:
            return
        finding = Finding(FindingKind.UNLAWFUL_HISTORY, detail, seq, table, key)
        found[(table, _hashable(key))] = finding
        fresh.append(finding)

    for finding in time.report.findings:
        code = _TIME_RULES.get(finding.kind)
        if code is not None and finding.table is not None:
            report(finding.seq, finding.table, finding.key, code, finding.detail)
    if broken is None:
        broken = broken_inserts(conn, run_id)
    first = _first_entries(conn, {(table, key) for table, key, _, _ in broken})
    for table, key, code, text in broken:
        report(first.get((table, key)), table, key, code, text)
    for finding in sorted(fresh, key=lambda f: f.seq or 0):
        lawful.add(finding)
    return not found


def broken_inserts(
    conn: sqlite3.Connection, run_id: str | None = None
) -> list[tuple[str, Any, ErrorCode, str]]:
    """(table, key, code, text) of every row that breaks an insert rule (at most MAX_KEYS
    rows a rule); with ``run_id``, only that run's rows (a table without runs: none)."""
    out: list[tuple[str, Any, ErrorCode, str]] = []
    for table, column in law.DENSE:
        if run_id is not None and "run_id" not in TABLES[table].columns:
            continue
        (rows, last) = conn.execute(f"SELECT count(*), max({column}) FROM main.{table}").fetchone()
        if last is None or last == rows:  # (ids are positive and unique: dense)
            continue
        for (key,) in conn.execute(
            f"SELECT t.{TABLES[table].key} FROM main.{table} AS t"
            f" WHERE t.{column} > 1 AND NOT EXISTS (SELECT 1 FROM main.{table} AS p"
            f" WHERE p.{column} = t.{column} - 1)"
            + (" AND t.run_id IS ?" if run_id is not None else " AND ? IS NULL")
            + f" ORDER BY t.{column} LIMIT {MAX_KEYS}",
            (run_id,),
        ):
            out.append((table, key, ErrorCode.OUT_OF_ORDER, f"{column} skips: ids are dense"))
    for rule in law.INSERT_RULES:
        spec = TABLES[rule.table]
        if run_id is not None and "run_id" not in spec.columns:
            continue
        which = " ".join(f"WHEN {cond} THEN {i}" for i, (_, _, cond) in enumerate(rule.cases))
        where = [f"({rule.scope})"] if rule.scope else []
        if run_id is not None:
            where.append("t.run_id IS ?")
        # (the rowid, not the key: a covering index answers without the table's rows)
        sql = (
            f"SELECT r, b FROM (SELECT t.{spec.rowid} AS r, CASE {which} END AS b"
            f" FROM main.{rule.table} AS t {rule.join}"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f") WHERE b IS NOT NULL LIMIT {MAX_KEYS}"
        )
        for rowid, case in conn.execute(sql, (run_id,) if run_id is not None else ()).fetchall():
            code, text, _ = rule.cases[case]
            (key,) = conn.execute(
                f"SELECT {spec.key} FROM main.{rule.table} WHERE {spec.rowid} = ?", (rowid,)
            ).fetchone()
            out.append((rule.table, key, code, text))
    return out


def _first_entries(conn: sqlite3.Connection, rows: set[tuple[str, Any]]) -> dict[Any, int]:
    """(table, key) -> the seq of its first entry. A key is looked up as it is and as its
    text: a PostgreSQL mirror's journal stores an integer key's decimal digits."""
    if not rows:
        return {}
    forms = {(t, f) for t, k in rows for f in (k, str(k))}
    wanted = orjson.dumps(sorted(forms, key=repr)).decode()
    first: dict[Any, int] = {}
    for t, k, seq in conn.execute(_FIRST_ENTRIES, (wanted,)):
        at = (t, str(k))
        first[at] = min(int(seq), first.get(at, int(seq)))
    return {(t, k): first[(t, str(k))] for t, k in rows if (t, str(k)) in first}


def _hashable(key: Any) -> Any:
    return key if isinstance(key, (int, str, type(None))) else repr(key)
