"""Which class serves a PostgreSQL ledger in place of each SQLite one."""

from __future__ import annotations

from typing import TypeVar

from ..errors import CassetteError, ErrorCode

C = TypeVar("C")


def postgres_class(cls: type[C]) -> type[C]:
    """The PostgreSQL counterpart of ``cls`` (itself if it is one); BACKEND_UNSUPPORTED
    for an entry point not ported yet."""
    from ..cassette import MessageCassette
    from ..chain import CausalChain
    from .cassette import PgMessageCassette
    from .chain import PgCausalChain

    counterparts: dict[type, type] = {
        MessageCassette: PgMessageCassette,
        CausalChain: PgCausalChain,
    }
    for sqlite_class, pg_class in counterparts.items():
        if issubclass(cls, pg_class):
            return cls
        if cls is sqlite_class:
            return pg_class
    raise CassetteError(
        ErrorCode.BACKEND_UNSUPPORTED,
        f"{cls.__name__} is not available on a PostgreSQL ledger yet",
    )
