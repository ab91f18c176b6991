"""Unlawful revisions that reach the journal, attacked as each attacker of LAW.md 12 would
write them, on SQLite; verify must name the first unlawful revision of the row and the
code the write path refuses it with, and keep naming it after honest writes overwrite the
row (before, an honest write made the table equal the journal's last image and verify
passed).

- A client on a package connection adds its own TEMP trigger ending in RAISE(IGNORE) (a
  WHEN clause keeps its honest calls working); it fires after the package's TEMP journal
  trigger and before the file's rules: the journal records a revision the row never takes.
- The ``sqlite3`` shell, with none of the package's functions, plants a persistent trigger;
  an honest worker's call then journals what the trigger makes of it; the shell drops the
  trigger, and the schema is again what the migrations make.
- A client on a package connection drops the file's rule triggers of a table, writes, and
  puts them back in their order (SQLite's counterpart of a PostgreSQL owner's
  ``DISABLE TRIGGER``): the row and its entry both hold the unlawful revision.
- A client drops the package's TEMP clock guard and completes after its lease expired
  (both backends; on PostgreSQL the owner turns the receipt's guard off), or requeues a
  signed lease without its attestation.
- A consistent rewrite of the rows (attacker (c) without the seal key) leaves older
  revisions to contradict the re-rendered latest ones.
Tests that name no verify finding show what is not an attack (a value a CHECK refuses
never reaches the journal; an honest ledger has no unlawful history) or what the law
leaves open and LAW.md says so (a forward clock, a lawful act in a worker's name).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.signing import generate
from catalytic_cassette.worker_keys import WorkerKey

from .backends import Ledger, past_the_temp_check
from .history_judge import (
    assert_first_unlawful,
    entries_of,
    forge,
    ignoring,
    journal_size,
    judged,
    migrated_ledger,
    needs_judge,
    owner_transaction,
    pg_write_path_code,
    report,
    unlawful,
    write_path_code,
)
from .test_redteam import rewrite_history

MINUTE_MS = 60_000


@contextmanager
def without_rules(conn: sqlite3.Connection, table: str) -> Iterator[None]:
    """Inside one write transaction: the file's triggers of ``table`` dropped, then put
    back in their order (the package's TEMP triggers, the journal's, stay)."""
    triggers = conn.execute(
        "SELECT name, sql FROM main.sqlite_master WHERE type = 'trigger' AND tbl_name = ?"
        " ORDER BY rowid",
        (table,),
    ).fetchall()
    conn.execute("BEGIN IMMEDIATE")
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER main.{name}")
    try:
        yield
    finally:
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """A new ledger: an empty migrated file, copied (migrating each took most of a test)."""
    made = tmp_path / "ledger.db"
    made.write_bytes(migrated_ledger())
    return made


@pytest.fixture
def cassette(path: Path, clock: ManualClock) -> Iterator[MessageCassette]:
    with MessageCassette(path, clock=clock, durability="normal") as opened:
        opened.post_message({"jobs": [{"intent": "i", "steps": [{"n": 0}, {"n": 1}]}]}, "r", "USER")
        yield opened


def _step(cassette: MessageCassette, step_id: int) -> dict[str, Any]:
    return cassette.get_step(step_id)


# ------------------------------------------- a client's own TEMP trigger ending in IGNORE

UPDATE_ATTACKS = {
    # name: (setup, forged SET clause, expected code)
    "leased-committed-without-receipt": ("claim", "status = 'COMMITTED'", "RECEIPT_REQUIRED"),
    "pending-committed": ("none", "status = 'COMMITTED'", "ILLEGAL_TRANSITION"),
    "second-holder-same-token": ("claim", "lease_owner = 'x'", "LEASE_FIELDS_LOCKED"),
    "payload-rewritten": ("none", "payload_json = '{{\"n\":666}}'", "IMMUTABLE_FIELD"),
    "payload-rewritten-on-claim": (
        "none",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {soon},"
        " fencing_token = 1, payload_json = '{{\"n\":666}}'",
        "IMMUTABLE_FIELD",
    ),
    "payload-rewritten-on-commit": (
        "claim",
        "status = 'COMMITTED', payload_json = '{{\"n\":666}}'",
        "IMMUTABLE_FIELD",
    ),
    "token-jumps-by-two": (
        "none",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {soon}, fencing_token = 2",
        "LEASE_FIELDS_LOCKED",
    ),
    "lease-beyond-30-days": (
        "none",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {far}, fencing_token = 1",
        "INVALID_TTL",
    ),
    "live-lease-requeued": (
        "claim",
        "status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL",
        "LEASE_NOT_EXPIRED",
    ),
}


def _honest_after(cassette: MessageCassette, step_id: int, setup: str) -> None:
    """An honest write over the row (the holder completes, or a worker claims), then
    more honest writes to the ledger."""
    if setup == "claim":
        step = _step(cassette, step_id)
        cassette.complete_step("r", step_id, "w", step["fencing_token"], {}, "SUCCESS")
    else:
        leased = cassette.claim_step("r", "v", 60)
        assert leased["step_id"] == step_id
        cassette.complete_step("r", step_id, "v", leased["fencing_token"], {}, "FAILURE")
    cassette.post_message({"more": 1}, "r", "USER")


@needs_judge
@pytest.mark.parametrize("attack", judged(UPDATE_ATTACKS))
def test_a_client_trigger_ignoring_a_step_update(
    cassette: MessageCassette, path: Path, clock: ManualClock, attack: str
) -> None:
    setup, clause, code = UPDATE_ATTACKS[attack]
    if setup == "claim":  # (a lease longer than verify's default clock skew)
        assert cassette.claim_step("r", "w", 600)["step_id"] == 1
    soon, far = clock.now_ms() + MINUTE_MS, clock.now_ms() + 31 * 24 * 3_600_000
    sql = f"UPDATE cassette_steps SET {clause.format(soon=soon, far=far)} WHERE step_id = 1"
    conn = cassette.conn
    assert write_path_code(conn, sql) == code  # what the rules refuse it with
    before = _step(cassette, 1)
    clock_guard = code not in {"INVALID_TTL", "LEASE_NOT_EXPIRED"}
    with ignoring(conn, "UPDATE", "cassette_steps", "NEW.step_id = 1", clock_guard=clock_guard):
        seq = forge(conn, sql)
    assert _step(cassette, 1) == before  # the row never took it
    _honest_after(cassette, 1, setup)
    findings = assert_first_unlawful(path, "cassette_steps", 1, seq, code)
    assert not [f for f in findings if f["kind"] == "state_mismatch"]  # the row overwritten
    cassette.post_message({"later": 1}, "r", "USER")
    assert_first_unlawful(path, "cassette_steps", 1, seq, code, cli_too=False)


@pytest.mark.parametrize("clause", ["status = 'DONE'", "fencing_token = -1"])
def test_a_client_trigger_cannot_journal_a_value_a_check_refuses(
    cassette: MessageCassette, path: Path, clause: str
) -> None:
    """The journal trigger writes only for a row the table's CHECK constraints take: an
    ignoring trigger then drops a change that left no entry, and verify passes."""
    cassette.claim_step("r", "w", 600)
    conn = cassette.conn
    before = journal_size(conn)
    with ignoring(conn, "UPDATE", "cassette_steps", "1"):
        conn.execute(f"UPDATE cassette_steps SET {clause} WHERE step_id = 1")
    assert journal_size(conn) == before
    assert report(path)["ok"]


@needs_judge
def test_a_client_trigger_journals_a_claim_the_row_never_took(
    cassette: MessageCassette, path: Path, clock: ManualClock
) -> None:
    """The journal holds a lawful claim by x the row never took; the next worker's claim
    gets the same token, and its entry (LEASED to LEASED) is the first unlawful one."""
    conn = cassette.conn
    soon = clock.now_ms() + MINUTE_MS
    sql = (
        "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'x',"
        f" lease_expires_at = {soon}, fencing_token = 1 WHERE step_id = 1"
    )
    with ignoring(conn, "UPDATE", "cassette_steps", "NEW.lease_owner = 'x'"):
        forge(conn, sql)
    seq = journal_size(conn)
    leased = cassette.claim_step("r", "w", 60)
    assert (leased["step_id"], leased["fencing_token"]) == (1, 1)  # x's token, again
    cassette.complete_step("r", 1, "w", 1, {}, "SUCCESS")
    assert_first_unlawful(path, "cassette_steps", 1, seq, "LEASE_FIELDS_LOCKED")


INSERT_ATTACKS = {
    # name: (table, forged insert, expected code)
    "receipt-from-another-worker": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json, created_at) VALUES (1, 1, 'r', 'x', 1, 'SUCCESS', '{{}}', {now})",
        "WRONG_WORKER",
    ),
    "receipt-stale-token": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json, created_at) VALUES (1, 1, 'r', 'w', 0, 'SUCCESS', '{{}}', {now})",
        "STALE_FENCING_TOKEN",
    ),
    "release-by-a-non-holder": (
        "cassette_releases",
        "INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token, created_at)"
        " VALUES (1, 'r', 'x', 1, {now})",
        "WRONG_WORKER",
    ),
}


@needs_judge
@pytest.mark.parametrize("attack", list(INSERT_ATTACKS))
def test_a_client_trigger_ignoring_an_insert(
    cassette: MessageCassette, path: Path, clock: ManualClock, attack: str
) -> None:
    """The journal records a receipt or release the table never took; the holder's honest
    completion then takes the same id (verify also finds the doubled entry)."""
    table, template, code = INSERT_ATTACKS[attack]
    cassette.claim_step("r", "w", 60)
    conn = cassette.conn
    sql = template.format(now=clock.now_ms())
    assert write_path_code(conn, sql) == code
    with ignoring(conn, "INSERT", table, "1"):
        seq = forge(conn, sql)
    assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
    cassette.complete_step("r", 1, "w", 1, {}, "SUCCESS")
    assert_first_unlawful(path, table, 1, seq, code)


SKIPPED_AFTER = {
    "receipt-without-its-commit": "cassette_receipts",
    "release-without-its-requeue": "cassette_releases",
}


@needs_judge
@pytest.mark.parametrize("attack", list(SKIPPED_AFTER))
def test_a_client_trigger_skipping_what_a_receipt_or_release_does_to_its_step(
    cassette: MessageCassette, path: Path, clock: ManualClock, attack: str
) -> None:
    """A TEMP AFTER trigger ending in RAISE(IGNORE) keeps the receipt or release and skips
    the step's commit or requeue its AFTER trigger writes (LAW 12 (a), left as it was):
    the entry is not followed by its step's revision. A released lease is then completed
    by its holder (the write path checks no release on a receipt); a receipted one
    expires and is requeued."""
    table = SKIPPED_AFTER[attack]
    leased = cassette.claim_step("r", "w", 1)
    conn = cassette.conn
    conn.execute(
        f"CREATE TEMP TRIGGER client_skip AFTER INSERT ON main.{table}"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    past_the_temp_check(conn)
    seq = journal_size(conn)
    if table == "cassette_receipts":
        cassette.complete_step("r", 1, "w", leased["fencing_token"], {}, "SUCCESS")
    else:
        cassette.requeue("r", 1, worker_id="w", fencing_token=leased["fencing_token"])
    conn.execute("DROP TRIGGER temp.client_skip")
    past_the_temp_check(conn)
    assert journal_size(conn) == seq + 1  # the receipt or release alone
    assert cassette.get_step(1)["status"] == "LEASED"
    if table == "cassette_releases":
        cassette.complete_step("r", 1, "w", leased["fencing_token"], {}, "SUCCESS")
    else:
        clock.advance(2_000)
        cassette.requeue("r")
    # (no write path refuses this: its AFTER trigger always writes the step's revision, so
    # the code is the judge's to choose; the entry it names is the receipt or release)
    found = unlawful(report(path)["findings"])
    assert (table, 1) in found, found
    assert found[(table, 1)][0] == seq, found


# ----------------------------------------------------- the sqlite3 shell plants a trigger


@pytest.fixture
def shell() -> str:
    found = shutil.which("sqlite3")
    if found is None:
        if os.environ.get("CASSETTE_REQUIRE_SQLITE3_SHELL"):
            pytest.fail("CASSETTE_REQUIRE_SQLITE3_SHELL is set but sqlite3 is not on PATH")
        pytest.skip("the sqlite3 command-line shell is not installed (CI installs it)")
    return found


def run_shell(shell: str, path: Path, script: str) -> None:
    result = subprocess.run(
        [shell, "-bail", str(path)], input=script, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr


def _schema(path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
    finally:
        conn.close()


@needs_judge
def test_a_planted_trigger_makes_an_honest_claim_one_the_row_never_took(
    shell: str, path: Path, clock: ManualClock
) -> None:
    """w's honest claim is journaled and dropped; with the trigger gone, v claims the same
    step and gets w's token: two holders of token 1, and verify sees the second claim
    follow a revision that already held the lease."""
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 0}, "r", "USER")
    schema = _schema(path)
    run_shell(
        shell,
        path,
        "CREATE TRIGGER planted BEFORE UPDATE ON cassette_steps"
        " WHEN NEW.lease_owner = 'w' BEGIN SELECT RAISE(IGNORE); END;",
    )
    with MessageCassette(path, clock=clock) as cassette:
        first = cassette.claim_step("r", "w", 60)
        assert (first["step_id"], first["fencing_token"]) == (1, 1)
        assert cassette.get_step(1)["status"] == "PENDING"
    run_shell(shell, path, "DROP TRIGGER planted;")
    assert _schema(path) == schema
    with MessageCassette(path, clock=clock) as cassette:
        seq = journal_size(cassette.conn)
        second = cassette.claim_step("r", "v", 60)
        assert (second["step_id"], second["fencing_token"]) == (1, 1)
        cassette.complete_step("r", 1, "v", 1, {}, "SUCCESS")
    assert_first_unlawful(path, "cassette_steps", 1, seq, "LEASE_FIELDS_LOCKED")


SHELL_FORGERIES = {
    # name: (planted triggers, the forged step revision's code)
    "payload-rewritten": (
        "CREATE TRIGGER planted_write AFTER INSERT ON cassette_messages"
        " WHEN NEW.message_id = 2 BEGIN"
        " UPDATE cassette_steps SET payload_json = '{\"n\":666}' WHERE step_id = 1; END;"
        "CREATE TRIGGER planted_skip BEFORE UPDATE ON cassette_steps"
        " WHEN NEW.payload_json IS NOT OLD.payload_json BEGIN SELECT RAISE(IGNORE); END;",
        "IMMUTABLE_FIELD",
    ),
    "committed-without-receipt": (
        "CREATE TRIGGER planted_write AFTER INSERT ON cassette_messages"
        " WHEN NEW.message_id = 2 BEGIN"
        " UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = 1; END;"
        "CREATE TRIGGER planted_skip BEFORE UPDATE ON cassette_steps"
        " WHEN NEW.status = 'COMMITTED' AND NOT EXISTS"
        " (SELECT 1 FROM cassette_receipts WHERE step_id = NEW.step_id)"
        " BEGIN SELECT RAISE(IGNORE); END;",
        "RECEIPT_REQUIRED",
    ),
}


@needs_judge
@pytest.mark.parametrize("forgery", list(SHELL_FORGERIES))
def test_a_planted_trigger_makes_an_honest_post_journal_a_forged_row(
    shell: str, path: Path, clock: ManualClock, forgery: str
) -> None:
    planted, code = SHELL_FORGERIES[forgery]
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 0}, "r", "USER")
        cassette.claim_step("r", "w", 60)
    schema = _schema(path)
    run_shell(shell, path, planted)
    with MessageCassette(path, clock=clock) as cassette:
        start = journal_size(cassette.conn)
        cassette.post_message({"n": 1}, "r", "USER")  # an honest post: message 2
        (seq,) = entries_of(cassette.conn, "cassette_steps", 1, start)
    run_shell(shell, path, "DROP TRIGGER planted_write; DROP TRIGGER planted_skip;")
    assert _schema(path) == schema
    with MessageCassette(path, clock=clock) as cassette:
        assert cassette.get_step(1)["status"] == "LEASED"
        cassette.complete_step("r", 1, "w", 1, {}, "SUCCESS")  # overwrites the row
    assert_first_unlawful(path, "cassette_steps", 1, seq, code)


# ------------------------------- a client drops the file's rules of a table, writes, restores


def _plan(cassette: MessageCassette, path: Path, clock: ManualClock) -> None:
    with CausalChain(path, clock=clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanCompleted", "function_name": "f"}
        )


ACTION_ID = "00000000-0000-4000-8000-00000000ffff"  # (an action's key is its action_id)
ACTION = (
    "INSERT INTO cassette_actions (action_seq, action_id, plan_id, intent_id, action_type,"
    " function_name, arguments_json, result_json, success, cost_micros, duration_ms,"
    f" timestamp, metadata_json) VALUES (NULL, '{ACTION_ID}', {{plan}},"
    " 'i', {kind}, 'f', '[]', NULL, 1, 0, 0, {now}, '{{}}')"
)

# A forged message's job and step, lawful, so that only the message breaks a rule.
MESSAGE_BODY = (
    "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
    " VALUES (2, {message}, 'r', 'i', 0, {now})",
    "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal, ordinal,"
    " status, fencing_token, payload_json, created_at)"
    " VALUES (3, 2, 'r', {message}, 0, 0, 'PENDING', 0, '{{}}', {now})",
)

WIDER = {
    # name: (table whose rules are dropped, forged SQL, key, expected code)
    "step-inserted-leased": (
        "cassette_steps",
        "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal, ordinal,"
        " status, lease_owner, lease_expires_at, fencing_token, payload_json, created_at)"
        " VALUES (3, 1, 'r', 1, 0, 2, 'LEASED', 'x', {soon}, 1, '{{}}', {now})",
        3,
        "ILLEGAL_TRANSITION",
    ),
    "receipt-of-another-job": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at)"
        " VALUES (1, 1, 2, 'r', 'w', 1, 'SUCCESS', '{{}}', {now})",
        1,
        "REFERENCE_MISMATCH",
    ),
    "receipt-of-another-run": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at)"
        " VALUES (1, 1, 1, 'other', 'w', 1, 'SUCCESS', '{{}}', {now})",
        1,
        "RUN_MISMATCH",
    ),
    "release-by-a-non-holder": (
        "cassette_releases",
        "INSERT INTO cassette_releases (release_id, step_id, run_id, worker_id, fencing_token,"
        " created_at) VALUES (1, 1, 'r', 'x', 1, {now})",
        1,
        "WRONG_WORKER",
    ),
    "receipt-id-skips": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at)"
        " VALUES (2, 1, 1, 'r', 'w', 1, 'SUCCESS', '{{}}', {now})",
        2,
        "OUT_OF_ORDER",
    ),
    "step-id-skips": (
        "cassette_steps",
        "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal, ordinal,"
        " status, fencing_token, payload_json, created_at)"
        " VALUES (4, 1, 'r', 1, 0, 2, 'PENDING', 0, '{{}}', {now})",
        4,
        "OUT_OF_ORDER",
    ),
    "receipt-of-a-pending-step": (
        "cassette_receipts",
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at)"
        " VALUES (1, 2, 1, 'r', 'w', 0, 'FAILURE', '{{}}', {now})",
        1,
        "NOT_LEASED",
    ),
    "release-of-a-pending-step": (
        "cassette_releases",
        "INSERT INTO cassette_releases (release_id, step_id, run_id, worker_id, fencing_token,"
        " created_at) VALUES (1, 2, 'r', 'w', 0, {now})",
        1,
        "NOT_LEASED",
    ),
    "message-id-skips": (
        "cassette_messages",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (3, 'r', 'USER', '{{}}', {now})",
        3,
        "OUT_OF_ORDER",
    ),
    "message-dated-before-the-ledger": (
        "cassette_messages",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (2, 'r', 'USER', '{{}}', 1)",
        2,
        "TIME_BACKWARDS",
    ),
    "message-with-an-integer-beyond-64-bits": (
        "cassette_messages",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (2, 'r', 'USER', '{{\"n\":1180591620717411303424}}', {now})",
        2,
        "INVALID_PAYLOAD",
    ),
    "message-nested-1500-deep": (
        "cassette_messages",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (2, 'r', 'USER', '{{\"a\":' || replace(printf('%.1500c', '['), ' ', '[')"
        " || replace(printf('%.1500c', ']'), ' ', ']') || '}}', {now})",
        2,
        "INVALID_PAYLOAD",
    ),
    "action-after-its-plan-finished": (
        "cassette_actions",
        ACTION.replace("{plan}", "'p'").replace("{kind}", "'PlanStepStarted'"),
        ACTION_ID,
        "PLAN_FINISHED",
    ),
    "plan-action-before-its-plan-started": (
        "cassette_actions",
        ACTION.replace("{plan}", "'q'").replace("{kind}", "'PlanPaused'"),
        ACTION_ID,
        "PLAN_NOT_STARTED",
    ),
    "attestation-of-a-claim-of-a-leased-step": (
        "cassette_attestations",
        "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id, step_id,"
        " fencing_token, worker_id, key_id, signature, created_at)"
        " VALUES (1, 'claim', 'r', NULL, 1, 2, 'x', '0123456789abcdef', '"
        + "A" * 86
        + "==', {now})",
        1,
        "INVALID_ATTESTATION",
    ),
    "job-of-another-run": (
        "cassette_jobs",
        "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
        " VALUES (2, 1, 'other', 'i', 1, {now})",
        2,
        "RUN_MISMATCH",
    ),
    "job-of-no-message": (
        "cassette_jobs",
        "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
        " VALUES (2, 9, 'r', 'i', 0, {now})",
        2,
        "REFERENCE_MISSING",
    ),
    "step-of-another-message-than-its-job": (
        "cassette_steps",
        "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal, ordinal,"
        " status, fencing_token, payload_json, created_at)"
        " VALUES (3, 1, 'r', 7, 0, 2, 'PENDING', 0, '{{}}', {now})",
        3,
        "REFERENCE_MISMATCH",
    ),
    "action-with-a-lone-surrogate": (
        "cassette_actions",
        ACTION.replace("{plan}", "'z'")
        .replace("{kind}", "'CapabilityCall'")
        .replace("'[]'", "'[\"\\ud800\"]'"),
        ACTION_ID,
        "INVALID_PAYLOAD",
    ),
    "action-caused-by-no-earlier-action": (
        "cassette_actions",
        ACTION.replace("{plan}", "'z'")
        .replace("{kind}", "'CapabilityCall'")
        .replace("metadata_json)", "metadata_json, caused_by)")
        .replace("'{{}}')", "'{{}}', '00000000-0000-4000-8000-00000000eeee')"),
        ACTION_ID,
        "REFERENCE_MISSING",
    ),
    "attestation-for-another-worker": (
        "cassette_attestations",
        "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id, step_id,"
        " fencing_token, worker_id, key_id, signature, created_at)"
        " VALUES (1, 'complete', 'r', NULL, 1, 1, 'x', '0123456789abcdef', '"
        + "A" * 86
        + "==', {now})",
        1,
        "WRONG_WORKER",
    ),
}


@needs_judge
@pytest.mark.parametrize("attack", judged(WIDER))
def test_a_client_without_a_tables_rules(
    cassette: MessageCassette, path: Path, clock: ManualClock, attack: str
) -> None:
    """The revision is in both the row and its entry; the write path refuses it with
    ``code`` when the rules are in place."""
    table, template, key, code = WIDER[attack]
    cassette.claim_step("r", "w", 60)
    _plan(cassette, path, clock)
    conn = cassette.conn
    soon = clock.now_ms() + MINUTE_MS
    sql = template.format(now=clock.now_ms(), soon=soon)
    refused = write_path_code(conn, sql)
    assert refused == code or (code == "PLAN_NOT_STARTED" and refused == "REFERENCE_MISSING"), (
        refused
    )
    seq = journal_size(conn)
    with without_rules(conn, table):
        conn.execute(sql)
        if table == "cassette_messages":  # its job and step, as a post writes them
            for then in MESSAGE_BODY:
                conn.execute(then.format(message=key, now=clock.now_ms()))
    assert journal_size(conn) > seq
    findings = report(path)["findings"]  # the schema is as it was
    assert not [f for f in findings if f["kind"] in {"schema_changed", "schema_missing"}]
    assert_first_unlawful(path, table, key, seq, code, cli_too=False)


# ----------------------------------------- a receipt dated after its lease, both backends


@pytest.mark.both_backends
@needs_judge
def test_a_success_receipt_dated_after_its_lease_expired(backend: Ledger) -> None:
    """LAW 3 rule 4: after expiry only ABORTED. On SQLite the client drops the package's
    TEMP clock guard and completes; on PostgreSQL the owner turns the receipt's guard off
    and on in one transaction (its created_at is then the one given)."""
    with backend.open() as cassette:
        cassette.post_message({"n": 0}, "r", "USER")
        leased = cassette.claim_step("r", "w", 1)
        backend.advance(2_000)
        if not backend.postgresql:
            cassette.conn.execute("DROP TRIGGER temp.cassette_receipts_clock_guard")
            past_the_temp_check(cassette.conn)
            seq = journal_size(cassette.conn)
            cassette.complete_step("r", 1, "w", leased["fencing_token"], {}, "SUCCESS")
    if backend.postgresql:
        seq = backend.count("cassette_journal")
        with owner_transaction(
            backend.target, "cassette_receipts", "cassette_receipts_insert"
        ) as pg:
            pg.execute(
                "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
                " fencing_token, outcome, receipt_json, created_at)"
                " VALUES (1, 1, 1, 'r', 'w', %s, 'SUCCESS', '{}', cassette_tx_ms())",
                (leased["fencing_token"],),
            )
    ((expires,),) = backend.rows("SELECT lease_expires_at FROM cassette_steps WHERE step_id = 1")
    ((dated,),) = backend.rows("SELECT created_at FROM cassette_receipts WHERE receipt_id = 1")
    assert dated > expires  # both dates in the rows
    assert_first_unlawful(backend.target, "cassette_receipts", 1, seq, "LEASE_EXPIRED")


def test_an_honest_ledger_has_no_unlawful_history(
    cassette: MessageCassette, path: Path, clock: ManualClock
) -> None:
    """The judge's other side: every kind of lawful revision passes."""
    first = cassette.claim_step("r", "w", 1)
    cassette.requeue("r", first["step_id"], worker_id="w", fencing_token=first["fencing_token"])
    again = cassette.claim_step("r", "w", 1)
    clock.advance(2_000)
    cassette.requeue("r")
    third = cassette.claim_step("r", "v", 60)
    assert third["step_id"] == again["step_id"]
    cassette.complete_step("r", third["step_id"], "v", third["fencing_token"], {}, "SUCCESS")
    other = cassette.claim_step("r", "v", 1)
    clock.advance(2_000)
    cassette.complete_step("r", other["step_id"], "v", other["fencing_token"], {}, "ABORTED")
    _plan(cassette, path, clock)
    result = report(path)
    assert result["ok"], result["findings"]
    assert unlawful(result["findings"]) == {}
    with pytest.raises(CassetteError):
        cassette.claim_step("r", "v", 60)


