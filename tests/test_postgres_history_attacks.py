"""Unlawful revisions a PostgreSQL database owner stores in ONE transaction: the rule
trigger of a table turned off, the unlawful write, the trigger turned on, commit. The
journal's own triggers stay on, so the chain is whole and the tables equal the journal's
last image; verify must judge each revision against the one before it, name the first
unlawful one and the code the write path refuses it with, and keep naming it after
honest writes overwrite the row. (``cassette copy`` to SQLite refuses several of these
ledgers: the law is the same on both sides.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from catalytic_cassette import MessageCassette

from .backends import ServerClock
from .history_judge import (
    assert_first_unlawful,
    journal_size,
    judged,
    needs_judge,
    owner_transaction,
    report,
)
from .history_judge import pg_write_path_code as write_path_code

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql

MINUTE_MS = 60_000
STEP_RULES = ("cassette_steps", "cassette_steps_update")


def _seq(url: str) -> int:
    with psycopg.connect(url) as conn:
        return journal_size(conn)


@pytest.fixture
def ledger(pg_ledger: str) -> Iterator[tuple[str, MessageCassette, ServerClock]]:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"n": 0}, {"n": 1}]}]}, "r", "USER"
        )
        yield pg_ledger, cassette, ServerClock(pg_ledger)


def _expires(url: str, step_id: int) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT lease_expires_at FROM cassette_steps WHERE step_id = %s", (step_id,)
        ).fetchone()
    return int(row[0])


@needs_judge
def test_a_success_stored_after_the_lease_expired(
    ledger: tuple[str, MessageCassette, ServerClock],
) -> None:
    url, cassette, clock = ledger
    leased = cassette.claim_step("r", "w", 1)
    clock.advance(2_000)
    sql = (
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at)"
        " VALUES (1, 1, 1, 'r', 'w', %s, 'SUCCESS', '{}', cassette_tx_ms())"
    )
    token = (leased["fencing_token"],)
    assert write_path_code(url, sql, token) == "LEASE_EXPIRED"
    seq = _seq(url)
    with owner_transaction(url, "cassette_receipts", "cassette_receipts_insert") as pg:
        pg.execute(sql, token)
    assert cassette.get_step(1)["status"] == "COMMITTED"
    cassette.post_message({"more": 1}, "r", "USER")
    assert_first_unlawful(url, "cassette_receipts", 1, seq, "LEASE_EXPIRED")


STEP_ATTACKS = {
    # name: (set-up: who holds step 1, forged SET clause, code, who completes after)
    "live-lease-sent-back-to-pending": (
        "w",
        "status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL",
        "LEASE_NOT_EXPIRED",
        "v",
    ),
    "lease-passed-to-another-worker": ("w", "lease_owner = 'x'", "LEASE_FIELDS_LOCKED", "x"),
    "fencing-token-reused": (
        "released",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {soon}",
        "LEASE_FIELDS_LOCKED",
        "x",
    ),
    "committed-without-receipt": ("w", "status = 'COMMITTED'", "RECEIPT_REQUIRED", ""),
    "payload-rewritten": ("", "payload_json = '{{\"n\":666}}'", "IMMUTABLE_FIELD", "v"),
    "token-jumps-by-two": (
        "",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {soon},"
        " fencing_token = fencing_token + 2",
        "LEASE_FIELDS_LOCKED",
        "x",
    ),
    "lease-beyond-30-days": (
        "",
        "status = 'LEASED', lease_owner = 'x', lease_expires_at = {far},"
        " fencing_token = fencing_token + 1",
        "INVALID_TTL",
        "x",
    ),
}


@needs_judge
@pytest.mark.parametrize("attack", judged(STEP_ATTACKS))
def test_an_owner_turns_the_step_rules_off_for_one_write(
    ledger: tuple[str, MessageCassette, ServerClock], attack: str
) -> None:
    url, cassette, clock = ledger
    holder, clause, code, after = STEP_ATTACKS[attack]
    if holder == "w":
        cassette.claim_step("r", "w", 600)
    elif holder == "released":
        first = cassette.claim_step("r", "w", 600)
        cassette.requeue("r", 1, worker_id="w", fencing_token=first["fencing_token"])
    now = clock.now_ms()
    soon, far = now + 10 * MINUTE_MS, now + 31 * 24 * 3_600_000
    sql = f"UPDATE cassette_steps SET {clause.format(soon=soon, far=far)} WHERE step_id = 1"
    assert write_path_code(url, sql) == code
    seq = _seq(url)
    with owner_transaction(url, *STEP_RULES) as pg:
        pg.execute(sql)
    if after == "v":  # an honest worker takes the step the owner made pending
        leased = cassette.claim_step("r", "v", 60)
        assert leased["step_id"] == 1
        cassette.complete_step("r", 1, "v", leased["fencing_token"], {}, "SUCCESS")
    elif after == "x":  # the worker the owner favoured completes through the package
        token = cassette.get_step(1)["fencing_token"]
        cassette.complete_step("r", 1, "x", token, {}, "SUCCESS")
    cassette.post_message({"more": 1}, "r", "USER")
    findings = assert_first_unlawful(url, "cassette_steps", 1, seq, code)
    assert not [f for f in findings if f["kind"] == "trigger_disabled"]
    cassette.post_message({"later": 1}, "r", "USER")
    assert_first_unlawful(url, "cassette_steps", 1, seq, code, cli_too=False)


@needs_judge
def test_an_owner_passes_a_release_of_a_non_holder(
    ledger: tuple[str, MessageCassette, ServerClock],
) -> None:
    url, cassette, _ = ledger
    cassette.claim_step("r", "w", 600)
    sql = (
        "INSERT INTO cassette_releases (release_id, step_id, run_id, worker_id, fencing_token,"
        " created_at) VALUES (1, 1, 'r', 'x', 1, cassette_tx_ms())"
    )
    assert write_path_code(url, sql) == "WRONG_WORKER"
    seq = _seq(url)
    with owner_transaction(url, "cassette_releases", "cassette_releases_insert") as pg:
        pg.execute(sql)
    assert cassette.get_step(1)["status"] == "PENDING"
    leased = cassette.claim_step("r", "v", 60)
    cassette.complete_step("r", 1, "v", leased["fencing_token"], {}, "SUCCESS")
    assert_first_unlawful(url, "cassette_releases", 1, seq, "WRONG_WORKER")


def test_an_owner_claim_over_the_cap_is_reported_at_its_seq(
    ledger: tuple[str, MessageCassette, ServerClock],
) -> None:
    url, cassette, clock = ledger
    far = clock.now_ms() + 31 * 24 * 3_600_000
    seq = _seq(url)
    with owner_transaction(url, *STEP_RULES) as pg:
        pg.execute(
            "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'x',"
            " lease_expires_at = %s, fencing_token = 1 WHERE step_id = 1",
            (far,),
        )
    cassette.complete_step("r", 1, "x", 1, {}, "SUCCESS")
    cassette.post_message({"after": 1}, "r", "USER")
    result = report(url)
    assert not result["ok"]
    over = [(f["seq"], f["key"]) for f in result["findings"] if f["kind"] == "lease_over_cap"]
    assert over == [(seq, 1)], result["findings"]


# ------------------------------------ inserts of the append-only tables, the owner's way

OWNER_INSERTS = {
    # name: (table, its rule trigger, forged SQL, key, code)
    "message-with-an-integer-beyond-64-bits": (
        "cassette_messages",
        "cassette_messages_insert",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (2, 'r', 'USER', '{\"n\":1180591620717411303424}', cassette_tx_ms())",
        2,
        "INVALID_PAYLOAD",
    ),
    "message-id-skips": (
        "cassette_messages",
        "cassette_messages_insert",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (3, 'r', 'USER', '{}', cassette_tx_ms())",
        3,
        "OUT_OF_ORDER",
    ),
    "job-of-another-run": (
        "cassette_jobs",
        "cassette_jobs_insert",
        "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
        " VALUES (2, 1, 'other', 'i', 1, cassette_tx_ms())",
        2,
        "RUN_MISMATCH",
    ),
    "job-of-no-message": (
        "cassette_jobs",
        "cassette_jobs_insert",
        "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
        " VALUES (2, 9, 'r', 'i', 0, cassette_tx_ms())",
        2,
        "REFERENCE_MISSING",
    ),
}


@needs_judge
@pytest.mark.parametrize("attack", list(OWNER_INSERTS))
def test_an_owner_inserting_past_a_tables_rules(
    ledger: tuple[str, MessageCassette, ServerClock], attack: str
) -> None:
    """The owner turns the table's rule trigger off for one insert; the journal records
    the row as it is. The write path, every trigger on, refuses it with ``code``."""
    url, cassette, _ = ledger
    table, trigger, sql, key, code = OWNER_INSERTS[attack]
    assert write_path_code(url, sql) == code
    seq = _seq(url)
    with owner_transaction(url, table, trigger) as pg:
        pg.execute(sql)
    assert _seq(url) > seq
    cassette.post_message({"n": 9}, "r", "USER") if table == "cassette_jobs" else None
    assert_first_unlawful(url, table, key, seq, code, cli_too=False)
