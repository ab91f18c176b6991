"""Shared fixtures: a fresh ledger per test, a clock tests drive, raw access."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ManualClock, MessageCassette, tree
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.merkle import CompactRange

from . import backends
from .backends import Ledger

# ------------------------------------------------------------------ backends
#
# A test marked ``both_backends`` (or in a module so marked) that uses ``backend`` or the
# fixtures built on it (``cassette``, ``clock``, ``db_path``, ``ledger``) runs twice: on a
# SQLite file and on a fresh PostgreSQL ledger (tests/backends.py). ``sqlite_only(reason)``
# keeps a test on SQLite and says why; ``postgresql_pending(reason)`` runs the PostgreSQL
# case as a strict xfail (a feature that still refuses BACKEND_UNSUPPORTED there).


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_kind" not in metafunc.fixturenames:
        return
    definition = metafunc.definition
    if definition.get_closest_marker("sqlite_only") is not None:
        return
    if definition.get_closest_marker("both_backends") is None:
        return
    pending = definition.get_closest_marker("postgresql_pending")
    postgresql: Any = "postgresql"
    if pending is not None:
        reason = pending.kwargs.get("reason") or (pending.args[0] if pending.args else "")
        # The API refuses with CassetteError; a CLI test's assertion on its output fails
        # instead (raises=AssertionError), as the marker says.
        raises = pending.kwargs.get("raises", CassetteError)
        postgresql = pytest.param(
            "postgresql",
            marks=pytest.mark.xfail(
                strict=True, raises=raises, reason=f"ported in a parallel branch: {reason}"
            ),
        )
    metafunc.parametrize("backend_kind", ["sqlite", postgresql], scope="function")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs a PostgreSQL server carries the ``postgresql`` marker, so
    ``-m "not postgresql"`` runs the suite on SQLite alone and ``-m postgresql`` the rest."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        on_server = "pg_server" in names or (
            callspec is not None
            and any(value == "postgresql" for value in callspec.params.values())
        )
        if on_server:
            item.add_marker(pytest.mark.postgresql)


@pytest.fixture
def backend_kind() -> str:
    """SQLite, unless the test is marked ``both_backends`` (then parametrized)."""
    return "sqlite"


@pytest.fixture
def backend(request: pytest.FixtureRequest, backend_kind: str, tmp_path: Path) -> Ledger:
    """The ledger of the backend under test, not yet made (a path or a URL)."""
    if backend_kind == "sqlite":
        return Ledger("sqlite", str(tmp_path / "ledger.db"))
    return Ledger("postgresql", request.getfixturevalue("pg_ledger"))


@pytest.fixture
def clock(backend: Ledger) -> ManualClock:
    """The ledger's clock: a ManualClock, or on PostgreSQL a ServerClock (same
    ``advance``/``now_ms``) that the ledger ignores, keeping the server's time."""
    return backend.clock  # type: ignore[return-value]


@pytest.fixture
def db_path(backend: Ledger) -> Path:
    """The ledger's path; on PostgreSQL its URL (a str: tests pass it on as they would a
    path, to ``MessageCassette``, ``--db`` or ``dump``)."""
    if backend.postgresql:
        return backend.target  # type: ignore[return-value]
    return Path(backend.target)


@pytest.fixture
def ledger(backend: Ledger) -> tuple[Path, ManualClock]:
    """An empty ledger and the clock to write it with (tests that open it themselves; a
    module's own ``ledger`` fixture takes precedence)."""
    backend.open(durability="normal").close()
    path: Any = backend.target if backend.postgresql else Path(backend.target)
    return path, backend.clock  # type: ignore[return-value]


@pytest.fixture
def cassette(db_path: Path, clock: ManualClock) -> Iterator[MessageCassette]:
    """The ledger at ``db_path`` opened with ``clock`` (a module may override either)."""
    with MessageCassette(db_path, clock=clock) as opened:
        yield opened


@pytest.fixture
def raw(db_path: Path, cassette: MessageCassette) -> Iterator[sqlite3.Connection]:
    """A raw sqlite3 connection with default settings, as an attacker would open it."""
    conn = sqlite3.connect(db_path)
    yield conn
    conn.close()


