"""The stored tree heals (``sql/sqlite/schema/50_journal.sql``), and the write path's other
derived state, attacked by a client with its own TEMP triggers on a package connection.

SQLite runs a connection's TEMP triggers before the file's, the newest BEFORE trigger first,
and RAISE(IGNORE) in an AFTER trigger ends the row's remaining triggers with the row kept.
The attacker here controls its own process: it adds a TEMP trigger and then records the
TEMP schema as installed again, so the package's own check (``temp_objects``, which stops a
careless client) does not stop it. Each test asserts what it leaves behind, and that honest
writers on another connection keep working.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import ErrorCode, ManualClock, MessageCassette, tree
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.merkle import MemoryTree
from catalytic_cassette.seals import record_seal
from catalytic_cassette.temp_objects import TempSchema
from catalytic_cassette.tree import GROW_BLOCK
from catalytic_cassette.verify import verify_path

from .conftest import action_dict

pytestmark = pytest.mark.sqlite_only(
    reason="SQLite's TEMP triggers and its stored tree nodes; PostgreSQL"
    " stores no tree node, and its owner's disabled triggers are judged by verify"
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(7, 39)))
SKIP_BLOCK_END = (
    "CREATE TEMP TRIGGER skip_block AFTER INSERT ON main.cassette_journal"
    " WHEN NEW.seq % 256 = 255 BEGIN SELECT RAISE(IGNORE); END"
)


def _hostile(conn: sqlite3.Connection, *triggers: str) -> sqlite3.Connection:
    """The attacker: its own TEMP triggers on a package connection, past the package's check."""
    for sql in triggers:
        conn.execute(sql)
    conn.temp_schema = TempSchema(conn)  # type: ignore[attr-defined]
    return conn


def _entries(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])


def _append(chain: CausalChain, count: int, name: str) -> None:
    chain.append_actions([action_dict("CapabilityCall", f"{name}{n}") for n in range(count)])


def _to_block_end(chain: CausalChain, name: str) -> None:
    """Append until the journal's last entry ends a block (this writer writes that entry)."""
    _append(chain, GROW_BLOCK - _entries(chain.conn) % GROW_BLOCK, name)


