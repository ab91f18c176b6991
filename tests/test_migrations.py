"""Migrations: from empty equals the schema file; failures change nothing; versions guarded."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, connect, sqlfiles
from catalytic_cassette.migrate import APPLICATION_ID, current_version, full_schema_sql

from .conftest import dump, file_digest, record_future_migration, seal_as_before_the_check

pytestmark = pytest.mark.sqlite_only(
    reason=("SQLite's migrations and schema file (PostgreSQL's: test_postgres_server.py)")
)


def _normalise(sql: str) -> str:
    without_comments = re.sub(r"--[^\n]*", "", sql)
    return re.sub(r"\s+", " ", without_comments).strip()


def _structure(conn: sqlite3.Connection) -> dict[tuple[str, str], object]:
    found: dict[tuple[str, str], object] = {}
    for kind, name, table, sql in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ):
        entry: dict[str, object] = {"table": table, "sql": _normalise(sql or "")}
        if kind == "table":
            entry["columns"] = conn.execute(f"PRAGMA table_xinfo({name})").fetchall()
        if kind == "index":
            entry["columns"] = conn.execute(f"PRAGMA index_xinfo({name})").fetchall()
        found[(kind, name)] = entry
    return found


def test_migrating_from_empty_gives_the_schema_file(db_path: Path) -> None:
    connect(db_path).close()
    migrated = sqlite3.connect(db_path)
    reference = sqlite3.connect(":memory:")
    for statement in sqlfiles.statements(sqlfiles.schema_sql("cassette.sql")):
        reference.execute(statement)
    assert _structure(migrated) == _structure(reference)
    assert len(_structure(reference)) > 30


def test_the_schema_file_is_what_the_migrations_generate() -> None:
    """schema/cassette.sql is generated (python -m catalytic_cassette.migrate), never edited."""
    assert sqlfiles.schema_sql("cassette.sql") == full_schema_sql()


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


def _load_v1(path: Path) -> None:
    script = (Path(__file__).parent / "data" / "ledger_v1.sql").read_text()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(script)  # a raw load of a dump: no transaction of ours is open
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def test_a_version_1_ledger_upgrades_and_still_verifies(db_path: Path) -> None:
    from catalytic_cassette.chain import CausalChain
    from catalytic_cassette.verify import verify_path

    _load_v1(db_path)
    before = sqlite3.connect(db_path)
    receipts = before.execute("SELECT * FROM cassette_receipts ORDER BY receipt_id").fetchall()
    journal = before.execute("SELECT seq, chain_hash FROM cassette_journal ORDER BY seq").fetchall()
    before.close()
    assert len(journal) > 20 and receipts

    with MessageCassette(db_path) as cassette:
        status = cassette.status("run-v1")
        assert status["steps"]["COMMITTED"] == 2 and status["steps"]["LEASED"] == 1
        step = cassette.claim_step("run-v1", "after-upgrade", 60)
        cassette.complete_step(
            "run-v1", step["step_id"], "after-upgrade", step["fencing_token"], {}, "SUCCESS"
        )
    with CausalChain(db_path) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
    after = sqlite3.connect(db_path)
    assert after.execute("SELECT max(version) FROM cassette_migrations").fetchone()[0] == (
        current_version()
    )
    assert (
        after.execute("SELECT * FROM cassette_receipts ORDER BY receipt_id").fetchall()[
            : len(receipts)
        ]
        == receipts
    )
    assert (
        after.execute("SELECT seq, chain_hash FROM cassette_journal ORDER BY seq").fetchall()[
            : len(journal)
        ]
        == journal
    )
    after.close()
    report = verify_path(str(db_path))
    assert report.ok, report.findings


def test_upgrading_a_version_1_ledger_that_fails_changes_nothing(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _load_v1(db_path)
    before = (dump(db_path), file_digest(db_path))
    shipped = sqlfiles.migrations()
    broken = sqlfiles.Migration(2, "actions", shipped[1].sql + "\nSELECT no_such_function();\n")
    monkeypatch.setattr(sqlfiles, "migrations", lambda: (shipped[0], broken, *shipped[2:]))
    with pytest.raises(CassetteError) as caught:
        connect(db_path)
    assert caught.value.code is ErrorCode.MIGRATION_FAILED
    assert (dump(db_path), file_digest(db_path)) == before


def test_a_version_7_ledger_keeps_its_journal_and_seals_through_migration_8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 8 rebuilds the journal with its table and key stored: every seq, body
    and hash is copied as it was, so a seal made before it still holds after."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette import ManualClock
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.chain import CausalChain
    from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
    from catalytic_cassette.verify import verify_path

    db_path, seals = tmp_path / "v7.db", tmp_path / "seals"
    seals.mkdir()
    key = Ed25519PrivateKey.generate()
    seven = sqlfiles.migrations()[:7]
    with monkeypatch.context() as patched:
        patched.setattr(sqlfiles, "migrations", lambda: seven)
        seal_as_before_the_check(patched)
        clock = ManualClock()
        with MessageCassette(db_path, clock=clock) as cassette:
            cassette.post_message({"n": 1}, "r", "USER")
            step = cassette.claim_step("r", "w", 60)
            cassette.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
        with CausalChain(db_path, clock=clock) as chain:
            chain.append_action(
                {
                    "plan_id": "p",
                    "intent_id": "i",
                    "action_type": "PlanStarted",
                    "function_name": "f",
                }
            )
            write_seal_file(record_seal(chain.conn, key, now_ms=clock.now_ms(), origin=None), seals)
            origin = default_origin(chain.conn)
            assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == 7
    before = sqlite3.connect(db_path)
    journal = before.execute(
        "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal"
    ).fetchall()
    before.close()

    with CausalChain(db_path) as chain:  # migrates
        assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == current_version()
        rows = chain.conn.execute("SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal")
        assert rows.fetchall() == journal
        stored = chain.conn.execute(
            "SELECT count(*) FROM cassette_journal WHERE tbl IS json_extract(body, '$.table')"
            " AND row_key IS json_extract(body, '$.key')"
        ).fetchone()[0]
        assert stored == len(journal)
        columns = chain.conn.execute("PRAGMA table_xinfo(cassette_journal)").fetchall()
        assert [(c[1], c[6]) for c in columns][-2:] == [("tbl", 3), ("row_key", 3)]  # STORED
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
        )
    report = verify_path(
        str(db_path), anchors=load_anchors(seals), seal_key=key.public_key(), origin=origin
    )
    assert report.ok and report.anchored, report.to_dict()


def test_a_version_9_ledger_keeps_its_journal_and_seals_through_migration_10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 10 re-creates guards and moves checks behind gates; it writes no row of the
    ledger: every journal entry, tree node and seal stays as it was, a seal made before it
    still holds after, and the ledger takes writes of every kind."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette import ManualClock
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.chain import CausalChain
    from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
    from catalytic_cassette.verify import verify_path

    db_path, seals = tmp_path / "v9.db", tmp_path / "seals"
    seals.mkdir()
    key = Ed25519PrivateKey.generate()
    nine = sqlfiles.migrations()[:9]
    clock = ManualClock()
    with monkeypatch.context() as patched:
        patched.setattr(sqlfiles, "migrations", lambda: nine)
        with MessageCassette(db_path, clock=clock) as cassette:
            for n in range(150):  # 450 entries: a complete block of 256 and a tail
                cassette.post_message({"n": n}, "r", "USER")
            for _ in range(20):
                step = cassette.claim_step("r", "w", 60)
                cassette.complete_step(
                    "r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
                )
        with CausalChain(db_path, clock=clock) as chain:
            chain.append_action(
                {
                    "plan_id": "p",
                    "intent_id": "i",
                    "action_type": "PlanStarted",
                    "function_name": "f",
                }
            )
            write_seal_file(record_seal(chain.conn, key, now_ms=clock.now_ms(), origin=None), seals)
            origin = default_origin(chain.conn)
            assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == 9
    before = sqlite3.connect(db_path)
    tables = ("cassette_journal", "cassette_tree_nodes", "cassette_seals", "cassette_steps")
    rows = {table: before.execute(f"SELECT * FROM {table}").fetchall() for table in tables}
    before.close()
    assert len(rows["cassette_journal"]) > 256 and rows["cassette_tree_nodes"]

    with CausalChain(db_path, clock=clock) as chain:  # migrates
        assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == current_version()
        for table in tables:
            assert chain.conn.execute(f"SELECT * FROM {table}").fetchall() == rows[table]
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanPaused", "function_name": "f"}
        )
        with pytest.raises(CassetteError) as refused:
            chain.append_action(
                {
                    "plan_id": "p",
                    "intent_id": "i",
                    "action_type": "PlanPaused",
                    "function_name": "f",
                }
            )
        assert refused.value.code is ErrorCode.PLAN_NOT_RUNNING
    with MessageCassette(db_path, clock=clock) as cassette:
        step = cassette.claim_step("r", "w", 60)
        cassette.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "FAILURE")
    report = verify_path(
        str(db_path), anchors=load_anchors(seals), seal_key=key.public_key(), origin=origin
    )
    assert report.ok and report.anchored, report.to_dict()


def test_a_version_10_ledger_keeps_its_journal_and_seals_through_migration_11(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 11 moves the rules before the row and the package journals before it; no
    row of the ledger is written or changed, entries keep their bodies and order, a seal
    made before it still holds after, and writes of every kind go on (a receipt's entry
    still before its step's, a release's before its requeue)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette import ManualClock
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.chain import CausalChain
    from catalytic_cassette.seals import default_origin, record_seal, write_seal_file
    from catalytic_cassette.verify import verify_path

    db_path, seals = tmp_path / "v10.db", tmp_path / "seals"
    seals.mkdir()
    key = Ed25519PrivateKey.generate()
    ten = sqlfiles.migrations()[:10]
    clock = ManualClock()

    def write_every_kind(n: int) -> None:
        with MessageCassette(db_path, clock=clock) as cassette:
            for i in range(n):
                cassette.post_message({"n": i}, "r", "USER")
            released = cassette.claim_step("r", "w", 60)
            cassette.requeue(
                "r", released["step_id"], worker_id="w", fencing_token=released["fencing_token"]
            )
            for _ in range(3):
                step = cassette.claim_step("r", "w", 60)
                cassette.complete_step(
                    "r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
                )
        with CausalChain(db_path, clock=clock) as chain:
            chain.append_action(
                {"plan_id": f"p{n}", "intent_id": "i", "action_type": "PlanStarted",
                 "function_name": "f"}
            )  # fmt: skip
            chain.save_checkpoint(f"p{n}", {"n": n})
            write_seal_file(record_seal(chain.conn, key, now_ms=clock.now_ms(), origin=None), seals)

    with monkeypatch.context() as patched:
        patched.setattr(sqlfiles, "migrations", lambda: ten)
        write_every_kind(100)  # past a block of 256 entries
        with CausalChain(db_path, clock=clock) as chain:
            origin = default_origin(chain.conn)
            assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == 10
    tables = ("cassette_journal", "cassette_tree_nodes", "cassette_seals", "cassette_steps")
    before = sqlite3.connect(db_path)
    rows = {table: before.execute(f"SELECT * FROM {table}").fetchall() for table in tables}
    before.close()
    assert len(rows["cassette_journal"]) > 256 and rows["cassette_tree_nodes"]

    with CausalChain(db_path, clock=clock) as chain:  # migrates
        assert chain.conn.execute("PRAGMA user_version").fetchone()[0] == current_version()
        for table in tables:
            assert chain.conn.execute(f"SELECT * FROM {table}").fetchall() == rows[table]
    write_every_kind(5)
    after = sqlite3.connect(db_path)
    ops = [
        (tbl, json.loads(body)["op"])
        for tbl, body in after.execute(
            "SELECT tbl, body FROM cassette_journal WHERE seq >= ? ORDER BY seq",
            (len(rows["cassette_journal"]),),
        )
    ]
    after.close()
    receipt = ops.index(("cassette_receipts", "INSERT"))
    assert ops[receipt + 1] == ("cassette_steps", "UPDATE")
    release = ops.index(("cassette_releases", "INSERT"))
    assert ops[release + 1] == ("cassette_steps", "UPDATE")
    report = verify_path(
        str(db_path), anchors=load_anchors(seals), seal_key=key.public_key(), origin=origin
    )
    assert report.ok and report.anchored, report.to_dict()


def test_opening_a_current_ledger_reads_no_migration_sql(tmp_path: Path) -> None:
    """Each open counts the migrations; their SQL (264 KB) is read only to migrate."""
    path = tmp_path / "ledger.db"
    MessageCassette(path).close()
    sqlfiles.migrations.cache_clear()
    try:
        MessageCassette(path).close()
        MessageCassette(path, read_only=True).close()
        assert all(m._sql is None for m in sqlfiles.migrations())
        assert sqlfiles.migrations()[0].sql.startswith("--")  # read when asked for
        assert sqlfiles.migrations()[0]._sql is not None
    finally:
        sqlfiles.migrations.cache_clear()
