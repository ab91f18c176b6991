"""Seals and the Merkle tree of a PostgreSQL ledger.

No tree node is stored on PostgreSQL yet: the tree is rebuilt from the journal's bodies
(each leaf recomputed, each link of the chain checked) whenever a seal or a proof needs
it, O(size) hashes, in a snapshot read without the head's lock. The server then checks a
new seal's root again against the leaves it holds (``cassette_seals_insert``,
schema/50_journal.sql).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .. import merkle
from ..clock import SystemClock
from ..errors import CassetteError, ErrorCode
from ..hashing import ZERO_HASH, chain_hash, leaf_hash
from ..note import Checkpoint, ed25519_key_id, sign_note
from ..seals import ORIGIN_PREFIX, RESTORE_ADVICE, Seal, check_origin, require_lawful
from ..tree import require_entry, require_size, require_sizes
from ..verify.findings import Collector
from ..verify.history import HistoryJudge, feed
from ..verify.options import VerifyOptions
from . import connection
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_BATCH = 4096


def ledger_id(conn: psycopg.Connection[Any]) -> str:
    """What the ledger calls itself (cassette_meta), as ``worker_keys.ledger_id`` on SQLite."""
    row = conn.execute(query("ledger_id")).fetchone()
    if row is None:
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the ledger has no ledger_id")
    return str(row[0])


def ledger_origin(conn: psycopg.Connection[Any]) -> str:
    return ORIGIN_PREFIX + ledger_id(conn)


def journal_size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(query("journal_size")).fetchone()
    return int(row[0]) if row else 0


def rebuilt_tree(
    conn: psycopg.Connection[Any], size: int, judge: HistoryJudge | None = None
) -> merkle.MemoryTree:
    """The tree of the first ``size`` entries, from their bodies; TREE_BROKEN (nothing
    signed, nothing written) when a stored leaf or link is not its body's. ``judge`` is
    fed every entry on the way (verify's history check)."""
    tree = merkle.MemoryTree()
    previous = ZERO_HASH
    with conn.cursor(name="cassette_tree") as cursor:
        cursor.itersize = _BATCH
        cursor.execute(query("journal_before"), {"size": size})
        for seq, body, stored_leaf, stored_chain in cursor:
            leaf = leaf_hash(str(body).encode("utf-8"))
            previous = chain_hash(seq, previous, leaf)
            if seq != tree.size or bytes(stored_leaf) != leaf or bytes(stored_chain) != previous:
                raise CassetteError(
                    ErrorCode.TREE_BROKEN,
                    f"journal entry {seq} is not what its body hashes to: " + RESTORE_ADVICE,
                    seq=seq,
                )
            tree.append(leaf)
            if judge is not None:
                feed(judge, ((seq, body),))
    if tree.size != size:
        raise CassetteError(ErrorCode.TREE_BROKEN, "the journal has gaps: " + RESTORE_ADVICE)
    return tree


def record_seal(
    conn: psycopg.Connection[Any],
    private_key: Ed25519PrivateKey,
    *,
    origin: str | None,
    size: int | None = None,
    before_commit: Callable[[Seal], object] | None = None,
) -> Seal:
    """Sign the head (or the first ``size`` entries) and record the seal, as
    ``seals.record_seal`` does on SQLite. The tree is rebuilt from the bodies in a
    REPEATABLE READ READ ONLY snapshot; the insert is its own READ COMMITTED transaction,
    which takes the head (the entries a seal covers never change, and the server checks
    the root once more there), so a host writing meanwhile makes it neither wait nor
    fail BUSY, as an insert in the snapshot's transaction would. Sealing needs INSERT on
    cassette_seals: the owner's."""
    with connection.snapshot(conn):
        chosen = check_origin(origin if origin is not None else ledger_origin(conn))
        have = journal_size(conn)
        size = have if size is None else size
        if size == 0:
            raise CassetteError(ErrorCode.INVALID_SEAL, "the ledger is empty: nothing to seal")
        if not 0 < size <= have:
            raise CassetteError(
                ErrorCode.INVALID_SEAL, f"cannot seal {size} entries of a ledger of {have}"
            )
        # The tree is rebuilt from every body: the history judge rides on that walk, so a
        # seal here judges the whole history (SQLite's, since the key's last seal).
        found = Collector()
        judge = HistoryJudge(found, SystemClock().now_ms(), VerifyOptions().clock_skew_ms)
        root = rebuilt_tree(conn, size, judge).root()
        judge.finish()
        require_lawful(found, 0)
    note = sign_note(Checkpoint(chosen, size, root).to_text(), chosen, private_key)
    key_id = ed25519_key_id(chosen, private_key.public_key()).hex()
    with connection.transaction(conn):
        row = conn.execute(
            query("insert_seal"),
            {
                "tree_size": size,
                "root_hex": root.hex(),
                "origin": chosen,
                "key_id": key_id,
                "note": note.decode("utf-8"),
            },
        ).fetchone()
        assert row is not None
        sealed = Seal(int(row[0]), size, root, chosen, key_id, note, int(row[1]))
        if before_commit is not None:
            before_commit(sealed)
    return sealed


class _RebuiltTree:
    """``proofs.ProofTree`` over a tree rebuilt from the bodies; what it cannot answer is
    INVALID_ARGUMENT, as from SQLite's stored tree."""

    def __init__(self, tree: merkle.MemoryTree) -> None:
        self._tree = tree

    def size(self) -> int:
        return self._tree.size

    def root(self, size: int) -> bytes:
        require_size(size, self._tree.size)
        return self._tree.root(size)

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        require_entry(index, size, self._tree.size)
        return self._tree.inclusion_proof(index, size)

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        require_sizes(old_size, new_size, self._tree.size)
        return self._tree.consistency_proof(old_size, new_size)


class PgProofSource:
    """``proofs.ProofSource`` of a PostgreSQL ledger: one REPEATABLE READ snapshot; the
    tree rebuilt from the bodies (TREE_BROKEN when a leaf or link is not its body's)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def snapshot(self) -> AbstractContextManager[object]:
        return connection.snapshot(self.conn)

    def entry_body(self, seq: int) -> bytes | None:
        row = self.conn.execute(query("entry_body"), {"seq": seq}).fetchone()
        return None if row is None else str(row[0]).encode("utf-8")

    def receipt_seq(self, receipt_id: int) -> int | None:
        row = self.conn.execute(query("receipt_seq"), {"receipt_id": str(receipt_id)}).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def seal_notes(self, seq: int) -> Iterator[bytes]:
        for (note,) in self.conn.execute(query("seal_notes"), {"seq": seq}).fetchall():
            yield str(note).encode("utf-8")

    def action_entries(self, scope: str, value: str) -> list[tuple[int, str]]:
        from ..proofs import scope_column

        sql = query("bundle_entries").format(column=scope_column(scope))
        rows = self.conn.execute(sql, {"value": value}).fetchall()
        return [(int(seq), str(body)) for seq, body in rows]

    def tree(self) -> _RebuiltTree:
        return _RebuiltTree(rebuilt_tree(self.conn, journal_size(self.conn)))


def journal_reader(conn: psycopg.Connection[Any]) -> Callable[[int, int], list[Any]]:
    """``follow.JournalReader`` of a PostgreSQL ledger: each poll one autocommit statement
    (no snapshot is held between polls). A reader that sees entry n sees every entry
    before it: writers commit in seq order, one after the other, on the head's lock."""

    def read_after(since_seq: int, limit: int) -> list[Any]:
        try:
            rows = conn.execute(
                query("journal_after"), {"since_seq": since_seq, "limit": limit}
            ).fetchall()
        except Exception as exc:
            raise connection.translate(exc) from exc
        if rows:  # shown once durable: a synchronous commit after them flushes them
            connection.flush(conn)
        return rows

    return read_after


def bodies_tree(conn: psycopg.Connection[Any]) -> _RebuiltTree:
    """The tree whose leaves are the hashes of the journal's bodies, as they are now,
    with no judgement of the stored hashes: a proof from it holds under a seal only if
    every body it covers is the one sealed (``session_verify`` reports what does not)."""
    tree = merkle.MemoryTree()
    with conn.cursor(name="cassette_bodies") as cursor:
        cursor.itersize = _BATCH
        cursor.execute(query("journal_bodies"))
        for (body,) in cursor:
            tree.append(leaf_hash(str(body).encode("utf-8")))
    return _RebuiltTree(tree)
