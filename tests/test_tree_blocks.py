"""The Merkle tree stored a block of tree.GROW_BLOCK leaves at a time (migration 0009).

What the database stores is exact: every node of every complete block, and none of the
last, incomplete block, which nobody may store. Reads and the seal guard compute those from
the leaves; verify names any node that differs from that rule, whoever put it there
(LAW.md section 8a).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import ErrorCode, ManualClock, MessageCassette, merkle, tree
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.connection import write_transaction
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.merkle import MemoryTree
from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
from catalytic_cassette.tree import GROW_BLOCK, StoredTree
from catalytic_cassette.verify import verify_path

from .conftest import action_dict, dump, file_digest, unguarded

pytestmark = pytest.mark.sqlite_only(
    reason="the Merkle tree SQLite stores by blocks (migration 0009); PostgreSQL stores no"
    " node, its tree is rebuilt from the journal's bodies (test_anchors runs on both)"
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(40, 72)))


def _entries(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])


def _grow_to(cassette: MessageCassette, entries: int) -> None:
    """Actions (one journal entry each) until the journal has ``entries`` entries."""
    missing = entries - _entries(cassette.conn)
    assert missing >= 0
    if missing:
        with CausalChain(cassette.db_path, clock=cassette.clock) as chain:
            chain.append_actions([action_dict("CapabilityCall", f"f{n}") for n in range(missing)])
    assert _entries(cassette.conn) == entries


def _nodes(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    return [
        (int(e), int(lv), bytes(h))
        for e, lv, h in conn.execute(
            "SELECT leaf_end, level, hash FROM cassette_tree_nodes ORDER BY leaf_end, level"
        )
    ]


def _all_nodes(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    """Every complete aligned subtree of the journal's leaves (level >= 1)."""
    leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
    memory = MemoryTree(leaves)
    return sorted(
        (tree.leaf_end(level, index), level, memory.subtree(level, index))
        for level in range(1, len(leaves).bit_length())
        for index in range(len(leaves) >> level)
    )


