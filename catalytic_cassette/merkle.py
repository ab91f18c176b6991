"""RFC 9162 (RFC 6962) Merkle tree hashes, inclusion and consistency proofs.

The tree is the Certificate Transparency one::

    leaf  = SHA-256(0x00 || data)
    node  = SHA-256(0x01 || left || right)
    empty = SHA-256("")

``MTH(D[n])`` splits at ``k``, the largest power of two smaller than ``n``, so every
complete subtree of the tree is *aligned*: the node at ``level`` ``l`` and ``index`` ``i``
covers the leaves ``[i * 2**l, (i + 1) * 2**l)`` and never changes once those leaves
exist.  The proof builders below only ever ask for such nodes, through a callable
``subtree(level, index) -> bytes`` (level 0 returns leaf hashes), so any storage that
can return aligned complete subtrees can serve roots and proofs.  The right edge of an
incomplete tree is computed from at most ``log2(n) + 1`` complete subtrees, so a root
or a proof for a tree of ``n`` leaves needs ``O(log n)`` lookups.

The verifiers follow RFC 9162 sections 2.1.3.2 and 2.1.4.2, with these policies: every
hash must be 32 bytes, a proof must have exactly the length the RFC construction gives
for its sizes, and a consistency proof from an empty tree (``old_size == 0``) is
rejected.  They return ``False`` for every invalid input and never raise on bad
proofs or sizes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Sequence

from .hashing import leaf_hash, node_hash

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "CompactRange",
    "MemoryTree",
    "SubtreeFn",
    "consistency_proof",
    "consistency_proof_length",
    "inclusion_proof",
    "inclusion_proof_length",
    "leaf_hash",
    "node_hash",
    "root",
    "root_from_leaves",
    "subtree_from_leaves",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
"""Length in bytes of every hash in the tree (SHA-256)."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""``MTH({})``: the root of the tree with no leaves."""

SubtreeFn = Callable[[int, int], bytes]
"""``subtree(level, index)``: hash of the aligned complete subtree covering leaves
``[index * 2**level, (index + 1) * 2**level)``; level 0 is the leaf hashes."""


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def _check_hash(value: bytes, what: str) -> bytes:
    if not _is_hash(value):
        raise ValueError(f"{what} must be {HASH_SIZE} bytes")
    return value


