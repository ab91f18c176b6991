"""verify on a PostgreSQL ledger (issue 15, item 5; LAW.md "Verify").

A clean ledger verifies; then the database owner (the cluster's superuser here) switches
the triggers off and tampers, the way LAW.md's threat model says an owner can, and each
attack is reported with its kind. The catalog snapshot of the server's major version
(catalog-<major>.json) is checked against what the migrations make on a fresh database,
so it never drifts:

    CASSETTE_REGENERATE_CATALOG=1 python -m pytest tests/test_postgres_verify.py -k catalog

rewrites it after a migration is added or changed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.cli import cli
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql import catalog, sqlfiles
from catalytic_cassette.postgresql import connection as pg_connection
from catalytic_cassette.postgresql import verify as pg_verify
from catalytic_cassette.verify import FindingKind, Level, VerifyReport, verify_path
from catalytic_cassette.verify.tables import TABLES

from . import postgres

psycopg = pytest.importorskip("psycopg")

REGENERATE = "CASSETTE_REGENERATE_CATALOG"


def kinds(report: VerifyReport) -> set[str]:
    return {f.kind.value for f in report.findings}


def errors(report: VerifyReport) -> set[str]:
    return {f.kind.value for f in report.errors}


@pytest.fixture
def busy(pg_ledger: str) -> str:
    """A ledger that has seen posts, claims, completions, an expired lease requeued and
    a release: every table holds rows, steps have several revisions."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message(
            {
                "jobs": [
                    {"intent": "a", "steps": [{"n": 1}, {"n": 2}]},
                    {"intent": "b", "steps": [{}]},
                ]
            },
            "run",
            "PLANNER",
            idempotency_key="k1",
        )
        cassette.post_message({"text": 'line\nbreak \u00e9 "q" \\'}, "run", "USER")
        cassette.post_message({"other": True}, "run-2", "USER")
        first = cassette.claim_step("run", "w1", ttl_seconds=60)
        cassette.complete_step(
            "run", first["step_id"], "w1", first["fencing_token"], {"ok": 1}, "SUCCESS"
        )
        second = cassette.claim_step("run", "w2", ttl_seconds=1)
        third = cassette.claim_step("run", "w3", ttl_seconds=60)
        cassette.requeue(  # a release
            "run", third["step_id"], worker_id="w3", fencing_token=third["fencing_token"]
        )
        with psycopg.connect(pg_ledger, autocommit=True) as owner:
            owner.execute("SELECT cassette_advance_clock(5000)")
        assert [r["action"] for r in cassette.requeue("run")] == ["requeued"]
        again = cassette.claim_step("run", "w4", ttl_seconds=60)
        assert again["step_id"] == second["step_id"]
        cassette.complete_step(
            "run", again["step_id"], "w4", again["fencing_token"], {"ok": 2}, outcome="FAILURE"
        )
        cassette.claim_step("run-2", "w5", ttl_seconds=600)
    return pg_ledger


def verify(url: str, **options: Any) -> VerifyReport:
    """verify as the API runs it, judged by the ledger's clock (the tests move it)."""
    with MessageCassette(url, read_only=True) as cassette:
        return cassette.verify_cassette(**options)


@pytest.fixture
def owner(busy: str) -> Iterator[Any]:
    """The database owner's raw session, with every trigger switched off for it."""
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        yield conn


def rehash_from(conn: Any, start: int) -> None:
    """Recompute every leaf and link from entry ``start`` on: what an owner who knows
    the formulas does after editing bodies."""
    prev = ZERO_HASH
    if start:
        prev = bytes(
            conn.execute(
                "SELECT chain_hash FROM cassette_journal WHERE seq = %s", (start - 1,)
            ).fetchone()[0]
        )
    rows = conn.execute(
        "SELECT seq, body FROM cassette_journal WHERE seq >= %s ORDER BY seq", (start,)
    ).fetchall()
    for seq, body in rows:
        leaf = leaf_hash(body.encode("utf-8"))
        prev = chain_hash(seq, prev, leaf)
        conn.execute(
            "UPDATE cassette_journal SET leaf_hash = %s, chain_hash = %s WHERE seq = %s",
            (leaf, prev, seq),
        )


