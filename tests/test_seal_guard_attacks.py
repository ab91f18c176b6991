"""The seal guard attacked (``sql/sqlite/schema/50_journal.sql``): no node of the incomplete
last block is stored, the seal guard folds that block from the journal's leaves through the
package's aggregate ``cassette_subtree_hash``, and verify wants exactly the nodes of complete
blocks.

Attackers as in LAW.md section 12: (a) a raw sqlite3 client, (b) a client with look-alike
functions (or the package with PRAGMAs changed), (c) someone who edits the file's bytes.
The attacks of tests/test_write_path_attacks.py and tests/test_tree_blocks.py are not repeated.

One attack worked (a strict xfail until record_seal checked before signing): a forged node
under a complete block, by a look-alike ``cassette_node_hash`` on the connection that ends
the block or by a byte edit, was folded by every later honest seal, which then signed a
root that is not the leaves' root. Now the honest sealer recomputes from the bodies what
the root reads since its key's last signed seal and refuses (TREE_BROKEN); seal rows
planted in its key's name do not move where it starts. Everything else is refused or
detected, and the ledger still works.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import ManualClock, MessageCassette, merkle, tree
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.errors import CassetteError, ErrorCode
from catalytic_cassette.hashing import node_hash
from catalytic_cassette.merkle import MemoryTree
from catalytic_cassette.note import Checkpoint, ed25519_key_id, sign_note
from catalytic_cassette.seals import Seal, default_origin, record_seal, write_seal_file
from catalytic_cassette.tree import GROW_BLOCK, StoredTree
from catalytic_cassette.verify import verify_path

from .conftest import dump, file_digest, unguarded
from .tree_helpers import SEAL_INSERT
from .tree_helpers import entries as _entries
from .tree_helpers import grow as _grow
from .tree_helpers import look_alike as _look_alike
from .tree_helpers import nodes as _nodes

pytestmark = pytest.mark.sqlite_only(
    reason=(
        "attacks on SQLite's stored tree and aggregate through sqlite3 connections and the file"
    )
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(40, 72)))
HEADS = [1, 2, 255, 256, 257, 511, 512, 513, 3 * GROW_BLOCK + 40]


# ------------------------------------------------------------------------- helpers


def _leaves(conn: sqlite3.Connection) -> list[bytes]:
    return [
        bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal ORDER BY seq")
    ]


def _bodies_root(conn: sqlite3.Connection, size: int) -> bytes:
    """The RFC 9162 root of the first ``size`` journal bodies (not the stored leaf hashes)."""
    bodies = conn.execute("SELECT body FROM cassette_journal WHERE seq < ? ORDER BY seq", (size,))
    return merkle.root_from_leaves([merkle.leaf_hash(b.encode()) for (b,) in bodies])


def _by_rule(conn: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
    leaves = _leaves(conn)
    limit = len(leaves) // GROW_BLOCK * GROW_BLOCK
    memory = MemoryTree(leaves)
    return sorted(
        (tree.leaf_end(level, index), level, memory.subtree(level, index))
        for level in range(1, len(leaves).bit_length())
        for index in range(len(leaves) >> level)
        if tree.leaf_end(level, index) < limit
    )


def _seal_row(conn: sqlite3.Connection, size: int, root: bytes) -> tuple[Any, ...]:
    """A seal row signed by KEY under the origin 'o', as a client would write it by SQL."""
    seal_id = conn.execute("SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals").fetchone()
    ms = conn.execute("SELECT ms FROM cassette_ledger_time").fetchone()[0]
    note = sign_note(Checkpoint("o", size, root).to_text(), "o", KEY).decode("utf-8")
    key_id = ed25519_key_id("o", KEY.public_key()).hex()
    return (seal_id[0], size, root.hex(), "o", key_id, note, ms)


def _try_seal(conn: sqlite3.Connection, size: int, root: bytes, *, keep: bool = False) -> str:
    """Insert a seal row of ``size`` and ``root`` by SQL; '' if accepted, else the error.
    Rolled back unless ``keep``."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(SEAL_INSERT, _seal_row(conn, size, root))
    except sqlite3.DatabaseError as exc:
        conn.execute("ROLLBACK")
        return str(exc)
    conn.execute("COMMIT" if keep else "ROLLBACK")
    return ""


def _fold(size: int, subtree: Callable[[int, int], bytes]) -> bytes:
    """The seal guard's fold (migration 0009), written out: bits of ``size`` low to high,
    each set bit the aligned subtree of that level ending before the next higher bits."""
    acc: bytes | None = None
    for b in range(size.bit_length()):
        if (size >> b) & 1:
            index = (size >> (b + 1)) << 1  # the subtree's index at level b
            here = subtree(b, index)
            acc = here if acc is None else node_hash(here, acc)
    assert acc is not None
    return acc


