"""The ledger's Merkle tree, read from the nodes stored beside the journal.

Level 0 is the journal's ``leaf_hash`` column; a complete aligned subtree of ``2**level``
leaves is a row of ``cassette_tree_nodes`` keyed by its last leaf. Roots and proofs of
any size need O(log n) point reads (``merkle`` builds them from complete subtrees).

The database stores the nodes a block of ``GROW_BLOCK`` leaves at a time (migration
0009) and never those of the incomplete last block: reads compute every node of that block
from its leaves (fewer than ``GROW_BLOCK``), as the seal guard does in SQL.
"""

from __future__ import annotations

import sqlite3

from . import merkle
from .errors import CassetteError, ErrorCode

GROW_BLOCK = 256
"""Leaves per block of stored nodes: the journal entry with ``seq % GROW_BLOCK ==
GROW_BLOCK - 1`` stores its block's nodes (``cassette_journal_grow_tree``,
schema/50_journal.sql)."""


def tail_start(tree_size: int) -> int:
    """The first leaf of the last, incomplete block of a tree of ``tree_size`` leaves:
    every node ending before it is stored, none ending at or after it."""
    return tree_size - tree_size % GROW_BLOCK


def size(conn: sqlite3.Connection) -> int:
    """Number of journal entries: the size of the tree."""
    row = conn.execute("SELECT max(seq) FROM cassette_journal").fetchone()
    return 0 if row[0] is None else int(row[0]) + 1


def leaf_end(level: int, index: int) -> int:
    """Journal seq of the last leaf of the aligned subtree (level, index)."""
    return ((index + 1) << level) - 1


