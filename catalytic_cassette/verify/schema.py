"""The file against the law: header fields, every schema object, migrations and meta rows.

Nothing here trusts a name: every row of sqlite_master, SQLite's own objects included,
is compared with what the shipped migrations (the baseline and any later one) create in a
private in-memory database.
"""

from __future__ import annotations

import re
import sqlite3
from functools import lru_cache

from ..migrate import (
    APPLICATION_ID,
    FORMAT,
    current_version,
    reference_objects,
    shipped_migrations,
)
from .findings import Collector, Finding, FindingKind, Severity

# The tables SQLite itself creates when someone runs ANALYZE, exactly as it creates them
# (stat4 only in builds with SQLITE_ENABLE_STAT4): never part of a ledger. Anything else
# under such a name is an extra table like any other.
STATISTICS_TABLES = {
    "sqlite_stat1": "CREATE TABLE sqlite_stat1(tbl,idx,stat)",
    "sqlite_stat4": "CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)",
}

SchemaRow = tuple[str, str, str, str | None]


@lru_cache(maxsize=8)
def expected_objects(version: int) -> dict[tuple[str, str], SchemaRow]:
    return {(row[0], row[1]): row for row in reference_objects(version)}


def recorded_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(version) FROM cassette_migrations NOT INDEXED").fetchone()
    return int(row[0] or 0)


def check_header(conn: sqlite3.Connection, out: Collector, version: int) -> None:
    """application_id marks a ledger; user_version repeats the recorded schema version."""
    app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    user_version = conn.execute("PRAGMA user_version").fetchall()[0][0]
    if app_id != APPLICATION_ID:
        out.add(
            Finding(
                FindingKind.HEADER,
                f"application_id is {app_id:#x}, a ledger's is {APPLICATION_ID:#x}",
            )
        )
    if user_version != version:
        out.add(
            Finding(
                FindingKind.HEADER,
                f"user_version is {user_version}, the recorded schema version is {version}",
            )
        )


def check_schema(conn: sqlite3.Connection, out: Collector) -> bool:
    """Report every schema difference; True when the tables themselves are as shipped."""
    ok = True
    version = recorded_version(conn)
    latest = current_version()
    if version != latest:
        ok = False
        out.add(Finding(FindingKind.SCHEMA_VERSION, f"schema version {version}, expected {latest}"))
    check_header(conn, out, version)
    shipped = list(shipped_migrations())
    recorded = conn.execute(
        "SELECT version, name, sha256 FROM cassette_migrations NOT INDEXED ORDER BY version"
    ).fetchall()
    if [tuple(row) for row in recorded] != shipped[: len(recorded)]:
        out.add(
            Finding(
                FindingKind.SCHEMA_CHANGED,
                "cassette_migrations differs from the shipped migrations",
                table="cassette_migrations",
            )
        )
    meta = conn.execute("SELECT key, value FROM cassette_meta NOT INDEXED ORDER BY key").fetchall()
    if not meta_is_a_cassettes([(str(k), str(v)) for k, v in meta]):
        out.add(
            Finding(
                FindingKind.SCHEMA_CHANGED,
                "cassette_meta differs from a cassette's",
                table="cassette_meta",
            )
        )
    check_ledger_id(conn, out, dict((str(k), str(v)) for k, v in meta))
    expected = expected_objects(min(version, latest) or latest)
    actual = {
        (str(kind), str(name)): (
            str(kind),
            str(name),
            str(table),
            None if sql is None else str(sql),
        )
        for kind, name, table, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
        )
    }
    for key, row in expected.items():
        if key not in actual:
            ok = ok and row[0] != "table"
            out.add(
                Finding(FindingKind.SCHEMA_MISSING, f"{row[0]} {row[1]} is missing", table=row[2])
            )
        elif actual[key] != row:
            ok = ok and row[0] != "table"
            out.add(
                Finding(FindingKind.SCHEMA_CHANGED, f"{row[0]} {row[1]} was changed", table=row[2])
            )
    _check_trigger_order(conn, out, expected)
    for key, row in actual.items():
        if key in expected:
            continue
        if row[0] == "table" and STATISTICS_TABLES.get(row[1]) == row[3] and row[2] == row[1]:
            out.add(
                Finding(
                    FindingKind.PLANNER_STATISTICS,
                    f"{row[1]} holds planner statistics (ANALYZE); the package's lookups name"
                    " their indexes, so statistics cannot turn them into scans",
                    table=row[1],
                    severity=Severity.WARNING,
                )
            )
            continue
        out.add(
            Finding(
                FindingKind.SCHEMA_EXTRA,
                f"{row[0]} {row[1]} is not part of the schema",
                table=row[2],
            )
        )
    return ok