def _post_raw(conn: sqlite3.Connection, clock: ManualClock) -> None:
    conn.execute(
        "INSERT INTO cassette_messages (run_id, source, idempotency_key, payload_json,"
        " created_at) VALUES ('x', 'USER', NULL, '{}', ?)",
        (clock.now_ms(),),
    )


def _kinds(path: Path) -> set[str]:
    return {str(f.kind) for f in verify_path(str(path)).errors}


def _still_works(path: Path, clock: ManualClock) -> None:
    """An honest writer appends through a block end and seals; the stored set is exact
    and the honest seal signs the root of the bodies."""
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        before = _entries(conn)
        _grow(path, clock, before - before % GROW_BLOCK + GROW_BLOCK + 3)
        seal = record_seal(conn, KEY, now_ms=0, origin=None)
        assert seal.root == _bodies_root(conn, seal.tree_size)
        assert _nodes(conn) == _by_rule(conn)


# ====================== the seal guard at every size, against RFC 9162 (MemoryTree)


@pytest.mark.slow
def test_the_seal_guard_takes_exactly_the_root_at_every_size_of_every_head(
    ledger: tuple[Path, ManualClock],
) -> None:
    """Heads at and around block boundaries (1, 255, 256, 257, 511, 512, 513, a head in a
    fourth block): every size 1..head (the head, sizes in the incomplete block and in
    older, complete blocks) takes MemoryTree's root and refuses the root of the sizes
    beside it and a root with one bit flipped. A seal of the head at 255 or 511 is itself
    the entry that ends the block: its node set is exact too."""
    path, clock = ledger
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        for head in HEADS:
            _grow(path, clock, head)
            memory = MemoryTree(_leaves(conn))
            for size in range(1, head + 1):
                right = memory.root(size)
                assert _try_seal(conn, size, right) == "", (head, size)
                flipped = bytes([right[0] ^ 1]) + right[1:]
                assert "SEAL_MISMATCH" in _try_seal(conn, size, flipped), (head, size)
                for other in (size - 1, size + 1):
                    if 1 <= other <= head:
                        refused = _try_seal(conn, size, memory.root(other))
                        assert "SEAL_MISMATCH" in refused, (head, size, other)
            assert "INVALID_SEAL" in _try_seal(conn, head + 1, memory.root(head))
            assert StoredTree(conn).root(head) == memory.root(head)
            assert _nodes(conn) == _by_rule(conn)
            if head % GROW_BLOCK == GROW_BLOCK - 1:  # the seal's entry ends the block
                assert _try_seal(conn, head, memory.root(head), keep=True) == ""
                assert _nodes(conn) == _by_rule(conn)
    assert verify_path(str(path)).ok


@pytest.fixture(scope="module")
def long_ledger(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[sqlite3.Connection, MemoryTree]]:
    """Five blocks and a tail: level-10 nodes (1024 leaves) are stored."""
    path = tmp_path_factory.mktemp("long") / "ledger.db"
    clock = ManualClock()
    MessageCassette(path, clock=clock, durability="normal").close()
    _grow(path, clock, 5 * GROW_BLOCK + 77)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        yield cassette.conn, MemoryTree(_leaves(cassette.conn))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_the_seal_guard_agrees_with_rfc_9162(
    long_ledger: tuple[sqlite3.Connection, MemoryTree], data: st.DataObject
) -> None:
    conn, memory = long_ledger
    size = data.draw(
        st.one_of(
            st.integers(1, memory.size),
            st.sampled_from([1, 255, 256, 257, 511, 512, 1023, 1024, 1025, 1280, memory.size]),
        )
    )
    assert _try_seal(conn, size, memory.root(size)) == ""
    wrong = data.draw(st.binary(min_size=32, max_size=32).filter(lambda r: r != memory.root(size)))
    assert "SEAL_MISMATCH" in _try_seal(conn, size, wrong)
    assert StoredTree(conn).root(size) == memory.root(size)


# ========================= (b) a look-alike cassette_subtree_hash: its own writes only


def _constant(value: bytes | None) -> type:
    class Forged:
        def __init__(self) -> None:
            pass

        def step(self, seq: object, leaf: object) -> None:
            pass

        def finalize(self) -> bytes | None:
            return value

    return Forged


