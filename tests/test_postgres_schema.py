"""The PostgreSQL law's files (sql/postgresql/schema/NN_<concern>.sql) and the migrations
made from them:

- the baseline migration is the schema files joined (``postgresql/baseline.py``): a
  checked-in copy that differs fails here;
- a database made from the schema files is the database the shipped migrations make
  (the baseline, then every later one), compared object by object with verify's catalog
  description (tables, columns, constraints, indexes, functions with their bodies and
  settings, triggers, grants, the owner, meta keys); a later migration that is not
  mirrored in the schema files, or the reverse, is caught;
- each table's triggers fire, per timing and event, in the order written here
  (PostgreSQL fires them in name order: a renamed trigger changes the law).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette.postgresql import baseline, catalog, connection, sqlfiles

from . import postgres
from .pg_later import later_migration

psycopg = pytest.importorskip("psycopg")


def test_the_baseline_is_the_schema_files_joined() -> None:
    assert baseline.BASELINE.read_text("utf-8") == baseline.render(), (
        "migrations/0001_baseline.sql differs from the schema files: run"
        " python -m catalytic_cassette.postgresql.baseline"
    )
    assert [m.name for m in sqlfiles.migrations()][:1] == ["baseline"]
    names = [path.name for path in baseline.schema_files()]
    assert names == sorted(names) and names[0] == "10_ledger.sql" and names[-1] == "70_roles.sql"


def from_schema_files(url: str, folder: Path) -> None:
    """The database ``folder``'s schema files make, as ``migrate`` runs (one transaction,
    as the database's owner, after the migrations' own table)."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(sqlfiles.query("become_owner"))
        conn.execute(sqlfiles.query("create_migrations_table"))
        conn.execute(sqlfiles.query("revoke_migrations_table"))
        for path in sorted(folder.glob("[0-9][0-9]_*.sql")):
            conn.execute(path.read_bytes())