class StoredTree:
    """Roots and proofs from one connection; read them inside one read transaction (the
    size of the tree, and so where its last block starts, is read once)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._tail_start: int | None = None

    def subtree(self, level: int, index: int) -> bytes:
        if level > 0 and leaf_end(level, index) >= self._tail():
            return self._from_leaves(level, index)
        if level == 0:
            row = self.conn.execute(
                "SELECT leaf_hash FROM cassette_journal WHERE seq = ?", (index,)
            ).fetchone()
        else:
            row = self.conn.execute(
                "SELECT hash FROM cassette_tree_nodes WHERE leaf_end = ? AND level = ?",
                (leaf_end(level, index), level),
            ).fetchone()
        if row is None or not isinstance(row[0], bytes):
            raise CassetteError(
                ErrorCode.TREE_BROKEN,
                f"the tree has no node at level {level}, index {index}",
                level=level,
                index=index,
            )
        return row[0]

    def _tail(self) -> int:
        if self._tail_start is None:
            self._tail_start = tail_start(self.size())
        return self._tail_start

    def _from_leaves(self, level: int, index: int) -> bytes:
        """A node of the incomplete last block, from its leaves (fewer than GROW_BLOCK)."""
        first = index << level
        leaves = [
            row[0]
            for row in self.conn.execute(
                "SELECT leaf_hash FROM cassette_journal NOT INDEXED"
                " WHERE seq BETWEEN ? AND ? ORDER BY seq",
                (first, leaf_end(level, index)),
            )
        ]
        if len(leaves) != 1 << level or not all(isinstance(leaf, bytes) for leaf in leaves):
            raise CassetteError(
                ErrorCode.TREE_BROKEN,
                f"the tree has no node at level {level}, index {index}",
                level=level,
                index=index,
            )
        return merkle.root_from_leaves(leaves)

    def size(self) -> int:
        return size(self.conn)

    def root(self, tree_size: int) -> bytes:
        require_size(tree_size, self.size())
        return merkle.root(tree_size, self.subtree)

    def inclusion_proof(self, index: int, tree_size: int) -> list[bytes]:
        require_entry(index, tree_size, self.size())
        return merkle.inclusion_proof(index, tree_size, self.subtree)

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        require_sizes(old_size, new_size, self.size())
        return merkle.consistency_proof(old_size, new_size, self.subtree)


# A node of a complete block that a connection kept from being stored (its own TEMP
# trigger, LAW.md section 8a) is stored again by the next append that ends a block when
# the whole block was skipped (schema/50_journal.sql), and otherwise by ``heal``, which the seal
# runs before it reads the tree. The insert guard checks each node against its stored
# children, whoever computes it.
_HEAL_NODE = (
    "INSERT INTO cassette_tree_nodes (leaf_end, level, hash)"
    " SELECT :end, :level, cassette_node_hash("
    "   CASE WHEN :level = 1 THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = :end - 1)"
    "        ELSE (SELECT hash FROM cassette_tree_nodes"
    "              WHERE leaf_end = :end - (1 << (:level - 1)) AND level = :level - 1) END,"
    "   CASE WHEN :level = 1 THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = :end)"
    "        ELSE (SELECT hash FROM cassette_tree_nodes"
    "              WHERE leaf_end = :end AND level = :level - 1) END)"
    " WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = :end AND level = :level)"
)


def _stored(conn: sqlite3.Connection, end: int, level: int) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = ? AND level = ?", (end, level)
    ).fetchone()
    return row is not None


def missing_nodes(conn: sqlite3.Connection, tree_size: int) -> list[tuple[int, int]]:
    """(leaf_end, level) of every node of the complete blocks of the first ``tree_size``
    entries that is not stored, children before parents.

    A stored node is the hash of its two stored children (the insert guard), so what is
    stored is closed downwards: when the roots of the complete subtrees that make up the
    complete blocks (one per bit of their size, ``O(log n)`` reads) are stored, so is
    everything under them. Only the subtrees of missing nodes are searched, so the cost
    is proportional to what is missing."""
    complete = tail_start(tree_size)
    pending = [
        (((complete >> (level + 1)) << (level + 1)) + (1 << level) - 1, level)
        for level in range(1, complete.bit_length())
        if complete >> level & 1
    ]
    missing: list[tuple[int, int]] = []
    while pending:
        end, level = pending.pop()
        if _stored(conn, end, level):
            continue
        missing.append((end, level))
        if level > 1:
            pending += [(end - (1 << (level - 1)), level - 1), (end, level - 1)]
    return sorted(missing)


def heal(conn: sqlite3.Connection) -> int:
    """Store every missing node of the complete blocks (inside the caller's write
    transaction); the number stored. Nothing to do, the usual case, costs one read per
    bit of the journal's size."""
    missing = missing_nodes(conn, size(conn))
    for end, level in missing:
        # (a level-1 node's own trigger may already have built some of the ones above it)
        conn.execute(_HEAL_NODE, {"end": end, "level": level})
    return len(missing)


# What a tree of ``have`` entries can answer, whichever backend keeps it: a root or a proof
# it cannot give is INVALID_ARGUMENT (a caller's request, not a broken tree).


def require_size(tree_size: int, have: int) -> None:
    if not 0 <= tree_size <= have:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT,
            f"tree size {tree_size} is not between 0 and the ledger's {have}",
            size=have,
        )


def require_entry(index: int, tree_size: int, have: int) -> None:
    require_size(tree_size, have)
    if not 0 <= index < tree_size:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT,
            f"entry {index} is not in a tree of {tree_size} entries",
        )


def require_sizes(old_size: int, new_size: int, have: int) -> None:
    require_size(new_size, have)
    if not 0 < old_size <= new_size:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT,
            f"a consistency proof needs 0 < old size <= new size, not {old_size}, {new_size}",
        )


def journal_size(path: str) -> int:
    """Entries in the journal of the ledger at ``path``, read-only; 0 when it cannot be
    read (a progress bar's length: the caller reports the real error itself)."""
    from .connection import connect_readonly

    try:
        conn = connect_readonly(path)
    except CassetteError:
        return 0
    try:
        return size(conn)
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
