"""Migrations: a new ledger gets the baseline; failures change nothing; versions guarded;
a file made by a development build before the baseline is refused, unchanged."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, connect, migrate, sqlfiles
from catalytic_cassette.connection import connect_reader, pending_versions
from catalytic_cassette.migrate import APPLICATION_ID, current_version

from .conftest import (
    dump,
    file_digest,
    load_development_ledger,
    record_future_migration,
    rewrite_migration_row,
)

pytestmark = pytest.mark.sqlite_only(
    reason=("SQLite's migrations (PostgreSQL's: test_postgres_server.py)")
)


def test_a_new_ledger_is_marked_and_versioned(db_path: Path) -> None:
    connect(db_path).close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == current_version()
    versions = [row[0] for row in conn.execute("SELECT version FROM cassette_migrations")]
    assert versions == list(range(1, current_version() + 1))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reopening_applies_nothing_and_changes_nothing(db_path: Path) -> None:
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"a": 1}, "run", "USER")
    before = (dump(db_path), file_digest(db_path))
    connect(db_path).close()
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_failed_migration_leaves_the_file_unchanged(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"a": 1}, "run", "USER")
    before = (dump(db_path), file_digest(db_path))
    broken = sqlfiles.Migration(
        current_version() + 1,
        "broken",
        "CREATE TABLE cassette_extra (x INTEGER) STRICT;\nINSERT INTO no_such_table VALUES (1);\n",
    )
    shipped = sqlfiles.migrations()
    monkeypatch.setattr(sqlfiles, "migrations", lambda: (*shipped, broken))
    with pytest.raises(CassetteError) as caught:
        connect(db_path)
    assert caught.value.code is ErrorCode.MIGRATION_FAILED
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_newer_schema_is_refused(db_path: Path) -> None:
    connect(db_path).close()
    record_future_migration(db_path, current_version() + 1)
    before = file_digest(db_path)
    with pytest.raises(CassetteError) as caught:
        connect(db_path)
    assert caught.value.code is ErrorCode.SCHEMA_TOO_NEW
    assert file_digest(db_path) == before


def test_a_foreign_sqlite_database_is_refused(db_path: Path) -> None:
    other = sqlite3.connect(db_path)
    other.execute("CREATE TABLE notes (body TEXT)")
    other.commit()
    other.close()
    before = file_digest(db_path)
    with pytest.raises(CassetteError) as caught:
        connect(db_path)
    assert caught.value.code is ErrorCode.NOT_A_CASSETTE
    assert file_digest(db_path) == before


def test_a_file_that_is_not_sqlite_is_refused(db_path: Path) -> None:
    db_path.write_bytes(b"hello, this is not a database at all" * 10)
    with pytest.raises(CassetteError) as caught:
        connect(db_path)
    assert caught.value.code is ErrorCode.NOT_A_CASSETTE
    assert db_path.read_bytes() == b"hello, this is not a database at all" * 10


def test_migration_files_are_numbered_without_gaps() -> None:
    versions = [m.version for m in sqlfiles.migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_the_first_migration_is_the_baseline() -> None:
    assert [(m.version, m.name) for m in sqlfiles.migrations()][:1] == [(1, "baseline")]


def _refused_unchanged(db_path: Path, attempt: object) -> None:
    before = (dump(db_path), file_digest(db_path))
    with pytest.raises(CassetteError) as caught:
        attempt()  # type: ignore[operator]
    assert caught.value.code is ErrorCode.SCHEMA_UNRELEASED
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_development_build_ledger_is_refused_and_left_unchanged(db_path: Path) -> None:
    """Nothing was released before the baseline: no path leads from such a file to this
    schema, and opening, migrating or reading it would give no lawful ledger."""
    from catalytic_cassette.verify import verify_path

    load_development_ledger(db_path)
    raw = sqlite3.connect(db_path)
    assert raw.execute("SELECT version, name FROM cassette_migrations").fetchall() == [
        (1, "cassette")
    ]
    assert raw.execute("SELECT count(*) FROM cassette_journal").fetchone()[0] > 20
    raw.close()
    _refused_unchanged(db_path, lambda: connect(db_path))
    _refused_unchanged(db_path, lambda: connect(db_path, migrate=False))
    _refused_unchanged(db_path, lambda: MessageCassette(db_path))
    _refused_unchanged(db_path, lambda: connect_reader(db_path))
    _refused_unchanged(db_path, lambda: pending_versions(str(db_path)))
    _refused_unchanged(db_path, lambda: verify_path(str(db_path)))


@pytest.mark.parametrize(
    ("column", "value"),
    [("name", "cassette"), ("sha256", "ab" * 32)],
    ids=["another name", "another text"],
)
def test_a_ledger_recording_another_baseline_is_refused(
    db_path: Path, column: str, value: str
) -> None:
    from catalytic_cassette.verify import verify_path

    with MessageCassette(db_path) as cassette:
        cassette.post_message({"a": 1}, "run", "USER")
    rewrite_migration_row(db_path, column, value)
    _refused_unchanged(db_path, lambda: connect(db_path))
    _refused_unchanged(db_path, lambda: verify_path(str(db_path)))


# Behaviour the journal's stored columns, the plan lifecycle and the order of entries
# give a ledger: checked on a new one.


def test_the_journal_stores_each_entrys_table_and_key(tmp_path: Path) -> None:
    from catalytic_cassette.chain import CausalChain

    db_path = tmp_path / "ledger.db"
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
        step = cassette.claim_step("r", "w", 60)
        cassette.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    with CausalChain(db_path) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        total = chain.conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
        stored = chain.conn.execute(
            "SELECT count(*) FROM cassette_journal WHERE tbl IS json_extract(body, '$.table')"
            " AND row_key IS json_extract(body, '$.key')"
        ).fetchone()[0]
        assert stored == total > 0
        columns = chain.conn.execute("PRAGMA table_xinfo(cassette_journal)").fetchall()
        assert [(c[1], c[6]) for c in columns][-2:] == [("tbl", 3), ("row_key", 3)]  # STORED


def test_writes_of_every_kind_keep_their_entries_order_and_seal(tmp_path: Path) -> None:
    """A receipt's entry comes before its step's, a release's before its requeue; a pause
    of a paused plan is refused; a seal over it all holds."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette import ManualClock
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.chain import CausalChain
    from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
    from catalytic_cassette.verify import verify_path

    db_path, seals = tmp_path / "ledger.db", tmp_path / "seals"
    seals.mkdir()
    key = Ed25519PrivateKey.generate()
    clock = ManualClock()
    with MessageCassette(db_path, clock=clock) as cassette:
        for i in range(100):  # past a block of 256 entries
            cassette.post_message({"n": i}, "r", "USER")
        released = cassette.claim_step("r", "w", 60)
        cassette.requeue(
            "r", released["step_id"], worker_id="w", fencing_token=released["fencing_token"]
        )
        for _ in range(3):
            step = cassette.claim_step("r", "w", 60)
            cassette.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    with CausalChain(db_path, clock=clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanPaused", "function_name": "f"}
        )
        with pytest.raises(CassetteError) as refused:
            chain.append_action(
                {"plan_id": "p", "intent_id": "i", "action_type": "PlanPaused",
                 "function_name": "f"}
            )  # fmt: skip
        assert refused.value.code is ErrorCode.PLAN_NOT_RUNNING
        chain.save_checkpoint("p", {"n": 1})
        write_seal_file(record_seal(chain.conn, key, now_ms=clock.now_ms(), origin=None), seals)
        origin = default_origin(chain.conn)
    after = sqlite3.connect(db_path)
    ops = [
        (tbl, json.loads(body)["op"])
        for tbl, body in after.execute("SELECT tbl, body FROM cassette_journal ORDER BY seq")
    ]
    assert after.execute("SELECT count(*) FROM cassette_tree_nodes").fetchone()[0] > 0
    after.close()
    assert len(ops) > 256
    receipt = ops.index(("cassette_receipts", "INSERT"))
    assert ops[receipt + 1] == ("cassette_steps", "UPDATE")
    release = ops.index(("cassette_releases", "INSERT"))
    assert ops[release + 1] == ("cassette_steps", "UPDATE")
    report = verify_path(
        str(db_path), anchors=load_anchors(seals), seal_key=key.public_key(), origin=origin
    )
    assert report.ok and report.anchored, report.to_dict()


def test_opening_reads_only_to_compare_the_recorded_migrations(tmp_path: Path) -> None:
    """A migration's SQL is read when first asked for: opening a current ledger reads it
    only to compare its digest with the ledger's row (SCHEMA_UNRELEASED otherwise)."""
    path = tmp_path / "ledger.db"
    MessageCassette(path).close()
    sqlfiles.migrations.cache_clear()
    migrate.shipped_migrations.cache_clear()
    try:
        assert all(m._sql is None for m in sqlfiles.migrations())
        MessageCassette(path, read_only=True).close()
        assert sqlfiles.migrations()[0]._sql is not None
        assert sqlfiles.migrations()[0].sql.startswith("--")
    finally:
        sqlfiles.migrations.cache_clear()
        migrate.shipped_migrations.cache_clear()
