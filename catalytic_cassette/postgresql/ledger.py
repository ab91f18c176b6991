"""What every PostgreSQL entry point shares in place of ``LedgerFile``'s SQLite methods:
the connection's named queries, the server's time, seals and snapshots, closing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

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


P = TypeVar("P", bound="PgLedger")


class PgLedger:
    """Mixed in before the SQLite class it stands in for (``PgMessageCassette``,
    ``PgCausalChain``): these override ``LedgerFile``'s methods."""

    @classmethod
    def _postgresql_class(cls: type[P]) -> type[P]:
        """A PostgreSQL class serves itself (``LedgerFile._postgresql_class``)."""
        return cls

    db_path: str
    pg: psycopg.Connection[Any]
    auto_seal: AutoSeal | None
    clock: Clock
    created: bool
    schema_version: int
    commits_early: bool

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
        does not take (a client's clock: time is the server's), connect and migrate, note
        whether this open made the ledger (``cassette init``), and refuse automatic seals
        to a role that cannot seal before anything is written."""
        from ..clock import SystemClock
        from ..connection import resolve_durability
        from ..ledger import default_db_path

        if clock is not None and not isinstance(clock, SystemClock):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "a PostgreSQL ledger keeps the server's time; it takes no clock",
            )
        self.auto_seal = None if read_only else auto_seal
        self.clock = SystemClock()
        self.db_path = os.fspath(db_path) if db_path is not None else default_db_path()
        durability = resolve_durability(durability)
        self.pg, self.created = connection.open_ledger(
            self.db_path,
            durability=durability,
            busy_timeout_ms=busy_timeout_ms,
            read_only=read_only,
        )
        self.schema_version = len(sqlfiles.migrations())
        # At durability normal every commit is asynchronous already (nothing to flush).
        self.commits_early = (
            durability == "full" and not read_only and bool(self._fetch("can_flush")[0][0])
        )
        if self.auto_seal is not None and not self._fetch("can_seal")[0][0]:
            self.pg.close()
            raise CassetteError(
                ErrorCode.PERMISSION_DENIED,
                "automatic seals need INSERT on cassette_seals, the ledger owner's: this"
                " role (a worker's or an appender's) cannot seal; seal with the owner's URL",
            )

    def _write(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        """A write that is one named statement (its own transaction), then the automatic
        seal (if any), as ``LedgerFile.write`` runs it once the transaction committed."""
        if self.commits_early:
            rows = connection.commit_early(self.pg, query(name), params)
        else:
            rows = self._fetch(name, **params)
        self._wrote()
        return rows

    @contextmanager
    def _writing(self) -> Iterator[psycopg.Connection[Any]]:
        """A write of several statements in one transaction, then the automatic seal (if
        any) once it committed; a refused write seals nothing."""
        begin = connection.early_transaction if self.commits_early else connection.transaction
        with begin(self.pg) as conn:
            yield conn
        self._wrote()

    def _wrote(self) -> None:
        if self.auto_seal is not None:
            self.auto_seal.after_write(self)

    def read_snapshot(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """Several reads in one snapshot (``connection.snapshot``)."""
        return connection.snapshot(self.pg)

    def _fetch(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        """One named query, one statement: its own transaction (autocommit)."""
        return connection.statement(self.pg, query(name), params)

    def now_ms(self) -> int:
        """The ledger's time now: the server's clock, never earlier than the last write."""
        return int(self._fetch("server_now")[0][0])

    def ledger_now(self, conn: sqlite3.Connection) -> int:
        unsupported("ledger_now on a SQLite connection")

    def write(self, tables: Iterable[str] | None = None) -> write_transaction:
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

    def journal_size(self) -> int:
        """The number of journal entries, counted in the journal (its last entry is its
        end; the head keeps no count: schema/10_ledger.sql)."""
        from .anchors import journal_size

        return journal_size(self.pg)

    def latest_seal(self) -> Seal | None:
        from ..seals import seal_of_row

        rows = self._fetch("latest_seal")
        return seal_of_row(rows[0]) if rows else None

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
        try:
            if self.auto_seal is not None:
                self.auto_seal.at_close(self)
        finally:
            self.pg.close()
