"""The SQLite write path attacked: the stored Merkle tree, one time per transaction, the
journal's head and batched inserts (``sql/sqlite/schema/50_journal.sql``, ``10_ledger.sql``).

Four rules are attacked here, each as the attackers of LAW.md section 12 would:

1. the Merkle tree stored a block of 256 leaves at a time (``cassette_journal_grow_tree``,
   ``cassette_tree_nodes_grow``, the tail stored by ``cassette_seals_insert_guard``) and
   verify's exact rule for the stored set;
2. one time per write transaction (``cassette_transaction_ms()``);
3. the journal head read by ``max(seq)`` over the table itself;
4. batches inserted 32 rows per statement.

Two attacks worked against a first form of the block rule (a connection with
recursive_triggers=OFF left blocks incomplete and honest seals refused for good; a seal
guard re-created with its own text fired before the tail was stored, unseen by verify);
both are fixed and their tests below now assert what the law promises. Every other test
documents a refusal (its code) or a detection (verify's finding, exit 1), and that the
ledger still works afterwards.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import (
    CassetteError,
    ErrorCode,
    ManualClock,
    MessageCassette,
    merkle,
    tree,
)
from catalytic_cassette.actions import format_v4
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.connection import write_transaction
from catalytic_cassette.merkle import MemoryTree
from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
from catalytic_cassette.tree import GROW_BLOCK, StoredTree
from catalytic_cassette.verify import verify_path

from .conftest import action_dict, dump, file_digest, unguarded
from .tree_helpers import SEAL_INSERT
from .tree_helpers import entries as _entries
from .tree_helpers import grow as _grow
from .tree_helpers import look_alike as _look_alike
from .tree_helpers import nodes as _nodes

pytestmark = pytest.mark.sqlite_only(
    reason=(
        "attacks on the SQLite write path's SQL through sqlite3 connections and the file; "
        "PostgreSQL's owner and role attacks: test_postgres_attacks.py"
    )
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(100, 132)))

# ------------------------------------------------------------------------- helpers


def _by_rule(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    """What migration 0009's rule stores: every complete aligned subtree ending before
    the limit (complete blocks, and the last block up to its largest seal)."""
    leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
    limit = len(leaves) // 256 * 256  # every node of the complete blocks of 256 leaves
    memory = MemoryTree(leaves)
    return sorted(
        (tree.leaf_end(level, index), level, memory.subtree(level, index))
        for level in range(1, len(leaves).bit_length())
        for index in range(len(leaves) >> level)
        if tree.leaf_end(level, index) < limit
    )


def _errors(path: Path) -> list[tuple[str, Any]]:
    return [(str(f.kind), f.key) for f in verify_path(str(path)).errors]


def _kinds(path: Path) -> set[str]:
    return {kind for kind, _ in _errors(path)}


def _seal(conn: sqlite3.Connection, size: int | None = None) -> int:
    return record_seal(conn, KEY, now_ms=0, origin=None, size=size).tree_size


def _seal_row(conn: sqlite3.Connection, size: Any, root_hex: str | None = None) -> tuple[Any, ...]:
    """A seal row as a package connection would insert it by SQL (not record_seal)."""
    if root_hex is None:
        root_hex = StoredTree(conn).root(int(size)).hex()
    seal_id = conn.execute("SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals").fetchone()
    ms = conn.execute("SELECT ms FROM cassette_ledger_time").fetchone()[0]
    return (seal_id[0], size, root_hex, "o", "00000000", f"o\n{size}\n", ms)


def _still_works(path: Path, clock: ManualClock) -> None:
    """An honest writer can append, complete a block and seal; verify is clean."""
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        before = _entries(cassette.conn)
        _grow(path, clock, before - before % GROW_BLOCK + GROW_BLOCK + 3)
        _seal(cassette.conn)
        assert _nodes(cassette.conn) == _by_rule(cassette.conn)


# ================================================= (b) recursive_triggers=OFF writers


def test_b_recursive_triggers_off_on_a_package_connection_cannot_break_later_seals(
    ledger: tuple[Path, ManualClock],
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK - 2)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        cassette.conn.execute("PRAGMA recursive_triggers = OFF")
        cassette.post_message({"n": 1}, "r", "USER")  # three entries: the block completes
        assert _nodes(cassette.conn) == _by_rule(cassette.conn)
    _grow(path, clock, 2 * GROW_BLOCK + 10)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert _seal(honest.conn) == 2 * GROW_BLOCK + 10
        assert _nodes(honest.conn) == _by_rule(honest.conn)
    assert verify_path(str(path)).ok


def test_b_a_look_alike_client_with_default_pragmas_cannot_brick_honest_seals(
    ledger: tuple[Path, ManualClock],
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK - 1)
    attacker = _look_alike(path, clock)
    assert attacker.execute("PRAGMA recursive_triggers").fetchone()[0] == 0
    attacker.execute(
        "INSERT INTO cassette_messages (run_id, source, idempotency_key, payload_json,"
        " created_at) VALUES ('x', 'USER', NULL, '{}', ?)",
        (clock.now_ms(),),
    )
    attacker.commit()
    attacker.close()
    _grow(path, clock, GROW_BLOCK + 20)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert _nodes(honest.conn) == _by_rule(honest.conn)
        assert _seal(honest.conn) == GROW_BLOCK + 20


def test_b_recursive_triggers_off_still_stores_the_whole_block(
    ledger: tuple[Path, ManualClock],
) -> None:
    """Fixed after this pass found it: a level-1 node stores every node above it in one
    statement, so a connection with recursive_triggers=OFF stores the block as any other."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK - 2)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        cassette.conn.execute("PRAGMA recursive_triggers = OFF")
        cassette.post_message({"n": 1}, "r", "USER")
        levels = dict(
            cassette.conn.execute(
                "SELECT level, count(*) FROM cassette_tree_nodes GROUP BY level"
            ).fetchall()
        )
        assert levels == {level: GROW_BLOCK >> level for level in range(1, 9)}
    assert verify_path(str(path)).ok


