"""Anchors (migration 0004): the stored Merkle tree, its SQL guards, the backfill of an old
ledger, seals and automatic seals, portable proofs checked offline, and backups taken while
another process keeps writing."""

from __future__ import annotations

import base64
import multiprocessing as mp
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import (
    CassetteError,
    ErrorCode,
    ManualClock,
    MessageCassette,
    connect,
    merkle,
    tree,
    write_transaction,
)
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.backup import backup, restore, seal_path_for
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.connection import ledger_time
from catalytic_cassette.errors import translate
from catalytic_cassette.merkle import MemoryTree, root_from_leaves
from catalytic_cassette.migrate import APPLICATION_ID
from catalytic_cassette.note import (
    Checkpoint,
    TlogProof,
    ed25519_key_id,
    open_note,
    parse_note,
    sign_note,
)
from catalytic_cassette.proofs import (
    check_proof_file,
    prove_consistency,
    prove_inclusion,
    receipt_entry,
)
from catalytic_cassette.seals import (
    ORIGIN_PREFIX,
    AutoSeal,
    default_origin,
    latest_seal,
    record_seal,
    write_seal_file,
)
from catalytic_cassette.tree import StoredTree
from catalytic_cassette.verify import VerifyReport, verify_path

from . import backends
from .conftest import action_dict, dump, file_digest, unguarded

# Most of this module drives the SQLite tree and seal functions on a sqlite3 connection
# (record_seal, StoredTree, raw node and seal rows); PostgreSQL's counterparts are
# tests/test_postgres_anchors.py's. What goes through the package's public API runs on
# both backends (marked both_backends).

CTX = mp.get_context("spawn")
TIMEOUT = 60
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(100, 132)))
PUBLIC = KEY.public_key()
OTHER_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(200, 232)))


# ------------------------------------------------------------------------------ helpers


def _mixed_ledger(path: Path, clock: ManualClock, rounds: int) -> None:
    """Messages (plain and with jobs), claims, receipts, a release, actions with parents
    and checkpoints; about 11 journal entries a round."""
    with MessageCassette(path, clock=clock) as cassette:
        for n in range(rounds):
            cassette.post_message({"n": n}, "run", "USER", f"plain-{n}")
            cassette.post_message(
                {"jobs": [{"intent": "work", "steps": [{"n": n}, {"n": n, "k": 1}]}]},
                "run",
                "PLANNER",
            )
            step = cassette.claim_step("run", f"w{n}", 60)
            cassette.complete_step(
                "run", step["step_id"], f"w{n}", step["fencing_token"], {"n": n}, "SUCCESS"
            )
            if n % 2:
                held = cassette.claim_step("run", "releaser", 60)
                cassette.requeue(
                    "run",
                    held["step_id"],
                    worker_id="releaser",
                    fencing_token=held["fencing_token"],
                )
    with CausalChain(path, clock=clock) as chain:
        root = chain.append_action(action_dict("PlanStarted", "plan")).action_id
        for n in range(rounds):
            child = chain.append_action(action_dict("CapabilityCall", f"call{n}", root)).action_id
            chain.append_action(action_dict("CapabilityResult", f"result{n}", child))
        chain.save_checkpoint("p", {"rounds": rounds})


def _leaves(conn: sqlite3.Connection) -> list[bytes]:
    return [
        bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal ORDER BY seq")
    ]