def test_b_a_forged_subtree_hash_lands_only_its_own_seal_and_verify_names_it(
    ledger: tuple[Path, ManualClock],
) -> None:
    """A look-alike aggregate makes the guard fold what it likes: its own seal row, with a
    root that is not the ledger's, goes in. That is all it does: no node is stored, verify
    reports the seal (seal_mismatch), and honest seals after it (other connections, the
    package's aggregate) sign the true root."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 20)
    forged = b"\x07" * 32
    attacker = _look_alike(path, clock)
    attacker.create_aggregate("cassette_subtree_hash", 2, _constant(forged))
    memory = MemoryTree(_leaves(attacker))
    size = GROW_BLOCK + 20  # 256 + 16 + 4: two subtrees of the tail, one block node

    def fake(level: int, index: int) -> bytes:
        return memory.subtree(level, index) if level >= 8 else forged

    lie = _fold(size, fake)
    assert lie != memory.root(size)
    assert _try_seal(attacker, size, memory.root(size)) != ""  # its guard wants the lie
    assert _try_seal(attacker, size, lie, keep=True) == ""
    assert _nodes(attacker) == _by_rule(attacker)
    attacker.close()
    assert "seal_mismatch" in _kinds(path)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        assert "SEAL_MISMATCH" in _try_seal(honest.conn, size, lie)
        seal = record_seal(honest.conn, KEY, now_ms=0, origin=None, size=size)
        assert seal.root == memory.root(size) == _bodies_root(honest.conn, size)
    _still_works(path, clock)
    assert _kinds(path) == {"seal_mismatch"}


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(
            lambda c: c.create_aggregate("cassette_subtree_hash", 2, _constant(None)), id="null"
        ),
        pytest.param(
            lambda c: c.create_aggregate("cassette_subtree_hash", 2, _constant(b"x")), id="short"
        ),
        pytest.param(
            lambda c: c.create_function("cassette_subtree_hash", 2, lambda s, h: h), id="scalar"
        ),
        pytest.param(
            lambda c: c.create_function("cassette_subtree_hash", 2, lambda s, h: 1 / 0), id="raises"
        ),
        pytest.param(lambda c: c.create_function("cassette_subtree_hash", 2, None), id="removed"),
    ],
)
def test_b_a_broken_subtree_hash_refuses_only_its_own_seal(
    ledger: tuple[Path, ManualClock], forge: Callable[[sqlite3.Connection], None]
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 37)
    before = (dump(path), file_digest(path))
    attacker = _look_alike(path, clock)
    forge(attacker)
    memory = MemoryTree(_leaves(attacker))
    for size in (3, GROW_BLOCK + 5, GROW_BLOCK + 37):
        assert _try_seal(attacker, size, memory.root(size)) != "", size
    # sizes with no subtree below level 8 never call it
    assert _try_seal(attacker, GROW_BLOCK, memory.root(GROW_BLOCK)) == ""
    attacker.close()
    assert dump(path) == before[0]
    assert verify_path(str(path)).ok
    _still_works(path, clock)


def test_b_a_subtree_hash_writing_through_its_own_connection_gains_nothing(
    ledger: tuple[Path, ManualClock],
) -> None:
    """The aggregate runs inside the seal guard; one that writes through its own
    connection there (a node of the tail, a message) meets the same triggers."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 30)
    attacker = _look_alike(path, clock)
    tried: list[str] = []

    class Sneaky(merkle.SubtreeHash):
        def finalize(self) -> bytes | None:
            for statement in (
                "INSERT INTO cassette_tree_nodes VALUES (257, 1, zeroblob(32))",
                "DELETE FROM cassette_tree_nodes",
            ):
                try:
                    attacker.execute(statement)
                except sqlite3.Error as exc:
                    tried.append(str(exc))
            return super().finalize()

    attacker.create_aggregate("cassette_subtree_hash", 2, Sneaky)  # type: ignore[arg-type]
    memory = MemoryTree(_leaves(attacker))
    _try_seal(attacker, GROW_BLOCK + 30, memory.root(GROW_BLOCK + 30), keep=True)
    attacker.close()
    assert tried and all(
        "TREE_BROKEN" in t or "APPEND_ONLY" in t or "not permitted" in t or "recursive" in t
        for t in tried
    ), tried
    assert _nodes_file(path) == _by_rule_file(path)
    assert verify_path(str(path)).ok
    _still_works(path, clock)


def _nodes_file(path: Path) -> list[tuple[int, int, bytes]]:
    conn = sqlite3.connect(path)
    try:
        return _nodes(conn)
    finally:
        conn.close()


def _by_rule_file(path: Path) -> list[tuple[int, int, bytes]]:
    conn = sqlite3.connect(path)
    try:
        return _by_rule(conn)
    finally:
        conn.close()