def _nodes(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    rows = conn.execute("SELECT leaf_end, level, hash FROM cassette_tree_nodes ORDER BY 1, 2")
    return [(int(e), int(lv), bytes(h)) for e, lv, h in rows]


def _by_the_rule(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    """Every node of every complete block, as verify rebuilds them from the leaves."""
    leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
    memory, limit = MemoryTree(leaves), len(leaves) // GROW_BLOCK * GROW_BLOCK
    return sorted(
        (tree.leaf_end(level, index), level, memory.subtree(level, index))
        for level in range(1, len(leaves).bit_length())
        for index in range(len(leaves) >> level)
        if tree.leaf_end(level, index) < limit
    )


def _tree_findings(path: Path) -> list[object]:
    return [f.key for f in verify_path(str(path)).errors if f.kind == "tree_node"]


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, CausalChain, CausalChain]:
    path, clock = tmp_path / "ledger.db", ManualClock()
    return path, CausalChain(path, clock=clock), CausalChain(path, clock=clock)


def test_a_block_skipped_at_its_end_heals_at_the_next_and_honest_writers_go_on(
    two: tuple[Path, CausalChain, CausalChain],
) -> None:
    path, attacker, honest = two
    _hostile(attacker.conn, SKIP_BLOCK_END)
    _append(honest, 100, "h")
    _to_block_end(attacker, "a")
    assert _nodes(honest.conn) == []  # the block was stored without its nodes
    assert _tree_findings(path)[:3] == [[1, 1], [3, 1], [3, 2]]  # verify says so meanwhile
    _append(honest, 2 * GROW_BLOCK + 10, "h")  # (before 0012: NOT NULL failed at 511)
    assert _nodes(honest.conn) == _by_the_rule(honest.conn)
    assert _tree_findings(path) == []
    record_seal(honest.conn, KEY, now_ms=1, origin=None)
    attacker.close()
    honest.close()
    assert verify_path(str(path)).ok


def test_an_attacker_that_skips_every_block_it_ends_blocks_nobody(
    two: tuple[Path, CausalChain, CausalChain],
) -> None:
    """Whoever ends the next block heals the run of skipped blocks before it, oldest first;
    each skipped block is healed once."""
    path, attacker, honest = two
    _hostile(attacker.conn, SKIP_BLOCK_END)
    for round_ in range(5):
        _append(honest, 37, f"h{round_}-")
        _to_block_end(attacker, f"a{round_}-")
        if round_ == 2:  # an honest block end in between heals the three before it
            _append(honest, 40, "x")
            _to_block_end(honest, "x")
            assert _nodes(honest.conn) == _by_the_rule(honest.conn)
    assert len(_tree_findings(path)) > 0
    _append(honest, 3, "y")
    _to_block_end(honest, "y")
    assert _entries(honest.conn) == 7 * GROW_BLOCK  # five skipped, two healing
    assert _nodes(honest.conn) == _by_the_rule(honest.conn)
    assert _tree_findings(path) == []


def test_a_node_kept_from_the_store_never_fails_an_append_and_the_seal_stores_it(
    two: tuple[Path, CausalChain, CausalChain],
) -> None:
    """A TEMP BEFORE trigger on the nodes drops the level 9 node its block end builds: the
    nodes above it wait instead of failing later appends, and the seal stores them."""
    path, attacker, honest = two
    _hostile(
        attacker.conn,
        "CREATE TEMP TRIGGER drop_node BEFORE INSERT ON main.cassette_tree_nodes"
        " WHEN NEW.level = 9 BEGIN SELECT RAISE(IGNORE); END",
    )
    _append(honest, GROW_BLOCK, "h")
    _to_block_end(attacker, "a")  # ends block 1: its level 9 node is dropped
    _append(honest, 2 * GROW_BLOCK + 5, "h")  # ends block 3, whose level 10 needs it
    assert _entries(honest.conn) == 4 * GROW_BLOCK + 5
    assert _tree_findings(path) == [[511, 9], [1023, 10]]
    assert tree.missing_nodes(honest.conn, _entries(honest.conn)) == [(511, 9), (1023, 10)]
    seal = record_seal(honest.conn, KEY, now_ms=1, origin=None)
    assert seal.tree_size == _entries(honest.conn) - 1
    assert _nodes(honest.conn) == _by_the_rule(honest.conn)
    assert _tree_findings(path) == []


def test_level_1_nodes_stored_without_the_nodes_above_them_are_completed_by_the_seal(
    two: tuple[Path, CausalChain, CausalChain],
) -> None:
    """The attacker skips its block end, then stores the block's level-1 nodes by hand
    with the trigger that builds above them skipped: no level 8 node, so later blocks
    cannot build on it; they wait, appends go on, and the seal completes the tree."""
    path, attacker, honest = two
    _hostile(
        attacker.conn,
        SKIP_BLOCK_END,
        "CREATE TEMP TRIGGER skip_grow AFTER INSERT ON main.cassette_tree_nodes"
        " BEGIN SELECT RAISE(IGNORE); END",
    )
    _to_block_end(attacker, "a")
    attacker.conn.execute(
        "INSERT INTO cassette_tree_nodes (leaf_end, level, hash)"
        " SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)"
        " FROM cassette_journal AS r JOIN cassette_journal AS l ON l.seq = r.seq - 1"
        " WHERE r.seq % 2 = 1 ORDER BY r.seq"
    )
    assert {level for _, level, _ in _nodes(attacker.conn)} == {1}
    _append(honest, 3 * GROW_BLOCK, "h")  # two more block ends, each needing block 0
    missing = tree.missing_nodes(honest.conn, _entries(honest.conn))
    assert (255, 8) in missing and (1023, 10) in missing
    assert _tree_findings(path) == [list(node) for node in missing][:100]  # (verify's cap)
    record_seal(honest.conn, KEY, now_ms=1, origin=None)
    assert _nodes(honest.conn) == _by_the_rule(honest.conn)
    assert tree.missing_nodes(honest.conn, _entries(honest.conn)) == []


def test_a_complete_tree_needs_one_read_per_bit_to_know_it(
    two: tuple[Path, CausalChain, CausalChain],
) -> None:
    _, _, honest = two
    _append(honest, 5 * GROW_BLOCK + 3, "h")
    reads: list[str] = []
    size = _entries(honest.conn)
    honest.conn.set_trace_callback(reads.append)
    assert tree.missing_nodes(honest.conn, size) == []
    honest.conn.set_trace_callback(None)
    assert len(reads) == bin(5).count("1")


# ------------------------------------------------- the other AFTER triggers of a write


def _run(path: Path, clock: ManualClock) -> MessageCassette:
    cassette = MessageCassette(path, clock=clock)
    for n in range(3):
        cassette.post_message({"n": n}, "r", "USER")
    return cassette


def test_a_receipt_whose_commit_is_skipped_leaves_only_its_own_step_leased(
    tmp_path: Path,
) -> None:
    """cassette_receipts_commit_step skipped: the receipt is stored and its step stays
    LEASED. Only that step is held (its one receipt exists, so it can never be completed
    again); every other step, run and writer goes on."""
    path, clock = tmp_path / "ledger.db", ManualClock()
    honest = _run(path, clock)
    attacker = MessageCassette(path, clock=clock)
    _hostile(
        attacker.conn,
        "CREATE TEMP TRIGGER skip_commit AFTER INSERT ON main.cassette_receipts"
        " BEGIN SELECT RAISE(IGNORE); END",
    )
    lease = attacker.claim_step("r", "mallory", 60)
    attacker.complete_step("r", lease["step_id"], "mallory", lease["fencing_token"], {}, "SUCCESS")
    status = honest.conn.execute(
        "SELECT status FROM cassette_steps WHERE step_id = ?", (lease["step_id"],)
    ).fetchone()[0]
    assert status == "LEASED"
    honest.post_message({"n": 9}, "other", "USER")
    done = 0
    while True:
        try:
            step = honest.claim_step("r", "w", 60)
        except CassetteError as none_left:
            assert none_left.code is ErrorCode.NO_PENDING_STEPS
            break
        honest.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
        done += 1
    assert done == 2
    step = honest.claim_step("other", "w", 60)
    honest.complete_step("other", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    attacker.close()
    honest.close()
    found = verify_path(str(path)).errors
    # receipt 1: its step is not COMMITTED (the state), and its entry is not followed by
    # the step's commit (the history judge names the rule)
    assert sorted((f.kind, f.key) for f in found) == [
        ("receipt_mismatch", 1),
        ("unlawful_history", 1),
    ], found
    (judged,) = (f for f in found if f.kind == "unlawful_history")
    assert judged.table == "cassette_receipts" and judged.detail.startswith("RECEIPT_REQUIRED")


def test_a_release_whose_requeue_is_skipped_holds_only_its_step_until_expiry(
    tmp_path: Path,
) -> None:
    """cassette_releases_requeue_step skipped: the release is stored and the step stays
    LEASED, as if its holder had kept the lease to its expiry (which it may); then any
    writer requeues it, and nothing else was held."""
    path, clock = tmp_path / "ledger.db", ManualClock()
    honest = _run(path, clock)
    attacker = MessageCassette(path, clock=clock)
    _hostile(
        attacker.conn,
        "CREATE TEMP TRIGGER skip_requeue AFTER INSERT ON main.cassette_releases"
        " BEGIN SELECT RAISE(IGNORE); END",
    )
    lease = attacker.claim_step("r", "mallory", 600)
    attacker.requeue(
        "r", lease["step_id"], worker_id="mallory", fencing_token=lease["fencing_token"]
    )
    assert (
        honest.conn.execute(
            "SELECT status FROM cassette_steps WHERE step_id = ?", (lease["step_id"],)
        ).fetchone()[0]
        == "LEASED"
    )
    for _ in range(2):
        step = honest.claim_step("r", "w", 60)
        honest.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    clock.advance(601_000)
    requeued = honest.requeue("r")
    assert [r["step_id"] for r in requeued] == [lease["step_id"]]
    step = honest.claim_step("r", "w", 60)
    honest.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    attacker.close()
    honest.close()
