"""Journal hashes (LAW.md, "Journal encoding").

leaf  = SHA-256(0x00 || body)                       (RFC 9162 leaf hash)
node  = SHA-256(0x01 || left || right)               (RFC 9162 interior node)
chain = SHA-256(0x02 || seq as u64 big-endian || prev_chain || leaf)
The chain before the first entry is 32 zero bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol


class Digest(Protocol):
    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


def _builtin_sha256() -> Callable[[bytes], Digest]:
    """SHA-256 from CPython's own module when the build has it, else ``hashlib``'s.

    Every ``cassette`` command opens a ledger, whose triggers call these functions;
    ``hashlib`` costs each call about 3 ms more, almost all in loading its OpenSSL module
    (docs/BENCHMARKS.md, "CLI start-up per call"). ``_sha256`` (3.10, 3.11) and
    ``_sha2`` (3.12+) are private modules of the standard library, the same that
    ``hashlib`` falls back to, so the digests are the same; a build without them (e.g.
    configured with only OpenSSL's hashes) uses ``hashlib``.
    """
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            from hashlib import sha256
    return sha256  # type: ignore[no-any-return,return-value,unused-ignore]


sha256 = _builtin_sha256()
ZERO_HASH = bytes(32)
SEQ_U64 = struct.Struct(">Q")


def leaf_hash(body: bytes) -> bytes:
    """``SHA-256(0x00 || body)``: the hash of one leaf entry."""
    return sha256(b"\x00" + body).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: the hash of an interior node."""
    return sha256(b"\x01" + left + right).digest()


def chain_hash(seq: int, prev: bytes, leaf: bytes) -> bytes:
    return sha256(b"\x02" + SEQ_U64.pack(seq) + prev + leaf).digest()


class Remembered:
    """A hash for SQLite (``create_function``) that remembers its recent results.

    Each journal entry and tree node is computed by a trigger and checked again by a
    guard within the same statement; remembering makes the check a lookup. A NULL
    argument gives NULL, so a guard comparing with it never passes by accident.
    """

    def __init__(self, compute: Callable[..., bytes | None], keep: int) -> None:
        self._compute = compute
        self._keep = keep
        self._memo: dict[tuple[Any, ...], bytes | None] = {}  # None: not remembered

    def __call__(self, *args: Any) -> bytes | None:
        found = self._memo.get(args)
        if found is not None or None in args:
            return found
        if len(self._memo) >= self._keep:
            self._memo.clear()
        found = self._memo[args] = self._compute(*args)
        return found


def _sql_leaf(body: str) -> bytes:
    return leaf_hash(body.encode("utf-8"))


def _sql_chain(seq: int, prev: bytes, leaf: bytes) -> bytes | None:
    return chain_hash(seq, prev, leaf) if seq >= 0 else None


def sql_functions() -> dict[str, tuple[int, Remembered]]:
    """The hashing functions a package connection registers: name -> (arity, function).

    One entry is enough for a leaf or link (one journal entry per statement); a new
    leaf completes up to one node per level, hence room for 128 nodes.
    """
    return {
        "cassette_leaf_hash": (1, Remembered(_sql_leaf, keep=1)),
        "cassette_chain_hash": (3, Remembered(_sql_chain, keep=1)),
        "cassette_node_hash": (2, Remembered(node_hash, keep=128)),
    }


def sha256_hex(text: str | None) -> str | None:
    """Lowercase hex SHA-256 of text's UTF-8 bytes (``cassette_sha256_hex`` in SQL)."""
    if text is None:
        return None
    return sha256(text.encode("utf-8")).hexdigest()
