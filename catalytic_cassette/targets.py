"""What kind of ledger a target names, a SQLite file or a PostgreSQL database, and the
class that opens it.

A target is ``--db``, ``CASSETTE_DB``, a copy's source or destination. This is the one
test of a target's kind; ``backends`` hands out each kind's other implementations. It
imports nothing, so the SQLite opener at the bottom of the package (``connection``) and
every ledger open (``LedgerFile``) may ask it without a circle through the
implementations above, and without loading them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

C = TypeVar("C")

URL_PREFIXES = ("postgresql://", "postgres://")


def is_postgres_url(target: str) -> bool:
    """Whether ``--db`` / ``CASSETTE_DB`` names a PostgreSQL ledger instead of a file."""
    return target.startswith(URL_PREFIXES)


def names_file(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a SQLite file (or ``:memory:``), to which the checks of a
    path apply (it exists, its directory does, it is not overwritten); a database's
    ledger is checked by its open instead."""
    return not is_postgres_url(os.fspath(target))


def require_file(target: str) -> None:
    """Refuse a database where only a SQLite file will do (BACKEND_UNSUPPORTED)."""
    if not names_file(target):
        from .errors import CassetteError, ErrorCode

        raise CassetteError(
            ErrorCode.BACKEND_UNSUPPORTED,
            "this command does not take a PostgreSQL ledger yet (docs: README, PostgreSQL)",
        )


def ledger_class(cls: type[C], target: str, on_postgresql: Callable[[], type[C]]) -> type[C]:
    """The class that serves ``target``: ``cls`` for a file, for a URL the PostgreSQL
    counterpart ``on_postgresql`` names (``LedgerFile._postgresql_class``)."""
    return cls if names_file(target) else on_postgresql()