def test_a_claim_over_the_cap_is_reported_at_its_seq(
    cassette: MessageCassette, path: Path, clock: ManualClock
) -> None:
    """A claim records no time; one whose lease ends more than 30 days after the first date
    after it is ``lease_over_cap`` at the claim's entry, also when the row never took it."""
    far = clock.now_ms() + 31 * 24 * 3_600_000
    sql = (
        "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'x',"
        f" lease_expires_at = {far}, fencing_token = 1 WHERE step_id = 1"
    )
    with ignoring(cassette.conn, "UPDATE", "cassette_steps", "1", clock_guard=False):
        seq = forge(cassette.conn, sql)
    leased = cassette.claim_step("r", "v", 60)
    cassette.complete_step("r", 1, "v", leased["fencing_token"], {}, "FAILURE")
    cassette.post_message({"after": 1}, "r", "USER")
    result = report(path)
    assert not result["ok"]
    over = [(f["seq"], f["key"]) for f in result["findings"] if f["kind"] == "lease_over_cap"]
    assert over == [(seq, 1)], result["findings"]


def test_a_forward_clock_expires_other_leases_in_the_ledgers_time(
    path: Path, clock: ManualClock
) -> None:
    """LAW 9a: a row dated an hour ahead makes a live lease expired by the ledger's time;
    anyone may requeue it and its holder is refused; verify, whose clock is later still,
    sees nothing."""
    ahead = ManualClock(clock.now_ms() + 3_600_000)
    with MessageCassette(path, clock=clock) as honest, MessageCassette(path, clock=ahead) as fast:
        honest.post_message({"n": 0}, "r", "USER")
        leased = honest.claim_step("r", "w", 600)
        fast.post_message({"n": 1}, "r", "USER")
        assert [r["step_id"] for r in fast.requeue("r")] == [leased["step_id"]]
        with pytest.raises(CassetteError) as refused:
            honest.complete_step("r", leased["step_id"], "w", 1, {}, "SUCCESS")
        assert refused.value.code.value == "NOT_LEASED"
    assert report(path)["ok"]