# ================================================ (a) DDL: trigger order, not content


def test_a_reordering_the_seal_guard_is_harmless(
    ledger: tuple[Path, ManualClock],
) -> None:
    """Found by this pass: the first version of 0009 needed a second BEFORE trigger on
    seals to fire before the seal guard. Now the guard is alone in its event, so dropping
    and re-creating it with its very same text changes nothing: verify holds and seals of
    any size still go in."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 40)
    raw = sqlite3.connect(path, isolation_level=None)
    (sql,) = raw.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'cassette_seals_insert_guard'"
    ).fetchone()
    raw.execute("DROP TRIGGER cassette_seals_insert_guard")
    raw.execute(sql)  # the very same text, now the newest trigger
    raw.close()
    assert verify_path(str(path)).ok
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert _seal(honest.conn) == GROW_BLOCK + 40
        assert _seal(honest.conn, GROW_BLOCK + 17) == GROW_BLOCK + 17


def test_a_a_trigger_moved_in_its_events_order_is_reported(
    ledger: tuple[Path, ManualClock],
) -> None:
    """Fixed after this pass found it: verify compares the order of each table's triggers
    of one event with the migrations' (SQLite fires the newest first), so re-creating a
    guard with its very same text is schema_changed; the seal guard stands alone in its
    event since 0009, so moving it changes nothing and seals still go in."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 40)
    raw = sqlite3.connect(path, isolation_level=None)
    (sql,) = raw.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'cassette_steps_update_guard'"
    ).fetchone()
    raw.execute("DROP TRIGGER cassette_steps_update_guard")
    raw.execute(sql)  # now fires before cassette_steps_signature_guard
    raw.close()
    findings = [(f.kind, f.table) for f in verify_path(str(path)).errors]
    assert findings == [("schema_changed", "cassette_steps")]
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert _seal(honest.conn) == GROW_BLOCK + 40