def _stored_by_rule(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    limit = _entries(conn) // 256 * 256  # every node of the complete blocks of 256 leaves
    return [node for node in _all_nodes(conn) if node[0] < limit]


def _tree_findings(path: Path) -> list[tuple[str, object]]:
    return [(f.kind, f.key) for f in verify_path(str(path)).errors]


def test_a_block_stores_its_nodes_when_its_last_entry_is_written(
    cassette: MessageCassette,
) -> None:
    conn = cassette.conn
    _grow_to(cassette, GROW_BLOCK - 1)
    assert _nodes(conn) == []  # nothing stored before the block completes
    _grow_to(cassette, GROW_BLOCK)
    assert _nodes(conn) == _all_nodes(conn)
    assert len(_nodes(conn)) == GROW_BLOCK - 1  # levels 1 to 8 of one block
    _grow_to(cassette, 2 * GROW_BLOCK + 7)
    assert _nodes(conn) == _stored_by_rule(conn)
    assert (2 * GROW_BLOCK - 1, 9) in {node[:2] for node in _nodes(conn)}  # above a block
    _grow_to(cassette, 4 * GROW_BLOCK)
    assert _nodes(conn) == _all_nodes(conn)
    assert max(level for _, level, _ in _nodes(conn)) == 10


def test_reads_compute_the_last_blocks_nodes_from_its_leaves(cassette: MessageCassette) -> None:
    conn = cassette.conn
    _grow_to(cassette, GROW_BLOCK + 77)
    leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
    memory, stored = MemoryTree(leaves), StoredTree(conn)
    for size in (1, 2, 77, GROW_BLOCK, GROW_BLOCK + 1, GROW_BLOCK + 64, len(leaves)):
        assert stored.root(size) == memory.root(size), size
    for index in (0, GROW_BLOCK - 1, GROW_BLOCK, len(leaves) - 1):
        assert stored.inclusion_proof(index, len(leaves)) == memory.inclusion_proof(
            index, len(leaves)
        )
    assert stored.consistency_proof(GROW_BLOCK + 5, len(leaves)) == memory.consistency_proof(
        GROW_BLOCK + 5, len(leaves)
    )


def test_a_seal_stores_no_node_and_checks_the_last_block_from_its_leaves(
    cassette: MessageCassette, db_path: Path
) -> None:
    conn = cassette.conn
    _grow_to(cassette, GROW_BLOCK + 40)
    before = _nodes(conn)
    seal = record_seal(conn, KEY, now_ms=1, origin=None)
    assert seal.tree_size == GROW_BLOCK + 40
    assert _nodes(conn) == before == _stored_by_rule(conn)  # the first block only
    assert verify_path(str(db_path)).ok
    for size in (GROW_BLOCK + 1, GROW_BLOCK + 2, GROW_BLOCK + 33, 2 * GROW_BLOCK - 1):
        _grow_to(cassette, max(size, _entries(conn)))
        assert record_seal(conn, KEY, now_ms=1, origin=None, size=size).tree_size == size
    _grow_to(cassette, 2 * GROW_BLOCK)  # the block completes: now its nodes are stored
    assert _nodes(conn) == _all_nodes(conn)
    assert verify_path(str(db_path)).ok


def test_a_seal_row_written_in_sql_is_checked_against_the_leaves_of_the_last_block(
    cassette: MessageCassette,
) -> None:
    """The rule is the database's: a package connection inserting the seal row itself
    (not through record_seal) is held to the same root, and stores nothing."""
    conn = cassette.conn
    _grow_to(cassette, GROW_BLOCK + 21)
    size = GROW_BLOCK + 21
    root = StoredTree(conn).root(size)
    row = conn.execute(
        "SELECT ?, ?, ?, 'o', '00000000', 'o' || char(10) || ? || char(10), ms"
        " FROM cassette_ledger_time",
        (1, size, root.hex(), size),
    ).fetchone()
    insert = (
        "INSERT INTO cassette_seals (seal_id, tree_size, root_hex, origin, key_id, note,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    before = _nodes(conn)
    for wrong in (bytes(32), StoredTree(conn).root(size - 1), root[::-1]):
        with pytest.raises(CassetteError) as refused, write_transaction(conn) as tx:
            tx.execute(insert, (*row[:2], wrong.hex(), *row[3:]))
        assert refused.value.code is ErrorCode.SEAL_MISMATCH
    with write_transaction(conn) as tx:
        tx.execute(insert, row)
    assert _nodes(conn) == before == _stored_by_rule(conn)


def test_a_deleted_node_is_reported(cassette: MessageCassette, db_path: Path) -> None:
    _grow_to(cassette, GROW_BLOCK + 40)
    record_seal(cassette.conn, KEY, now_ms=1, origin=None)
    cassette.close()
    with unguarded(db_path) as raw:
        deleted = raw.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end = 15 AND level = 3")
        assert deleted.rowcount == 1
    assert _tree_findings(db_path) == [("tree_node", [15, 3])]


def test_no_node_of_the_incomplete_block_can_be_stored(
    cassette: MessageCassette, db_path: Path
) -> None:
    """Not even a right one through the package's own connection: nobody stores a node
    over other writers' entries before their block completes them. One planted with the
    triggers dropped is reported, right hash or not."""
    _grow_to(cassette, GROW_BLOCK + 40)
    leaves = [bytes(r[0]) for r in cassette.conn.execute("SELECT leaf_hash FROM cassette_journal")]
    node = merkle.node_hash(leaves[GROW_BLOCK], leaves[GROW_BLOCK + 1])
    insert = "INSERT INTO cassette_tree_nodes (leaf_end, level, hash) VALUES (?, 1, ?)"
    before = (dump(db_path), file_digest(db_path))
    with pytest.raises(CassetteError) as refused, write_transaction(cassette.conn) as tx:
        tx.execute(insert, (GROW_BLOCK + 1, node))
    assert refused.value.code is ErrorCode.TREE_BROKEN
    assert (dump(db_path), file_digest(db_path)) == before
    cassette.close()
    with unguarded(db_path) as raw:
        raw.execute(insert, (GROW_BLOCK + 1, node))
    findings = verify_path(str(db_path)).errors
    assert [(f.kind, f.key) for f in findings] == [("tree_node", [GROW_BLOCK + 1, 1])]
    assert "incomplete last block" in findings[0].detail


def test_a_block_whose_nodes_are_not_stored_refuses_its_append(
    cassette: MessageCassette, db_path: Path
) -> None:
    """Fail closed: with the trigger that stores the nodes above level 1 dropped (DDL,
    attacker a), the append that ends a block is refused rather than leave it without
    its root, and the file is as it was."""
    _grow_to(cassette, GROW_BLOCK - 1)
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("DROP TRIGGER cassette_tree_nodes_grow")
    raw.close()
    before = (dump(db_path), file_digest(db_path))
    with pytest.raises(CassetteError) as refused:
        _grow_to(cassette, GROW_BLOCK)
    assert refused.value.code is ErrorCode.TREE_BROKEN
    assert not cassette.conn.in_transaction
    assert (dump(db_path), file_digest(db_path)) == before
    assert "schema_missing" in {f.kind for f in verify_path(str(db_path)).errors}


def test_a_raw_connection_cannot_add_a_node(cassette: MessageCassette, db_path: Path) -> None:
    _grow_to(cassette, 5)
    cassette.close()
    before = (dump(db_path), file_digest(db_path))
    raw = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.OperationalError, match="no such function"):
        raw.execute("INSERT INTO cassette_tree_nodes VALUES (1, 1, zeroblob(32))")
    raw.rollback()
    raw.close()
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_ledger_sealed_inside_its_last_block_keeps_its_seals_and_stores_by_the_rule(
    tmp_path: Path,
) -> None:
    """Every node of the complete blocks is stored and none of the last block; a seal made
    inside that block still holds once it completes, and the next block completes as any
    other."""
    db_path, seals = tmp_path / "ledger.db", tmp_path / "seals"
    seals.mkdir()
    clock = ManualClock()
    with MessageCassette(db_path, clock=clock) as cassette:
        _grow_to(cassette, GROW_BLOCK + 30)
        write_seal_file(record_seal(cassette.conn, KEY, now_ms=clock.now_ms(), origin=None), seals)
        _grow_to(cassette, GROW_BLOCK + 90)
        origin = default_origin(cassette.conn)
        conn = cassette.conn
        assert _nodes(conn) == _stored_by_rule(conn)
        assert set(_nodes(conn)) < set(_all_nodes(conn))
        assert max(end for end, _, _ in _nodes(conn)) == GROW_BLOCK - 1  # the complete block
        anchored = verify_path(
            str(db_path), anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=origin
        )
        assert anchored.ok and anchored.anchored, anchored.to_dict()
        _grow_to(cassette, 2 * GROW_BLOCK + 3)
        assert _nodes(conn) == _stored_by_rule(conn)
    assert verify_path(str(db_path)).ok
