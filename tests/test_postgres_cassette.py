"""The message cassette on both backends: the same API, results and codes (issue 15).

Every test here runs against a SQLite file and a real PostgreSQL server; the attacks as
the database owner and as the worker role, and the journal's bytes, are PostgreSQL's own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash

from .backends import BACKENDS, Ledger

JOBS = {
    "jobs": [
        {"intent": "build", "steps": [{"n": 1}, {"n": 2}]},
        {"intent": "ship", "steps": [{"n": 3}]},
    ]
}


@pytest.fixture(params=BACKENDS)
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "sqlite":
        return Ledger("sqlite", str(tmp_path / "ledger.db"))
    return Ledger("postgresql", request.getfixturevalue("pg_ledger"))


@pytest.fixture
def opened(either: Ledger) -> Iterator[Any]:
    with either.open() as cassette:
        yield cassette


def refused(code: ErrorCode, call: Any, *args: Any, **kwargs: Any) -> CassetteError:
    with pytest.raises(CassetteError) as caught:
        call(*args, **kwargs)
    assert caught.value.code is code, caught.value
    return caught.value


# ------------------------------------------------------------------ the same API


def test_post_claim_complete_in_claim_order(opened: Any) -> None:
    message_id, job_id = opened.post_message(JOBS, "run", "USER")
    assert (message_id, job_id) == (1, 1)
    leases = [opened.claim_step("run", "w") for _ in range(3)]
    assert [(x["job_id"], x["ordinal"], x["payload"]) for x in leases] == [
        (1, 0, {"n": 1}),
        (1, 1, {"n": 2}),
        (2, 0, {"n": 3}),
    ]
    assert all(x["fencing_token"] == 1 and x["lease_expires_at"] > 0 for x in leases)
    refused(ErrorCode.NO_PENDING_STEPS, opened.claim_step, "run", "w")
    first = leases[0]
    receipt = opened.complete_step("run", first["step_id"], "w", 1, {"ok": True}, "SUCCESS")
    assert receipt == 1
    assert opened.get_step(first["step_id"])["status"] == "COMMITTED"
    assert opened.status("run") == {
        "run_id": "run",
        "messages": 1,
        "steps": {"PENDING": 0, "LEASED": 2, "COMMITTED": 1},
        "receipts": {"SUCCESS": 1, "FAILURE": 0, "ABORTED": 0},
        "expired_leases": 0,
    }


def test_idempotent_posts(opened: Any) -> None:
    assert opened.post_message({"a": 1}, "run", "USER", "key") == (1, 1)
    assert opened.post_message({"a": 1}, "run", "USER", "key") == (1, 1)
    error = refused(
        ErrorCode.IDEMPOTENCY_CONFLICT, opened.post_message, {"a": 2}, "run", "USER", "key"
    )
    assert error.detail == {"message_id": 1}
    assert opened.post_message({"a": 1}, "run", "USER", "other") == (2, 2)


def test_a_refused_item_refuses_its_batch_and_names_it(either: Ledger, opened: Any) -> None:
    before = either.journal()
    error = refused(
        ErrorCode.INVALID_SOURCE,
        opened.post_messages,
        [({"a": 1}, "run", "USER", None), ({"a": 2}, "run", "NOBODY", None)],
    )
    assert error.detail["index"] == 1
    assert either.journal() == before
    assert opened.status("run")["messages"] == 0


def test_completion_rules(either: Ledger, opened: Any) -> None:
    opened.post_message({"a": 1}, "run", "USER")
    opened.post_message({"a": 2}, "other", "USER")
    lease = opened.claim_step("run", "w", ttl_seconds=10)
    step = lease["step_id"]
    refused(ErrorCode.STALE_FENCING_TOKEN, opened.complete_step, "run", step, "w", 7, {}, "SUCCESS")
    refused(ErrorCode.WRONG_WORKER, opened.complete_step, "run", step, "x", 1, {}, "SUCCESS")
    refused(ErrorCode.RUN_MISMATCH, opened.complete_step, "other", step, "w", 1, {}, "SUCCESS")
    refused(ErrorCode.NOT_LEASED, opened.complete_step, "other", 2, "w", 0, {}, "SUCCESS")
    refused(ErrorCode.STEP_NOT_FOUND, opened.complete_step, "run", 99, "w", 1, {}, "SUCCESS")
    refused(ErrorCode.INVALID_OUTCOME, opened.complete_step, "run", step, "w", 1, {}, "MAYBE")
    either.advance(10_000)
    refused(ErrorCode.LEASE_EXPIRED, opened.complete_step, "run", step, "w", 1, {}, "SUCCESS")
    assert opened.complete_step("run", step, "w", 1, {"why": "late"}, "ABORTED") == 1
    refused(ErrorCode.DUPLICATE_RECEIPT, opened.complete_step, "run", step, "w", 1, {}, "ABORTED")


def test_expiry_requeue_and_release(either: Ledger, opened: Any) -> None:
    opened.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
    first = opened.claim_step("run", "w", ttl_seconds=5)
    refused(ErrorCode.LEASE_NOT_EXPIRED, opened.requeue, "run", first["step_id"])
    assert opened.requeue("run") == []
    either.advance(5_000)
    assert opened.status("run")["expired_leases"] == 1
    assert opened.requeue("run") == [
        {"step_id": first["step_id"], "action": "requeued", "fencing_token": 1}
    ]
    again = opened.claim_step("run", "v", ttl_seconds=5)
    assert (again["step_id"], again["fencing_token"]) == (first["step_id"], 2)
    refused(
        ErrorCode.STALE_FENCING_TOKEN,
        opened.complete_step,
        "run",
        again["step_id"],
        "w",
        1,
        {},
        "SUCCESS",
    )
    released = opened.requeue("run", again["step_id"], worker_id="v", fencing_token=2)
    assert released == [{"step_id": again["step_id"], "action": "released", "fencing_token": 2}]
    assert opened.get_step(again["step_id"])["status"] == "PENDING"
    third = opened.claim_step("run", "u", ttl_seconds=5)
    either.advance(5_000)
    opened.claim_step("run", "u", ttl_seconds=60)
    assert opened.requeue("run", max_attempts=3) == [
        {"step_id": third["step_id"], "action": "aborted", "fencing_token": 3}
    ]
    assert opened.status("run")["receipts"]["ABORTED"] == 1


def test_complete_and_claim_in_one_transaction(opened: Any) -> None:
    opened.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
    lease = opened.claim_step("run", "w")
    done = opened.complete_and_claim("run", lease["step_id"], "w", 1, {}, "SUCCESS")
    assert done["receipt_id"] == 1 and done["next"]["step_id"] == 2
    last = opened.complete_and_claim("run", 2, "w", 1, {}, "FAILURE")
    assert last["next"] is None


def test_argument_errors_are_the_same(opened: Any) -> None:
    refused(ErrorCode.INVALID_RUN_ID, opened.post_message, {}, "", "USER")
    refused(ErrorCode.INVALID_SOURCE, opened.post_message, {}, "run", "ROBOT")
    refused(ErrorCode.INVALID_PAYLOAD, opened.post_message, [], "run", "USER")
    refused(ErrorCode.INVALID_TTL, opened.claim_step, "run", "w", 0)
    refused(ErrorCode.INVALID_ARGUMENT, opened.claim_steps, "run", "w", 0)
    refused(ErrorCode.STEP_NOT_FOUND, opened.get_step, 5)


# ------------------------------------------------------------- PostgreSQL's own


def test_postgres_journal_is_the_sqlite_encoding(pg_ledger: str) -> None:
    """Each body is what SQLite's json_object() writes for the same values (rendered here
    by SQLite itself), and leaf and chain hashes follow LAW.md's formulas."""
    ledger = Ledger("postgresql", pg_ledger)
    odd = 'q"\\/\x01\x1f\x7f é\u2028\u2029\ufeff😀'
    with ledger.open() as cassette:
        run, worker = "run " + odd, "worker " + odd
        cassette.post_message({"text": odd, odd: [1, -2, 3.5, None, True]}, run, "USER", odd)
        lease = cassette.claim_step(run, worker)
        cassette.complete_step(run, lease["step_id"], worker, 1, {odd: odd}, "SUCCESS")
    entries = ledger.journal()
    assert [seq for seq, *_ in entries] == list(range(len(entries))) and len(entries) == 6
    render = sqlite3.connect(":memory:")
    previous = ZERO_HASH
    for seq, body, leaf, chain in entries:
        assert render_like_sqlite(render, body) == body
        assert leaf == leaf_hash(body.encode("utf-8"))
        assert chain == chain_hash(seq, previous, leaf)
        previous = chain