# ========================================================= (a) raw SQL on the tree


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO cassette_tree_nodes VALUES (1, 1, zeroblob(32))",
        "INSERT INTO cassette_tree_nodes VALUES (257, 1, zeroblob(32))",
        "DELETE FROM cassette_tree_nodes WHERE leaf_end = 255",
        "DELETE FROM cassette_tree_nodes",
        "UPDATE cassette_tree_nodes SET hash = zeroblob(32) WHERE leaf_end = 1",
        "INSERT INTO cassette_seals VALUES (1, 260, '" + "0" * 64 + "', 'o', '00000000',"
        " 'o' || char(10) || '260' || char(10), 0)",
        "DELETE FROM cassette_seals",
        "UPDATE cassette_seals SET tree_size = 256",
    ],
)
def test_a_a_raw_client_cannot_add_delete_or_change_nodes_or_seals(
    ledger: tuple[Path, ManualClock], statement: str
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 10)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        _seal(cassette.conn)
    before = (dump(path), file_digest(path))
    raw = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.DatabaseError, match=r"no such function|APPEND_ONLY"):
        raw.execute(statement)
    raw.close()
    assert (dump(path), file_digest(path)) == before
    assert verify_path(str(path)).ok
    _still_works(path, clock)


# ============================================ (a) ANALYZE: statistics steer nothing


def _vm_steps(conn: sqlite3.Connection, action: Any) -> int:
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        action()
    finally:
        conn.set_progress_handler(None, 0)
    return steps[0]


def test_a_hostile_planner_statistics_change_no_node_and_cost_no_scan(tmp_path: Path) -> None:
    """sqlite_stat1 claiming every index useless and every table one row long: the
    block, parent and seal statements store the same nodes in about as many VM steps
    (no statement became a scan of the journal or the tree); verify warns only."""
    clock = ManualClock()
    paths = [tmp_path / "plain.db", tmp_path / "steered.db"]
    MessageCassette(paths[0], clock=clock, durability="normal").close()
    _grow(paths[0], clock, 3 * GROW_BLOCK - 5)
    shutil.copyfile(paths[0], paths[1])
    raw = sqlite3.connect(paths[1], isolation_level=None)
    raw.execute("ANALYZE")
    indexes = raw.execute(
        "SELECT tbl_name, name FROM sqlite_master WHERE type = 'index'"
        " OR (type = 'table' AND name LIKE 'cassette_%')"
    ).fetchall()
    raw.execute("DELETE FROM sqlite_stat1")
    for table, name in indexes:
        if table == name:  # the table: one row
            raw.execute("INSERT INTO sqlite_stat1 VALUES (?, NULL, '1')", (table,))
        else:  # an index whose every prefix matches a million rows
            raw.execute(
                "INSERT INTO sqlite_stat1 VALUES (?, ?, '1000000 1000000 1000000 1000000')",
                (table, name),
            )
    raw.close()
    steps, stored = [], []
    for path in paths:
        with CausalChain(path, clock=ManualClock(), durability="normal") as chain:
            conn = chain.conn
            steps.append(
                _vm_steps(
                    conn,
                    lambda chain=chain: chain.append_actions(
                        [action_dict("InternalStep", f"g{n}") for n in range(40)]
                    ),
                )
            )
            steps.append(_vm_steps(conn, lambda conn=conn: _seal(conn)))
            stored.append(_nodes(conn))
            assert _nodes(conn) == _by_rule(conn)
    assert len(stored[0]) == len(stored[1])  # (the two batches' action ids differ)
    plain_append, plain_seal, steered_append, steered_seal = steps
    assert steered_append <= plain_append * 1.5 + 50, steps
    assert steered_seal <= plain_seal * 1.5 + 50, steps
    report = verify_path(str(paths[1]))
    assert report.ok
    assert "planner_statistics" in {str(f.kind) for f in report.findings}


# =================================== (b) crafted seal sizes on a package connection


@pytest.mark.parametrize(
    ("size", "code"),
    [
        (0, "INVALID_SEAL"),
        (-1, "INVALID_SEAL"),
        (-254, "INVALID_SEAL"),
        (-(2**63), "INVALID_SEAL"),
        (2**63 - 1, "INVALID_SEAL"),  # 255 mod 256: the tail trigger runs, past the journal
        (GROW_BLOCK + 50, "INVALID_SEAL"),  # one more than the journal, same block
        (GROW_BLOCK + 200, "INVALID_SEAL"),  # beyond the journal, same block
        (3 * GROW_BLOCK + 3, "INVALID_SEAL"),  # beyond, another block
        ("300", "SEAL_MISMATCH"),  # text: STRICT makes it 300; not the root given
        (12.5, "CONSTRAINT_VIOLATION"),  # STRICT: no REAL in an INTEGER column
        (float(GROW_BLOCK + 9), "INVALID_SEAL"),  # made 265, but the note says 265.0
        (None, "INVALID_SEAL"),
    ],
)
def test_b_a_crafted_seal_size_is_refused_and_stores_no_node(
    ledger: tuple[Path, ManualClock], size: Any, code: str
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 49)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        before = _nodes(conn)
        row = _seal_row(conn, size, root_hex=StoredTree(conn).root(GROW_BLOCK + 9).hex())
        with (
            pytest.raises((CassetteError, sqlite3.DatabaseError)) as refused,
            write_transaction(conn) as tx,
        ):
            tx.execute(SEAL_INSERT, row)
        text = refused.value.code.value if isinstance(refused.value, CassetteError) else ""
        assert code in (text or str(refused.value)), refused.value
        assert _nodes(conn) == before == _by_rule(conn)
    assert verify_path(str(path)).ok
    _still_works(path, clock)