def check_ledger_id(conn: sqlite3.Connection, out: Collector, meta: dict[str, str]) -> None:
    """cassette_meta is not journaled, but seals under the default origin name the ledger
    id in journaled rows: a rewritten ledger_id no longer matches them."""
    from ..seals import ORIGIN_PREFIX

    names = conn.execute(
        "SELECT DISTINCT origin FROM cassette_seals NOT INDEXED WHERE substr(origin, 1, ?) = ?",
        (len(ORIGIN_PREFIX), ORIGIN_PREFIX),
    ).fetchall()
    expected = ORIGIN_PREFIX + meta.get("ledger_id", "")
    if any(str(name) != expected for (name,) in names):
        out.add(
            Finding(
                FindingKind.SCHEMA_CHANGED,
                "cassette_meta's ledger_id is not the one the ledger's seals name",
                table="cassette_meta",
            )
        )


def meta_is_a_cassettes(meta: list[tuple[str, str]]) -> bool:
    """('format', FORMAT) and a ledger_id of 32 lowercase hex digits."""
    if [key for key, _ in meta] != ["format", "ledger_id"] or meta[0][1] != FORMAT:
        return False
    return all(
        len(value) == 32 and all(c in "0123456789abcdef" for c in value)
        for key, value in meta
        if key == "ledger_id"
    )


def looks_like_a_ledger(conn: sqlite3.Connection) -> bool:
    """The file holds a ledger's tables, whatever its header says (a changed header on a
    ledger is tampering, not "not a cassette")."""
    names = {
        str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    return {"cassette_migrations", "cassette_journal", "cassette_meta"} <= names


_TRIGGER_EVENT = re.compile(
    r"\b(BEFORE|AFTER|INSTEAD\s+OF)?\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE
)


def _event(sql: str | None) -> str:
    """'AFTER INSERT', 'BEFORE UPDATE', ... of a CREATE TRIGGER (BEFORE when unsaid),
    read from its head only: the words before its table's ON, not its body."""
    head = re.split(r"\sON\s", sql or "", maxsplit=1, flags=re.IGNORECASE)[0]
    found = _TRIGGER_EVENT.search(head)
    if found is None:
        return "?"
    timing = " ".join((found.group(1) or "BEFORE").upper().split())
    return f"{timing} {found.group(2).upper()}"


def _check_trigger_order(
    conn: sqlite3.Connection, out: Collector, expected: dict[tuple[str, str], SchemaRow]
) -> None:
    """SQLite fires the triggers of one table and event newest first, in the order of
    their rows in sqlite_master; dropping a trigger and creating it again with the same
    text moves it to the front. That order is part of the law (which refusal a write
    gets, which statement runs first), so the triggers of each table and event must stand
    in the order the migrations create them."""
    law: dict[tuple[str, str], list[str]] = {}
    for (kind, name), row in expected.items():
        if kind == "trigger":
            law.setdefault((row[2], _event(row[3])), []).append(name)
    found: dict[tuple[str, str], list[str]] = {}
    for name, table, sql in conn.execute(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
    ):
        found.setdefault((str(table), _event(sql)), []).append(str(name))
    for (table, event), names in law.items():
        present = [name for name in found.get((table, event), []) if name in names]
        wanted = [name for name in names if name in present]
        if present != wanted:
            out.add(
                Finding(
                    FindingKind.SCHEMA_CHANGED,
                    f"the {event} triggers of {table} stand in another order than the"
                    " migrations make them, so they fire in another order",
                    table=table,
                )
            )
