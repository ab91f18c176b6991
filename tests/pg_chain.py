"""The journal's end as a PostgreSQL test reads it: recomputed from the bodies, never
taken from the stored hashes (shared by the PostgreSQL attack modules)."""

from __future__ import annotations

from typing import Any

from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash


def journal_end(conn: Any) -> tuple[int, bytes]:
    """The journal's size and last link, recomputed here from the bodies. Every entry
    must be at the seq after the one before it and store the leaf and link recomputed
    here (asserted): a chain whole from its first entry."""
    prev = ZERO_HASH
    rows = conn.execute(
        "SELECT seq, body, leaf_hash, chain_hash FROM public.cassette_journal ORDER BY seq"
    ).fetchall()
    for expected, (seq, body, leaf, link) in enumerate(rows):
        assert seq == expected
        computed = leaf_hash(body.encode("utf-8"))
        prev = chain_hash(seq, prev, computed)
        assert (bytes(leaf), bytes(link)) == (computed, prev), seq
    return len(rows), prev
