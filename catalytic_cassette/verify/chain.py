"""The journal as a chain: contiguous seq, every leaf and link hash recomputed, and the
Merkle tree rebuilt from the recomputed leaves (compared with every stored node).

Streams rows in seq order through the table itself (never an index); memory is constant.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..hashing import SEQ_U64, ZERO_HASH
from ..merkle import EMPTY_ROOT
from ..tree import GROW_BLOCK, tail_start
from ..tree import size as tree_size
from .findings import Collector, Finding, FindingKind
from .options import Progress

PROGRESS_EVERY = 10_000
_MAX_SEQ = 2**64 - 1


def check_chain(
    conn: sqlite3.Connection,
    out: Collector,
    progress: Progress | None,
    walk: TreeWalk | None,
    *,
    start: int = 0,
    stop: int | None = None,
    see: Callable[[list[int], list[bytes], list[Any], list[Any]], None] | None = None,
) -> int:
    """Stream the journal in seq order; each entry is checked against its predecessor only.

    With ``start``/``stop``, only the entries ``start <= seq < stop`` (the first checked
    against the stored link before it), so that parts can be checked in parallel; the
    whole journal otherwise. ``see`` is given the seqs, bodies, and stored table names and
    keys of each batch of entries as they pass.
    Returns the seq expected after the last entry read."""
    conn.text_factory = bytes  # hash the stored bytes; a tampered body need not be UTF-8
    try:
        return _walk_chain(conn, out, progress, walk, start, stop, see)
    finally:
        conn.text_factory = str


def _walk_chain(
    conn: sqlite3.Connection,
    out: Collector,
    progress: Progress | None,
    walk: TreeWalk | None,
    start: int,
    stop: int | None,
    see: Callable[[list[int], list[bytes], list[Any], list[Any]], None] | None,
) -> int:
    prev = ZERO_HASH
    if start > 0:
        before = conn.execute(
            "SELECT chain_hash FROM cassette_journal NOT INDEXED WHERE seq = ?", (start - 1,)
        ).fetchone()
        prev = before[0] if before is not None and isinstance(before[0], bytes) else b""
    where = "" if start == 0 else f" WHERE seq >= {int(start)}"
    if stop is not None:
        where += (" AND" if where else " WHERE") + f" seq < {int(stop)}"
    stored = "tbl, row_key" if see is not None else "NULL, NULL"  # (only ``see`` reads them)
    cursor = conn.execute(
        f"SELECT seq, body, leaf_hash, chain_hash, {stored} FROM cassette_journal NOT INDEXED"
        f"{where} ORDER BY seq"
    )
    return walk_entries(
        iter(lambda: cursor.fetchmany(1024), []), out, progress, walk, start, prev, see
    )


Entry = tuple[Any, Any, Any, Any, Any, Any]  # seq, body, leaf_hash, chain_hash, tbl, row_key


def walk_entries(
    batches: Iterable[Sequence[Entry]],
    out: Collector,
    progress: Progress | None,
    walk: TreeWalk | None,
    start: int,
    prev: bytes,
    see: Callable[[list[int], list[bytes], list[Any], list[Any]], None] | None,
) -> int:
    """The chain check proper, on journal entries from any source (a SQLite cursor, a
    PostgreSQL server-side cursor) in batches, in seq order from ``start``, with ``prev``
    the stored chain hash before it. A body may be bytes or text (hashed as UTF-8).
    Returns the seq expected after the last entry read."""
    # The loop runs once per journal row: hashing is inlined (same formulas as
    # hashing.leaf_hash and hashing.chain_hash), each hash a copy of one that has already
    # taken its first byte (cheaper than a new one: about 0.1 us a hash); rows arrive in
    # batches, and the tree and ``see`` take each batch whole.
    leaf_hasher, link_hasher, pack = (
        hashlib.sha256(b"\x00").copy,
        hashlib.sha256(b"\x02").copy,
        SEQ_U64.pack,
    )
    expected_seq = start
    read = 0
    for rows in batches:
        seqs: list[int] = []
        bodies: list[bytes] = []
        leaves: list[bytes] = []
        for seq, body, leaf, chain, _, _ in rows:
            if seq != expected_seq:
                out.add(
                    Finding(
                        FindingKind.JOURNAL_GAP,
                        f"expected seq {expected_seq}, found {seq}",
                        seq=seq,
                    )
                )
                expected_seq = seq
            if not isinstance(body, bytes):
                body = str(body).encode("utf-8")
            hasher = leaf_hasher()
            hasher.update(body)
            recomputed = hasher.digest()
            seqs.append(seq)
            bodies.append(body)
            leaves.append(recomputed)
            if leaf != recomputed:
                table, key = body_identity(body)
                out.add(
                    Finding(
                        FindingKind.LEAF_HASH, "leaf_hash does not match the body", seq, table, key
                    )
                )
            if isinstance(leaf, bytes) and 0 <= seq <= _MAX_SEQ:
                hasher = link_hasher()
                hasher.update(pack(seq) + prev + leaf)
                link = hasher.digest()
            else:
                link = None
            if chain != link:
                table, key = body_identity(body)
                out.add(
                    Finding(
                        FindingKind.CHAIN_HASH,
                        "chain_hash does not link to the previous entry",
                        seq,
                        table,
                        key,
                    )
                )
            prev = chain if isinstance(chain, bytes) else b""
            expected_seq += 1
        if walk is not None:
            walk.extend(leaves)
        if see is not None:
            see(seqs, bodies, [row[4] for row in rows], [row[5] for row in rows])
        if progress is not None:
            before, read = read, read + len(rows)
            for _ in range(read // PROGRESS_EVERY - before // PROGRESS_EVERY):
                progress(PROGRESS_EVERY)
    if progress is not None and read % PROGRESS_EVERY:
        progress(read % PROGRESS_EVERY)
    return expected_seq


def check_tree_from(
    conn: sqlite3.Connection, start: int, size: int, edge: Sequence[tuple[int, bytes]]
) -> tuple[Collector, bytes | None]:
    """Check, from the bodies, what the root of the first ``size`` entries reads beyond the
    first ``start`` (a multiple of ``TreeWalk.BLOCK``, with ``edge`` the right edge of the
    tree of those, as ``TreeWalk`` takes it): every journal entry from ``start`` on (leaf
    and link hashes) up to the end of the block holding entry ``size - 1`` if that block is
    complete, else up to ``size``, and every stored node ending in that range.

    Returns the findings and the root of the first ``size`` entries recomputed from the
    bodies (None if ``size == start``: nothing walked). For ``record_seal``, inside its
    write transaction."""
    head = tree_size(conn)
    if not 0 <= start <= size <= head:
        raise ValueError(f"cannot check from {start} to {size} in a journal of {head}")
    end = min(size + (-size) % GROW_BLOCK, head)
    out = Collector()
    walk = TreeWalk(conn, out, {size}, stored_nodes=True, start=start, edge=edge, nodes_before=end)
    reached = check_chain(conn, out, None, walk, start=start, stop=end)
    if reached != end:
        out.add(Finding(FindingKind.JOURNAL_GAP, f"expected seq {reached}, found none", reached))
    walk.finish()
    return out, walk.roots.get(size)


def body_identity(body: Any) -> tuple[str | None, Any]:
    """(table, key) named by a journal body, or (None, None) if it is not even JSON."""
    from ..payloads import loads

    try:
        parsed = loads(body)
        return parsed.get("table"), parsed.get("key")
    except Exception:  # a tampered body may not be JSON at all
        return None, None


class TreeWalk:
    """Rebuilds the Merkle tree from the recomputed leaves while the chain is walked.

    Compares every stored node (the nodes table is read in its key order, which is
    completion order) and keeps the root at each wanted size. Memory is one block of
    leaves plus O(log n).

    Leaves are hashed into the tree a block at a time (``BLOCK``, a power of two): each
    level of the block is one list comprehension, and the block's root joins the right
    edge of the blocks before it, as ``CompactRange`` does per leaf. The nodes a block
    completes are compared with the next stored rows as one list (the common case:
    equal); only a list that differs is walked node by node to name what is missing,
    extra or altered. Same formulas as ``hashing.node_hash``; a node is named by the
    position of its last leaf (``leaf_end``) and its level.
    """

    BLOCK = 4096

    def __init__(
        self,
        conn: sqlite3.Connection,
        out: Collector,
        wanted: set[int],
        *,
        stored_nodes: bool,
        start: int = 0,
        edge: Sequence[tuple[int, bytes]] = (),
        nodes_before: int | None = None,
    ) -> None:
        """With ``start`` (a multiple of ``BLOCK``), the walk begins at that leaf: ``edge``
        is the right edge of the tree of the ``start`` leaves before it, as (level, hash),
        largest first, and only stored nodes ending at or after ``start`` (and before
        ``nodes_before``, if given) are compared. The whole tree otherwise."""
        if start % self.BLOCK or start < 0:
            raise ValueError(f"a walk starts at a multiple of {self.BLOCK}, not {start}")
        self.out = out
        self.wanted = sorted(wanted)
        self.roots: dict[int, bytes] = {0: EMPTY_ROOT} if 0 in wanted else {}
        self._leaves: list[bytes] = []  # of the block being filled
        self._base = start  # leaves in the blocks before it
        self._edge: list[tuple[int, bytes]] = list(edge)  # (level, hash): those blocks' edge
        bound = " WHERE leaf_end >= ?" + ("" if nodes_before is None else " AND leaf_end < ?")
        self._stored = (
            conn.execute(
                "SELECT leaf_end, level, hash FROM cassette_tree_nodes NOT INDEXED"
                f"{bound} ORDER BY leaf_end, level",
                (start,) if nodes_before is None else (start, nodes_before),
            )
            if stored_nodes
            else None
        )
        # The last, incomplete block of stored nodes (tree.GROW_BLOCK) holds none: nodes
        # ending at or after this leaf must be absent. Known once the walk reaches the end.
        self._tail_from: int | None = None
        self._pending: list[tuple[int, int, bytes]] = []  # completed, not yet compared
        self._fetched: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self._next: tuple[int, int, bytes] | None = None

    def extend(self, leaves: list[bytes]) -> None:
        """The next leaves, in journal order (the tree counts positions, not seqs)."""
        self._leaves += leaves
        while len(self._leaves) >= self.BLOCK:
            if len(self._leaves) > self.BLOCK:
                self._leaves, rest = self._leaves[: self.BLOCK], self._leaves[self.BLOCK :]
            else:
                rest = []
            self._block()  # (takes self._leaves, a whole block, and empties it)
            self._leaves = rest

    def _block(self) -> None:
        leaves, base, sha256 = self._leaves, self._base, hashlib.sha256
        count = len(leaves)
        levels = [leaves]
        nodes: list[tuple[int, int, bytes]] = []
        level = leaves
        while len(level) > 1:
            level = [
                sha256(b"\x01" + a + b).digest()
                for a, b in zip(level[0::2], level[1::2], strict=False)
            ]  # (an odd last one waits)
            step = 1 << len(levels)
            nodes.extend(
                zip(
                    range(base + step - 1, base + count, step),
                    [len(levels)] * len(level),
                    level,
                    strict=True,
                )
            )
            levels.append(level)
        for size in self.wanted:
            if base < size <= base + count:
                self.roots[size] = self._root(levels, size - base)
        if count == self.BLOCK:  # the block's root joins the right edge
            edge, height, value = self._edge, len(levels) - 1, levels[-1][0]
            while edge and edge[-1][0] == height:
                value = sha256(b"\x01" + edge.pop()[1] + value).digest()
                height += 1
                nodes.append((base + count - 1, height, value))
            edge.append((height, value))
            self._base += count
            self._leaves = []
        self._pending.extend(sorted(nodes))
        self._compare_pending()

    def _root(self, levels: list[list[bytes]], prefix: int) -> bytes:
        """The root after the first ``prefix`` leaves of the current block (RFC 9162):
        the edge before the block, then the block's complete subtrees, largest first."""
        edge = [value for _, value in self._edge]
        edge += [
            levels[k][(prefix >> k) - 1] for k in range(len(levels) - 1, -1, -1) if prefix >> k & 1
        ]
        result = edge[-1]
        for left in reversed(edge[:-1]):
            result = hashlib.sha256(b"\x01" + left + result).digest()
        return result

    def _compare_pending(self) -> None:
        if self._stored is None or not self._pending:
            self._pending.clear()
            return
        if self._tail_from is None:  # walking: only nodes of complete blocks are known due
            limit = tail_start(self._base + len(self._leaves))
            cut = len(self._pending)  # (the common case: all of them)
            if self._pending[-1][0] >= limit:
                cut = bisect.bisect_left(self._pending, (limit,))
            pending, self._pending = self._pending[:cut], self._pending[cut:]
            if not pending:
                return
        else:
            pending, self._pending = self._pending, []
        stored = self._take(len(pending))
        if stored != pending or self._tail_from is not None:  # (the last block: node by node)
            self._fetched.extendleft(reversed(stored))  # walked one by one below
            self._advance()
            for leaf_end, level, value in pending:
                self._compare(leaf_end, level, value)
            if self._next is not None:  # not yet compared: first in line for the next batch
                self._fetched.appendleft(self._next)
                self._next = None

    def _take(self, count: int) -> list[tuple[int, int, bytes]]:
        """The next ``count`` stored nodes (fewer at the end)."""
        taken = [self._fetched.popleft() for _ in range(min(count, len(self._fetched)))]
        if len(taken) < count and self._stored is not None:
            taken.extend(self._stored.fetchmany(count - len(taken)))
        return taken

    def _advance(self) -> None:
        if self._fetched:
            self._next = self._fetched.popleft()
            return
        row = next(self._stored, None) if self._stored is not None else None
        self._next = (row[0], row[1], row[2]) if row is not None else None

    def _compare(self, leaf_end: int, level: int, value: bytes) -> None:
        while self._next is not None and self._next[:2] < (leaf_end, level):
            self._extra(*self._next)
            self._advance()
        in_tail = self._tail_from is not None and leaf_end >= self._tail_from
        if self._next is None or self._next[:2] != (leaf_end, level):
            if in_tail:
                return  # not stored until its block completes
            self.out.add(
                Finding(
                    FindingKind.TREE_NODE,
                    f"the stored tree has no node at level {level} ending at entry {leaf_end}",
                    leaf_end,
                    "cassette_tree_nodes",
                    [leaf_end, level],
                )
            )
            return
        if in_tail:
            self._extra(leaf_end, level, value, "in the incomplete last block, which stores none")
        elif self._next[2] != value:
            self.out.add(
                Finding(
                    FindingKind.TREE_NODE,
                    f"the stored node at level {level} ending at entry {leaf_end} is not the"
                    " hash of the journal's leaves",
                    leaf_end,
                    "cassette_tree_nodes",
                    [leaf_end, level],
                )
            )
        self._advance()

    def _extra(
        self,
        leaf_end: int,
        level: int,
        _hash: bytes,
        why: str = "that the journal does not complete",
    ) -> None:
        self.out.add(
            Finding(
                FindingKind.TREE_NODE,
                f"the stored tree has a node at level {level} ending at entry {leaf_end} {why}",
                leaf_end,
                "cassette_tree_nodes",
                [leaf_end, level],
            )
        )

    def finish(self) -> None:
        self._tail_from = tail_start(self._base + len(self._leaves))
        if self._leaves:  # a last, partial block: its complete subtrees and wanted roots
            self._block()
        self._compare_pending()  # (nodes held back while their block was incomplete)
        if self._stored is None:
            return
        self._advance()
        while self._next is not None:
            self._extra(*self._next)
            self._advance()