def _split(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaves(leaf_hashes: Sequence[bytes]) -> bytes:
    """``MTH`` of a list of leaf hashes (RFC 9162 2.1.1), in linear time.

    Pairs neighbours level by level; an odd node at the end of a level moves up
    unchanged, which is the same tree as the RFC's split at the largest power of two.
    """
    level = [_check_hash(h, "leaf hash") for h in leaf_hashes]
    if not level:
        return EMPTY_ROOT
    while len(level) > 1:
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def _lookup(subtree: SubtreeFn, level: int, index: int) -> bytes:
    value = subtree(level, index)
    if not _is_hash(value):
        raise ValueError(f"subtree({level}, {index}) did not return a {HASH_SIZE}-byte hash")
    return value


def _range_hash(subtree: SubtreeFn, start: int, count: int) -> bytes:
    """``MTH(D[start:start + count])`` for a range that occurs in the RFC recursion.

    Such a range starts at a multiple of the largest power of two not above ``count``,
    so it is one aligned complete subtree per set bit of ``count`` (largest first),
    folded from the right: ``popcount(count)`` lookups.
    """
    pieces: list[bytes] = []
    offset = start
    for level in range(count.bit_length() - 1, -1, -1):
        if count >> level & 1:
            pieces.append(_lookup(subtree, level, offset >> level))
            offset += 1 << level
    result = pieces.pop()
    while pieces:
        result = node_hash(pieces.pop(), result)
    return result


def root(size: int, subtree: SubtreeFn) -> bytes:
    """``MTH(D[size])`` from aligned complete subtrees: ``popcount(size)`` lookups."""
    if size < 0:
        raise ValueError("tree size must not be negative")
    if size == 0:
        return EMPTY_ROOT
    return _range_hash(subtree, 0, size)


def inclusion_proof(index: int, size: int, subtree: SubtreeFn) -> list[bytes]:
    """``PATH(index, D[size])`` (RFC 9162 2.1.3.1), ordered from the leaf up.

    Walks down from the root.  Every sibling on the way is one complete subtree except
    the right sibling where the walk first turns left, which lies on the tree's right
    edge and costs ``popcount`` lookups: at most ``2 * floor(log2(size))`` lookups.
    """
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of size {size}")
    path: list[bytes] = []
    start, n = 0, size
    while n > 1:
        k = _split(n)
        if index - start < k:
            path.append(_range_hash(subtree, start + k, n - k))
            n = k
        else:
            path.append(_range_hash(subtree, start, k))
            start += k
            n -= k
    path.reverse()
    return path


def consistency_proof(old_size: int, new_size: int, subtree: SubtreeFn) -> list[bytes]:
    """``PROOF(old_size, D[new_size])`` (RFC 9162 2.1.4.1), ``1 <= old_size <= new_size``.

    Equal sizes give the empty proof.  As for inclusion proofs, only the sibling where
    the walk first turns left can be incomplete: at most ``2 * floor(log2(new_size)) + 1``
    lookups.
    """
    if old_size < 1:
        raise ValueError("a consistency proof needs a non-empty old tree")
    if old_size > new_size:
        raise ValueError(f"old size {old_size} is larger than new size {new_size}")
    # SUBPROOF(m, D[start:start + n], whole), iteratively; "whole" is the RFC's b flag.
    collected: list[bytes] = []
    m, start, n, whole = old_size, 0, new_size, True
    while m != n:
        k = _split(n)
        if m <= k:
            collected.append(_range_hash(subtree, start + k, n - k))
            n = k
        else:
            collected.append(_range_hash(subtree, start, k))
            start += k
            n -= k
            m -= k
            whole = False
    proof = [] if whole else [_range_hash(subtree, start, n)]
    proof.extend(reversed(collected))
    return proof


def inclusion_proof_length(index: int, size: int) -> int:
    """The number of hashes in ``PATH(index, D[size])``; ``0 <= index < size``."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of size {size}")
    length = 0
    while size > 1:
        k = _split(size)
        if index < k:
            size = k
        else:
            index -= k
            size -= k
        length += 1
    return length


def consistency_proof_length(old_size: int, new_size: int) -> int:
    """The number of hashes in ``PROOF(old_size, D[new_size])``; ``1 <= old <= new``."""
    if not 1 <= old_size <= new_size:
        raise ValueError(f"no consistency proof from size {old_size} to size {new_size}")
    length = 0
    m, n, whole = old_size, new_size, True
    while m != n:
        k = _split(n)
        if m <= k:
            n = k
        else:
            m -= k
            n -= k
            whole = False
        length += 1
    return length if whole else length + 1


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 2.1.3.2: does ``proof`` show leaf ``index`` of a ``size``-leaf tree?

    Rejects ``index >= size`` (so any size 0), hashes that are not 32 bytes and proofs
    of the wrong length.
    """
    if not (_is_hash(leaf_hash) and _is_hash(root)):
        return False
    if not 0 <= index < size:
        return False
    path = list(proof)
    if len(path) != inclusion_proof_length(index, size):
        return False
    if not all(_is_hash(p) for p in path):
        return False
    fn, sn = index, size - 1
    r = leaf_hash
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(r, root)


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 2.1.4.2: does ``proof`` show the ``old_size`` tree is a prefix of the new?

    Equal sizes need an empty proof and equal roots.  Rejects ``old_size == 0`` (the
    RFC only defines proofs for ``0 < old_size``; this module's policy is to refuse
    rather than accept anything), ``old_size > new_size``, hashes that are not 32
    bytes and proofs of the wrong length.
    """
    if not (_is_hash(old_root) and _is_hash(new_root)):
        return False
    if not 1 <= old_size <= new_size:
        return False
    path = list(proof)
    if not all(_is_hash(p) for p in path):
        return False
    if old_size == new_size:
        return not path and hmac.compare_digest(old_root, new_root)
    if len(path) != consistency_proof_length(old_size, new_size):
        return False
    if old_size & (old_size - 1) == 0:
        # The old tree is a complete subtree of the new one: its root starts the path.
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(fr, old_root) and hmac.compare_digest(sr, new_root)


class CompactRange:
    """The right edge of a growing tree: one hash per set bit of its size.

    Streams any number of leaves in ``O(log n)`` memory. ``append`` returns the aligned
    complete subtrees the new leaf completes, smallest first, as ``(level, hash)``.
    """

    def __init__(self) -> None:
        self._edge: list[tuple[int, bytes]] = []
        self.size = 0

    def append(self, leaf: bytes) -> list[tuple[int, bytes]]:
        completed: list[tuple[int, bytes]] = []
        level, value = 0, leaf
        while self._edge and self._edge[-1][0] == level:
            value = node_hash(self._edge.pop()[1], value)
            level += 1
            completed.append((level, value))
        self._edge.append((level, value))
        self.size += 1
        return completed

    def root(self) -> bytes:
        if not self._edge:
            return EMPTY_ROOT
        result = self._edge[-1][1]
        for _, left in reversed(self._edge[:-1]):
            result = node_hash(left, result)
        return result


class MemoryTree:
    """An append-only tree in memory that keeps every aligned complete subtree.

    ``append`` is amortised O(1); ``subtree`` is the callable the proof builders take.
    For tests and small uses: it holds about ``2 * size`` hashes.
    """

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        for h in leaf_hashes:
            self.append(h)

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def __len__(self) -> int:
        return self.size

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash (not leaf data: see ``leaf_hash``)."""
        nodes = self._levels[0]
        nodes.append(_check_hash(leaf, "leaf hash"))
        level = 0
        while len(nodes) % 2 == 0:
            if level + 1 == len(self._levels):
                self._levels.append([])
            parent = self._levels[level + 1]
            parent.append(node_hash(nodes[-2], nodes[-1]))
            nodes = parent
            level += 1

    def subtree(self, level: int, index: int) -> bytes:
        """The aligned complete subtree ``(level, index)``; IndexError if incomplete."""
        if level < 0 or index < 0 or level >= len(self._levels):
            raise IndexError(f"no complete subtree ({level}, {index})")
        nodes = self._levels[level]
        if index >= len(nodes):
            raise IndexError(f"no complete subtree ({level}, {index})")
        return nodes[index]

    def _size(self, size: int | None) -> int:
        if size is None:
            return self.size
        if not 0 <= size <= self.size:
            raise ValueError(f"tree size {size} is not in 0..{self.size}")
        return size

    def root(self, size: int | None = None) -> bytes:
        """The root of the first ``size`` leaves (default: all of them)."""
        return root(self._size(size), self.subtree)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self._size(size), self.subtree)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        return consistency_proof(old_size, self._size(new_size), self.subtree)