# ------------------------------------------------------------------------ the snapshot


def test_catalog_snapshot_is_what_the_migrations_make(pg_database: str) -> None:
    """The snapshot of this server's major describes a freshly migrated database exactly;
    with CASSETTE_REGENERATE_CATALOG=1 it is rewritten instead (after a migration
    changes), or made, on a server of a major that has none yet."""
    MessageCassette(pg_database).close()
    with psycopg.connect(pg_database) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sqlfiles.query("verify_settings"))
        described = catalog.describe(conn)
        path = catalog.snapshot_path(catalog.server_major(conn))
    text = catalog.render(len(sqlfiles.migrations()), described)
    if os.environ.get(REGENERATE) == "1":
        path.write_text(text, "utf-8")
        catalog.reference.cache_clear()
    assert path.is_file() and path.read_text("utf-8") == text, (
        f"{path.name} is stale: run {REGENERATE}=1 python -m pytest {__file__} -k catalog"
    )


def test_every_shipped_snapshot_describes_the_latest_schema() -> None:
    """A snapshot per major version, each of the migrations this package ships (one left
    behind when a migration was added would refuse to verify on its major)."""
    majors = catalog.shipped_majors()
    assert 15 in majors  # (the CI's server)
    for major in majors:
        loaded = catalog.reference(major)
        assert loaded is not None and loaded["version"] == len(sqlfiles.migrations()), major
    assert catalog.reference(max(majors) + 1) is None


@pytest.mark.parametrize("major", sorted(set(catalog.shipped_majors())))
def test_the_journaled_tables_have_the_columns_verify_reads(major: int) -> None:
    """Every journaled table of each snapshot has the columns of its journal body, in
    order (verify copies them by name), and nothing else."""
    loaded = catalog.reference(major)
    assert loaded is not None
    objects = loaded["objects"]
    present = [name for name in TABLES if f"relation {name}" in objects]
    assert present  # (the message cassette's tables at least)
    for name in present:
        columns = [c[0] for c in objects[f"relation {name}"]["columns"]]
        assert tuple(columns) == TABLES[name].columns, name
        assert list(catalog.column_types(major)[name]) == columns


# ------------------------------------------------------------------------ clean ledgers


def test_an_empty_ledger_verifies(pg_ledger: str) -> None:
    report = verify(pg_ledger)
    assert report.ok and report.findings == [] and report.journal_rows == 0


def test_a_busy_ledger_verifies(busy: str) -> None:
    report = verify(busy)
    assert report.findings == [], report.findings
    with psycopg.connect(busy) as conn:
        size = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    assert report.ok and report.journal_rows == size > 20
    assert report.level == "full"
    quick = verify_path(busy, level=Level.QUICK)
    assert quick.ok and quick.journal_rows == size and quick.level == "quick"