def seal_as_before_the_check(patched: pytest.MonkeyPatch) -> None:
    """Within ``patched``, record_seal signs the stored tree unchecked, as every release
    before the seal check did: for a ledger built at an older schema (before 0009 every
    node up to the head was stored, which today's rule, and so the check, refuses)."""
    from catalytic_cassette import seals

    def unchecked(
        conn: sqlite3.Connection, key: object, origin: str, size: int, ahead: object = None
    ) -> bytes:
        return tree.StoredTree(conn).root(size)

    patched.setattr(seals, "_check_ahead", lambda *_: None)
    patched.setattr(seals, "_checked_root", unchecked)


def dump(path: Path | str) -> list[str]:
    """Every schema object and row of the ledger, as SQL text (either backend)."""
    return backends.dump(path)


def file_digest(path: Path) -> str:
    """SHA-256 of the database file and its WAL: the bytes on disk."""
    digest = hashlib.sha256()
    if backends.is_postgresql(path):  # no file: the rows and triggers stand for the bytes
        digest.update("\n".join(backends.dump(path)).encode("utf-8"))
        return digest.hexdigest()
    for suffix in ("", "-wal"):
        part = Path(str(path) + suffix)
        if part.exists():
            digest.update(part.read_bytes())
    return digest.hexdigest()


@contextmanager
def unguarded(path: Path, table: str | None = None) -> Iterator[sqlite3.Connection]:
    """A raw connection with every trigger (of ``table``, if named) dropped; they are put
    back on exit, in their original order (SQLite fires the newest BEFORE trigger of an
    event first)."""
    conn = sqlite3.connect(path, isolation_level=None)
    triggers = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
        " AND (? IS NULL OR tbl_name = ?) ORDER BY rowid",
        (table, table),
    ).fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    try:
        yield conn
    finally:
        for _, sql in triggers:
            conn.execute(sql)
        conn.close()


