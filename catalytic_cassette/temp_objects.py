"""A package connection writes only while its TEMP schema is the one it installed.

SQLite resolves an unqualified name in the TEMP schema first, and runs a connection's TEMP
triggers before the file's own. So a client that adds TEMP objects to a package connection
changes what the package's SQL does on it: a TEMP trigger ending in ``RAISE(IGNORE)`` skips
the file's triggers after it (LAW.md section 8a), a TEMP table or view named like a ledger
table (``cassette_steps``) takes the place of the file's table in every unqualified
statement. Each write transaction of the package therefore begins by checking that the
connection's TEMP schema is exactly what the package installed (``connect``, or
``install_temp_triggers`` on a lazy connection), and refuses otherwise with
``FOREIGN_TEMP_OBJECT`` (nothing written).

The check is one ``PRAGMA temp.schema_version`` read: SQLite increments that cookie on
every change to the TEMP schema, so the objects themselves are compared only when it moved
(a TEMP table the package creates and drops, verify's, moves it too). It catches a careless
client; a hostile one controls its own process and can skip it, which is why verify judges
what reached the journal (LAW.md section 9).
"""

from __future__ import annotations

import sqlite3

from .errors import CassetteError, ErrorCode

_OBJECTS = "SELECT type, name, tbl_name, sql FROM sqlite_temp_master"
_VERSION = "PRAGMA temp.schema_version"


class TempSchema:
    """What a package connection installed in its TEMP schema, and the cookie that said so.

    It keeps a cursor of its own for the cookie: a new cursor per read (what
    ``Connection.execute`` makes) was a fifth of the check's cost (docs/BENCHMARKS.md)."""

    __slots__ = ("_cursor", "objects", "version")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._cursor = sqlite3.Cursor(conn)
        self.objects = _objects(conn)
        self.version = self.cookie()

    def taken(self, conn: sqlite3.Connection) -> None:
        """Take what the TEMP schema holds now as installed: the package has just added
        to it (``connection.install_temp_triggers``), after checking it."""
        self.objects = _objects(conn)
        self.version = self.cookie()

    def cookie(self) -> int:
        # (fetchall: the statement runs to its end and is reset, nothing stays open)
        return int(self._cursor.execute(_VERSION).fetchall()[0][0])


def _objects(conn: sqlite3.Connection) -> frozenset[tuple[object, ...]]:
    return frozenset(tuple(row) for row in sqlite3.Connection.execute(conn, _OBJECTS))


def refuse_foreign(conn: sqlite3.Connection, installed: TempSchema) -> None:
    """Raise FOREIGN_TEMP_OBJECT unless the TEMP schema is what was installed."""
    version = installed.cookie()
    if version == installed.version:
        return
    found = _objects(conn)
    if found != installed.objects:
        added = sorted(str(name) for _, name, _, _ in found - installed.objects)
        removed = sorted(str(name) for _, name, _, _ in installed.objects - found)
        raise CassetteError(
            ErrorCode.FOREIGN_TEMP_OBJECT,
            "this connection's TEMP schema is not the one the package installed (a TEMP"
            " trigger, table or view of the client changes what the ledger's SQL does):"
            " nothing was written",
            added=added,
            removed=removed,
        )
    installed.version = version
