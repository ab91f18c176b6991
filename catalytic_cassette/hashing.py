"""Journal hashes (LAW.md, "Journal encoding").

leaf  = SHA-256(0x00 || body)                       (RFC 9162 leaf hash)
node  = SHA-256(0x01 || left || right)               (RFC 9162 interior node)
chain = SHA-256(0x02 || seq as u64 big-endian || prev_chain || leaf)
The chain before the first entry is 32 zero bytes.
"""

from __future__ import annotations

import hashlib
import struct

ZERO_HASH = bytes(32)
SEQ_U64 = struct.Struct(">Q")


def leaf_hash(body: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + body).digest()


def chain_hash(seq: int, prev: bytes, leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x02" + SEQ_U64.pack(seq) + prev + leaf).digest()


class LeafHasher:
    """``cassette_leaf_hash`` for SQLite, remembering the last body.

    The journaling trigger and the journal guard hash the same body in one
    statement; the one-entry memo halves that work.
    """

    def __init__(self) -> None:
        self._body: str | None = None
        self._leaf = b""

    def __call__(self, body: str | None) -> bytes | None:
        if body is None:
            return None
        if body != self._body:
            self._leaf = leaf_hash(body.encode("utf-8"))
            self._body = body
        return self._leaf


class ChainHasher:
    """``cassette_chain_hash`` for SQLite, remembering the last link.

    Like the leaf, each new link is computed by the journaling trigger and checked
    again by the journal guard within one statement.
    """

    def __init__(self) -> None:
        self._last: tuple[int, bytes, bytes] | None = None
        self._chain = b""

    def __call__(self, seq: int | None, prev: bytes | None, leaf: bytes | None) -> bytes | None:
        if seq is None or prev is None or leaf is None or seq < 0:
            return None
        key = (seq, bytes(prev), bytes(leaf))
        if key != self._last:
            self._chain = chain_hash(*key)
            self._last = key
        return self._chain


class NodeHasher:
    """``cassette_node_hash`` for SQLite, remembering the nodes it made last.

    The tree trigger computes each new node and the nodes' insert guard checks it
    again in the same statement; the small memo makes that check a lookup.
    """

    _KEEP = 128

    def __init__(self) -> None:
        self._memo: dict[tuple[bytes, bytes], bytes] = {}

    def __call__(self, left: bytes | None, right: bytes | None) -> bytes | None:
        if left is None or right is None:
            return None
        key = (bytes(left), bytes(right))
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= self._KEEP:
                self._memo.clear()
            found = self._memo[key] = hashlib.sha256(b"\x01" + key[0] + key[1]).digest()
        return found


def sha256_hex(text: str | None) -> str | None:
    """Lowercase hex SHA-256 of text's UTF-8 bytes (``cassette_sha256_hex`` in SQL)."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
