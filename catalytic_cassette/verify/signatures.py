"""Action signatures, checked against a public key the caller pins."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from .findings import Collector, Finding, FindingKind

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ..worker_keys import PinnedKey


def check_signatures(
    conn: sqlite3.Connection, out: Collector, public_key: Ed25519PublicKey
) -> None:
    from ..actions import COLUMNS, SELECT_COLUMNS
    from ..signing import check

    details = {
        "unsigned_action": "the action carries no signature",
        "unknown_key": "the action was signed by another key",
        "bad_signature": "the signature does not match the action",
    }
    query = f"SELECT {SELECT_COLUMNS} FROM cassette_actions ORDER BY action_seq"
    for row in conn.execute(query):
        values = dict(zip(COLUMNS, row, strict=True))
        problem = check(public_key, values)
        if problem is not None:
            out.add(
                Finding(
                    FindingKind(problem),
                    details[problem],
                    None,
                    "cassette_actions",
                    values["action_id"],
                )
            )


def check_worker_signatures(
    conn: sqlite3.Connection, out: Collector, pinned: dict[str, PinnedKey]
) -> None:
    """Worker attestations against the pinned keys (worker_keys.py does the work)."""
    from ..worker_keys import check_worker_keys

    for found in check_worker_keys(conn, pinned):
        signer = f" (key {found.key_id})" if found.key_id else ""
        detail = f"worker {found.worker_id!r}{signer}: {found.detail}"
        out.add(Finding(FindingKind(found.kind), detail, None, found.table, found.key))
