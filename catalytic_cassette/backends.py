"""Which implementation serves a ledger target, chosen in one place.

A target (``--db``, ``CASSETTE_DB``, a copy's source or destination) names a SQLite file
or a PostgreSQL database (``targets``, which also chooses a ledger's class). Every caller
asks this module for the implementation of what else it needs (a reader, a verify, a
proof source, a copy's ends, a restore's destination) instead of branching on the target
itself, and no module outside ``postgresql/`` but this one imports PostgreSQL's. Each
backend's modules are imported only when a target names that backend, so a command on a
file never loads PostgreSQL's (nor psycopg); at load this module imports only ``targets``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .targets import names_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .anchor import Anchor
    from .copy_ends import Destination, Source
    from .follow import JournalReader
    from .proofs import ProofSource
    from .session_checks import SessionReport
    from .verify.findings import VerifyReport


def pending_migrations(target: str) -> tuple[list[int], int]:
    """The migrations ``target`` has not applied yet, and the latest version there is."""
    if names_file(target):
        from .connection import pending_versions
        from .migrate import current_version

        return pending_versions(target), current_version()
    from .postgresql import connection, sqlfiles

    return connection.pending_versions(target), len(sqlfiles.migrations())


@contextmanager
def open_proof_source(target: str) -> Iterator[ProofSource]:
    """What proofs are built from, read-only: proving never creates or changes a ledger."""
    if names_file(target):
        from .connection import connect_reader
        from .proofs import SqliteProofSource

        conn = connect_reader(target)
        try:
            yield SqliteProofSource(conn)
        finally:
            conn.close()
        return
    from .postgresql import connection
    from .postgresql.anchors import PgProofSource

    pg = connection.connect_reader(target)
    try:
        yield PgProofSource(pg)
    finally:
        pg.close()


@contextmanager
def open_journal_reader(target: str) -> Iterator[JournalReader]:
    """Polls of the journal, read-only."""
    if names_file(target):
        from .connection import connect_reader
        from .follow import read_after

        conn = connect_reader(target)
        try:
            yield lambda since, limit: read_after(conn, since, limit)
        finally:
            conn.close()
        return
    from .postgresql import connection
    from .postgresql.anchors import journal_reader

    pg = connection.connect_reader(target)
    try:
        yield journal_reader(pg)
    finally:
        pg.close()


def journal_length_unopened(target: str) -> int:
    """The journal's length read before the ledger is opened, for a progress bar: a
    file's; 0 (no bar) for a database, whose length is not read before its snapshot."""
    if not names_file(target):
        return 0
    from .tree import journal_size

    return journal_size(target)


def server_verify(target: str) -> Callable[..., VerifyReport] | None:
    """The verify of a ledger held by a server (its own reads, the same checks), or
    None for a file, which ``verify.run`` reads itself."""
    if names_file(target):
        return None
    from .postgresql.verify import verify_url

    return verify_url


def verify_session_on_server(
    target: str,
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None,
    anchors: list[Anchor] | None,
    seal_key: Ed25519PublicKey | None,
    origin: str | None,
) -> SessionReport | None:
    """One session verified on a server's ledger, or None for a file, which
    ``session_verify`` reads itself."""
    if names_file(target):
        return None
    from .postgresql.sessions import verify_session_url

    return verify_session_url(
        target,
        session_id,
        public_key=public_key,
        anchors=anchors,
        seal_key=seal_key,
        origin=origin,
    )


def snapshot_replays_journal(target: str | os.PathLike[str]) -> bool:
    """Whether a snapshot of ``target`` is a replay of its journal (a database's export)
    rather than the file's own bytes: such a copy cannot show a row changed behind the
    journal's back, so the source must verify first."""
    return not names_file(target)


def restore_by_copy(dest: str | os.PathLike[str]) -> bool:
    """Whether a restore fills ``dest`` by a copy through its own law (a database, which
    must hold no journal entry yet: checked here) rather than by writing a new file."""
    if names_file(dest):
        return False
    from .postgresql.copying import require_no_journal

    require_no_journal(os.fspath(dest))
    return True


def open_source(target: str) -> Source:
    """A copy's source: ``target``'s journal read in one snapshot."""
    if names_file(target):
        from .copying_sqlite import SqliteSource

        return SqliteSource(target)
    from .postgresql.copying import PgSource

    return PgSource(target)


def open_destination(target: str, durability: str | None, ledger_id: str) -> Destination:
    """A copy's destination, written in one transaction."""
    if names_file(target):
        from .copying_sqlite import SqliteDestination

        return SqliteDestination(target, durability, ledger_id)
    from .postgresql.copying import PgDestination

    return PgDestination(target, durability)