def test_b_a_wrong_root_at_a_tail_size_is_refused_and_its_nodes_undone(
    ledger: tuple[Path, ManualClock],
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 49)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        for size in (GROW_BLOCK + 2, GROW_BLOCK + 48, GROW_BLOCK + 49):
            with pytest.raises(CassetteError) as refused, write_transaction(conn) as tx:
                tx.execute(SEAL_INSERT, _seal_row(conn, size, root_hex="ab" * 32))
            assert refused.value.code is ErrorCode.SEAL_MISMATCH
            assert _nodes(conn) == _by_rule(conn)
    assert verify_path(str(path)).ok


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 2 * GROW_BLOCK + 10), st.floats(0, 1)), min_size=1, max_size=5
    )
)
def test_b_any_sequence_of_growth_and_seals_stores_exactly_the_rule(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, float]]
) -> None:
    """Seals of any size the journal has (1, block boundaries, the head, older sizes
    after newer ones) keep the stored set exact; every seal holds as an anchor."""
    folder = tmp_path_factory.mktemp("seq")
    path, seals = folder / "ledger.db", folder / "seals"
    seals.mkdir()
    clock = ManualClock()
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        for grow, where in steps:
            _grow(path, clock, _entries(conn) + grow)
            head = _entries(conn)
            if head:
                size = max(1, min(head, round(where * head)))
                write_seal_file(
                    record_seal(conn, KEY, now_ms=clock.now_ms(), origin=None, size=size), seals
                )
            assert _nodes(conn) == _by_rule(conn)
        origin = default_origin(conn)
    if any(seals.iterdir()):
        report = verify_path(
            str(path), anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=origin
        )
        assert report.ok and report.anchored, report.to_dict()


# ======================= (b) a seal row skipped by OR IGNORE keeps the tail it stored


def test_b_an_ignored_seal_row_leaves_nothing_behind(
    ledger: tuple[Path, ManualClock],
) -> None:
    """INSERT OR IGNORE skips a row that fails a CHECK after the BEFORE triggers ran; a
    seal stores no node (since the fix below), so nothing of it stays."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 40)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        before = _nodes(conn)
        row = list(_seal_row(conn, GROW_BLOCK + 30))
        row[5] = "not the note's origin\n"
        with write_transaction(conn) as tx:
            tx.execute(SEAL_INSERT.replace("INSERT", "INSERT OR IGNORE"), row)
        assert conn.execute("SELECT count(*) FROM cassette_seals").fetchone()[0] == 0
        assert _nodes(conn) == before == _by_rule(conn)
    assert verify_path(str(path)).ok
    _still_works(path, clock)


# =========================================== (b) a forged cassette_node_hash in the tail


def test_b_a_forged_node_cannot_be_planted_over_other_writers_entries(
    ledger: tuple[Path, ManualClock],
) -> None:
    """Found by this pass on the first version of 0009, where a seal stored the nodes of
    the incomplete block: a look-alike cassette_node_hash could plant a wrong level-1 node
    there (its own guard agreeing), honest seals over it were refused, and once the block
    completed an honest seal signed the forged root. Fixed: no connection may store a
    node of the incomplete block (TREE_BROKEN), and the seal guard folds that block from
    its leaves."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 20)
    digest = file_digest(path)
    attacker = _look_alike(path, clock)
    attacker.create_function("cassette_node_hash", 2, lambda left, right: b"\x07" * 32)
    with pytest.raises(sqlite3.IntegrityError, match="TREE_BROKEN"):
        attacker.execute(
            "INSERT INTO cassette_tree_nodes VALUES (?, 1, ?)", (GROW_BLOCK + 5, b"\x07" * 32)
        )
    attacker.rollback()
    attacker.close()
    assert file_digest(path) == digest
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert _seal(honest.conn) == GROW_BLOCK + 20
    _grow(path, clock, 2 * GROW_BLOCK + 3)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        _seal(honest.conn)
    assert verify_path(str(path)).ok


