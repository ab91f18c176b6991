"""Verify one session without reading the rest of the file: its actions, their journal
entries (the body, the leaf hash and the chain link to the entry before), causes in
time, archived plan hashes, signatures, and (with anchors) each entry's inclusion under
a seal kept elsewhere.

It reads through the indexes on session_id and on the journal's (table, key): unlike
the full verify it trusts those indexes, so a row an attacker hid from an index is the
full verify's to find (integrity_check). What it proves is that each action it finds
is the one its journal entry recorded and, under a seal, the one the signed tree holds.

The checks (``session_checks``) read through a ``reasoning.Fetch`` of named statements
(SQLite's are ``SQLITE_READS``, PostgreSQL's the same names in
``sql/postgresql/queries.sql``) and a ``proofs.ProofTree``, so one copy of them serves
both backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .actions import SELECT_COLUMNS
from .anchor import Anchor
from .connection import connect_readonly, read_transaction
from .errors import CassetteError, ErrorCode
from .migrate import current_version, schema_version
from .reasoning import sqlite_fetch
from .session_checks import SessionReport as SessionReport  # (re-exported: the report)
from .session_checks import verify_session_of as verify_session_of

if TYPE_CHECKING:
    import sqlite3

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# The named reads of a session's check, on SQLite.
SQLITE_READS: dict[str, str] = {
    "session_actions": f"SELECT {SELECT_COLUMNS} FROM cassette_actions"
    " WHERE session_id = :session_id ORDER BY action_seq",
    "session_entries": "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal"
    " WHERE tbl = 'cassette_actions' AND row_key = :action_id ORDER BY seq",
    "chain_hash_at": "SELECT chain_hash FROM cassette_journal WHERE seq = :seq",
    "session_cause_time": "SELECT timestamp FROM cassette_actions WHERE action_id = :action_id",
}


def verify_session_path(
    path: str,
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
) -> SessionReport:
    """Open the ledger read-only and verify one session in one read snapshot (a
    PostgreSQL URL: ``postgresql.sessions.verify_session_url``).

    Raises CassetteError (the CLI's "cannot verify") for a file that is not a cassette,
    a newer schema, or a session with no actions.
    """
    from .backends import verify_session_on_server

    on_server = verify_session_on_server(
        path, session_id, public_key=public_key, anchors=anchors, seal_key=seal_key, origin=origin
    )
    if on_server is not None:
        return on_server
    conn = connect_readonly(path)
    try:
        version = schema_version(conn)
        if not 0 < version <= current_version():
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"{path} is not a ledger of this version")
        with read_transaction(conn):
            return verify_session(
                conn,
                session_id,
                public_key=public_key,
                anchors=anchors,
                seal_key=seal_key,
                origin=origin,
            )
    finally:
        conn.close()


def verify_session(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
) -> SessionReport:
    """``verify_session_of`` on a SQLite connection (inside the caller's snapshot)."""
    from .tree import StoredTree

    return verify_session_of(
        sqlite_fetch(conn, SQLITE_READS),
        lambda: StoredTree(conn),
        session_id,
        public_key=public_key,
        anchors=anchors,
        seal_key=seal_key,
        origin=origin,
    )