def subtree_from_leaves(leaf_hashes: Iterable[bytes]) -> SubtreeFn:
    """A ``subtree`` callable over the given leaf hashes, built in linear time."""
    return MemoryTree(leaf_hashes).subtree


class SubtreeHash:
    """``cassette_subtree_hash(seq, leaf_hash)``, an SQL aggregate of package connections:
    the root of a complete subtree from its leaves, in any order of rows (sorted by seq
    here). NULL unless the rows are consecutive seqs, as many as a power of two, each with
    a 32-byte hash, so a guard comparing with it never passes by accident. The seal guard
    folds the subtrees of the incomplete last block with it (schema/50_journal.sql)."""

    def __init__(self) -> None:
        self._leaves: list[tuple[int, bytes]] = []

    def step(self, seq: object, leaf: object) -> None:
        if isinstance(seq, int) and _is_hash(leaf):
            self._leaves.append((seq, leaf))  # type: ignore[arg-type]
        else:
            self._leaves.append((-1, b""))  # poisons the result

    def finalize(self) -> bytes | None:
        leaves = sorted(self._leaves)
        count = len(leaves)
        if count == 0 or count & (count - 1) or leaves[0][0] < 0:
            return None
        if leaves[-1][0] - leaves[0][0] != count - 1 or len({s for s, _ in leaves}) != count:
            return None
        return root_from_leaves([leaf for _, leaf in leaves])