# ========= (b) and (c): a forged node under a complete block: honest seals refuse it


def _forged_block_end(path: Path, clock: ManualClock) -> None:
    """(b): the look-alike writes the entry that ends block 0 with its own node hash; its
    guard (same function) agrees, so the block's 255 nodes over other writers' entries
    are stored forged."""
    _grow(path, clock, GROW_BLOCK - 1)
    attacker = _look_alike(path, clock)
    attacker.create_function(
        "cassette_node_hash", 2, lambda left, right: hashlib.sha256(b"\xee" + left + right).digest()
    )
    _post_raw(attacker, clock)
    attacker.close()


def _edited_block_root(path: Path, clock: ManualClock) -> None:
    """(c): the bytes of block 0's root node edited (triggers dropped and put back)."""
    _grow(path, clock, GROW_BLOCK + 5)
    with unguarded(path) as raw:
        raw.execute(
            "UPDATE cassette_tree_nodes SET hash = ? WHERE leaf_end = 255 AND level = 8",
            (b"\x55" * 32,),
        )


@pytest.mark.parametrize(
    "plant", [_forged_block_end, _edited_block_root], ids=["b-node-hash", "c-bytes"]
)
def test_a_forged_complete_block_is_reported_by_verify(
    ledger: tuple[Path, ManualClock], plant: Callable[[Path, ManualClock], None]
) -> None:
    path, clock = ledger
    plant(path, clock)
    assert "tree_node" in _kinds(path)


@pytest.mark.parametrize(
    "plant", [_forged_block_end, _edited_block_root], ids=["b-node-hash", "c-bytes"]
)
def test_an_honest_seal_never_signs_a_root_that_is_not_the_leaves(
    ledger: tuple[Path, ManualClock], plant: Callable[[Path, ManualClock], None]
) -> None:
    """record_seal recomputes the blocks it reads from the bodies before it signs: the
    forged block is refused (TREE_BROKEN, with what to do), nothing is signed or written,
    no transaction is left open, and every later try is refused the same way."""
    path, clock = ledger
    plant(path, clock)
    _grow(path, clock, GROW_BLOCK + 40)
    before = (dump(path), file_digest(path))
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        conn = honest.conn
        for size in (None, GROW_BLOCK, GROW_BLOCK + 40):
            with pytest.raises(CassetteError) as refused:
                record_seal(conn, KEY, now_ms=0, origin=None, size=size)
            assert refused.value.code is ErrorCode.TREE_BROKEN
            assert "restore the ledger from a backup" in refused.value.message
            assert not conn.in_transaction
        assert conn.execute("SELECT count(*) FROM cassette_seals").fetchone()[0] == 0
    assert (dump(path), file_digest(path)) == before
    assert "tree_node" in _kinds(path)


def test_a_refused_seal_leaves_the_file_byte_for_byte_unchanged(
    ledger: tuple[Path, ManualClock],
) -> None:
    path, clock = ledger
    _forged_block_end(path, clock)
    _grow(path, clock, 3 * GROW_BLOCK + 7)
    before = (dump(path), file_digest(path))
    written: list[Seal] = []
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        with pytest.raises(CassetteError) as refused:
            record_seal(honest.conn, KEY, now_ms=0, origin=None, before_commit=written.append)
        assert refused.value.code is ErrorCode.TREE_BROKEN
        assert refused.value.detail["findings"], refused.value.detail
        assert not honest.conn.in_transaction
        assert file_digest(path) == before[1]
    assert not written  # the seal file is never written
    assert (dump(path), file_digest(path)) == before


def _spied_walks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(start, size) of every walk a seal makes, in order."""
    from catalytic_cassette.verify import chain

    walks: list[tuple[int, int]] = []
    real = chain.check_tree_from

    def spy(conn: sqlite3.Connection, start: int, size: int, edge: Any) -> Any:
        walks.append((start, size))
        return real(conn, start, size, edge)

    monkeypatch.setattr(chain, "check_tree_from", spy)
    return walks


def test_an_honest_ledger_seals_as_before_each_seal_checking_from_the_last(
    ledger: tuple[Path, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seals at sizes in and around blocks and walk blocks (4096), of the head and of
    less: each signs the bodies' root, and each checks from its key's newest signed
    seal at or below its size, at that seal's walk block; verify agrees."""
    path, clock = ledger
    walks = _spied_walks(monkeypatch)
    other = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    plan = [  # (grow to, size to seal or None for the head, key, walk expected from)
        (300, None, KEY, 0),
        (4500, 4200, KEY, 0),  # the checkpoint at 300 lies in walk block 0
        (4500, None, KEY, 4096),  # the seal at 4200 is a checkpoint
        (4500, 4300, KEY, 4096),  # a smaller size: the newest checkpoint at or below it
        (4500, 4000, KEY, 0),
        (4500, 4096, KEY, 0),  # from the seal at 4000
        (4500, 4096, KEY, 4096),  # its own size: nothing left to walk
        (9000, None, other, 0),  # another key has no checkpoint of its own
        (9000, None, KEY, 4096),  # the seal at 4501 (entry 4500 is the seal's own)
    ]
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        for head, size, key, expected in plan:
            if _entries(conn) < head:
                _grow(path, clock, head)
            seal = record_seal(conn, key, now_ms=0, origin=None, size=size)
            assert seal.root == _bodies_root(conn, seal.tree_size), (head, size)
            assert walks[-1][0] == expected, (head, size, walks)
    assert verify_path(str(path)).ok