@pytest.mark.both_backends
@needs_judge
def test_a_signed_lease_requeued_without_its_attestation(backend: Ledger, tmp_path: Path) -> None:
    """LAW 6b: a lease claimed signed ends only by its worker's attested act or an
    attested requeue. The requeue is stored unsigned after the lease expired (SQLite: a
    client's ignoring TEMP trigger; PostgreSQL: the owner's step rules off for it); the
    holder then closes the lease honestly, signed (ABORTED, after expiry)."""
    key_path, _ = generate(str(tmp_path / "w1"))
    key = WorkerKey.load("w1", key_path)
    with backend.open(worker_key=key) as cassette:
        cassette.post_message({"n": 0}, "r", "WORKER")
        leased = cassette.claim_step("r", "w1", 1)
        backend.advance(2_000)
        sql = (
            "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
            " lease_expires_at = NULL WHERE step_id = 1"
        )
        if backend.postgresql:
            assert pg_write_path_code(backend.target, sql) == "SIGNATURE_REQUIRED"
            seq = backend.count("cassette_journal")
            with owner_transaction(backend.target, "cassette_steps", "cassette_steps_update") as pg:
                pg.execute(sql)
            assert cassette.get_step(1)["status"] == "PENDING"
            again = cassette.claim_step("r", "w1", 60)  # the row took it: claimed anew
            cassette.complete_step("r", 1, "w1", again["fencing_token"], {}, "SUCCESS")
        else:
            conn = cassette.conn
            assert write_path_code(conn, sql) == "SIGNATURE_REQUIRED"
            with ignoring(conn, "UPDATE", "cassette_steps", "NEW.lease_owner IS NULL"):
                seq = forge(conn, sql)
            cassette.complete_step("r", 1, "w1", leased["fencing_token"], {}, "ABORTED")
    assert_first_unlawful(backend.target, "cassette_steps", 1, seq, "SIGNATURE_REQUIRED")