def render_like_sqlite(conn: sqlite3.Connection, body: str) -> str:
    """The body SQLite's journal trigger would write for the entry's values."""
    import json

    entry = json.loads(body)
    row = entry["row"]
    pairs = ", ".join("?, ?" for _ in row)
    inner = [item for key, value in row.items() for item in (key, value)]
    (rendered,) = conn.execute(
        f"SELECT json_object('table', ?, 'op', ?, 'key', ?, 'row', json_object({pairs}))",
        [entry["table"], entry["op"], entry["key"], *inner],
    ).fetchone()
    return str(rendered)


def test_a_write_that_waits_past_the_busy_timeout_is_busy_and_writes_nothing(
    pg_ledger: str,
) -> None:
    """Another session holds the head (it wrote, and has not committed): a write that
    waits longer than its busy timeout is BUSY, writes nothing, leaves no transaction."""
    import psycopg

    ledger = Ledger("postgresql", pg_ledger)
    with ledger.open() as cassette:
        cassette.post_message({"a": 1}, "run", "USER")
    before = ledger.journal()
    with psycopg.connect(pg_ledger) as holder:  # not autocommit: a transaction stays open
        holder.execute("SELECT cassette_tx_ms()")
        with ledger.open(busy_timeout_ms=200) as waiting:
            refused(ErrorCode.BUSY, waiting.post_message, {"b": 2}, "run", "USER")
            assert waiting.pg.info.transaction_status.name == "IDLE"
        holder.rollback()
    assert ledger.journal() == before


