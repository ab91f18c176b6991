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
A rule with a gate (readable JSON) reads its table's rows one by one only in the blocks of
rows its gate holds for: the gate, a necessary condition read once per block, is what
makes the whole tables' texts cheap to judge.

Time is the time check's (``timeline.py``): it judges each date against the ledger's time
at its seq, across tables, and its ``time_backwards`` at a seq is the finding that names
TIME_BACKWARDS (not repeated here). Its ``lease_over_cap`` at a claim is also named here as
the claim's first unlawful revision (INVALID_TTL), as the write path refuses that claim:
the step's history then starts being unlawful there, not at the next claim.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
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
        # (two queries: each alone is answered without a scan of the table)
        rows, last = (
            conn.execute(f"SELECT {what} FROM main.{table}").fetchone()[0]
            for what in ("count(*)", f"max({column})")
        )
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
        for rowid, case in broken_rows(conn, rule, run_id):
            code, text, _ = rule.cases[case]
            (key,) = conn.execute(
                f"SELECT {spec.key} FROM main.{rule.table} WHERE {spec.rowid} = ?", (rowid,)
            ).fetchone()
            out.append((rule.table, key, code, text))
    return out


def broken_rows(
    conn: sqlite3.Connection, rule: law.InsertRule, run_id: str | None = None
) -> list[tuple[int, int]]:
    """(rowid, index of the first case that holds) of at most MAX_KEYS rows that break
    ``rule`` (a gated rule's: the first in rowid order, as its scan without the gate
    reads them); with ``run_id``, of that run's rows only."""
    spec = TABLES[rule.table]
    which = " ".join(f"WHEN {cond} THEN {i}" for i, (_, _, cond) in enumerate(rule.cases))
    where = [f"({rule.scope})"] if rule.scope else []
    if run_id is not None:
        where.append("t.run_id IS ?")
    params: tuple[Any, ...] = (run_id,) if run_id is not None else ()
    if rule.gate:  # only the blocks of rows its gate holds for
        where.append(f"t.{spec.rowid} BETWEEN ? AND ?")
    # (the rowid, not the key: a covering index answers without the table's rows)
    sql = (
        f"SELECT r, b FROM (SELECT t.{spec.rowid} AS r, CASE {which} END AS b"
        f" FROM main.{rule.table} AS t {rule.join}"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f") WHERE b IS NOT NULL LIMIT {MAX_KEYS}"
    )
    if not rule.gate:
        return [(int(r), int(b)) for r, b in conn.execute(sql, params)]
    found: list[tuple[int, int]] = []
    for block in _blocks(conn, rule, run_id):
        found += ((int(r), int(b)) for r, b in conn.execute(sql, params + block))
        if len(found) >= MAX_KEYS:
            break
    return found[:MAX_KEYS]


# Rows a rule's gate is read for at once (``law.InsertRule.gate``): the gate's calls cost
# once per block, not once per row; a smaller block opens fewer rows with each broken or
# near one. Measured at 10^6 actions, the readable-JSON rule: 0.74-0.78 s of CPU at 512
# and 1,024 rows a block, 0.82-0.84 s at 128, 0.77-0.85 s at 4,096, 2.1 s row by row.
GATE_BLOCK = 512
# A gate that opens more blocks than this share of those read is not worth its cost: the
# rest of the table is judged row by row in one range.
_GATE_OPENS = 0.25
_WHOLE = (-(2**63), 2**63 - 1)


def _blocks(
    conn: sqlite3.Connection, rule: law.InsertRule, run_id: str | None
) -> Iterator[tuple[int, int]]:
    """The ranges of rowids whose rows a gated rule must read one by one, in rowid order:
    the blocks of ``GATE_BLOCK`` ids its gate holds for, or every rowid when the ids are
    too sparse for blocks to pay."""
    rowid = f"t.{TABLES[rule.table].rowid}"
    # (three queries: each alone is answered without a scan of the table)
    low, high, rows = (
        conn.execute(f"SELECT {what} FROM main.{rule.table} AS t").fetchone()[0]
        for what in (f"min({rowid})", f"max({rowid})", "count(*)")
    )
    if type(low) is not int or type(high) is not int or high - low >= 2 * rows:
        yield _WHOLE  # (empty, or sparse ids: as many blocks as ids would cost more)
        return
    # The blocks the gate holds for, in one statement: the thread reading them takes no
    # interpreter lock between blocks (a walk in another thread holds it most of the time).
    last = GATE_BLOCK - 1
    opens = conn.execute(
        f"WITH RECURSIVE b(low) AS (SELECT ? UNION ALL SELECT low + {GATE_BLOCK} FROM b"
        f" WHERE low + {GATE_BLOCK} <= ?) SELECT low FROM b WHERE (SELECT {rule.gate}"
        f" FROM main.{rule.table} AS t WHERE {rowid} BETWEEN b.low AND b.low + {last}"
        + (" AND t.run_id IS ?" if run_id is not None else "")
        + ")",
        (low, high) + ((run_id,) if run_id is not None else ()),
    )
    try:
        for opened, (start,) in enumerate(opens, 1):
            read = (start - low) // GATE_BLOCK + 1
            if opened > 8 and opened > _GATE_OPENS * read:  # the rest, row by row
                yield start, _WHOLE[1]
                return
            yield start, min(start + last, high)
    finally:
        opens.close()  # (also when the caller has found enough rows)
    # (rows below low or above high: none, by min and max)


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