def _nodes(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    return [
        (int(e), int(lv), bytes(h))
        for e, lv, h in conn.execute(
            "SELECT leaf_end, level, hash FROM cassette_tree_nodes ORDER BY leaf_end, level"
        )
    ]


def _expected_nodes(leaves: list[bytes]) -> list[tuple[int, int, bytes]]:
    """Every complete aligned subtree of level >= 1, keyed as the table keys it."""
    memory = MemoryTree(leaves)
    found = []
    for level in range(1, len(leaves).bit_length()):
        for index in range(len(leaves) >> level):
            found.append((tree.leaf_end(level, index), level, memory.subtree(level, index)))
    return sorted(found)


def _expected_stored(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    """The nodes the ledger stores (migration 0009): every node of its complete blocks of
    tree.GROW_BLOCK leaves and, in the last block, those within its largest seal."""
    leaves = _leaves(conn)
    limit = len(leaves) // 256 * 256  # every node of the complete blocks of 256 leaves
    return [node for node in _expected_nodes(leaves) if node[0] < limit]


def _check_tree(conn: sqlite3.Connection) -> int:
    """The stored tree is the RFC tree of the journal's leaves, at every size."""
    leaves = _leaves(conn)
    n = len(leaves)
    assert _nodes(conn) == _expected_stored(conn)
    assert n < tree.GROW_BLOCK or len(_nodes(conn)) > n // 2  # complete blocks are stored
    stored = StoredTree(conn)
    assert stored.size() == tree.size(conn) == n
    for size in range(n + 1):
        assert stored.root(size) == root_from_leaves(leaves[:size]), size
    return n


def _tree_findings(report: VerifyReport) -> list[tuple[str, int | None, Any]]:
    return [(f.kind, f.seq, f.key) for f in report.errors]


# ------------------------------------------------------------------ 1. the stored tree


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "ledger.db"
    _mixed_ledger(path, ManualClock(), rounds=24)  # past the first block of stored nodes
    return path


def test_the_stored_tree_is_the_rfc_tree_of_the_journal_at_every_size(mixed: Path) -> None:
    conn = sqlite3.connect(mixed)
    try:
        n = _check_tree(conn)
        tables = {r[0] for r in conn.execute("SELECT DISTINCT tbl FROM cassette_journal")}
    finally:
        conn.close()
    assert tree.GROW_BLOCK + 10 <= n <= 2 * tree.GROW_BLOCK
    assert {
        "cassette_messages",
        "cassette_steps",
        "cassette_receipts",
        "cassette_releases",
        "cassette_actions",
        "cassette_checkpoints",
    } <= tables


def test_every_inclusion_and_consistency_proof_verifies(mixed: Path) -> None:
    conn = sqlite3.connect(mixed)
    try:
        leaves = _leaves(conn)
        stored = StoredTree(conn)
        memory = MemoryTree(leaves)
        n = len(leaves)
        checked = 0
        roots = [root_from_leaves(leaves[:size]) for size in range(n + 1)]
        stranger = merkle.leaf_hash(b"not an entry of this ledger")
        for size in range(1, n + 1):
            for index in range(size):
                path = stored.inclusion_proof(index, size)
                assert path == memory.inclusion_proof(index, size)
                assert merkle.verify_inclusion(index, size, leaves[index], path, roots[size])
                assert not merkle.verify_inclusion(index, size, stranger, path, roots[size])
                checked += 1
            for old in range(1, size + 1):
                proof = stored.consistency_proof(old, size)
                assert proof == memory.consistency_proof(old, size)
                assert merkle.verify_consistency(old, size, roots[old], roots[size], proof)
                if old < size:
                    assert not merkle.verify_consistency(old, size, roots[old], stranger, proof)
                checked += 1
    finally:
        conn.close()
    assert checked == n * (n + 1)


def test_stored_tree_refuses_sizes_it_does_not_have(mixed: Path) -> None:
    conn = sqlite3.connect(mixed)
    try:
        stored = StoredTree(conn)
        n = stored.size()
        for call in (
            lambda: stored.root(n + 1),
            lambda: stored.root(-1),
            lambda: stored.inclusion_proof(n, n),
            lambda: stored.inclusion_proof(0, n + 1),
            lambda: stored.consistency_proof(0, n),
            lambda: stored.consistency_proof(3, 2),
            lambda: stored.consistency_proof(1, n + 1),
        ):
            with pytest.raises(CassetteError) as refused:
                call()
            assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    finally:
        conn.close()


WRITES = st.lists(
    st.one_of(
        st.tuples(st.just("post"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("complete"), st.just(0), st.just(0)),
        st.tuples(st.just("action"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("seal"), st.just(0), st.just(0)),
        st.tuples(st.just("bulk"), st.integers(1, 90), st.just(0)),  # across a block end
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=WRITES)
def test_property_stored_roots_equal_the_in_memory_tree(writes: list[tuple[str, int, int]]) -> None:
    """Any sequence of writes (posts of 0-3 jobs, claim+complete, actions, seals): after
    each, the stored tree gives the same root at every size as a MemoryTree of the leaves
    and holds exactly the nodes of its complete blocks and of its seals."""
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "ledger.db"
        clock = ManualClock()
        memory = MemoryTree()
        with CausalChain(path, clock=clock) as chain, MessageCassette(path, clock=clock) as cas:
            parents: list[str] = []
            for n, (kind, a, b) in enumerate(writes):
                if kind == "post":
                    jobs = [
                        {"intent": f"j{j}", "steps": [{"s": s} for s in range(b)]} for j in range(a)
                    ]
                    cas.post_message({"jobs": jobs} if jobs else {"n": n}, "run", "USER")
                elif kind == "complete":
                    try:
                        step = cas.claim_step("run", "w", 60)
                    except CassetteError as none:
                        assert none.code is ErrorCode.NO_PENDING_STEPS
                        continue
                    cas.complete_step(
                        "run", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
                    )
                elif kind == "action":
                    parent = parents[a % len(parents)] if parents else None
                    call = action_dict("CapabilityCall", f"f{n}", parent)
                    parents.append(chain.append_action(call).action_id)
                elif kind == "bulk":
                    cas.post_messages([({"n": n}, "run", "USER", None)] * a)
                elif memory.size:
                    record_seal(cas.conn, KEY, now_ms=clock.now_ms(), origin=None)
                for leaf in _leaves(cas.conn)[memory.size :]:
                    memory.append(leaf)
                stored = StoredTree(cas.conn)
                assert stored.size() == memory.size
                for size in range(memory.size + 1):
                    assert stored.root(size) == memory.root(size)
                assert _nodes(cas.conn) == _expected_stored(cas.conn)
            assert _nodes(cas.conn) == _expected_stored(cas.conn)


# ------------------------------------------------------- tampering with the stored tree


@pytest.fixture
def mixed_copy(mixed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy.db"
    src, dst = sqlite3.connect(mixed), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return copy


def test_an_edited_tree_node_is_a_tree_node_finding(mixed_copy: Path) -> None:
    assert verify_path(str(mixed_copy)).ok
    with unguarded(mixed_copy) as conn:
        conn.execute(
            "UPDATE cassette_tree_nodes SET hash = zeroblob(32) WHERE leaf_end = 15 AND level = 3"
        )
    assert _tree_findings(verify_path(str(mixed_copy))) == [("tree_node", 15, [15, 3])]


def test_a_deleted_tree_node_is_a_finding_and_breaks_reads(mixed_copy: Path) -> None:
    with unguarded(mixed_copy) as conn:
        conn.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end = 7 AND level = 2")
    assert _tree_findings(verify_path(str(mixed_copy))) == [("tree_node", 7, [7, 2])]
    conn = sqlite3.connect(mixed_copy)
    try:
        stored = StoredTree(conn)
        reads: list[Callable[[], object]] = [
            lambda: stored.inclusion_proof(0, 8),
            lambda: stored.consistency_proof(4, 8),
        ]
        for read in reads:
            with pytest.raises(CassetteError) as refused:
                read()
            assert refused.value.code is ErrorCode.TREE_BROKEN
            assert refused.value.detail == {"level": 2, "index": 1}
        # Roots that do not need that node still read (the size-8 root is one node).
        assert stored.root(8) == root_from_leaves(_leaves(conn)[:8])
    finally:
        conn.close()


def test_an_extra_tree_node_is_a_finding(mixed_copy: Path) -> None:
    with unguarded(mixed_copy) as conn:
        n = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
        extra = n | 1  # the first level-1 node that needs a leaf the journal lacks
        conn.execute("INSERT INTO cassette_tree_nodes VALUES (?, 1, zeroblob(32))", (extra,))
    assert _tree_findings(verify_path(str(mixed_copy))) == [("tree_node", extra, [extra, 1])]


def test_a_damaged_tree_cannot_prove_an_entry_under_its_seal(mixed_copy: Path) -> None:
    conn = connect(mixed_copy, clock=ManualClock())
    try:
        seal = record_seal(conn, KEY, now_ms=1, origin=None)
        assert prove_inclusion(conn, 0, seal.note).index == 0
    finally:
        conn.close()
    with unguarded(mixed_copy) as raw:
        raw.execute("UPDATE cassette_tree_nodes SET hash = zeroblob(32) WHERE leaf_end = 3")
    conn = connect(mixed_copy, clock=ManualClock())
    try:
        with pytest.raises(CassetteError) as refused:
            prove_inclusion(conn, 0, seal.note)
        assert refused.value.code is ErrorCode.SEAL_MISMATCH
    finally:
        conn.close()


# --------------------------------------------------------------------- 2. SQL guards


INSERT_SEAL = (
    "INSERT INTO cassette_seals (seal_id, tree_size, root_hex, origin, key_id, note, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _seal_row(conn: sqlite3.Connection, size: int, root: bytes | None = None) -> tuple[Any, ...]:
    origin = default_origin(conn)
    if root is None:
        root = StoredTree(conn).root(size) if 0 <= size <= tree.size(conn) else bytes(32)
    note = sign_note(Checkpoint(origin, max(size, 0), root).to_text(), origin, KEY).decode()
    seal_id = conn.execute("SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals").fetchone()
    return (
        seal_id[0],
        size,
        root.hex(),
        origin,
        ed25519_key_id(origin, PUBLIC).hex(),
        note,
        ledger_time(conn),
    )


def _refused(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> CassetteError:
    with pytest.raises(CassetteError) as refused, write_transaction(conn) as tx:
        tx.execute(sql, params)
    return refused.value


@pytest.fixture
def posted(cassette: MessageCassette) -> MessageCassette:
    """A sealed ledger past its first complete block of stored nodes (tree.GROW_BLOCK)."""
    cassette.post_messages([({"n": n}, "run", "USER", None) for n in range(86)])
    record_seal(cassette.conn, KEY, now_ms=1, origin=None)
    cassette.post_message({"n": 3}, "run", "USER")
    return cassette


def test_a_seal_whose_root_is_not_the_ledgers_is_refused(
    posted: MessageCassette, db_path: Path
) -> None:
    conn = posted.conn
    before = (dump(db_path), file_digest(db_path))
    size = tree.size(conn)
    for wrong in (bytes(32), StoredTree(conn).root(size - 1), StoredTree(conn).root(size)[::-1]):
        error = _refused(conn, INSERT_SEAL, _seal_row(conn, size, wrong))
        assert error.code is ErrorCode.SEAL_MISMATCH
    assert (dump(db_path), file_digest(db_path)) == before
    # The right root at the same size is accepted: the guard is not refusing everything.
    with write_transaction(conn) as tx:
        tx.execute(INSERT_SEAL, _seal_row(conn, size))
    accepted = latest_seal(conn)
    assert accepted is not None and accepted.tree_size == size


@pytest.mark.parametrize("size", ["zero", "negative", "beyond", "far_beyond"])
def test_a_seal_of_size_zero_or_beyond_the_journal_is_invalid_seal(
    posted: MessageCassette, db_path: Path, size: str
) -> None:
    """INVALID_SEAL (LAW.md section 7), whatever root it carries: the size is checked
    before the root. (Found and fixed while these tests were written: the root guard
    used to fire first and answer SEAL_MISMATCH.)"""
    conn = posted.conn
    before = (dump(db_path), file_digest(db_path))
    n = tree.size(conn)
    chosen = {"zero": 0, "negative": -1, "beyond": n + 1, "far_beyond": 2 * n}[size]
    for root in (StoredTree(conn).root(0), StoredTree(conn).root(n), bytes(32)):
        error = _refused(conn, INSERT_SEAL, _seal_row(conn, chosen, root))
        assert error.code is ErrorCode.INVALID_SEAL, root
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_seal_row_with_a_bad_origin_key_id_or_note_is_invalid_seal(
    posted: MessageCassette, db_path: Path
) -> None:
    conn = posted.conn
    before = (dump(db_path), file_digest(db_path))
    good = _seal_row(conn, tree.size(conn))
    origin = good[3]
    bad = {
        "note of another size": (
            *good[:5],
            good[5].replace(f"\n{good[1]}\n", "\n1\n", 1),
            *good[6:],
        ),
        "note of another origin": (*good[:5], "x" + good[5], *good[6:]),
        "origin with a space": (*good[:3], "a b", *good[4:]),
        "key id not hex": (*good[:4], "ABCDEFGH", *good[5:]),
    }
    assert good[5].startswith(f"{origin}\n{good[1]}\n")
    for what, row in bad.items():
        assert _refused(conn, INSERT_SEAL, row).code is ErrorCode.INVALID_SEAL, what
    assert (dump(db_path), file_digest(db_path)) == before
    with write_transaction(conn) as tx:
        tx.execute(INSERT_SEAL, good)
    assert verify_path(str(db_path), anchors=None, seal_key=PUBLIC, origin=origin).ok


def test_record_seal_refuses_what_cannot_be_sealed(cassette: MessageCassette) -> None:
    conn = cassette.conn
    with pytest.raises(CassetteError) as empty:
        record_seal(conn, KEY, now_ms=1, origin=None)
    assert empty.value.code is ErrorCode.INVALID_SEAL
    cassette.post_message({"n": 0}, "run", "USER")
    for origin, size in ((None, 0), (None, 4), (None, -1), ("has space", None), ("a+b", None)):
        with pytest.raises(CassetteError) as refused:
            record_seal(conn, KEY, now_ms=1, origin=origin, size=size)
        assert refused.value.code is ErrorCode.INVALID_SEAL, (origin, size)
    assert conn.execute("SELECT count(*) FROM cassette_seals").fetchone()[0] == 0


RAW_ATTACKS = {
    "update node": ("UPDATE cassette_tree_nodes SET hash = zeroblob(32)", "APPEND_ONLY"),
    "delete node": ("DELETE FROM cassette_tree_nodes WHERE level = 1", "APPEND_ONLY"),
    "insert node": (
        "INSERT INTO cassette_tree_nodes VALUES (1001, 1, zeroblob(32))",
        "no such function: cassette_node_hash",
    ),
    "replace node": (
        "INSERT OR REPLACE INTO cassette_tree_nodes SELECT leaf_end, level, zeroblob(32)"
        " FROM cassette_tree_nodes",
        "no such function: cassette_node_hash",
    ),
    "update seal": ("UPDATE cassette_seals SET root_hex = lower(hex(zeroblob(32)))", "APPEND_ONLY"),
    "delete seal": ("DELETE FROM cassette_seals", "APPEND_ONLY"),
    "insert seal": (
        "INSERT INTO cassette_seals SELECT seal_id + 1, tree_size, root_hex, origin, key_id,"
        " note, created_at FROM cassette_seals",
        "no such function: cassette_node_hash",
    ),
    "replace seal": (
        "INSERT OR REPLACE INTO cassette_seals SELECT * FROM cassette_seals",
        "no such function: cassette_node_hash",
    ),
}


@pytest.mark.parametrize("attack", sorted(RAW_ATTACKS))
def test_raw_connection_attacks_on_nodes_and_seals_change_nothing(
    posted: MessageCassette, db_path: Path, attack: str
) -> None:
    sql, expected = RAW_ATTACKS[attack]
    before = (dump(db_path), file_digest(db_path))
    raw = sqlite3.connect(db_path)
    try:
        with pytest.raises(sqlite3.Error) as refused:
            raw.execute(sql)
        assert str(refused.value).startswith(expected)
        if expected == "APPEND_ONLY":
            assert translate(refused.value).code is ErrorCode.APPEND_ONLY
        raw.rollback()
    finally:
        raw.close()
    assert (dump(db_path), file_digest(db_path)) == before


def test_package_connection_attacks_on_nodes_are_refused(
    posted: MessageCassette, db_path: Path
) -> None:
    conn = posted.conn
    before = (dump(db_path), file_digest(db_path))
    n = tree.size(conn)
    existing = conn.execute(
        "SELECT leaf_end, level, hash FROM cassette_tree_nodes LIMIT 1"
    ).fetchone()
    insert = "INSERT INTO cassette_tree_nodes (leaf_end, level, hash) VALUES (?, ?, ?)"
    leaves = _leaves(conn)
    attempts = [
        (insert, tuple(existing), ErrorCode.APPEND_ONLY),
        (insert.replace("INSERT", "INSERT OR REPLACE"), tuple(existing), ErrorCode.APPEND_ONLY),
        ("UPDATE cassette_tree_nodes SET hash = hash", (), ErrorCode.APPEND_ONLY),
        ("DELETE FROM cassette_tree_nodes", (), ErrorCode.APPEND_ONLY),
        # a level-1 node whose leaves do not exist yet
        (insert, (n + 1 if n % 2 == 0 else n + 2, 1, bytes(32)), ErrorCode.TREE_BROKEN),
        # an existing node again, even with another hash
        (insert, (1, 1, merkle.node_hash(leaves[1], leaves[0])), ErrorCode.APPEND_ONLY),
        # misaligned: leaves 1 and 2 are not a complete aligned subtree
        (insert, (2, 1, merkle.node_hash(leaves[1], leaves[2])), ErrorCode.TREE_BROKEN),
    ]
    for sql, params, code in attempts:
        assert _refused(conn, sql, params).code is code, (sql, params)
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_missing_node_can_only_be_put_back_as_the_hash_of_its_children(
    posted: MessageCassette, db_path: Path
) -> None:
    conn = posted.conn
    leaves = _leaves(conn)
    right = merkle.node_hash(leaves[0], leaves[1])
    with unguarded(db_path) as raw:
        raw.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end = 1 AND level = 1")
    assert _tree_findings(verify_path(str(db_path))) == [("tree_node", 1, [1, 1])]
    insert = "INSERT INTO cassette_tree_nodes (leaf_end, level, hash) VALUES (1, 1, ?)"
    for wrong in (bytes(32), merkle.node_hash(leaves[1], leaves[0]), leaves[0] + b""):
        assert _refused(conn, insert, (wrong,)).code is ErrorCode.TREE_BROKEN
    with write_transaction(conn) as tx:
        tx.execute(insert, (right,))
    assert verify_path(str(db_path)).ok


# ------------------------------------------------------------------ 3. the migration


def _load_v1(path: Path) -> None:
    """tests/data/ledger_v1.sql loaded raw, as tests/test_migrations.py does."""
    script = (Path(__file__).parent / "data" / "ledger_v1.sql").read_text()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(script)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def test_a_version_1_ledger_gets_its_whole_tree_backfilled(db_path: Path) -> None:
    _load_v1(db_path)
    raw = sqlite3.connect(db_path)
    old_leaves = _leaves(raw)
    assert (
        raw.execute("SELECT name FROM sqlite_master WHERE name = 'cassette_tree_nodes'").fetchone()
        is None
    )
    raw.close()
    assert len(old_leaves) > 20 and len(old_leaves) & (len(old_leaves) - 1)  # not a power of 2

    connect(db_path, clock=ManualClock()).close()  # migrates 1 -> current
    conn = sqlite3.connect(db_path)
    try:
        assert _leaves(conn) == old_leaves
        assert _check_tree(conn) == len(old_leaves)
        ledger_id = conn.execute(
            "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
        ).fetchone()[0]
        assert len(ledger_id) == 32 and int(ledger_id, 16) >= 0
        assert (
            conn.execute(
                "SELECT name FROM sqlite_master WHERE name = 'cassette_tree_backfill'"
            ).fetchone()
            is None
        )
    finally:
        conn.close()
    report = verify_path(str(db_path))
    assert report.ok, report.errors

    # The upgraded ledger grows its tree and seals like a new one.
    with MessageCassette(db_path, clock=ManualClock()) as cassette:
        cassette.post_message({"after": "upgrade"}, "run-v1", "USER")
        seal = record_seal(cassette.conn, KEY, now_ms=1, origin=None)
        assert seal.origin == ORIGIN_PREFIX + ledger_id
        assert seal.root == root_from_leaves(_leaves(cassette.conn)[: seal.tree_size])
        _check_tree(cassette.conn)
    assert verify_path(str(db_path)).ok


# ------------------------------------------------------------------------ 4. seals


def test_a_seal_is_a_signed_checkpoint_of_the_ledger(
    cassette: MessageCassette, db_path: Path, tmp_path: Path
) -> None:
    for n in range(5):
        cassette.post_message({"n": n}, "run", "USER")
    conn = cassette.conn
    size = tree.size(conn)
    dated = ledger_time(conn)  # a seal is dated no earlier than the ledger's latest time
    seal = record_seal(conn, KEY, now_ms=42, origin=None)
    origin = default_origin(conn)
    assert origin.startswith(ORIGIN_PREFIX) and seal.origin == origin

    note = parse_note(seal.note)
    checkpoint = Checkpoint.from_text(note.text)
    assert checkpoint == Checkpoint(origin, size, root_from_leaves(_leaves(conn)[:size]))
    assert seal.tree_size == size and seal.root == checkpoint.root
    assert note.text == f"{origin}\n{size}\n{base64.b64encode(seal.root).decode()}\n".encode()
    [signature] = note.signatures
    assert signature.key_name == origin
    assert signature.key_id == ed25519_key_id(origin, PUBLIC)
    assert seal.key_id == signature.key_id.hex()
    assert open_note(seal.note, origin, PUBLIC) == note.text
    assert seal.note == sign_note(note.text, origin, KEY)  # Ed25519 is deterministic

    # Recorded in the ledger as journal entry `size`: the seal covers the entries before it.
    row = conn.execute(
        "SELECT seal_id, tree_size, root_hex, origin, key_id, note, created_at FROM cassette_seals"
    ).fetchone()
    assert dated > 42
    assert row == (1, size, seal.root.hex(), origin, seal.key_id, seal.note.decode(), dated)
    assert latest_seal(conn) == seal
    entry = conn.execute(
        "SELECT tbl, row_key FROM cassette_journal WHERE seq = ?", (size,)
    ).fetchone()
    assert entry == ("cassette_seals", 1) and tree.size(conn) == size + 1

    written = write_seal_file(seal, tmp_path)
    assert written.name == f"{origin.replace('/', '_')}-{size:020d}.seal"
    assert written.read_bytes() == seal.note
    assert write_seal_file(seal, tmp_path) == written  # the same seal again: a no-op
    later = record_seal(conn, KEY, now_ms=43, origin=None, size=size)
    assert later.note == seal.note and later.seal_id == 2
    other = record_seal(conn, OTHER_KEY, now_ms=44, origin=None, size=size)
    with pytest.raises(CassetteError) as refused:
        write_seal_file(other, written)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert written.read_bytes() == seal.note
    report = verify_path(
        str(db_path), anchors=load_anchors(tmp_path), seal_key=PUBLIC, origin=origin
    )
    assert report.ok and [a["status"] for a in report.anchors] == ["holds"]


def test_a_seal_under_a_chosen_origin(
    cassette: MessageCassette, tmp_path: Path, db_path: Path
) -> None:
    cassette.post_message({"n": 0}, "run", "USER")
    seal = record_seal(cassette.conn, KEY, now_ms=1, origin="example.com/audit/log-1")
    assert Checkpoint.from_text(open_note(seal.note, "example.com/audit/log-1", PUBLIC)).origin == (
        "example.com/audit/log-1"
    )
    path = write_seal_file(seal, tmp_path)
    assert path.name == f"example.com_audit_log-1-{3:020d}.seal"  # message, job, step
    holds = verify_path(
        str(db_path), anchors=load_anchors(path), seal_key=PUBLIC, origin="example.com/audit/log-1"
    )
    assert holds.ok and holds.anchors[0]["status"] == "holds"
    wrong = verify_path(
        str(db_path),
        anchors=load_anchors(path),
        seal_key=PUBLIC,
        origin=default_origin(cassette.conn),
    )
    assert wrong.anchors[0]["status"] == "unknown_key" and wrong.unverifiable


def _seal_sizes(directory: Path) -> list[int]:
    return [int(p.name[-25:-5]) for p in sorted(directory.glob("*.seal"))]


@pytest.mark.both_backends
def test_auto_seal_seals_every_n_entries_and_at_close(
    db_path: Path, tmp_path: Path, clock: ManualClock
) -> None:
    """A plain message is three entries. every=5: a seal once 5 or more entries are
    unsealed (its own entry counts as sealed), and one at close; reopening and closing an
    unchanged ledger seals nothing again."""
    seals = tmp_path / "seals"
    seals.mkdir()
    with MessageCassette(db_path, clock=clock, auto_seal=AutoSeal(KEY, seals, every=5)) as cas:
        for n in range(5):
            cas.post_message({"n": n}, "run", "USER")
        assert _seal_sizes(seals) == [6, 13]
    assert _seal_sizes(seals) == [6, 13, 17]
    for _ in range(2):
        MessageCassette(db_path, clock=clock, auto_seal=AutoSeal(KEY, seals, every=5)).close()
    assert _seal_sizes(seals) == [6, 13, 17]
    recorded = backends.rows(db_path, "SELECT tree_size FROM cassette_seals ORDER BY seal_id")
    assert [size for (size,) in recorded] == [6, 13, 17]
    origin = ORIGIN_PREFIX + _ledger_id(db_path)
    report = verify_path(str(db_path), anchors=load_anchors(seals), seal_key=PUBLIC, origin=origin)
    assert report.ok and [a["status"] for a in report.anchors] == ["holds"] * 3
    assert report.anchored is not None and report.anchored["entries_after_anchor"] == 1


def _ledger_id(path: Path) -> str:
    return str(backends.rows(path, "SELECT value FROM cassette_meta WHERE key = 'ledger_id'")[0][0])


@pytest.mark.both_backends
def test_auto_seal_on_a_causal_chain_with_a_key_file(
    db_path: Path, tmp_path: Path, clock: ManualClock
) -> None:
    from catalytic_cassette.signing import generate

    key_file, pub_file = generate(str(tmp_path / "sealer"))
    seals = tmp_path / "seals"
    seals.mkdir()
    with CausalChain(db_path, clock=clock, auto_seal=AutoSeal(key_file, seals, every=4)) as chain:
        for n in range(9):
            chain.append_action(action_dict("CapabilityCall", f"f{n}"))
        chain.append_actions([action_dict("CapabilityCall", f"g{n}") for n in range(6)])
    # One entry per action: sealed at 4 (entry 4 is the seal), at 9 (4 more), then the
    # ninth action (entry 10) and six at once (entries 11-16): sealed at 17. Closing right
    # after a seal writes nothing.
    assert _seal_sizes(seals) == [4, 9, 17]
    from catalytic_cassette.signing import load_public

    report = verify_path(
        str(db_path),
        anchors=load_anchors(seals),
        seal_key=load_public(pub_file),
        origin=ORIGIN_PREFIX + _ledger_id(db_path),
    )
    assert report.ok and {a["status"] for a in report.anchors} == {"holds"}


def test_auto_seal_refuses_a_bad_setting(tmp_path: Path) -> None:
    with pytest.raises(CassetteError) as never:
        AutoSeal(KEY, tmp_path, every=0)
    assert never.value.code is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(CassetteError) as nowhere:
        AutoSeal(KEY, tmp_path / "missing")
    assert nowhere.value.code is ErrorCode.CANNOT_OPEN


# ------------------------------------------------------------------------ 5. proofs


def _small_sealed(path: Path, run: str = "r") -> tuple[bytes, bytes, int]:
    """A message completed by a worker, a few actions; sealed; more; sealed again.
    Returns (first seal note, second seal note, receipt_id)."""
    clock = ManualClock()
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"a": 1}, {"b": 2}]}]}, run, "USER"
        )
        step = cassette.claim_step(run, "w", 60)
        receipt = cassette.complete_step(
            run, step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
        )
    with CausalChain(path, clock=clock) as chain:
        root = chain.append_action(action_dict("PlanStarted", "plan")).action_id
        chain.append_action(action_dict("CapabilityCall", "call", root))
        first = record_seal(chain.conn, KEY, now_ms=clock.now_ms(), origin=None)
        chain.append_action(action_dict("CapabilityResult", "result", root))
        second = record_seal(chain.conn, KEY, now_ms=clock.now_ms(), origin=None)
        chain.append_action(action_dict("InternalStep", "after", root))
    return first.note, second.note, receipt


def _delete_ledger(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_inclusion_proofs_of_every_sealed_entry_check_offline(
    db_path: Path, tmp_path: Path
) -> None:
    first, second, receipt_id = _small_sealed(db_path)
    conn = connect(db_path, clock=ManualClock())
    try:
        origin = default_origin(conn)
        bodies = [str(r[0]) for r in conn.execute("SELECT body FROM cassette_journal ORDER BY seq")]
        sealed = Checkpoint.from_text(parse_note(second).text).size
        files = {}
        for seq in range(sealed):
            proof = prove_inclusion(conn, seq, None)  # the newest recorded seal covering it
            assert proof.checkpoint == second and proof.extra == bodies[seq].encode()
            files[seq] = tmp_path / f"entry-{seq}.proof"
            files[seq].write_bytes(proof.to_bytes())
        receipt_seq = receipt_entry(conn, receipt_id)
        under_first = prove_inclusion(conn, receipt_seq, first).to_bytes()
        with pytest.raises(CassetteError) as uncovered:
            prove_inclusion(conn, sealed, None)  # the second seal's own entry
        assert uncovered.value.code is ErrorCode.NOT_FOUND
        with pytest.raises(CassetteError) as beyond:
            prove_inclusion(conn, sealed, first)
        assert beyond.value.code is ErrorCode.INVALID_ARGUMENT
    finally:
        conn.close()
    _delete_ledger(db_path)  # everything below works from the files alone
    assert not db_path.exists()

    for seq, file in files.items():
        data = file.read_bytes()
        result = check_proof_file(data, origin, PUBLIC)
        assert result.ok and result.kind == "inclusion" and result.problem is None, seq
        assert result.detail["index"] == seq and result.detail["size"] == sealed
        assert result.detail["entry"] == bodies[seq]
        assert TlogProof.from_bytes(data).index == seq
        assert check_proof_file(data, origin, OTHER_KEY.public_key()).problem == "unknown_key"
        elsewhere = check_proof_file(data, origin + "-other", PUBLIC)
        assert not elsewhere.ok and elsewhere.problem == "unknown_key"
    checked = check_proof_file(under_first, origin, PUBLIC)
    assert checked.ok and orjson.loads(checked.detail["entry"])["table"] == "cassette_receipts"
    assert orjson.loads(checked.detail["entry"])["key"] == receipt_id


def test_a_proof_under_a_checkpoint_naming_another_origin_is_wrong_origin(db_path: Path) -> None:
    """Signed by the pinned key under the pinned name, but the checkpoint inside names
    another log: not a proof about this ledger."""
    _small_sealed(db_path)
    conn = connect(db_path, clock=ManualClock())
    try:
        origin = default_origin(conn)
        leaves = _leaves(conn)
        size = len(leaves)
        text = Checkpoint("another/log", size, root_from_leaves(leaves)).to_text()
        note = sign_note(text, origin, KEY)
        path = tuple(StoredTree(conn).inclusion_proof(0, size))
        body = str(conn.execute("SELECT body FROM cassette_journal WHERE seq = 0").fetchone()[0])
    finally:
        conn.close()
    data = TlogProof(0, path, note, body.encode()).to_bytes()
    result = check_proof_file(data, origin, PUBLIC)
    assert not result.ok and result.problem == "wrong_origin"
    honest = sign_note(Checkpoint(origin, size, root_from_leaves(leaves)).to_text(), origin, KEY)
    assert check_proof_file(TlogProof(0, path, honest, body.encode()).to_bytes(), origin, PUBLIC).ok


def test_consistency_proofs_between_seals_and_to_the_head(db_path: Path) -> None:
    first, second, _ = _small_sealed(db_path)
    conn = connect(db_path, clock=ManualClock())
    try:
        origin = default_origin(conn)
        head = tree.size(conn)
        between = prove_consistency(conn, first, second)
        to_head = prove_consistency(conn, first, None)
        second_to_head = prove_consistency(conn, second, None)
        with pytest.raises(CassetteError) as backwards:
            prove_consistency(conn, second, first)
        assert backwards.value.code is ErrorCode.INVALID_ARGUMENT
        head_root = StoredTree(conn).root(head)
    finally:
        conn.close()
    _delete_ledger(db_path)
    old_size = Checkpoint.from_text(parse_note(first).text).size
    new_size = Checkpoint.from_text(parse_note(second).text).size
    assert old_size < new_size < head

    result = check_proof_file(orjson.dumps(between), origin, PUBLIC)
    assert result.ok and result.kind == "consistency"
    assert result.detail == {
        "old_size": old_size,
        "new_size": new_size,
        "new_head_signed": True,
        "origin": origin,
    }
    for doc, old in ((to_head, old_size), (second_to_head, new_size)):
        assert doc["new_size"] == head and doc["new_root"] == head_root.hex()
        checked = check_proof_file(orjson.dumps(doc, option=orjson.OPT_INDENT_2), origin, PUBLIC)
        assert checked.ok and checked.detail["new_head_signed"] is False
        assert checked.detail["old_size"] == old
        assert check_proof_file(orjson.dumps(doc), origin, OTHER_KEY.public_key()).problem == (
            "unknown_key"
        )
        assert not check_proof_file(orjson.dumps(doc), origin + "x", PUBLIC).ok
        lying = {**doc, "new_root": bytes(32).hex()}
        assert check_proof_file(orjson.dumps(lying), origin, PUBLIC).problem == "bad_proof"
    mismatched = {**between, "new_root": to_head["new_root"], "new_size": head}
    assert check_proof_file(orjson.dumps(mismatched), origin, PUBLIC).problem == "malformed"


def test_a_seal_of_another_ledger_proves_nothing_here(db_path: Path, tmp_path: Path) -> None:
    first, _, _ = _small_sealed(db_path)
    other_path = tmp_path / "other.db"
    other_first, _, _ = _small_sealed(other_path, run="another-run")
    conn = connect(db_path, clock=ManualClock())
    try:
        assert prove_inclusion(conn, 0, first).checkpoint == first
        assert prove_consistency(conn, first, None)["old_seal"] == first.decode()
        for call in (
            lambda: prove_inclusion(conn, 0, other_first),
            lambda: prove_consistency(conn, other_first, None),
        ):
            with pytest.raises(CassetteError) as refused:
                call()
            assert refused.value.code is ErrorCode.SEAL_MISMATCH
    finally:
        conn.close()


# ---------------------------------------------------- 6. backups while another writes


def appending_writer(path: str, stop: Any, acks: Any) -> None:
    """Post messages until told to stop; count each committed post in ``acks``.

    It pauses a millisecond between posts: a writer that takes the lock again the instant
    it commits can hold off the backup's one short write (its seal) for the whole busy
    timeout, since SQLite's busy handler is not fair (seen: 6 s, thousands of posts)."""
    import time

    with MessageCassette(path) as cassette:
        n = 0
        while not stop.is_set():
            cassette.post_message({"n": n, "pad": "x" * 200}, "run-live", "WORKER", f"live-{n}")
            n += 1
            with acks.get_lock():
                acks.value = n
            time.sleep(0.001)


def _wait_for(acks: Any, count: int) -> None:
    import time

    deadline = time.monotonic() + TIMEOUT
    while acks.value < count:
        assert time.monotonic() < deadline, "the writer stopped appending"
        time.sleep(0.005)


def test_a_backup_taken_while_another_process_appends_verifies_and_restores(
    tmp_path: Path,
) -> None:
    source = tmp_path / "live.db"
    _mixed_ledger(source, ManualClock(), rounds=3)
    stop, acks = CTX.Event(), CTX.Value("i", 0)
    writer = CTX.Process(target=appending_writer, args=(str(source), stop, acks))
    writer.start()
    try:
        _wait_for(acks, 20)
        before = acks.value
        made = backup(source, tmp_path / "backup.db", KEY)
        during = acks.value - before
        _wait_for(acks, acks.value + 5)  # still appending after the backup
    finally:
        stop.set()
        writer.join(TIMEOUT)
    assert writer.exitcode == 0
    assert during > 0

    copy = Path(made["backup"])
    seal_file = seal_path_for(copy)
    assert made["seal"] == str(seal_file) and seal_file.is_file()
    origin = made["origin"]
    assert origin == ORIGIN_PREFIX + _ledger_id(source)
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert made["entries"] == tree.size(conn) == len(_leaves(conn))
        assert made["root"] == root_from_leaves(_leaves(conn)).hex()
    finally:
        conn.close()
    anchors = load_anchors(seal_file)
    report = verify_path(str(copy), anchors=anchors, seal_key=PUBLIC, origin=origin)
    assert report.ok and [a["status"] for a in report.anchors] == ["holds"]
    assert report.anchored is not None and report.anchored["entries_after_anchor"] == 0
    # The source went on: the backup is a sealed prefix of it, and the seal is recorded there.
    live = verify_path(str(source), anchors=load_anchors(seal_file), seal_key=PUBLIC, origin=origin)
    assert live.ok and live.anchors[0]["status"] == "holds"
    assert live.journal_rows > made["entries"]

    target = tmp_path / "restored.db"
    restored = restore(copy, target, PUBLIC, origin)
    assert restored == {"restored": str(target), "entries": made["entries"], "origin": origin}
    assert dump(target) == dump(copy)
    again = verify_path(
        str(target), anchors=load_anchors(seal_file), seal_key=PUBLIC, origin=origin
    )
    assert again.ok and again.anchors[0]["status"] == "holds"

    taken = file_digest(target)
    with pytest.raises(CassetteError) as exists:
        restore(copy, target, PUBLIC, origin)
    assert exists.value.code is ErrorCode.INVALID_ARGUMENT
    assert file_digest(target) == taken
    with pytest.raises(CassetteError) as twice:
        backup(source, copy, KEY)
    assert twice.value.code is ErrorCode.INVALID_ARGUMENT
    assert verify_path(str(copy), anchors=anchors, seal_key=PUBLIC, origin=origin).ok


def test_restore_with_another_key_or_origin_cannot_check_the_seal(tmp_path: Path) -> None:
    source = tmp_path / "ledger.db"
    _mixed_ledger(source, ManualClock(), rounds=1)
    made = backup(source, tmp_path / "backup.db", KEY, clock=ManualClock())
    for key, origin in ((OTHER_KEY.public_key(), made["origin"]), (PUBLIC, made["origin"] + "x")):
        target = tmp_path / "restored.db"
        with pytest.raises(CassetteError) as refused:
            restore(made["backup"], target, key, origin)
        assert (
            refused.value.code is ErrorCode.VERIFY_FAILED
            and refused.value.detail.get("unverifiable") is True
        )
        assert not target.exists()


# ------------------------------------------------- verify against seal files, in detail


def _seal_file(directory: Path, conn: sqlite3.Connection, size: int, key: Any = KEY) -> Path:
    """A seal file of the first ``size`` entries, signed without recording anything."""
    origin = default_origin(conn)
    root = root_from_leaves(_leaves(conn)[:size])
    path = directory / f"size-{size:04d}.seal"
    path.write_bytes(sign_note(Checkpoint(origin, size, root).to_text(), origin, key))
    return path


def test_fork_evidence_narrows_to_one_entry_between_two_seals(
    cassette: MessageCassette, db_path: Path, tmp_path: Path
) -> None:
    """Seals of 12 and 13 entries: entry 12 is changed. The 12 seal holds, the 13 seal is
    forked and its evidence names entry 12 with its body; a 20 seal is forked between 12
    and 20."""
    for n in range(8):
        cassette.post_message({"n": n}, "run", "USER")
    seals = tmp_path / "seals"
    seals.mkdir()
    for size in (12, 13, 20):
        _seal_file(seals, cassette.conn, size)
    origin = default_origin(cassette.conn)
    with unguarded(db_path) as raw:
        (honest,) = raw.execute("SELECT body FROM cassette_journal WHERE seq = 12").fetchone()
        body = honest.replace('{\\"n\\":4}', '{\\"n\\":5}')
        assert body != honest
        raw.execute("UPDATE cassette_journal SET body = ? WHERE seq = 12", (body,))
        (leaf,) = raw.execute("SELECT leaf_hash FROM cassette_journal WHERE seq = 12").fetchone()
    report = verify_path(str(db_path), anchors=load_anchors(seals), seal_key=PUBLIC, origin=origin)
    assert [(a["size"], a["status"]) for a in report.anchors] == [
        (12, "holds"),
        (13, "forked"),
        (20, "forked"),
    ]
    # The edited body is named by its own seq, and so is the row that no longer matches
    # its entry. (No node of these 24 entries is stored: their block of tree.GROW_BLOCK
    # leaves is incomplete and no seal is recorded in the ledger.)
    assert _tree_findings(report) == [
        ("leaf_hash", 12, 5),
        ("forked", 13, None),
        ("forked", 20, None),
        ("state_mismatch", 12, 5),
    ]
    exact = report.anchors[1]["evidence"]["first_differing_entry"]
    assert exact == {
        "at_least": 12,
        "below": 13,
        "seq": 12,
        "body": body,
        "leaf_hash": leaf.hex(),
    }
    assert report.anchors[2]["evidence"]["first_differing_entry"] == {"at_least": 12, "below": 20}
    assert report.anchored is not None and report.anchored["newest_holding_size"] == 12


@pytest.mark.parametrize("entries", [0, 3])
def test_a_signed_checkpoint_of_the_empty_tree_is_no_evidence_of_a_fork(
    cassette: MessageCassette, db_path: Path, tmp_path: Path, entries: int
) -> None:
    if entries:
        cassette.post_message({"n": 0}, "run", "USER")
    assert tree.size(cassette.conn) == entries
    seal = _seal_file(tmp_path, cassette.conn, 0)
    assert Checkpoint.from_text(parse_note(seal.read_bytes()).text).root == merkle.EMPTY_ROOT
    origin = default_origin(cassette.conn)
    report = verify_path(str(db_path), anchors=load_anchors(seal), seal_key=PUBLIC, origin=origin)
    assert report.anchors[0]["status"] == "holds"
    assert report.ok and not report.unverifiable


def test_recorded_seals_are_checked_against_their_notes(
    posted: MessageCassette, db_path: Path
) -> None:
    """SQL checks a recorded seal's root and the start of its note; verify checks the rest:
    a note that is no signed note, or one whose root differs from the row's, is a
    seal_mismatch; with the key pinned, a bad signature too. A seal by another key is
    someone else's business (not a finding)."""
    conn = posted.conn
    size = tree.size(conn)
    good = _seal_row(conn, size)
    origin = good[3]
    other_root = StoredTree(conn).root(size - 1)
    not_a_note = f"{origin}\n{size}\nnot base64\n"
    wrong_root = sign_note(Checkpoint(origin, size, other_root).to_text(), origin, KEY).decode()
    text, _, sig_line = good[5].rpartition("\n\n")
    bad_sig = (
        text
        + "\n\n"
        + sig_line.replace(sig_line[-6:-2], "AAAA" if sig_line[-6:-2] != "AAAA" else "BBBB")
    )
    by_other = sign_note(
        Checkpoint(origin, size, StoredTree(conn).root(size)).to_text(), origin, OTHER_KEY
    )
    for note in (not_a_note, wrong_root, bad_sig, by_other.decode()):
        row = _seal_row(conn, size)
        with write_transaction(conn) as tx:
            tx.execute(INSERT_SEAL, (*row[:5], note, row[6]))
    ids = [r[0] for r in conn.execute("SELECT seal_id FROM cassette_seals ORDER BY seal_id")]
    assert len(ids) == 5  # the fixture's own seal, then the four above
    plain = verify_path(str(db_path))
    assert _tree_findings(plain) == [
        ("seal_mismatch", None, ids[1]),
        ("seal_mismatch", None, ids[2]),
    ]
    pinned = verify_path(str(db_path), anchors=None, seal_key=PUBLIC, origin=origin)
    assert _tree_findings(pinned) == [
        ("seal_mismatch", None, ids[1]),
        ("seal_mismatch", None, ids[2]),
        ("seal_mismatch", None, ids[3]),
    ]


def test_a_backup_of_a_ledger_that_fails_verify_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    source = tmp_path / "ledger.db"
    _mixed_ledger(source, ManualClock(), rounds=1)
    with unguarded(source) as raw:
        raw.execute("UPDATE cassette_receipts SET outcome = 'FAILURE'")
    target = tmp_path / "backup.db"
    with pytest.raises(CassetteError) as refused:
        backup(source, target, KEY, clock=ManualClock())
    assert refused.value.code is ErrorCode.VERIFY_FAILED
    assert "state_mismatch" in refused.value.message
    assert not target.exists() and not seal_path_for(target).exists()
    conn = sqlite3.connect(source)
    try:  # nothing was sealed for it either
        assert conn.execute("SELECT count(*) FROM cassette_seals").fetchone()[0] == 0
    finally:
        conn.close()


def test_verify_against_seals_needs_a_pinned_key_and_origin_and_some_seals(
    mixed: Path, tmp_path: Path
) -> None:
    conn = sqlite3.connect(mixed)
    try:
        seal = _seal_file(tmp_path, conn, 5)
    finally:
        conn.close()
    for key, origin in ((PUBLIC, None), (None, "o"), (None, None)):
        with pytest.raises(CassetteError) as refused:
            verify_path(str(mixed), anchors=load_anchors(seal), seal_key=key, origin=origin)
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    empty = tmp_path / "no-seals"
    empty.mkdir()
    for missing in (empty, tmp_path / "nothing.seal"):
        with pytest.raises(CassetteError) as none:
            load_anchors(missing)
        assert none.value.code is ErrorCode.NOT_FOUND