def _planted_seal(path: Path, clock: ManualClock, how: str) -> None:
    """Attacker (b), after forging a block, inserts a seal row of the head (the guard
    folds the forged stored nodes, so it is accepted) that claims to be the honest key's:
    its key_id column, or even its signature line's key id; or an honest note replayed;
    or, by a byte edit, a note that is not even UTF-8."""
    attacker = _look_alike(path, clock)
    origin = default_origin(attacker)
    size = _entries(attacker)
    root = StoredTree(attacker).root(size)  # the forged root, as the guard computes it
    text = Checkpoint(origin, size, root).to_text()
    ours = ed25519_key_id(origin, KEY.public_key())
    if how == "key-id-column":
        note = sign_note(text, origin, Ed25519PrivateKey.from_private_bytes(bytes(32)))
    elif how == "signature-line":
        line = "\u2014 " + origin + " " + base64.b64encode(ours + bytes(64)).decode() + "\n"
        note = text + b"\n" + line.encode()
    elif how == "not-utf-8":  # (c): a note that Python cannot decode as text, by byte edit
        note = text + b"\n\xff\xfe " + base64.b64encode(ours + bytes(64)) + b"\n"
    else:  # "replay": the honest seal's note of an earlier size, in a row of that size
        row = attacker.execute(
            "SELECT tree_size, root_hex, note FROM cassette_seals ORDER BY seal_id LIMIT 1"
        ).fetchone()
        size, root, note = int(row[0]), bytes.fromhex(row[1]), row[2].encode()
    seal_id = attacker.execute("SELECT max(seal_id) + 1 FROM cassette_seals").fetchone()[0]
    ms = attacker.execute("SELECT ms FROM cassette_ledger_time").fetchone()[0]
    row = (seal_id, size, root.hex(), origin, ours.hex(), note, ms)
    insert = SEAL_INSERT.replace(
        "VALUES (?, ?, ?, ?, ?, ?, ?)", "VALUES (?, ?, ?, ?, ?, CAST(? AS TEXT), ?)"
    )
    if how == "not-utf-8":  # the journal's leaf function could not read it: triggers dropped
        attacker.close()
        with unguarded(path) as raw:
            raw.execute(insert, row)
        return
    attacker.execute(insert, row)
    attacker.close()


@pytest.mark.parametrize("how", ["key-id-column", "signature-line", "not-utf-8", "replay"])
def test_b_a_seal_row_planted_by_the_attacker_is_no_checkpoint(
    ledger: tuple[Path, ManualClock], how: str
) -> None:
    """An honest seal at 4100 (walk block 4096), a block forged by the look-alike that
    ends it (entries 4352-4607), then a seal row of the head (past 8192) in the honest
    key's name: were that row a checkpoint, the next seal would walk from 8192 and fold
    the forged block unseen through the level-13 node. It walks from 4096, meets the
    forged block and refuses; the honest seal's own size still seals."""
    path, clock = ledger
    _grow(path, clock, 4100)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        first = record_seal(honest.conn, KEY, now_ms=0, origin=None)
    _grow(path, clock, 18 * GROW_BLOCK - 1)
    attacker = _look_alike(path, clock)
    attacker.create_function(
        "cassette_node_hash", 2, lambda left, right: hashlib.sha256(b"\xee" + left + right).digest()
    )
    _post_raw(attacker, clock)  # ends block 17 with forged nodes
    attacker.close()
    _grow(path, clock, 8192 + 9)
    _planted_seal(path, clock, how)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        conn = honest.conn
        assert conn.execute("SELECT count(*) FROM cassette_seals").fetchone()[0] == 2
        with pytest.raises(CassetteError) as refused:
            record_seal(conn, KEY, now_ms=0, origin=None)
        assert refused.value.code is ErrorCode.TREE_BROKEN
        assert refused.value.detail["checked_from"] == 4096
        named = refused.value.detail["findings"]
        assert named and all(f["kind"] == "tree_node" for f in named)
        assert all(17 * GROW_BLOCK <= f["seq"] < 18 * GROW_BLOCK for f in named)
        assert not conn.in_transaction
        again = record_seal(conn, KEY, now_ms=0, origin=None, size=first.tree_size)
        assert again.root == first.root