# ====================================== (a with DDL) / (c): the stored set is exact


def _plant_whole_tail(conn: sqlite3.Connection) -> None:
    """What a version 8 ledger stored: every node up to the head."""
    leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
    memory = MemoryTree(leaves)
    have = {(e, lv) for e, lv in conn.execute("SELECT leaf_end, level FROM cassette_tree_nodes")}
    for level in range(1, 9):
        for index in range(len(leaves) >> level):
            end = tree.leaf_end(level, index)
            if (end, level) not in have:
                conn.execute(
                    "INSERT INTO cassette_tree_nodes VALUES (?, ?, ?)",
                    (end, level, memory.subtree(level, index)),
                )


def _drop_block_root(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end = ? AND level = 8", (255,))


def _node_past_head(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO cassette_tree_nodes VALUES (1023, 10, zeroblob(32))")


def _seal_gone(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM cassette_seals")


def _seal_shrunk(conn: sqlite3.Connection) -> None:
    """The seal row says fewer entries."""
    conn.execute(
        "UPDATE cassette_seals SET tree_size = ?1, note = origin || char(10) || ?1 || char(10)"
        " || substr(note, length(origin) + length(tree_size) + 3)",
        (GROW_BLOCK + 2,),
    )


@pytest.mark.parametrize(
    ("edit", "finding"),
    [
        (_plant_whole_tail, "tree_node"),
        (_drop_block_root, "tree_node"),
        (_node_past_head, "tree_node"),
        (_seal_gone, "row_missing"),
        (_seal_shrunk, "state_mismatch"),
    ],
)
def test_c_an_edit_of_the_stored_tree_or_its_seals_is_reported(
    ledger: tuple[Path, ManualClock], edit: Any, finding: str
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 40)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        _seal(cassette.conn, GROW_BLOCK + 30)
        _grow(path, clock, GROW_BLOCK + 60)
    with unguarded(path) as raw:
        edit(raw)
    assert finding in _kinds(path)


# ============================== (b) the package with a forged clock: one time per write


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, ManualClock]]:
    path = tmp_path / "ledger.db"
    clock = ManualClock()
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        cassette.post_messages([({"n": n}, "r", "USER", None) for n in range(3)])
    yield path, clock


def test_b_a_clock_behind_the_ledger_cannot_complete_a_lease_the_ledger_saw_expire(
    run: tuple[Path, ManualClock],
) -> None:
    """Worker w's clock stays behind; another writer's clock has passed w's expiry.
    The transaction's time is the later of the two, so the late completion is refused
    and a requeue from the slow clock is allowed."""
    path, slow = run
    fast = ManualClock(slow.now_ms())
    with MessageCassette(path, clock=slow, durability="normal") as late:
        step = late.claim_step("r", "w", 60)
        fast.advance(120_000)
        with MessageCassette(path, clock=fast, durability="normal") as other:
            other.post_message({"n": 9}, "r2", "USER")
        with pytest.raises(CassetteError) as refused:
            late.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
        assert refused.value.code is ErrorCode.LEASE_EXPIRED
        assert late.conn.execute("SELECT cassette_transaction_ms()").fetchone()[0] == (
            slow.now_ms()
        )  # the refused transaction's time is gone with it
        requeued = late.requeue("r", step["step_id"])
        assert [r["action"] for r in requeued] == ["requeued"]
        again = late.claim_step("r", "w2", 60)
        assert again["lease_expires_at"] == fast.now_ms() + 60_000  # dated by ledger time
    assert verify_path(str(path)).ok


def test_b_an_honest_completion_within_its_lease_is_never_refused_by_a_stale_time(
    run: tuple[Path, ManualClock],
) -> None:
    """A transaction's time is read when it starts writing, never carried over from an
    earlier transaction of the same connection (a refused one included)."""
    path, clock = run
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        first = cassette.claim_step("r", "w", 60)
        with pytest.raises(CassetteError):
            cassette.complete_step("r", 999, "w", 1, {}, "SUCCESS")  # refused mid-transaction
        clock.advance(59_000)
        cassette.complete_step("r", first["step_id"], "w", first["fencing_token"], {}, "SUCCESS")
        second = cassette.claim_step("r", "w", 1)
        assert second["lease_expires_at"] == clock.now_ms() + 1000
        clock.advance(1000)
        with pytest.raises(CassetteError) as refused:
            cassette.complete_step(
                "r", second["step_id"], "w", second["fencing_token"], {}, "SUCCESS"
            )
        assert refused.value.code is ErrorCode.LEASE_EXPIRED
    assert verify_path(str(path)).ok


def test_b_a_forged_transaction_time_on_one_connection_binds_no_other(
    run: tuple[Path, ManualClock],
) -> None:
    """cassette_transaction_ms is a connection's own function: a look-alike that says
    every lease has expired refuses the attacker's own completion, not an honest one."""
    path, clock = run
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        step = honest.claim_step("r", "w", 60)
        with MessageCassette(path, clock=clock, durability="normal") as forger:
            forger.conn.create_function("cassette_transaction_ms", 0, lambda: 2**62)
            with pytest.raises(CassetteError) as refused:
                forger.complete_step(
                    "r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
                )
            assert refused.value.code is ErrorCode.LEASE_EXPIRED
        honest.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    assert verify_path(str(path)).ok


# ===================================================== chunks of 32 rows per statement


@pytest.fixture(scope="module")
def empty_chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chunks") / "empty.db"
    CausalChain(path, clock=ManualClock()).close()
    return path


@contextmanager
def _twins(template: Path) -> Iterator[tuple[CausalChain, CausalChain]]:
    folder = template.parent / f"twins-{format_v4(bytes(16))[:8]}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    paths = [folder / "together.db", folder / "each.db"]
    for path in paths:
        shutil.copyfile(template, path)
    try:
        with (
            CausalChain(paths[0], clock=ManualClock(), durability="normal") as together,
            CausalChain(paths[1], clock=ManualClock(), durability="normal") as each,
        ):
            yield together, each
    finally:
        shutil.rmtree(folder, ignore_errors=True)


LIFECYCLE = [
    "PlanStarted",
    "PlanPaused",
    "PlanResumed",
    "PlanCompleted",
    "PlanAborted",
    "PlanStepStarted",
    "PlanStepCompleted",
    "InternalStep",
    "CapabilityCall",
]


@st.composite
def _risky_batch(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Actions whose plan lifecycle, parents and causes may point anywhere in the batch
    (forward references inside one chunk included), so the database may refuse any."""
    count = draw(st.integers(2, 8) | st.integers(30, 70))
    ids = [format_v4(draw(st.binary(min_size=16, max_size=16))) for _ in range(count)]
    items = []
    for index in range(count):
        item: dict[str, Any] = {
            "action_id": ids[index] if draw(st.integers(0, 30)) else ids[max(0, index - 1)],
            "plan_id": draw(st.sampled_from(["a", "b"])),
            "intent_id": "i",
            "action_type": draw(st.sampled_from(LIFECYCLE)),
            "function_name": "f",
        }
        for link in ("parent_action_id", "caused_by"):
            if draw(st.integers(0, 6)) == 0:
                item[link] = ids[draw(st.integers(0, count - 1))]
        items.append(item)
    return items


def _outcome(call: Any) -> tuple[Any, ...]:
    try:
        return ("ok", [a.action_seq for a in call()])
    except CassetteError as refused:
        return ("refused", refused.code, refused.message)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=_risky_batch())
def test_a_chunked_batch_refuses_what_one_by_one_refuses_at_the_same_index(
    empty_chain: Path, items: list[dict[str, Any]]
) -> None:
    with _twins(empty_chain) as (together, each):
        before = list(together.conn.iterdump())
        batch = _outcome(lambda: together.append_actions(items))
        index = None
        for position, item in enumerate(items):
            single = _outcome(lambda item=item: [each.append_action(item)])
            if single[0] == "refused":
                index = position
                break
        if index is None:
            assert batch[0] == "ok", batch
            assert list(together.conn.iterdump()) == list(each.conn.iterdump())
        else:
            assert batch[:2] == single[:2], (batch, single, index)
            assert batch[2] == single[2]
            assert list(together.conn.iterdump()) == before
            try:
                together.append_actions(items)
            except CassetteError as refused:
                assert refused.detail["index"] == index


@pytest.mark.parametrize("bad", [0, 31, 32, 33, 63, 64, 95, 96, 99])
def test_a_refusal_at_a_chunk_boundary_names_its_index(empty_chain: Path, bad: int) -> None:
    items = [action_dict("InternalStep", f"f{n}") for n in range(100)]
    items[bad]["parent_action_id"] = "ffffffff-ffff-4fff-bfff-ffffffffffff"
    with _twins(empty_chain) as (together, _):
        with pytest.raises(CassetteError) as refused:
            together.append_actions(items)
        assert refused.value.code is ErrorCode.REFERENCE_MISSING
        assert refused.value.detail["index"] == bad
        assert _entries(together.conn) == 0


def test_a_batch_that_ends_a_block_mid_chunk_stores_the_blocks_nodes(empty_chain: Path) -> None:
    """Entry 255 is written by the 16th row of a chunk: the block's nodes are stored by
    that row's statement, the same nodes as one by one."""
    with _twins(empty_chain) as (together, each):
        items = [
            {**action_dict("InternalStep", f"f{n}"), "action_id": format_v4(n.to_bytes(16, "big"))}
            for n in range(GROW_BLOCK + 20)
        ]
        together.append_actions(items[:240])
        together.append_actions(items[240:])  # rows 240..275: the block ends at row 15
        for item in items:
            each.append_action(item)
        assert _nodes(together.conn) == _nodes(each.conn) == _by_rule(together.conn)
        assert list(together.conn.iterdump()) == list(each.conn.iterdump())


# =============================================================== (c) seals in the last block


def _sealed_ledger(path: Path, seals: Path, plan: list[Any]) -> tuple[ManualClock, str]:
    """A ledger grown to each size of ``plan``, or sealed at the given size ('head' for
    the head)."""
    clock = ManualClock()
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        for step in plan:
            if isinstance(step, tuple):
                size = _entries(cassette.conn) if step[1] == "head" else step[1]
                seal = record_seal(
                    cassette.conn, KEY, now_ms=clock.now_ms(), origin=None, size=size
                )
                write_seal_file(seal, seals)
            else:
                _grow(path, clock, step)
        origin = default_origin(cassette.conn)
    return clock, origin


@pytest.mark.parametrize(
    "plan",
    [
        [GROW_BLOCK + 1, ("seal", "head"), GROW_BLOCK + 9],  # seal at tail + 1
        [GROW_BLOCK + 2, ("seal", "head"), GROW_BLOCK + 9],  # one level-1 node
        [2 * GROW_BLOCK - 1, ("seal", "head")],  # its own entry ends the block
        [2 * GROW_BLOCK, ("seal", "head"), 2 * GROW_BLOCK + 7],  # at a boundary
        [GROW_BLOCK + 60, ("seal", GROW_BLOCK + 50), ("seal", GROW_BLOCK + 10)],
        [GROW_BLOCK + 60, ("seal", 100)],  # only an earlier block sealed
        [GROW_BLOCK + 70, ("seal", "head"), GROW_BLOCK + 80],
    ],
)
def test_c_a_sealed_ledger_stores_by_the_rule_and_keeps_its_seals(
    tmp_path: Path, plan: list[Any]
) -> None:
    path, seals = tmp_path / "ledger.db", tmp_path / "seals"
    seals.mkdir()
    clock, origin = _sealed_ledger(path, seals, plan)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        assert _nodes(conn) == _by_rule(conn)
        head = _entries(conn)
        leaves = [bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal")]
        assert StoredTree(conn).root(head) == merkle.root_from_leaves(leaves)
    anchored = verify_path(
        str(path), anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=origin
    )
    assert anchored.ok and anchored.anchored, anchored.to_dict()
    _still_works(path, clock)
    assert verify_path(str(path)).ok