class _SuperuserShell:
    """A PostgreSQL session as the superuser with ordinary triggers off, answering
    ``execute(sql, params)`` with SQLite's ``?`` placeholders as a sqlite3 connection does."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg

    def execute(self, statement: str, params: Any = ()) -> Any:
        if params:
            return self.pg.execute(backends.pg_sql(statement), params)
        return self.pg.execute(statement)


@contextmanager
def tampering(target: Path | str) -> Iterator[Any]:
    """A connection with every trigger out of the way, as someone who owns the storage
    has: on SQLite the triggers dropped (``unguarded``); on PostgreSQL the superuser's
    session with ordinary triggers off (``session_replication_role``), committed on exit."""
    if not backends.is_postgresql(target):
        with unguarded(Path(target)) as conn:
            yield conn
        return
    import psycopg

    with psycopg.connect(str(target)) as pg:  # one transaction, committed on exit
        pg.execute("SET LOCAL session_replication_role = replica")
        yield _SuperuserShell(pg)


def tamper(target: Path | str, *statements: str) -> None:
    """Run ``statements`` through ``tampering``."""
    with tampering(target) as conn:
        for statement in statements:
            conn.execute(statement)


def write_journal(conn: sqlite3.Connection, bodies: list[str]) -> None:
    """Replace the journal and the tree with ``bodies`` as entries 0..n-1, every leaf,
    link and node recomputed: what someone who can write the file (triggers dropped)
    and knows the formulas can do."""
    conn.execute("DELETE FROM cassette_journal")
    conn.execute("DELETE FROM cassette_tree_nodes")
    keep = tree.tail_start(len(bodies))  # the nodes of complete blocks (0009)
    prev, edge = ZERO_HASH, CompactRange()
    for seq, body in enumerate(bodies):
        leaf = leaf_hash(body.encode("utf-8"))
        prev = chain_hash(seq, prev, leaf)
        conn.execute(
            "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash) VALUES (?, ?, ?, ?)",
            (seq, body, leaf, prev),
        )
        conn.executemany(
            "INSERT INTO cassette_tree_nodes (leaf_end, level, hash) VALUES (?, ?, ?)",
            [(seq, level, node) for level, node in edge.append(leaf) if seq < keep],
        )


def action_dict(
    kind: str, name: str, parent: str | None = None, *, plan: str = "p", session: str | None = None
) -> dict[str, Any]:
    """An action to append: ``kind`` in plan ``plan``, named and argued by ``name``."""
    return {
        "plan_id": plan,
        "intent_id": "intent",
        "action_type": kind,
        "function_name": name,
        "parent_action_id": parent,
        "session_id": session,
        "arguments": [name],
    }


def record_future_migration(path: Path, version: int, name: str = "future") -> None:
    """What a newer package's migration does to this file: it re-creates the migrations
    guard for its own version (as every migration from 0005 on does), then records it; on
    PostgreSQL the owner records it (the table has no guard there)."""
    if backends.is_postgresql(path):
        assert backends.raw_script(
            path,
            f"INSERT INTO cassette_migrations (version, name) VALUES ({int(version)}, '{name}')",
        )
        return
    conn = sqlite3.connect(path)
    conn.create_function("cassette_chain_hash", 3, lambda *args: None)  # a package connection
    conn.execute("DROP TRIGGER cassette_migrations_insert_guard")
    conn.execute(
        "CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations"
        f" WHEN NEW.version IS NOT {int(version)} BEGIN"
        " SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself');"
        " END"
    )
    conn.execute(
        "INSERT INTO cassette_migrations (version, name, sha256) VALUES (?, ?, ?)",
        (version, name, "ab" * 32),
    )
    conn.commit()
    conn.close()


DEVELOPMENT_LEDGER = Path(__file__).parent / "data" / "ledger_v1.sql"


def load_development_ledger(path: Path) -> None:
    """A ledger made by a development build before the 0.1.0 baseline: the dump of one
    made at the first of the migrations that preceded it (its cassette_migrations row
    names migration 1 'cassette', with that file's SHA-256), loaded raw."""
    from catalytic_cassette.migrate import APPLICATION_ID

    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(DEVELOPMENT_LEDGER.read_text())  # a raw load: no transaction is open
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def rewrite_migration_row(path: Path, column: str, value: str) -> None:
    """A current ledger whose recorded baseline row is changed in one column: what a file
    of a development build with another baseline looks like (the guard that keeps the row
    is dropped and re-created with its own text, so the schema is as shipped)."""
    conn = sqlite3.connect(path, isolation_level=None)
    (guard,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'cassette_migrations_no_update'"
    ).fetchone()
    conn.execute("BEGIN")
    conn.execute("DROP TRIGGER cassette_migrations_no_update")
    conn.execute(f"UPDATE cassette_migrations SET {column} = ? WHERE version = 1", (value,))
    conn.execute(guard)
    conn.execute("COMMIT")
    conn.close()


# PostgreSQL (issue 15): a server per session, a fresh database per test; see tests/postgres.py.
@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The URL of a PostgreSQL server, as its superuser (CASSETTE_TEST_POSTGRES, or a
    throwaway cluster); fails without one unless CASSETTE_SKIP_POSTGRES=1."""
    from . import postgres

    with postgres.server() as url:
        yield url


@pytest.fixture
def pg_database(pg_server: str) -> Iterator[str]:
    """The URL of a new, empty database on ``pg_server``, dropped after the test."""
    from . import postgres

    url = postgres.create_database(pg_server)
    yield url
    postgres.drop_database(pg_server, url)


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> Iterator[str]:
    """The name of a database migrated once per session, for ``pg_ledger`` to copy."""
    from . import postgres

    url = postgres.create_database(pg_server)
    MessageCassette(url).close()
    postgres.vacuum(url)
    yield postgres.database_name(url)
    postgres.drop_database(pg_server, url)


@pytest.fixture
def pg_ledger(pg_server: str, pg_template: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL ledger (a copy of the migrated template)."""
    from . import postgres

    url = postgres.clone_database(pg_server, pg_template)
    yield url
    postgres.drop_database(pg_server, url)


@pytest.fixture(autouse=True)
def _statements_are_named(request: pytest.FixtureRequest) -> Iterator[None]:
    """On PostgreSQL, every statement the package sends during a test is a named query
    or a migration (issue 15, item 8; tests/named_sql.py)."""
    if request.node.get_closest_marker("postgresql") is None:
        yield
        return
    from .named_sql import recording, unnamed

    with recording() as sent:
        yield
    stray = sorted(set(unnamed(sent)))
    assert not stray, f"the package sent SQL named nowhere in sql/postgresql: {stray}"
