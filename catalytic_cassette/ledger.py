"""What every entry point shares: a ledger path, its clock and one open connection."""

from __future__ import annotations

import os
import sqlite3
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .clock import Clock, SystemClock
from .connection import (
    DEFAULT_BUSY_TIMEOUT_MS,
    connect,
    connect_reader,
    ledger_now,
    read_transaction,
    write_transaction,
)
from .errors import CassetteError, ErrorCode, translate
from .migrate import current_version
from .targets import ledger_class

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from .seals import AutoSeal, Seal

L = TypeVar("L", bound="LedgerFile")
DB_ENV = "CASSETTE_DB"
DEFAULT_DB = "cassette.db"


def default_db_path() -> str:
    return os.environ.get(DB_ENV) or DEFAULT_DB


def snapshot_into(source: sqlite3.Connection, path: Path) -> None:
    """SQLite's online backup in one step (one read snapshot; writers keep going in WAL),
    into the new file ``path``, complete on its own (rollback journal, not WAL)."""
    try:
        target = sqlite3.connect(path, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = DELETE").fetchall()
        finally:
            target.close()
    except sqlite3.Error as exc:
        raise translate(exc) from exc


class LedgerFile:
    """Opens (creating and migrating if needed) the ledger; a context manager.

    ``read_only=True`` opens an existing, current ledger without ever writing it: a
    missing file is CANNOT_OPEN instead of a new empty ledger, and writes are refused.
    ``lazy_temp_triggers=True`` (what a one-shot CLI command opens with) installs each
    table's TEMP triggers at the first write transaction that names it (``connect``);
    a PostgreSQL ledger has none and ignores it.

    A ``postgresql://`` URL instead of a path opens a PostgreSQL ledger: the class's
    PostgreSQL counterpart (``_postgresql_class``) is chosen here, once, by
    ``targets.ledger_class``.
    """

    def __new__(
        cls: type[L], db_path: str | os.PathLike[str] | None = None, *_: Any, **__: Any
    ) -> L:
        target = os.fspath(db_path) if db_path is not None else default_db_path()
        return object.__new__(ledger_class(cls, target, cls._postgresql_class))

    @classmethod
    def _postgresql_class(cls: type[L]) -> type[L]:
        """The class that serves this entry point on a PostgreSQL ledger: each ported
        class names its counterpart (``PgLedger``'s classes serve themselves);
        BACKEND_UNSUPPORTED for one not ported yet."""
        raise CassetteError(
            ErrorCode.BACKEND_UNSUPPORTED,
            f"{cls.__name__} is not available on a PostgreSQL ledger yet",
        )

    def __init__(
        self,
        db_path: str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
        durability: str | None = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        auto_seal: AutoSeal | None = None,
        read_only: bool = False,
        lazy_temp_triggers: bool = False,
    ) -> None:
        self.auto_seal = None if read_only else auto_seal
        self.db_path = os.fspath(db_path) if db_path is not None else default_db_path()
        self.clock: Clock = clock or SystemClock()
        self.conn: sqlite3.Connection
        # what `cassette init` reports: whether this open made the ledger, and its version
        self.created = self.db_path == ":memory:" or not os.path.exists(self.db_path)
        self.schema_version = current_version()
        if read_only:
            self.conn = connect_reader(self.db_path, clock=self.clock)
        else:
            self.conn = connect(
                self.db_path,
                clock=self.clock,
                durability=durability,
                busy_timeout_ms=busy_timeout_ms,
                lazy_temp_triggers=lazy_temp_triggers,
            )

    def now_ms(self) -> int:
        """The writer's clock: the same object the SQL function cassette_now_ms() reads."""
        return self.clock.now_ms()

    def ledger_now(self, conn: sqlite3.Connection) -> int:
        """The time a write is dated with, inside its transaction (``connection.ledger_now``)."""
        return ledger_now(conn, self.clock)

    def seal(
        self,
        private_key: Ed25519PrivateKey,
        *,
        origin: str | None = None,
        size: int | None = None,
        before_commit: Callable[[Seal], object] | None = None,
    ) -> Seal:
        """Sign the head (or the first ``size`` entries) and record the seal
        (``seals.record_seal``); ``before_commit`` runs inside its transaction."""
        from .seals import record_seal

        return record_seal(
            self.conn,
            private_key,
            now_ms=self.now_ms(),
            origin=origin,
            size=size,
            before_commit=before_commit,
        )

    def read_snapshot(self) -> AbstractContextManager[Any]:
        """Several reads in one snapshot: a read transaction (inside a transaction
        already, that one)."""
        return read_transaction(self.conn)

    def journal_size(self) -> int:
        """The number of journal entries (the tree's size)."""
        from .tree import size

        return size(self.conn)

    def latest_seal(self) -> Seal | None:
        from .seals import latest_seal

        return latest_seal(self.conn)

    def export_snapshot(self, path: Path) -> None:
        """Write one snapshot of the ledger into the new file ``path``, complete on its
        own (SQLite's online backup; writers keep going)."""
        snapshot_into(self.conn, path)

    def write(self, tables: Iterable[str] | None = None) -> write_transaction:
        """One write transaction; once it commits, the automatic seal (if any) runs.
        ``tables``: the tables it writes, when known (``connect``'s lazy_temp_triggers)."""
        sealed = None if self.auto_seal is None else self._sealed
        return write_transaction(self.conn, sealed, tables)

    def _sealed(self) -> None:
        if self.auto_seal is not None:
            self.auto_seal.after_write(self)

    def close(self) -> None:
        try:
            if self.auto_seal is not None:
                self.auto_seal.at_close(self)
        finally:
            self.conn.close()

    def __enter__(self: L) -> L:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
