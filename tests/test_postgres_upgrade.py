"""Upgrades of a PostgreSQL ledger, and what no upgrade reaches.

- A ledger made by a development build before the baseline migration (its recorded
  migrations are not the baseline's) is refused by open, migrate and verify with
  SCHEMA_UNRELEASED, its documented exit status, no traceback, and nothing changed:
  nothing made before the baseline was released, so no path leads from it.
- A ledger at the baseline, upgraded in place by a later migration: its journal, rows
  and seals come through whole, verify is clean on the upgraded ledger, and work goes on
  linked to the journal's end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.cli import cli
from catalytic_cassette.postgresql import sqlfiles
from catalytic_cassette.seals import ORIGIN_PREFIX, AutoSeal
from catalytic_cassette.verify import verify_path

from .pg_chain import journal_end
from .pg_later import later_migration
from .test_postgres_init_atomic import dump

psycopg = pytest.importorskip("psycopg")

KEY = Ed25519PrivateKey.generate()
ONE_STEP = {"jobs": [{"intent": "i", "steps": [{}, {}]}]}

# The migrations a development build recorded before the baseline, in order.
DEVELOPMENT_MIGRATIONS = [
    "cassette",
    "roles",
    "seals",
    "actions",
    "worker_path",
    "hardening",
    "worker_keys",
    "append_time",
    "head_at_commit",
    "identity_takes_the_head",
    "seal_root_before_head",
    "noop_no_head",
    "lighter_worker_path",
    "worker_path_plans",
    "journal_computed_once",
    "chain_search_path",
    "head_lock_and_clock",
]


def work(url: str, seals: Path, worker: str) -> None:
    """Posts, claims and completes, a step left leased, sealed at close."""
    with MessageCassette(url, auto_seal=AutoSeal(KEY, seals, every=10_000)) as cassette:
        cassette.post_message(ONE_STEP, "run", "USER")
        lease = cassette.claim_step("run", worker, ttl_seconds=600)
        assert lease is not None
        cassette.complete_step(
            "run", lease["step_id"], worker, lease["fencing_token"], {"ok": 1}, "SUCCESS"
        )
        assert cassette.claim_step("run", worker, ttl_seconds=600) is not None


def made_before_the_baseline(url: str, recorded: int) -> None:
    """A ledger with rows whose cassette_migrations holds what a development build
    recorded after its first ``recorded`` migrations."""
    with MessageCassette(url) as cassette:
        cassette.post_message(ONE_STEP, "run", "USER")
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM cassette_migrations")
        for version, name in enumerate(DEVELOPMENT_MIGRATIONS[:recorded], start=1):
            conn.execute(
                "INSERT INTO cassette_migrations (version, name) VALUES (%s, %s)", (version, name)
            )


@pytest.mark.parametrize("recorded", [1, 16, 17])
def test_a_ledger_made_before_the_baseline_is_refused(pg_database: str, recorded: int) -> None:
    made_before_the_baseline(pg_database, recorded)
    before = dump(pg_database)
    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT * FROM cassette_migrations ORDER BY version").fetchall()
        journal = conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall()
    for read_only in (False, True):
        with pytest.raises(CassetteError) as refused:
            MessageCassette(pg_database, read_only=read_only)
        assert refused.value.code is ErrorCode.SCHEMA_UNRELEASED
        assert "before the 0.1.0 baseline" in refused.value.message
    with pytest.raises(CassetteError) as refused:
        verify_path(pg_database)
    assert refused.value.code is ErrorCode.SCHEMA_UNRELEASED
    # The CLI: one line, the code, exit 1 (3 for verify: it cannot verify), no traceback.
    for command, status in (
        (["init"], 1),
        (["migrate"], 1),
        (["migrate", "--check"], 1),
        (["status", "--run-id", "run"], 1),
        (["verify"], 3),
    ):
        result = CliRunner().invoke(cli, ["--db", pg_database, *command])
        assert result.exit_code == status, (command, result.output)
        assert "SCHEMA_UNRELEASED" in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.output + result.stderr
    assert dump(pg_database) == before
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT * FROM cassette_migrations ORDER BY version").fetchall() == rows
        assert conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall() == journal


def test_a_first_migration_of_another_name_is_refused(pg_database: str) -> None:
    """Not only the name development builds wrote: any version-1 row that is not the
    shipped baseline's name is a ledger no release made."""
    with MessageCassette(pg_database) as cassette:
        cassette.post_message(ONE_STEP, "run", "USER")
    with psycopg.connect(pg_database) as conn:
        conn.execute("DELETE FROM cassette_migrations")
        conn.execute("INSERT INTO cassette_migrations (version, name) VALUES (1, 'baseline_x')")
    before = dump(pg_database)
    for read_only in (False, True):
        with pytest.raises(CassetteError) as refused:
            MessageCassette(pg_database, read_only=read_only)
        assert refused.value.code is ErrorCode.SCHEMA_UNRELEASED
    with pytest.raises(CassetteError) as refused:
        verify_path(pg_database)
    assert refused.value.code is ErrorCode.SCHEMA_UNRELEASED
    assert dump(pg_database) == before


def test_a_ledger_at_the_baseline_is_released(pg_ledger: str) -> None:
    with psycopg.connect(pg_ledger) as conn:
        recorded = conn.execute("SELECT version, name FROM cassette_migrations").fetchall()
    assert recorded == [(1, "baseline")]


# A later migration that changes what the catalog describes nothing of (verify compares
# the upgraded ledger with the snapshot), but runs DDL and DML through the law: it reads
# every table and makes and drops a function.
LATER = """
CREATE FUNCTION cassette_later_count() RETURNS bigint
LANGUAGE sql AS $$
    SELECT (SELECT count(*) FROM cassette_journal) + (SELECT count(*) FROM cassette_steps)
$$;
SELECT cassette_later_count();
DROP FUNCTION cassette_later_count();
"""


def test_a_ledger_at_the_baseline_upgrades_whole(
    pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seals = tmp_path / "seals"
    seals.mkdir()
    work(pg_database, seals, "w1")
    with psycopg.connect(pg_database) as conn:
        before = conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall()
        (version,) = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()
    assert version == len(sqlfiles.migrations())
    with later_migration(monkeypatch, LATER) as later:
        work(pg_database, seals, "w2")  # opened with the later migration: upgraded first
        with psycopg.connect(pg_database) as conn:
            (version,) = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()
            after = conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall()
            size, _ = journal_end(conn)  # every entry, old and new, at its seq and linked
            (ledger_id,) = conn.execute(
                "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
            ).fetchone()
        assert version == later.version
        assert after[: len(before)] == before
        assert size > len(before)
        report = verify_path(
            pg_database,
            anchors=load_anchors(seals),
            seal_key=KEY.public_key(),
            origin=ORIGIN_PREFIX + ledger_id,
        )
        assert report.ok, report.findings
        assert [a["status"] for a in report.anchors] == ["holds", "holds"]