def test_a_planted_trigger_can_still_act_lawfully_in_a_workers_name(
    shell: str, path: Path, clock: ManualClock
) -> None:
    """LAW 12 (a), what a planted-then-dropped trigger can still do: make an honest post
    journal a FAILURE receipt in the holder's name. Every revision is lawful and the rows
    match, so verify passes; only worker keys stop it (SIGNATURE_REQUIRED) or show it."""
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 0}, "r", "USER")
        cassette.claim_step("r", "w", 600)
    run_shell(
        shell,
        path,
        "CREATE TRIGGER planted AFTER INSERT ON cassette_messages WHEN NEW.message_id = 2"
        " BEGIN INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at) SELECT step_id, job_id, run_id,"
        " lease_owner, fencing_token, 'FAILURE', '{\"forged\":1}', NEW.created_at"
        " FROM cassette_steps WHERE step_id = 1; END;",
    )
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")  # an honest post
        assert cassette.get_step(1)["status"] == "COMMITTED"
    run_shell(shell, path, "DROP TRIGGER planted;")
    result = report(path)
    assert result["ok"], result["findings"]
    assert unlawful(result["findings"]) == {}


@needs_judge
def test_a_consistent_rewrite_of_the_rows_is_judged_against_older_revisions(
    cassette: MessageCassette, path: Path
) -> None:
    """Attacker (c) without the seal key: the rows edited (the receipt and the committed
    step given to x), their latest journal revisions re-rendered from them, every hash and
    tree node recomputed (tests/test_redteam.py). The chain, the tree and the tables agree
    and no seal is left to compare; the claim's older revision still names w, so the judge
    names the receipt (WRONG_WORKER)."""
    leased = cassette.claim_step("r", "w", 600)
    cassette.complete_step("r", 1, "w", leased["fencing_token"], {}, "SUCCESS")
    cassette.close()
    reader = sqlite3.connect(path)
    try:
        (receipt_seq,) = entries_of(reader, "cassette_receipts", 1)
    finally:
        reader.close()

    def give_to_x(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE cassette_receipts SET worker_id = 'x' WHERE receipt_id = 1")
        conn.execute("UPDATE cassette_steps SET lease_owner = 'x' WHERE step_id = 1")

    rewrite_history(path, give_to_x)
    findings = assert_first_unlawful(path, "cassette_receipts", 1, receipt_seq, "WRONG_WORKER")
    assert {f["kind"] for f in findings if f["severity"] == "error"} == {"unlawful_history"}


@needs_judge
def test_a_look_alike_transaction_clock_lets_a_success_after_expiry_through(
    cassette: MessageCassette, path: Path, clock: ManualClock
) -> None:
    """Attacker (b) with a look-alike function: the TEMP clock guard reads
    ``cassette_transaction_ms()``, which the client registers to answer a time before the
    lease's expiry, while the package dates the receipt by its clock, after it."""
    leased = cassette.claim_step("r", "w", 1)
    clock.advance(2_000)
    before_expiry = leased["lease_expires_at"] - 1
    cassette.conn.create_function("cassette_transaction_ms", 0, lambda: before_expiry)
    seq = journal_size(cassette.conn)
    cassette.complete_step("r", 1, "w", leased["fencing_token"], {}, "SUCCESS")
    assert cassette.get_step(1)["status"] == "COMMITTED"
    assert_first_unlawful(path, "cassette_receipts", 1, seq, "LEASE_EXPIRED", cli_too=False)