def test_no_sqlite_method_runs_on_a_postgres_cassette() -> None:
    """Every public method of MessageCassette (and LedgerFile) is defined again for
    PostgreSQL, so none of the SQLite code can meet a psycopg connection."""
    from catalytic_cassette import MessageCassette
    from catalytic_cassette.ledger import LedgerFile
    from catalytic_cassette.postgresql.cassette import PgMessageCassette
    from catalytic_cassette.postgresql.ledger import PgLedger

    public = {
        name
        for cls in (MessageCassette, LedgerFile)
        for name in vars(cls)
        if not name.startswith("_")
    }
    # the one-item forms call the batch forms, which are PostgreSQL's
    pure = {"post_message", "claim_step"}
    assert public - set(vars(PgMessageCassette)) - set(vars(PgLedger)) == pure


def test_text_postgres_cannot_hold_is_invalid_argument_and_writes_nothing(
    pg_ledger: str,
) -> None:
    ledger = Ledger("postgresql", pg_ledger)
    with ledger.open() as cassette:
        refused(ErrorCode.INVALID_ARGUMENT, cassette.post_message, {"a": 1}, "r\x00", "USER")
        refused(ErrorCode.INVALID_ARGUMENT, cassette.claim_step, "r\x00", "w")
        assert cassette.pg.info.transaction_status.name == "IDLE"
    assert ledger.journal() == []


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://%zz",
        "postgresql://someone:hunter2secret@nowhere.invalid:notaport/db",
        "postgresql://nobody@/db?host=/nonexistent-socket-dir",
    ],
)
def test_a_url_that_cannot_be_opened_is_cannot_open_and_hides_its_password(url: str) -> None:
    error = refused(ErrorCode.CANNOT_OPEN, MessageCassette, url)
    assert "hunter2secret" not in str(error)


def test_an_abort_at_max_attempts_journals_the_same_receipt(either: Ledger, opened: Any) -> None:
    """The ABORTED receipt the ledger writes itself (requeue with max_attempts) is the
    package's canonical JSON on both backends (found by the differential test)."""
    from catalytic_cassette import payloads

    opened.post_message({"a": 1}, "run", "USER")
    opened.claim_step("run", "w", ttl_seconds=5)
    either.advance(5_000)
    assert opened.requeue("run", max_attempts=1)[0]["action"] == "aborted"
    bodies = [json.loads(body) for _, body, _, _ in either.journal()]
    (receipt,) = [b["row"] for b in bodies if b["table"] == "cassette_receipts"]
    assert receipt["receipt_json"] == payloads.dumps({"reason": "max_attempts", "attempts": 1})
