"""One ledger of either backend, opened the way the API tests open it: for the tests
that hold the SQLite and the PostgreSQL ledger to the same behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from catalytic_cassette import ManualClock, MessageCassette

BACKENDS = ("sqlite", "postgresql")


@dataclass
class Ledger:
    kind: str
    target: str  # a file path or a postgresql:// URL
    clock: ManualClock = field(default_factory=ManualClock)

    def open(self, **options: Any) -> MessageCassette:
        if self.kind == "sqlite":
            return MessageCassette(self.target, clock=self.clock, **options)
        return MessageCassette(self.target, **options)

    def advance(self, ms: int) -> None:
        """Move the ledger's time forward: the test clock, or the server's offset (which
        only the database owner may move)."""
        if self.kind == "sqlite":
            self.clock.advance(ms)
            return
        import psycopg

        with psycopg.connect(self.target, autocommit=True) as conn:
            conn.execute("SELECT cassette_advance_clock(%s)", (ms,))

    def journal(self) -> list[tuple[int, str, bytes, bytes]]:
        """Every entry: (seq, body, leaf_hash, chain_hash), in order."""
        query = "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal ORDER BY seq"
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.target)
            try:
                return [(s, b, bytes(lh), bytes(ch)) for s, b, lh, ch in conn.execute(query)]
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.target) as pg:
            return [(s, b, bytes(lh), bytes(ch)) for s, b, lh, ch in pg.execute(query)]


def sqlite_ledger(tmp_path: Path) -> Ledger:
    return Ledger("sqlite", str(tmp_path / "ledger.db"))
