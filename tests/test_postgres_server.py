"""The PostgreSQL test infrastructure itself: a real server, a fresh database per test,
and the rule for a missing server (fail, or skip only when a variable says so)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from . import postgres

ROOT = Path(__file__).resolve().parents[1]
SEEN: list[str] = []  # the databases earlier tests of this process were given


def _tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    return [row[0] for row in rows]


def _exists(server_url: str, name: str) -> bool:
    import psycopg

    with psycopg.connect(server_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_gets_its_own_empty_working_database(
    pg_server: str, pg_database: str, turn: int
) -> None:
    import psycopg

    name = postgres.database_name(pg_database)
    assert name.startswith(postgres.PREFIX) and name not in SEEN
    assert _tables(pg_database) == []
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (name,)
        conn.execute("CREATE TABLE marker (turn integer)")
        conn.execute("INSERT INTO marker VALUES (%s)", (turn,))
    assert _tables(pg_database) == ["public.marker"]
    # The databases of earlier tests (on this server) were dropped after them.
    assert not [seen for seen in SEEN if _exists(pg_server, seen)]
    SEEN.append(name)


def test_the_test_cluster_runs_the_fast_settings(pg_server: str) -> None:
    if os.environ.get(postgres.SERVER_VARIABLE):
        pytest.skip("a server given by the variable keeps its own settings")
    import psycopg

    with psycopg.connect(pg_server) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            assert conn.execute(f"SHOW {setting}").fetchone() == ("off",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)


def test_drop_closes_connections_a_test_left_open(pg_server: str) -> None:
    import psycopg

    url = postgres.create_database(pg_server)
    left_open = psycopg.connect(url)
    try:
        postgres.drop_database(pg_server, url)
        assert not _exists(pg_server, postgres.database_name(url))
    finally:
        left_open.close()


def test_clone_database_copies_a_template(pg_server: str) -> None:
    import psycopg

    template = postgres.create_database(pg_server)
    with psycopg.connect(template) as conn:
        conn.execute("CREATE TABLE migrated (version integer)")
        conn.execute("INSERT INTO migrated VALUES (7)")
    clones = [postgres.clone_database(pg_server, postgres.database_name(template)) for _ in "ab"]
    try:
        assert len({*clones, template}) == 3
        with psycopg.connect(clones[0]) as conn:
            assert conn.execute("SELECT version FROM migrated").fetchall() == [(7,)]
            conn.execute("DELETE FROM migrated")
        with psycopg.connect(clones[1]) as conn:  # a clone's change stays in that clone
            assert conn.execute("SELECT version FROM migrated").fetchall() == [(7,)]
    finally:
        for url in [*clones, template]:
            postgres.drop_database(pg_server, url)


def test_with_database_replaces_the_path_and_any_dbname() -> None:
    assert (
        postgres.with_database("postgresql://u@/postgres?host=/tmp/x%20y&port=5432", "db1")
        == "postgresql://u@/db1?host=/tmp/x+y&port=5432"
    )
    assert (
        postgres.with_database("postgresql://u:p@h:5433?dbname=other&sslmode=off", "db2")
        == "postgresql://u:p@h:5433/db2?sslmode=off"
    )


# The rule for a missing server: fail, unless CASSETTE_SKIP_POSTGRES=1.


def test_no_server_and_no_variable_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres.SKIP_VARIABLE, raising=False)
    with pytest.raises(pytest.fail.Exception, match="no PostgreSQL server: gone"):
        postgres.unavailable("gone")
    monkeypatch.setenv(postgres.SKIP_VARIABLE, "0")
    with pytest.raises(pytest.fail.Exception):
        postgres.unavailable("gone")


def test_no_server_and_the_skip_variable_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(postgres.SKIP_VARIABLE, "1")
    with pytest.raises(pytest.skip.Exception, match="gone"):
        postgres.unavailable("gone")


@pytest.mark.parametrize("skip", ["", "1"])
def test_a_server_that_cannot_be_had_fails_or_skips(
    monkeypatch: pytest.MonkeyPatch, skip: str
) -> None:
    """Both ways to have no server: no PostgreSQL to start, and an unreachable URL."""
    pg_cluster = postgres._pg_cluster()

    def missing() -> Path:
        raise pg_cluster.ClusterError("PostgreSQL not found")

    monkeypatch.setenv(postgres.SKIP_VARIABLE, skip)
    monkeypatch.delenv(postgres.SERVER_VARIABLE, raising=False)
    monkeypatch.setattr(pg_cluster, "find_bin_dir", missing)
    expected = pytest.skip.Exception if skip else pytest.fail.Exception
    with pytest.raises(expected, match="PostgreSQL not found"), postgres.server():
        pass
    unreachable = "postgresql://postgres@/postgres?host=/nonexistent-cassette&port=5432"
    monkeypatch.setenv(postgres.SERVER_VARIABLE, unreachable)
    with pytest.raises(expected, match="unreachable"), postgres.server():
        pass


def test_the_cli_starts_a_durable_cluster_and_stops_it(pg_server: str) -> None:
    import psycopg

    pg_cluster = postgres._pg_cluster()
    try:
        pg_cluster.find_bin_dir()
    except pg_cluster.ClusterError as error:  # a server from the variable, none here
        postgres.unavailable(str(error))
    # Not tmp_path: under root the cluster runs as postgres, who cannot enter pytest's.
    directory = tempfile.mkdtemp(prefix="cassette-pg-cli-")
    script = [sys.executable, str(ROOT / "scripts" / "pg_cluster.py")]
    try:
        started = subprocess.run(
            [*script, "start", directory, "--durable"], capture_output=True, text=True, check=False
        )
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("postgresql://postgres@/postgres?host=")
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
        stopped = subprocess.run([*script, "stop", directory], capture_output=True, check=False)
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=5).close()
    finally:
        subprocess.run([*script, "stop", directory], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)
