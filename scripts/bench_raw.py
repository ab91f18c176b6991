"""The raw sqlite3 baseline of the benchmarks: the package's own tables and indexes, no law.

Issue 12 compares the ledger with "raw with the same tables and the same indexes". The
baseline file is therefore made by the package itself (every migration applied), and then
every trigger in it is dropped: what is left is each table exactly as the ledger declares
it (columns, CHECK and UNIQUE constraints) with every index, including the partial and
expression ones. Nothing writes the journal, the Merkle tree or any guard's lookups. The
baseline's connection gets the package's connection settings that cost or save I/O (WAL,
`synchronous`, `wal_autocheckpoint`), so only the law differs. Because the schema is the
migrated one, a new migration's table or index reaches the baseline without an edit here.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalytic_cassette.connection import WAL_AUTOCHECKPOINT_PAGES, connect

SYNC = {"full": "FULL", "normal": "NORMAL"}


def create(path: Path) -> None:
    """A new file with the package's migrated schema and none of its triggers."""
    connect(path, durability="normal").close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        triggers = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'trigger'")
        for (name,) in triggers.fetchall():
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


def connect_raw(path: Path, durability: str) -> sqlite3.Connection:
    """A plain sqlite3 connection with the package's I/O settings and nothing else: no
    SQL functions, no TEMP triggers, foreign keys off (as any raw connection)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute(f"PRAGMA synchronous = {SYNC[durability]}").fetchall()
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}").fetchall()
    return conn


def ledger(path: Path, durability: str) -> sqlite3.Connection:
    create(path)
    return connect_raw(path, durability)


def describe(path: Path, tables: tuple[str, ...]) -> list[str]:
    """What the baseline carries for the tables a workload writes: one line per table
    with its indexes (automatic ones for UNIQUE and PRIMARY KEY constraints included)."""
    conn = sqlite3.connect(path)
    try:
        lines = []
        for table in tables:
            indexes = [row[1] for row in conn.execute(f"PRAGMA index_list('{table}')")]
            triggers = conn.execute(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = ?",
                (table,),
            ).fetchone()[0]
            lines.append(
                f"{table}: {len(indexes)} indexes ({', '.join(sorted(indexes))}),"
                f" {triggers} triggers"
            )
        return lines
    finally:
        conn.close()
