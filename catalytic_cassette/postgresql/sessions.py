"""``cassette verify --session`` on a PostgreSQL ledger: ``session_verify``'s checks,
read through the named queries in one REPEATABLE READ READ ONLY snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import connection
from .anchors import bodies_tree
from .connection import named_fetch

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ..anchor import Anchor
    from ..session_checks import SessionReport


def verify_session_url(
    url: str,
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
) -> SessionReport:
    """As ``session_verify.verify_session_path``: a ledger that is not current is
    NOT_A_CASSETTE or SCHEMA_OUTDATED (``connection.connect_reader``). The tree an
    anchor is checked against is the one the bodies hash to (``anchors.bodies_tree``)."""
    from ..session_checks import verify_session_of

    conn = connection.connect_reader(url)
    try:
        with connection.snapshot(conn):
            return verify_session_of(
                named_fetch(conn),
                lambda: bodies_tree(conn),
                session_id,
                public_key=public_key,
                anchors=anchors,
                seal_key=seal_key,
                origin=origin,
            )
    finally:
        conn.close()
