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

from catalytic_cassette import hashing
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


# ------------------------------------------------------------------ the floor
# The raw tables plus the cheapest hash-chained journal a ledger could keep in the same
# transaction: one entry per row written (the body as the package encodes it, its leaf
# and chain hash), in a plain table, by TEMP triggers as the package writes its own, with
# no guard, no Merkle tree, no check. No design that journals every row in the database
# can cost less; a target the floor itself misses is out of reach by construction.
# (A variant that built each entry in Python, json.dumps and hashlib, cost the same within
# 3 %: 725k against 744k instructions per cycle.)

CYCLE_WRITES = (
    ("cassette_steps", "UPDATE", "step_id"),
    ("cassette_receipts", "INSERT", "receipt_id"),
)
POST_WRITES = (
    ("cassette_messages", "INSERT", "message_id"),
    ("cassette_jobs", "INSERT", "job_id"),
    ("cassette_steps", "INSERT", "step_id"),
)

_FLOOR_TRIGGER = """
CREATE TEMP TRIGGER floor_{table}_{event} AFTER {event} ON main.{table}
BEGIN
    INSERT INTO floor_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', '{table}', 'op', '{event}', 'key', NEW.{key},
                                   'row', json_object({columns})) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM floor_journal) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END
"""


def add_floor_journal(conn: sqlite3.Connection, writes: tuple[tuple[str, str, str], ...]) -> None:
    """Journal every write ``(table, event, key column)`` of ``conn`` into ``floor_journal``."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS floor_journal (seq INTEGER PRIMARY KEY, body TEXT NOT NULL,"
        " leaf_hash BLOB NOT NULL, chain_hash BLOB NOT NULL) STRICT"
    )
    for name, (arity, function) in hashing.sql_functions().items():
        conn.create_function(name, arity, function, deterministic=True)
    for table, event, key in writes:
        names = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        columns = ", ".join(f"'{column}', NEW.{column}" for column in names)
        conn.execute(_FLOOR_TRIGGER.format(table=table, event=event, key=key, columns=columns))


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
