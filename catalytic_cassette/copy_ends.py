"""The two ends of a ledger copy (``copying``), which each backend implements: a source
read in one snapshot and a destination written in one transaction, and the journal entry
that passes between them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol


class Entry(NamedTuple):
    seq: int
    body: str
    leaf: bytes
    chain: bytes


class Source(Protocol):
    """A ledger's journal read in one snapshot."""

    def ledger_id(self) -> str: ...

    def entries(self, start: int) -> Iterator[Entry]: ...

    def tables(self) -> set[str]: ...

    def close(self) -> None: ...


class Destination(Protocol):
    """A ledger being written in one transaction, one replayed write at a time."""

    tables: frozenset[str]

    def transaction(self) -> AbstractContextManager[object]: ...

    def adopt_ledger_id(self, ledger_id: str) -> None:
        """Take the source's identity, or refuse when the destination is another ledger."""
        ...

    def size(self) -> int: ...

    def chain_at(self, seq: int) -> bytes: ...

    def ledger_time(self) -> int: ...

    def lease_expiry(self, step_id: int) -> int | None: ...

    def write(self, at_ms: int, sql_kind: str, table: str, row: dict[str, Any]) -> list[Entry]:
        """The write, dated ``at_ms``; the journal entries it made."""
        ...

    def close(self) -> None: ...