def from_migrations(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        connection.migrate(conn)


def described(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sqlfiles.query("verify_settings"))
        return catalog.describe(conn)


@pytest.fixture
def two_databases(pg_server: str) -> Iterator[tuple[str, str]]:
    urls = (postgres.create_database(pg_server), postgres.create_database(pg_server))
    yield urls
    for url in urls:
        postgres.drop_database(pg_server, url)


def test_the_schema_files_make_what_the_migrations_make(two_databases: tuple[str, str]) -> None:
    from_schema, migrated = two_databases
    from_schema_files(from_schema, baseline.SCHEMA)
    from_migrations(migrated)
    assert described(from_schema) == described(migrated)


LATER = """
CREATE FUNCTION cassette_later(value bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT value + 1 $$;
REVOKE EXECUTE ON FUNCTION cassette_later(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cassette_later(bigint) TO cassette_auditor;
"""


@pytest.mark.slow
@pytest.mark.parametrize("mirrored", [True, False])
def test_a_later_migration_is_compared_with_the_schema_files(
    two_databases: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mirrored: bool
) -> None:
    """After a release, a change is a new migration and the same change in the schema
    files: the two databases are equal when both are made, and differ when the schema
    files miss it."""
    folder = tmp_path / "schema"
    shutil.copytree(baseline.SCHEMA, folder)
    if mirrored:
        (folder / "80_later.sql").write_text(LATER, "utf-8")
    from_schema, migrated = two_databases
    from_schema_files(from_schema, folder)
    with later_migration(monkeypatch, LATER):
        from_migrations(migrated)
    with psycopg.connect(migrated) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM cassette_migrations")]
    assert versions == [1, 2]
    if mirrored:
        assert described(from_schema) == described(migrated)
    else:
        differ = {
            key
            for key in described(from_schema).keys() | described(migrated).keys()
            if described(from_schema).get(key) != described(migrated).get(key)
        }
        assert differ == {
            "function public.cassette_later(bigint)",
            "grants function public.cassette_later(bigint)",
        }


# Per table, timing and event: the triggers in the order PostgreSQL fires them.
TRIGGER_ORDER = {
    ("cassette_actions", "AFTER", "INSERT"): ["cassette_actions_journal"],
    ("cassette_actions", "BEFORE", "DELETE"): ["cassette_actions_no_change"],
    ("cassette_actions", "BEFORE", "INSERT"): ["cassette_actions_insert"],
    ("cassette_actions", "BEFORE", "TRUNCATE"): ["cassette_actions_no_truncate"],
    ("cassette_actions", "BEFORE", "UPDATE"): ["cassette_actions_no_change"],
    ("cassette_attestations", "AFTER", "INSERT"): ["cassette_attestations_journal"],
    ("cassette_attestations", "BEFORE", "DELETE"): ["cassette_attestations_no_change"],
    ("cassette_attestations", "BEFORE", "INSERT"): ["cassette_attestations_insert"],
    ("cassette_attestations", "BEFORE", "TRUNCATE"): ["cassette_attestations_no_truncate"],
    ("cassette_attestations", "BEFORE", "UPDATE"): ["cassette_attestations_no_change"],
    ("cassette_checkpoints", "AFTER", "INSERT"): ["cassette_checkpoints_journal"],
    ("cassette_checkpoints", "BEFORE", "DELETE"): ["cassette_checkpoints_no_change"],
    ("cassette_checkpoints", "BEFORE", "INSERT"): ["cassette_checkpoints_insert"],
    ("cassette_checkpoints", "BEFORE", "TRUNCATE"): ["cassette_checkpoints_no_truncate"],
    ("cassette_checkpoints", "BEFORE", "UPDATE"): ["cassette_checkpoints_no_change"],
    ("cassette_head", "BEFORE", "DELETE"): ["cassette_head_guard"],
    ("cassette_head", "BEFORE", "INSERT"): ["cassette_head_guard"],
    ("cassette_head", "BEFORE", "TRUNCATE"): ["cassette_head_no_truncate"],
    ("cassette_head", "BEFORE", "UPDATE"): ["cassette_head_guard_update"],
    ("cassette_jobs", "AFTER", "INSERT"): ["cassette_jobs_journal"],
    ("cassette_jobs", "BEFORE", "DELETE"): ["cassette_jobs_no_change"],
    ("cassette_jobs", "BEFORE", "INSERT"): ["cassette_jobs_insert"],
    ("cassette_jobs", "BEFORE", "TRUNCATE"): ["cassette_jobs_no_truncate"],
    ("cassette_jobs", "BEFORE", "UPDATE"): ["cassette_jobs_no_change"],
    ("cassette_journal", "BEFORE", "DELETE"): ["cassette_journal_no_change"],
    ("cassette_journal", "BEFORE", "INSERT"): ["cassette_journal_guard"],
    ("cassette_journal", "BEFORE", "TRUNCATE"): ["cassette_journal_no_truncate"],
    ("cassette_journal", "BEFORE", "UPDATE"): ["cassette_journal_no_change"],
    ("cassette_messages", "AFTER", "INSERT"): ["cassette_messages_journal"],
    ("cassette_messages", "BEFORE", "DELETE"): ["cassette_messages_no_change"],
    ("cassette_messages", "BEFORE", "INSERT"): ["cassette_messages_insert"],
    ("cassette_messages", "BEFORE", "TRUNCATE"): ["cassette_messages_no_truncate"],
    ("cassette_messages", "BEFORE", "UPDATE"): ["cassette_messages_no_change"],
    ("cassette_meta", "BEFORE", "DELETE"): ["cassette_meta_no_change"],
    ("cassette_meta", "BEFORE", "TRUNCATE"): ["cassette_meta_no_truncate"],
    ("cassette_meta", "BEFORE", "UPDATE"): ["cassette_meta_no_change"],
    # The receipt is journaled before it commits its step: the step's entry follows it.
    ("cassette_receipts", "AFTER", "INSERT"): [
        "cassette_receipts_1_journal",
        "cassette_receipts_2_commit_step",
    ],
    ("cassette_receipts", "BEFORE", "DELETE"): ["cassette_receipts_no_change"],
    # The lease's rules (STEP_NOT_FOUND, STALE_FENCING_TOKEN, ...) before the signature's.
    ("cassette_receipts", "BEFORE", "INSERT"): [
        "cassette_receipts_insert",
        "cassette_receipts_signature",
    ],
    ("cassette_receipts", "BEFORE", "TRUNCATE"): ["cassette_receipts_no_truncate"],
    ("cassette_receipts", "BEFORE", "UPDATE"): ["cassette_receipts_no_change"],
    ("cassette_releases", "AFTER", "INSERT"): [
        "cassette_releases_1_journal",
        "cassette_releases_2_requeue_step",
    ],
    ("cassette_releases", "BEFORE", "DELETE"): ["cassette_releases_no_change"],
    ("cassette_releases", "BEFORE", "INSERT"): [
        "cassette_releases_insert",
        "cassette_releases_signature",
    ],
    ("cassette_releases", "BEFORE", "TRUNCATE"): ["cassette_releases_no_truncate"],
    ("cassette_releases", "BEFORE", "UPDATE"): ["cassette_releases_no_change"],
    ("cassette_seals", "AFTER", "INSERT"): ["cassette_seals_journal"],
    ("cassette_seals", "BEFORE", "DELETE"): ["cassette_seals_no_change"],
    ("cassette_seals", "BEFORE", "INSERT"): ["cassette_seals_insert"],
    ("cassette_seals", "BEFORE", "TRUNCATE"): ["cassette_seals_no_truncate"],
    ("cassette_seals", "BEFORE", "UPDATE"): ["cassette_seals_no_change"],
    ("cassette_steps", "AFTER", "INSERT"): ["cassette_steps_journal"],
    ("cassette_steps", "AFTER", "UPDATE"): ["cassette_steps_journal"],
    ("cassette_steps", "BEFORE", "DELETE"): ["cassette_steps_no_delete"],
    ("cassette_steps", "BEFORE", "INSERT"): ["cassette_steps_insert"],
    ("cassette_steps", "BEFORE", "TRUNCATE"): ["cassette_steps_no_truncate"],
    ("cassette_steps", "BEFORE", "UPDATE"): ["cassette_steps_update"],
}

# pg_trigger.tgtype's bits: 2 BEFORE, 4 INSERT, 8 DELETE, 16 UPDATE, 32 TRUNCATE; the
# server fires one table's triggers of one timing and event in name order (C collation).
FIRING_ORDER = """
SELECT c.relname, CASE WHEN t.tgtype & 2 = 2 THEN 'BEFORE' ELSE 'AFTER' END, e.event,
       array_agg(t.tgname::text ORDER BY t.tgname COLLATE "C")
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
 CROSS JOIN LATERAL (VALUES (4, 'INSERT'), (8, 'DELETE'), (16, 'UPDATE'), (32, 'TRUNCATE'))
       AS e(bit, event)
 WHERE NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace
   AND t.tgtype & e.bit <> 0
 GROUP BY 1, 2, 3
"""


def test_each_tables_triggers_fire_in_the_laws_order(pg_ledger: str) -> None:
    with psycopg.connect(pg_ledger) as conn:
        order = {
            (t, timing, event): names for t, timing, event, names in conn.execute(FIRING_ORDER)
        }
    assert order == TRIGGER_ORDER
