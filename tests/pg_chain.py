"""What the PostgreSQL attack modules read and write by hand, shared: the journal's end
recomputed from the bodies (never taken from the stored hashes), the stored entries, the
head's state, and the body of a raw message entry."""

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


# The body a raw entry for message 99 carries: a message no table holds.
BODY = (
    '{"table":"cassette_messages","op":"INSERT","key":99,"row":{"message_id":99,'
    '"run_id":"run","source":"USER","idempotency_key":null,"payload_json":"{}",'
    '"created_at":1}}'
)


def journal(conn: Any) -> list[tuple[int, str, bytes]]:
    """Every stored entry's seq, body and chain hash, in order."""
    rows = conn.execute("SELECT seq, body, chain_hash FROM public.cassette_journal ORDER BY seq")
    return [(int(seq), body, bytes(chain)) for seq, body, chain in rows.fetchall()]


def head(conn: Any) -> tuple[Any, ...]:
    """The head's whole state: its stamp and the ledger's clock (migration 0017)."""
    row = conn.execute("SELECT tx, time_ms, clock_offset_ms FROM public.cassette_head").fetchone()
    return tuple(row)
