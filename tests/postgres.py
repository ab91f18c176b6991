"""Test helpers for a real PostgreSQL server: where it comes from, and a fresh database
per test.

The server is ``CASSETTE_TEST_POSTGRES`` (a ``postgresql://`` URL) when set; otherwise a
throwaway cluster started with ``scripts/pg_cluster.py`` for the test session. Without a
server a test that needs one fails, unless ``CASSETTE_SKIP_POSTGRES=1`` says to skip it
(issue 15: skipped locally only when a variable says so; CI sets nothing and fails).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

if TYPE_CHECKING:  # psycopg is imported when a test needs it: without it, the rest runs
    import psycopg

SERVER_VARIABLE = "CASSETTE_TEST_POSTGRES"
SKIP_VARIABLE = "CASSETTE_SKIP_POSTGRES"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
# Every database a test makes starts with this, so a leftover is recognisable.
PREFIX = "cassette_test_"
# The non-superuser role owning every database a test makes (and so every test ledger).
OWNER = "cassette_test_owner"


def _pg_cluster() -> ModuleType:
    """scripts/pg_cluster.py, imported without leaving scripts/ on sys.path for the rest of
    the session (as tests/test_scripts.py does)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import pg_cluster

        return pg_cluster
    finally:
        sys.path.remove(str(SCRIPTS))


def skip_allowed(environ: Mapping[str, str]) -> bool:
    """Whether a test without a server is skipped rather than failed."""
    return environ.get(SKIP_VARIABLE, "") == "1"


def unavailable(reason: str) -> NoReturn:
    """A test needs PostgreSQL and there is none: fail, or skip when the variable says so."""
    if skip_allowed(os.environ):
        pytest.skip(f"no PostgreSQL server ({SKIP_VARIABLE}=1): {reason}")
    pytest.fail(
        f"no PostgreSQL server: {reason}\n"
        f"Set {SERVER_VARIABLE} to a postgresql:// URL, install PostgreSQL (initdb, pg_ctl)"
        f" so the tests start their own, or set {SKIP_VARIABLE}=1 to skip these tests locally.",
        pytrace=False,
    )


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` instead (the URL's path, and any ``dbname``
    parameter dropped so it cannot override the path)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
    return urlunsplit(parts._replace(path="/" + name, query=urlencode(query, safe="/")))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _check_server(url: str) -> None:
    """Raise if ``url`` cannot be reached (psycopg's own error, which says why)."""
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        conn.execute("SELECT 1")


@contextmanager
def server(tmp_root: Path | None = None) -> Iterator[str]:
    """A server URL for the session: the variable's, or a throwaway cluster's, stopped and
    removed on exit. Calls ``unavailable`` when there is none."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed (pip install -e '.[test]')")
    given = os.environ.get(SERVER_VARIABLE)
    if given:
        if not given.startswith(("postgresql://", "postgres://")):
            unavailable(f"{SERVER_VARIABLE} is not a postgresql:// URL: {given!r}")
        # The verdict is given outside the except block, so the report is the message
        # alone, not a chain of tracebacks.
        problem = None
        try:
            _check_server(given)
        except Exception as error:
            problem = f"{SERVER_VARIABLE}={given} is unreachable: {error}"
        if problem is not None:
            unavailable(problem)
        yield given
        return
    pg_cluster = _pg_cluster()
    # Not pytest's tmp_path: its parents are private to root, and under root the cluster
    # runs as the postgres user, which must enter the directory. Short, too: the unix
    # socket's path must fit in 107 bytes.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    directory = Path(tempfile.mkdtemp(prefix=f"cassette-pg-{worker}-", dir=tmp_root))
    try:
        try:
            cluster = pg_cluster.start(directory, durable=False)
        except pg_cluster.ClusterError as error:
            problem = str(error)
        else:
            problem = None
        if problem is not None:
            unavailable(problem)
        try:
            yield cluster.url
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _admin(server_url: str) -> psycopg.Connection[tuple[Any, ...]]:
    import psycopg

    return psycopg.connect(server_url, autocommit=True)


def create_database(server_url: str, template: str = "template0") -> str:
    """A new database copied from ``template``; returns its URL.

    FILE_COPY copies the template's files (measured faster here than the default WAL_LOG,
    which writes every page to the WAL, and it does not grow with the template's data).
    The template must have no other connection open while it is copied."""
    from psycopg import sql

    name = PREFIX + uuid.uuid4().hex[:16]
    with _admin(server_url) as conn:
        ensure_owner(conn)
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY OWNER {}").format(
                sql.Identifier(name), sql.Identifier(template), sql.Identifier(OWNER)
            )
        )
    return with_database(server_url, name)


def ensure_owner(conn: psycopg.Connection[Any]) -> None:
    """The role that owns every database a test makes (``OWNER``), made once: a ledger is
    its database owner's (LAW.md 14), who must not be a superuser (verify's
    ``ownership``). Tests connect as the server's superuser, so a ledger they make is
    migrated as this role."""
    import psycopg
    from psycopg import sql

    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
        return
    # (another process may make it at the same moment)
    with suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(sql.Identifier(OWNER)))


def vacuum(url: str) -> None:
    """VACUUM the system catalogs of a database just migrated: the migrations run in one
    transaction, so every catalog row version they replaced (CREATE OR REPLACE FUNCTION,
    ALTER) is still on its page, and a clone's first reads would prune those pages, WAL
    written while the server looks idle (tests that watch the WAL's position would see it
    move). The ledger's tables are left alone: their statistics stay "never counted"."""
    from psycopg import sql

    with _admin(url) as conn:
        catalogs = conn.execute(
            "SELECT relname FROM pg_class"
            " WHERE relnamespace = 'pg_catalog'::regnamespace AND relkind = 'r'"
        ).fetchall()
        for (name,) in catalogs:
            conn.execute(sql.SQL("VACUUM pg_catalog.{}").format(sql.Identifier(name)))


def clone_database(server_url: str, template_name: str) -> str:
    """A new database that is a copy of database ``template_name`` (for example a migrated
    template made once per session); returns its URL. Close every connection to the
    template first: PostgreSQL refuses to copy a database in use."""
    return create_database(server_url, template=template_name)


def drop_database(server_url: str, database_url_or_name: str) -> None:
    """Drop a database, closing whatever connections a test left open to it."""
    from psycopg import sql

    name = (
        database_name(database_url_or_name)
        if "://" in database_url_or_name
        else database_url_or_name
    )
    with _admin(server_url) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
