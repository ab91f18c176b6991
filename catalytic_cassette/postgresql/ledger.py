"""What every PostgreSQL entry point shares in place of ``LedgerFile``'s SQLite methods:
the connection's named queries, the server's time, seals and snapshots, closing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import CassetteError, ErrorCode
from . import connection, sqlfiles
from .sqlfiles import query

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    import psycopg
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..clock import Clock
    from ..connection import write_transaction
    from ..seals import AutoSeal, Seal


def unsupported(what: str) -> NoReturn:
    raise CassetteError(
        ErrorCode.BACKEND_UNSUPPORTED, f"{what} is not available on a PostgreSQL ledger yet"
    )


class PgLedger:
    """Mixed in before the SQLite class it stands in for (``PgMessageCassette``,
    ``PgCausalChain``): these override ``LedgerFile``'s methods."""

    db_path: str
    pg: psycopg.Connection[Any]
    auto_seal: AutoSeal | None
    clock: Clock
    created: bool
    schema_version: int

    def _open_ledger(
        self,
        db_path: str | os.PathLike[str] | None,
        *,
        clock: Clock | None,
        durability: str | None,
        busy_timeout_ms: int,
        auto_seal: AutoSeal | None,
        read_only: bool,
    ) -> None:
        """What every PostgreSQL entry point's ``__init__`` does: refuse what the backend
        does not take (a client's clock: time is the server's; automatic seals), connect
        and migrate, and note whether this open made the ledger (``cassette init``)."""
        from ..clock import SystemClock
        from ..connection import resolve_durability
        from ..ledger import default_db_path

        if clock is not None and not isinstance(clock, SystemClock):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "a PostgreSQL ledger keeps the server's time; it takes no clock",
            )
        if auto_seal is not None:
            unsupported("automatic sealing")
        self.auto_seal = None
        self.clock = SystemClock()
        self.db_path = os.fspath(db_path) if db_path is not None else default_db_path()
        self.pg, self.created = connection.open_ledger(
            self.db_path,
            durability=resolve_durability(durability),
            busy_timeout_ms=busy_timeout_ms,
            read_only=read_only,
        )
        self.schema_version = len(sqlfiles.migrations())

    def _fetch(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        """One named query, one statement: its own transaction (autocommit)."""
        return connection.statement(self.pg, query(name), params)

    def now_ms(self) -> int:
        """The ledger's time now: the server's clock, never earlier than the last write."""
        return int(self._fetch("server_now")[0][0])

    def ledger_now(self, conn: sqlite3.Connection) -> int:
        unsupported("ledger_now on a SQLite connection")

    def write(self) -> write_transaction:
        unsupported("a raw SQLite write transaction")

    def seal(
        self,
        private_key: Ed25519PrivateKey,
        *,
        origin: str | None = None,
        size: int | None = None,
        before_commit: Callable[[Seal], object] | None = None,
    ) -> Seal:
        from .anchors import record_seal

        return record_seal(
            self.pg, private_key, origin=origin, size=size, before_commit=before_commit
        )

    def export_snapshot(self, path: Path) -> None:
        """One snapshot of the journal copied into the new file ``path``, every entry
        through SQLite's law (``copying``): a backup that restores into either backend."""
        import sqlite3

        from ..copying import copy_ledger

        copy_ledger(self.db_path, os.fspath(path))
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA journal_mode = DELETE").fetchall()  # one file, no -wal
        finally:
            conn.close()

    def close(self) -> None:
        self.pg.close()