def test_the_cli_verifies_a_postgresql_ledger_with_the_same_json_and_exit_codes(
    busy: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    MessageCassette(tmp_path / "l.db").close()
    result = runner.invoke(cli, ["--db", busy, "verify", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    sqlite_answer = json.loads(
        runner.invoke(cli, ["--db", str(tmp_path / "l.db"), "verify", "--json"]).stdout
    )
    assert answer.keys() == sqlite_answer.keys()
    assert answer["ok"] is True and answer["journal_rows"] > 0
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE cassette_jobs SET intent = 'forged' WHERE job_id = 1")
    result = runner.invoke(cli, ["--db", busy, "verify"])
    assert result.exit_code == 1
    assert "state_mismatch" in result.stdout and "cassette_jobs[1]" in result.stdout
    # cannot verify: no server there (exit 3), sessions not ported (exit 3)
    gone = postgres.with_database(busy, "cassette_no_such_db")
    assert runner.invoke(cli, ["--db", gone, "verify"]).exit_code == 3
    session = runner.invoke(cli, ["--db", busy, "verify", "--session", "s"])
    assert session.exit_code == 3 and "NOT_FOUND" in session.output  # no such session


def test_the_benchmark_script_runs(pg_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    sys.path.insert(0, str(postgres.SCRIPTS))
    try:
        import bench_verify_pg
    finally:
        sys.path.remove(str(postgres.SCRIPTS))
    assert bench_verify_pg.main([pg_server, "--entries", "60", "--repeat", "1"]) == 0
    printed = capsys.readouterr().out
    assert "postgresql" in printed and "sqlite" in printed and "60 entries" in printed


def test_worker_keys_are_checked(busy: str) -> None:
    """With no worker pinned, nothing is expected of anyone (the checks themselves:
    test_postgres_worker_keys.py)."""
    assert verify(busy, worker_keys={}).ok


def test_a_database_without_a_ledger_cannot_be_verified(pg_database: str) -> None:
    with pytest.raises(CassetteError) as caught:
        verify_path(pg_database)
    assert caught.value.code is ErrorCode.NOT_A_CASSETTE


# --------------------------------------------------------------------- the owner's attacks


def test_a_rewritten_row(owner: Any, busy: str) -> None:
    owner.execute("UPDATE cassette_messages SET payload_json = '{\"x\":2}' WHERE message_id = 2")
    report = verify(busy)
    assert errors(report) == {"state_mismatch"}
    (finding,) = report.errors
    assert (finding.table, finding.key) == ("cassette_messages", 2)


def test_a_rewritten_step_with_every_column_checked(owner: Any, busy: str) -> None:
    owner.execute("UPDATE cassette_steps SET lease_owner = 'mallory' WHERE status = 'LEASED'")
    report = verify(busy)
    assert "state_mismatch" in errors(report)
    assert {f.table for f in report.errors} >= {"cassette_steps"}


def test_a_deleted_row(owner: Any, busy: str) -> None:
    owner.execute("DELETE FROM cassette_receipts WHERE receipt_id = 1")
    report = verify(busy)
    assert {"row_missing", "committed_without_receipt"} <= errors(report)
    missing = [f for f in report.errors if f.kind is FindingKind.ROW_MISSING]
    assert [(f.table, f.key) for f in missing] == [("cassette_receipts", 1)]


def test_a_row_without_history(owner: Any, busy: str) -> None:
    owner.execute(
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (4, 'run', 'USER', '{}', 1)"
    )
    report = verify(busy)
    assert "unjournaled_row" in errors(report)
    assert "empty_message" in errors(report)


def test_an_edited_journal_body(owner: Any, busy: str) -> None:
    owner.execute(
        "UPDATE cassette_journal SET body = replace(body, 'PLANNER', 'USER') WHERE seq = 0"
    )
    report = verify(busy)
    assert "leaf_hash" in errors(report)
    assert report.errors[0].seq == 0


def test_an_edited_body_with_every_hash_recomputed(owner: Any, busy: str) -> None:
    """The chain holds (the owner recomputed it), but the body no longer
    describes the row: state against history finds it."""
    owner.execute(
        "UPDATE cassette_journal SET body = replace(body, 'PLANNER', 'USER') WHERE seq = 0"
    )
    rehash_from(owner, 0)
    report = verify(busy)
    assert errors(report) == {"state_mismatch"}
    assert [(f.table, f.key, f.seq) for f in report.errors] == [("cassette_messages", 1, 0)]


def test_a_truncated_tail(owner: Any, busy: str) -> None:
    """The journal's last entries removed, the rows they journal left: the chain that is
    left holds, and the rows say what it lost. (A cut that takes the rows too is caught
    by a seal only: tests/test_postgres_head.py.)"""
    size = owner.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    owner.execute("DELETE FROM cassette_journal WHERE seq >= %s", (size - 3,))
    report = verify(busy)
    assert "journal_head" not in kinds(report)
    # the last receipt has no entry left, and the steps it and the last claim changed
    # are not what their latest remaining entries say
    assert errors(report) == {"unjournaled_row", "state_mismatch"}, report.findings


def test_a_journal_gap(owner: Any, busy: str) -> None:
    owner.execute("DELETE FROM cassette_journal WHERE seq = 3")
    report = verify(busy)
    assert {"journal_gap", "chain_hash"} <= errors(report)


def test_the_stored_key_beside_a_body(owner: Any, busy: str) -> None:
    owner.execute("UPDATE cassette_journal SET row_key = '99' WHERE seq = 1")
    report = verify(busy)
    assert errors(report) == {"journal_columns"}
    assert [f.seq for f in report.errors] == [1]


def test_the_stored_key_of_an_action_is_its_id_unquoted(pg_ledger: str) -> None:
    """An action's journal entry keeps its action_id beside the body as SQLite does (no
    JSON quotes): a clean chain verifies, and the id quoted is reported."""
    from catalytic_cassette import CausalChain

    with CausalChain(pg_ledger) as chain:
        stored = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "CapabilityCall",
                "function_name": "f",
            }
        )
    assert verify(pg_ledger).findings == []
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE cassette_journal SET row_key = %s WHERE tbl = 'cassette_actions'",
            (f'"{stored.action_id}"',),
        )
    report = verify(pg_ledger)
    assert errors(report) == {"journal_columns"}
    assert [f.key for f in report.errors] == [f'"{stored.action_id}"']


def test_a_step_committed_without_its_receipt_and_journaled_consistently(busy: str) -> None:
    """The owner turns off the step guard (which also takes the head), takes the head
    itself, as the journal's append checks (migration 0014), and commits a step by hand: the
    journaling trigger still writes a true entry, so chain and state agree; the
    consistency rules find the step without its receipt."""
    with psycopg.connect(busy, autocommit=True) as conn, conn.transaction():
        conn.execute("ALTER TABLE cassette_steps DISABLE TRIGGER cassette_steps_update")
        conn.execute("SELECT cassette_tx_ms()")
        conn.execute(
            "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id ="
            " (SELECT min(step_id) FROM cassette_steps WHERE run_id = 'run-2')"
        )
        conn.execute("ALTER TABLE cassette_steps ENABLE TRIGGER cassette_steps_update")
    report = verify(busy)
    assert errors(report) == {"committed_without_receipt", "unlawful_history"}, report.findings
    # --run-id limits state, consistency and history to one run's rows
    assert verify(busy, run_id="run").ok
    assert errors(verify(busy, run_id="run-2")) == {
        "committed_without_receipt",
        "unlawful_history",
    }


def test_run_id_limits_the_row_checks(owner: Any, busy: str) -> None:
    owner.execute("UPDATE cassette_messages SET source = 'SYSTEM' WHERE run_id = 'run-2'")
    assert verify(busy, run_id="run").ok
    assert errors(verify(busy, run_id="run-2")) == {"state_mismatch"}


STRUCTURE_ATTACKS = [
    (
        "ALTER TABLE cassette_messages DISABLE TRIGGER cassette_messages_no_change",
        "trigger_disabled",
    ),
    ("ALTER TABLE cassette_journal DISABLE TRIGGER ALL", "trigger_disabled"),
    (
        "ALTER TABLE cassette_steps ENABLE REPLICA TRIGGER cassette_steps_update",
        "trigger_disabled",
    ),
    (
        "CREATE TRIGGER zz_planted BEFORE INSERT ON cassette_messages"
        " FOR EACH ROW EXECUTE FUNCTION cassette_append_only()",
        "schema_extra",
    ),
    (
        "CREATE FUNCTION sha256(text) RETURNS bytea LANGUAGE sql AS 'SELECT NULL::bytea'",
        "schema_extra",
    ),
    (
        "CREATE OR REPLACE FUNCTION cassette_name_ok(value text) RETURNS boolean"
        " LANGUAGE sql IMMUTABLE AS $$ SELECT true $$",
        "schema_changed",
    ),
    (
        "ALTER FUNCTION cassette_claim(text, text, integer, bigint) SECURITY INVOKER",
        "schema_changed",
    ),
    (
        "ALTER FUNCTION cassette_post(text, text, text, text, text[], integer[], text[])"
        " SET search_path = pg_temp, public",
        "schema_changed",
    ),
    ("GRANT INSERT ON cassette_messages TO cassette_worker", "schema_changed"),
    ("GRANT EXECUTE ON FUNCTION cassette_advance_clock(bigint) TO PUBLIC", "schema_changed"),
    ("REVOKE SELECT ON cassette_journal FROM cassette_auditor", "schema_changed"),
    ("DROP INDEX cassette_steps_leased", "schema_missing"),
    ("CREATE INDEX planted ON cassette_steps (status)", "schema_extra"),
    ("CREATE RULE hide AS ON UPDATE TO cassette_messages DO INSTEAD NOTHING", "schema_extra"),
    ("ALTER TABLE cassette_steps ENABLE ROW LEVEL SECURITY", "schema_changed"),
    ("CREATE POLICY planted ON cassette_receipts USING (true)", "schema_extra"),
    ("CREATE TABLE cassette_child () INHERITS (cassette_messages)", "schema_extra"),
    (
        "ALTER TABLE cassette_messages DROP CONSTRAINT cassette_messages_message_id_check",
        "schema_missing",
    ),
    ("ALTER TABLE cassette_journal ALTER COLUMN body DROP NOT NULL", "schema_changed"),
    ("ALTER TABLE cassette_releases ADD COLUMN note text", "schema_changed"),
    ("ALTER TABLE cassette_steps SET UNLOGGED", "schema_changed"),
    ("CREATE VIEW cassette_view AS SELECT 1 AS one", "schema_extra"),
    ("ALTER ROLE cassette_worker SET search_path = pg_temp, public", "schema_extra"),
]


@pytest.mark.parametrize(("attack", "kind"), STRUCTURE_ATTACKS)
def test_the_structure(busy: str, attack: str, kind: str) -> None:
    with psycopg.connect(busy, autocommit=True) as conn:
        try:
            conn.execute(attack)
            report = verify(busy)
        finally:
            if attack.startswith("ALTER ROLE"):  # (roles are the cluster's, not this ledger's)
                conn.execute("ALTER ROLE cassette_worker RESET search_path")
    assert kind in errors(report), report.findings
    assert all(f.kind.value.startswith(("schema", "trigger")) for f in report.errors)


# ----------------------------------------------- a server major without a snapshot


@pytest.fixture
def unknown_major(monkeypatch: pytest.MonkeyPatch) -> int:
    """The server reports a major this package shipped no snapshot for (PostgreSQL 15 is
    what is installed; the version verify reads is faked)."""
    major = max(catalog.shipped_majors()) + 1
    monkeypatch.setattr(catalog, "server_major", lambda conn: major)
    return major


def test_a_major_without_a_snapshot_cannot_have_its_catalog_verified(
    busy: str, unknown_major: int
) -> None:
    """Not a false `schema_changed`: one UNVERIFIABLE finding that names the major, and
    the chain, state and consistency checks still run."""
    report = verify(busy)
    assert report.ok and report.unverifiable
    (finding,) = report.findings
    assert finding.kind is FindingKind.SCHEMA_UNCHECKED
    assert finding.severity.value == "unverifiable"
    assert f"PostgreSQL {unknown_major}" in finding.detail
    assert report.journal_rows > 20


def test_a_major_without_a_snapshot_still_finds_tampered_rows(
    owner: Any, busy: str, unknown_major: int
) -> None:
    owner.execute("UPDATE cassette_jobs SET intent = 'forged' WHERE job_id = 1")
    owner.execute("UPDATE cassette_journal SET body = body || ' ' WHERE seq = 3")
    report = verify(busy)
    assert {"state_mismatch", "leaf_hash"} <= errors(report)
    assert FindingKind.SCHEMA_UNCHECKED in {f.kind for f in report.findings}


def test_a_major_without_a_snapshot_does_not_compare_a_structure_it_cannot_read(
    busy: str, unknown_major: int
) -> None:
    """A changed function would be `schema_changed` on the snapshot's major; on another
    the catalog is not compared at all, and the report says it cannot verify."""
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION cassette_name_ok(value text) RETURNS boolean"
            " LANGUAGE sql IMMUTABLE AS $$ SELECT true $$"
        )
    report = verify(busy)
    assert report.unverifiable and not errors(report)