def test_c_a_node_edited_under_a_signed_seal_refuses_the_next_seal(
    ledger: tuple[Path, ManualClock],
) -> None:
    """A block's root edited after the key sealed past it: the stored tree no longer
    gives the signed root, so the checkpoint itself refuses (nothing after it is
    trusted), with what to do."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 5)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        record_seal(honest.conn, KEY, now_ms=0, origin=None)
    with unguarded(path) as raw:
        raw.execute(
            "UPDATE cassette_tree_nodes SET hash = ? WHERE leaf_end = 255 AND level = 8",
            (b"\x55" * 32,),
        )
    before = file_digest(path)
    with MessageCassette(path, clock=clock, durability="normal") as honest:
        with pytest.raises(CassetteError) as refused:
            record_seal(honest.conn, KEY, now_ms=0, origin=None)
        assert refused.value.code is ErrorCode.TREE_BROKEN
        assert "no longer gives the root this key signed" in refused.value.message
        assert "restore the ledger from a backup" in refused.value.message
        assert not honest.conn.in_transaction
    assert file_digest(path) == before


# ===================================== (a) hostile statistics: no scan in the guard


def _vm_steps(conn: sqlite3.Connection, action: Callable[[], object]) -> int:
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


def _hostile_stats(path: Path, kind: str) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("ANALYZE")
    objects = raw.execute(
        "SELECT tbl_name, name FROM sqlite_master WHERE type = 'index'"
        " OR (type = 'table' AND name LIKE 'cassette_%')"
    ).fetchall()
    raw.execute("DELETE FROM sqlite_stat1")
    for table, name in objects:
        if table == name:  # tables: huge, or one row
            stat = "1000000000" if kind == "lure" else "1"
            raw.execute("INSERT INTO sqlite_stat1 VALUES (?, NULL, ?)", (table, stat))
        else:  # indexes: perfectly selective (a lure), or useless
            stat = "1000000000 1 1 1 1" if kind == "lure" else "1000000 1000000 1000000 1000000"
            raw.execute("INSERT INTO sqlite_stat1 VALUES (?, ?, ?)", (table, name, stat))
    raw.close()


@pytest.mark.parametrize("kind", ["lure", "useless"])
def test_a_statistics_cannot_turn_the_guard_or_the_block_into_a_scan(
    tmp_path: Path, kind: str
) -> None:
    """The seal guard's leaf range and node reads, the block trigger and the node bound
    cost the same VM steps on a ledger of 3 blocks and one of 24 (no read grows with the
    journal), with or without hostile sqlite_stat1."""
    costs: dict[tuple[int, bool], tuple[int, int]] = {}
    for blocks in (3, 24):
        base = tmp_path / f"b{blocks}.db"
        clock = ManualClock()
        MessageCassette(base, clock=clock, durability="normal").close()
        _grow(base, clock, blocks * GROW_BLOCK - 1)  # the next entry ends a block
        for steered in (False, True):
            path = tmp_path / f"b{blocks}-{steered}.db"
            shutil.copyfile(base, path)
            if steered:
                _hostile_stats(path, kind)
            with MessageCassette(path, clock=ManualClock(), durability="normal") as c:
                conn = c.conn
                block = _vm_steps(conn, partial(c.post_message, {"n": 1}, "r", "USER"))
                head = _entries(conn)  # three entries past the block
                size = head - head % GROW_BLOCK - 1  # low 8 bits set: every level below 8
                memory = MemoryTree(_leaves(conn))
                root = memory.root(size)
                seal = _vm_steps(conn, partial(_try_seal, conn, size, root))
                assert _try_seal(conn, size, memory.root(size)) == ""
                assert _nodes(conn) == _by_rule(conn)
            costs[(blocks, steered)] = (block, seal)
    small, large = costs[(3, False)], costs[(24, False)]
    for key, (block, seal) in costs.items():
        assert block <= small[0] * 1.3 + 20, (key, costs)
        assert seal <= small[1] * 1.3 + 20, (key, costs)
    assert large[1] <= small[1] * 1.3 + 20, costs


# ============================== (a) raw DDL via writable_schema on the new triggers


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("cassette_tree_nodes_bounded", "% 256", "% 2"),  # nodes of the tail allowed
        ("cassette_seals_insert_guard", "b >= 8", "b >= 0"),  # tail read from nodes
        ("cassette_seals_insert_guard", "NOT INDEXED", "INDEXED BY cassette_journal_by_row"),
        ("cassette_journal_grow_tree", "seq % 256 = 255", "seq % 256 = 254"),
    ],
)
def test_a_writable_schema_edits_of_the_new_triggers_are_reported(
    ledger: tuple[Path, ManualClock], name: str, old: str, new: str
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK + 9)
    raw = sqlite3.connect(path, isolation_level=None)
    (sql,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    assert old in sql
    raw.execute("PRAGMA writable_schema = ON")
    raw.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql.replace(old, new, 1), name))
    raw.execute("PRAGMA writable_schema = OFF")
    raw.close()
    assert "schema_changed" in _kinds(path)


# ======== (b) the package with PRAGMAs changed: tail folds and block ends unaffected


@pytest.mark.parametrize(
    "pragma",
    [
        "PRAGMA reverse_unordered_selects = ON",
        "PRAGMA recursive_triggers = OFF",
        "PRAGMA case_sensitive_like = ON",
        "PRAGMA automatic_index = OFF",
        "PRAGMA cache_size = 1",
    ],
)
def test_b_a_package_connection_with_pragmas_changed_seals_and_stores_the_truth(
    ledger: tuple[Path, ManualClock], pragma: str
) -> None:
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK - 3)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        conn.execute(pragma).fetchall()
        conn.execute("PRAGMA reverse_unordered_selects = ON")
        for _ in range(3):
            cassette.post_message({"n": 1}, "r", "USER")  # ends block 0
            memory = MemoryTree(_leaves(conn))
            for size in range(max(1, memory.size - 40), memory.size + 1):
                assert _try_seal(conn, size, memory.root(size)) == "", size
            seal = record_seal(conn, KEY, now_ms=0, origin=None)
            assert seal.root == _bodies_root(conn, seal.tree_size)
        assert _nodes(conn) == _by_rule(conn)
    assert verify_path(str(path)).ok


def test_b_a_trigger_depth_limit_fails_closed(ledger: tuple[Path, ManualClock]) -> None:
    """SQLITE_LIMIT_TRIGGER_DEPTH of 1 on a package connection: the entry that ends a
    block cannot store its nodes above level 1, and the append is refused, not kept."""
    path, clock = ledger
    _grow(path, clock, GROW_BLOCK - 1)
    before = dump(path)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        if not hasattr(conn, "setlimit"):
            pytest.skip("sqlite3.Connection.setlimit needs Python 3.11")
        conn.setlimit(getattr(sqlite3, "SQLITE_LIMIT_TRIGGER_DEPTH", 10), 1)
        with pytest.raises(Exception):  # noqa: B017 (any refusal)
            cassette.post_message({"n": 1}, "r", "USER")
    assert dump(path) == before
    assert verify_path(str(path)).ok
    _still_works(path, clock)


# ====================== (c) a ledger sealed in its last block


def test_c_a_ledger_sealed_inside_its_last_block_keeps_its_seals_and_completes(
    tmp_path: Path,
) -> None:
    """Three seals fall inside the last block (one at its first entry, one inside, the
    head), whose nodes are not stored: every seal verifies as an anchor, the seal guard
    re-takes each of them, the block completes on an ordinary append (and on one from a
    recursive_triggers=OFF connection for the next), and new seals anchor too."""
    path, seals = tmp_path / "ledger.db", tmp_path / "seals"
    seals.mkdir()
    clock = ManualClock()
    sizes: list[int] = []
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        _grow(path, clock, GROW_BLOCK + 1)
        for size in (GROW_BLOCK + 1, None):
            seal = record_seal(cassette.conn, KEY, now_ms=clock.now_ms(), origin=None, size=size)
            write_seal_file(seal, seals)
            sizes.append(seal.tree_size)
        _grow(path, clock, 2 * GROW_BLOCK - 60)
        seal = record_seal(
            cassette.conn, KEY, now_ms=clock.now_ms(), origin=None, size=GROW_BLOCK + 100
        )
        write_seal_file(seal, seals)
        sizes.append(seal.tree_size)
        seal = record_seal(cassette.conn, KEY, now_ms=clock.now_ms(), origin=None)
        write_seal_file(seal, seals)
        sizes.append(seal.tree_size)
        origin = default_origin(cassette.conn)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        assert _nodes(conn) == _by_rule(conn)
        memory = MemoryTree(_leaves(conn))
        for size in sizes:
            assert _try_seal(conn, size, memory.root(size)) == "", size
    anchored = verify_path(
        str(path), anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=origin
    )
    assert anchored.ok and anchored.anchored, anchored.to_dict()
    _grow(path, clock, 2 * GROW_BLOCK)  # block 1 ends on an ordinary append
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        assert _nodes(cassette.conn) == _by_rule(cassette.conn)
        cassette.conn.execute("PRAGMA recursive_triggers = OFF")
        while _entries(cassette.conn) < 3 * GROW_BLOCK + 2:
            cassette.post_message({"n": 1}, "r", "USER")
        assert _nodes(cassette.conn) == _by_rule(cassette.conn)
        write_seal_file(record_seal(cassette.conn, KEY, now_ms=clock.now_ms(), origin=None), seals)
        write_seal_file(
            record_seal(
                cassette.conn, KEY, now_ms=clock.now_ms(), origin=None, size=2 * GROW_BLOCK + 7
            ),
            seals,
        )
    anchored = verify_path(
        str(path), anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=origin
    )
    assert anchored.ok and anchored.anchored, anchored.to_dict()


def test_a_long_walk_is_done_before_the_lock_and_only_the_rest_inside_it(
    ledger: tuple[Path, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's first seal of a ledger longer than the threshold walks up to the last walk
    block in a read snapshot, then, under the write lock, only from there: it signs the
    bodies' root all the same, and a second seal starts from the first."""
    from catalytic_cassette import seals

    monkeypatch.setattr(seals, "AHEAD_MIN_ENTRIES", 4096)
    walks = _spied_walks(monkeypatch)
    path, clock = ledger
    _grow(path, clock, 2 * 4096 + 300)
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        conn = cassette.conn
        size = _entries(conn)
        seal = record_seal(conn, KEY, now_ms=0, origin=None)
        assert seal.root == _bodies_root(conn, seal.tree_size) and seal.tree_size == size
        assert walks == [(0, 8192), (8192, size)]
        record_seal(conn, KEY, now_ms=0, origin=None)
        assert walks[2:] == [(8192, size + 1)]  # from the first seal: below the threshold
    assert verify_path(str(path)).ok


