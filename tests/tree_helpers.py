"""Shared by the attack tests of migration 0009: a ledger grown to a number of journal
entries, its stored tree nodes, and attacker (b)'s look-alike connection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from catalytic_cassette import ManualClock, sqlfiles
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.connection import register_functions

from .conftest import action_dict

SEAL_INSERT = (
    "INSERT INTO cassette_seals (seal_id, tree_size, root_hex, origin, key_id, note,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def entries(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])


def grow(path: Path, clock: ManualClock, count: int) -> None:
    """Actions (one journal entry each) until the journal has ``count`` entries."""
    with CausalChain(path, clock=clock, durability="normal") as chain:
        missing = count - entries(chain.conn)
        assert missing >= 0
        if missing:
            chain.append_actions([action_dict("CapabilityCall", f"f{n}") for n in range(missing)])
        assert entries(chain.conn) == count


def nodes(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    return [
        (int(e), int(lv), bytes(h))
        for e, lv, h in conn.execute(
            "SELECT leaf_end, level, hash FROM cassette_tree_nodes ORDER BY leaf_end, level"
        )
    ]


def look_alike(path: Path, clock: ManualClock) -> sqlite3.Connection:
    """Attacker (b): a plain sqlite3 connection (default PRAGMAs) with the package's
    functions registered and its TEMP triggers installed: every rule of the file runs,
    and any function can then be replaced."""
    conn = sqlite3.connect(path, isolation_level=None)
    register_functions(conn, clock)
    for statement in sqlfiles.connection_statements():
        conn.execute(statement)
    return conn