def test_the_cli_exits_3_on_a_major_without_a_snapshot(busy: str, unknown_major: int) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--db", busy, "verify"])
    assert result.exit_code == 3, result.output
    assert "unverifiable: schema_unchecked" in result.stdout
    assert "CANNOT VERIFY" in result.stderr
    answer = json.loads(runner.invoke(cli, ["--db", busy, "verify", "--json"]).stdout)
    assert answer["ok"] is True
    assert [f["kind"] for f in answer["findings"]] == ["schema_unchecked"]


def test_the_database_replica_setting_is_reported(busy: str) -> None:
    """ALTER DATABASE ... SET session_replication_role = replica would switch every
    session's triggers off."""
    name = postgres.database_name(busy)
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET session_replication_role = replica')
    report = verify(busy)
    assert errors(report) == {"schema_extra"}
    assert "settings of every role in this database" in report.errors[0].detail


def test_a_dropped_head_is_tampering_not_another_database(busy: str) -> None:
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("DROP TABLE cassette_head")
    report = verify_path(busy)
    assert {"schema_missing", "journal_head"} <= errors(report)


def test_an_older_package_cannot_verify_a_newer_schema(busy: str) -> None:
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("ALTER TABLE cassette_migrations DISABLE TRIGGER ALL")
        conn.execute("INSERT INTO cassette_migrations (version, name) VALUES (999, 'future')")
    with pytest.raises(CassetteError) as caught:
        verify_path(busy)
    assert caught.value.code is ErrorCode.SCHEMA_TOO_NEW