@pytest.mark.parametrize(
    "plant", [_forged_block_end, _edited_block_root], ids=["b-node-hash", "c-bytes"]
)
def test_the_walk_before_the_lock_refuses_a_forged_tree_and_writes_nothing(
    ledger: tuple[Path, ManualClock],
    monkeypatch: pytest.MonkeyPatch,
    plant: Callable[[Path, ManualClock], None],
) -> None:
    from catalytic_cassette import seals

    monkeypatch.setattr(seals, "AHEAD_MIN_ENTRIES", 4096)
    walks = _spied_walks(monkeypatch)
    path, clock = ledger
    plant(path, clock)
    _grow(path, clock, 4096 + 300)
    before = (dump(path), file_digest(path))
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        with pytest.raises(CassetteError) as refused:
            record_seal(cassette.conn, KEY, now_ms=0, origin=None)
        assert not cassette.conn.in_transaction
    assert refused.value.code is ErrorCode.TREE_BROKEN
    assert walks == [(0, 4096)]  # refused before the write lock
    assert (dump(path), file_digest(path)) == before


def test_a_tree_changed_between_the_walk_and_the_lock_is_refused(
    ledger: tuple[Path, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the walk before the lock checked counts only if the stored tree still gives
    the root it recomputed once the lock is held: a node changed in between (here: the
    walk's answer replaced, as if the bytes had moved under it) refuses the seal."""
    from catalytic_cassette import seals

    monkeypatch.setattr(seals, "AHEAD_MIN_ENTRIES", 4096)
    real = seals._check_ahead

    def moved(*args: Any) -> tuple[int, bytes] | None:
        found = real(*args)
        assert found is not None
        return found[0], b"\x77" * 32

    monkeypatch.setattr(seals, "_check_ahead", moved)
    path, clock = ledger
    _grow(path, clock, 4096 + 300)
    before = (dump(path), file_digest(path))
    with MessageCassette(path, clock=clock, durability="normal") as cassette:
        with pytest.raises(CassetteError) as refused:
            record_seal(cassette.conn, KEY, now_ms=0, origin=None)
        assert not cassette.conn.in_transaction
    assert refused.value.code is ErrorCode.TREE_BROKEN
    assert "changed while" in refused.value.message
    assert (dump(path), file_digest(path)) == before