def test_the_auditor_role_verifies(busy: str, pg_server: str) -> None:
    """A login that holds only cassette_auditor reads all verify needs."""
    role = "cassette_test_auditor_" + postgres.database_name(busy)[-8:]  # (not a ledger role)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE cassette_auditor')
    try:
        as_auditor = busy.replace("postgres@", role + "@", 1)
        assert as_auditor != busy
        report = verify_path(as_auditor)
        assert report.ok and report.findings == [] and report.journal_rows > 0
    finally:
        postgres.drop_database(pg_server, busy)  # (its grants name the role)
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f'DROP ROLE "{role}"')


def test_verify_against_a_seal_catches_a_recomputed_chain(
    owner: Any, busy: str, tmp_path: Path
) -> None:
    """The rows of the journal are byte for byte the SQLite ledger's, so a seal (a signed
    root of the tree of leaf hashes) means the same: an owner who rewrites a body and
    recomputes every hash is caught by the root verify rebuilds from the bodies."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.merkle import root_from_leaves
    from catalytic_cassette.note import Checkpoint, sign_note

    key, origin = Ed25519PrivateKey.generate(), "example.com/pg-ledger"
    leaves = [
        leaf_hash(body.encode("utf-8"))
        for (body,) in owner.execute("SELECT body FROM cassette_journal ORDER BY seq")
    ]
    note = Checkpoint(origin, len(leaves), root_from_leaves(leaves)).to_text()
    (tmp_path / "one.seal").write_bytes(sign_note(note, origin, key))

    def against() -> VerifyReport:
        anchors = load_anchors(tmp_path / "one.seal")
        return verify_path(busy, anchors=anchors, seal_key=key.public_key(), origin=origin)

    report = against()
    assert report.ok and [a["status"] for a in report.anchors] == ["holds"]
    assert report.anchored is not None and report.anchored["entries_after_anchor"] == 0
    (first,) = owner.execute(
        "SELECT min(seq) FROM cassette_journal WHERE body LIKE '%\"w1\"%'"
    ).fetchone()
    owner.execute("UPDATE cassette_journal SET body = replace(body, '\"w1\"', '\"w9\"')")
    owner.execute("UPDATE cassette_steps SET lease_owner = 'w9' WHERE lease_owner = 'w1'")
    owner.execute("UPDATE cassette_receipts SET worker_id = 'w9' WHERE worker_id = 'w1'")
    rehash_from(owner, first)
    assert verify(busy).ok  # (without the seal, a consistent rewrite is not detectable)
    report = against()
    assert [a["status"] for a in report.anchors] == ["forked"]
    assert "forked" in errors(report)


def test_recorded_seals_and_the_ledger_id(busy: str) -> None:
    """Seals the ledger records must be the roots rebuilt from the bodies, and the
    ledger_id the one their default origin names."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    with MessageCassette(busy) as cassette:
        cassette.seal(Ed25519PrivateKey.generate())
        cassette.post_message({"after": "the seal"}, "run", "USER")
    assert verify(busy).findings == []
    with psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE cassette_seals SET root_hex = repeat('ab', 32)")
        report = verify(busy)
        assert {"seal_mismatch", "state_mismatch"} == errors(report)
        conn.execute("UPDATE cassette_meta SET value = repeat('0', 32) WHERE key = 'ledger_id'")
        report = verify(busy)
        assert "schema_changed" in errors(report)
        assert any("ledger_id" in f.detail for f in report.errors)


# ------------------------------------------------------------------------ one snapshot


def test_a_writer_committing_during_verify_changes_nothing_it_sees(
    busy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries and rows committed after verify took its snapshot (here: between its
    journal walk and its reads of the tables, the worst moment) are not seen at all."""
    copy = pg_verify.Mirror.copy_table
    wrote: list[int] = []

    def write_then_copy(self: pg_verify.Mirror, conn: Any, table: str) -> None:
        if not wrote:
            with MessageCassette(busy) as writer:
                writer.post_message({"late": True}, "run", "USER")
                step = writer.claim_step("run", "late", ttl_seconds=60)
                writer.complete_step(
                    "run", step["step_id"], "late", step["fencing_token"], {}, "SUCCESS"
                )
            wrote.append(1)
        copy(self, conn, table)

    monkeypatch.setattr(pg_verify.Mirror, "copy_table", write_then_copy)
    report = verify(busy)
    assert wrote and report.findings == [], report.findings
    monkeypatch.undo()
    after = verify(busy)
    assert after.ok and after.journal_rows > report.journal_rows


def test_a_writer_on_another_connection_during_verify(busy: str) -> None:
    """Posts, claims and completions committed while three verifies run: none reports
    anything (each sees one snapshot)."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with MessageCassette(busy) as writer:
                n = 0
                while not stop.is_set():
                    writer.post_message({"n": n}, "run-w", "USER")
                    step = writer.claim_step("run-w", "writer", ttl_seconds=60)
                    writer.complete_step(
                        "run-w", step["step_id"], "writer", step["fencing_token"], {}, "SUCCESS"
                    )
                    n += 1
        except BaseException as exc:  # (reported by the test)
            failures.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        reports = [verify(busy) for _ in range(3)]
    finally:
        stop.set()
        thread.join()
    assert not failures
    assert all(r.findings == [] for r in reports), [r.findings for r in reports]


def test_the_translation_of_an_unreachable_server() -> None:
    with pytest.raises(CassetteError) as caught:
        pg_verify.verify_url("postgresql://nobody@/x?host=/nonexistent-cassette-socket")
    assert caught.value.code is ErrorCode.CANNOT_OPEN
    assert pg_connection.redact("postgresql://u:secret@h/d") == "postgresql://u:***@h/d"
