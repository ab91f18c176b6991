"""The cassette law's mandatory cases, through the Python API with a manual clock."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import (
    CassetteError,
    ErrorCode,
    ManualClock,
    MessageCassette,
    write_transaction,
)

from . import backends
from .backends import Ledger, package_idle
from .conftest import dump

TTL_MS = 10_000

pytestmark = pytest.mark.both_backends


# --------------------------------------------------------------------- helpers


def count(cassette: MessageCassette, table: str, where: str = "1 = 1", *args: Any) -> int:
    sql = f"SELECT count(*) FROM {table} WHERE {where}"
    return int(backends.rows(cassette.db_path, sql, *args)[0][0])


def journal_len(cassette: MessageCassette) -> int:
    return count(cassette, "cassette_journal")


def claim_all(cassette: MessageCassette, run_id: str, worker: str = "w") -> list[dict[str, Any]]:
    claimed = []
    while True:
        try:
            claimed.append(cassette.claim_step(run_id, worker, TTL_MS / 1000))
        except CassetteError as error:
            assert error.code is ErrorCode.NO_PENDING_STEPS
            return claimed


def count_rows(cassette: MessageCassette, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return backends.rows(cassette.db_path, sql, *args)


def refused(code: ErrorCode, excinfo: pytest.ExceptionInfo[CassetteError]) -> CassetteError:
    assert excinfo.value.code is code, excinfo.value
    return excinfo.value


def raw_write(cassette: MessageCassette, sql: str, params: Any = ()) -> None:
    with write_transaction(cassette.conn) as conn:
        conn.execute(sql, params)


def attack(
    backend: Ledger, cassette: MessageCassette, sql: str | tuple[str, str], params: Any = ()
) -> None:
    """Run a write the law refuses: on SQLite through the package's own connection (every
    function registered, so only the triggers stand in the way), on PostgreSQL as the
    database owner (the package's worker role holds no table privilege at all). ``sql``
    is one statement both dialects take, or (SQLite's, PostgreSQL's)."""
    sqlite_sql, postgresql_sql = (sql, sql) if isinstance(sql, str) else sql
    if not backend.postgresql:
        raw_write(cassette, sqlite_sql, params)
        return
    code = backend.raw_sql(postgresql_sql, *params)
    if code is not None:
        raise CassetteError(code, postgresql_sql)


def receipt_row(cassette: MessageCassette, step_id: int) -> tuple[Any, ...]:
    rows = backends.rows(
        cassette.db_path,
        "SELECT worker_id, fencing_token, outcome, receipt_json FROM cassette_receipts"
        " WHERE step_id = ?",
        step_id,
    )
    assert len(rows) == 1
    return rows[0]


@pytest.fixture
def states(cassette: MessageCassette) -> dict[str, int]:
    """Run A with one COMMITTED, one LEASED (live) and one PENDING step, plus a release."""
    for n in range(4):
        cassette.post_message({"n": n}, "A", "USER")
    committed = cassette.claim_step("A", "w1", 10)
    cassette.complete_step(
        "A", committed["step_id"], "w1", committed["fencing_token"], {"r": 1}, "SUCCESS"
    )
    released = cassette.claim_step("A", "w2", 10)
    cassette.requeue(
        "A", released["step_id"], worker_id="w2", fencing_token=released["fencing_token"]
    )
    leased = cassette.claim_step("A", "w3", 10)
    assert leased["step_id"] == released["step_id"]
    pending = cassette.claim_step("A", "w4", 10)
    cassette.requeue("A", pending["step_id"], worker_id="w4", fencing_token=1)
    return {
        "committed": committed["step_id"],
        "leased": leased["step_id"],
        "pending": pending["step_id"],
    }


# ----------------------------------------------------------------- append-only


APPEND_ONLY_SQL = [
    "UPDATE cassette_messages SET source = 'SYSTEM'",
    "DELETE FROM cassette_messages",
    "UPDATE cassette_receipts SET outcome = 'FAILURE'",
    "UPDATE cassette_receipts SET receipt_json = '{}'",
    "DELETE FROM cassette_receipts",
    "UPDATE cassette_jobs SET intent = 'other'",
    "DELETE FROM cassette_jobs",
    "DELETE FROM cassette_steps",
    "UPDATE cassette_releases SET worker_id = 'someone'",
    "DELETE FROM cassette_releases",
    "UPDATE cassette_journal SET body = body",
    "DELETE FROM cassette_journal",
    # An upsert: SQLite's REPLACE deletes the old row (APPEND_ONLY); PostgreSQL's ON
    # CONFLICT would update it, but the insert's own rule refuses a chosen id first.
    (
        "INSERT OR REPLACE INTO cassette_messages (message_id, run_id, source, payload_json,"
        " created_at) VALUES (1, 'A', 'USER', '{}', 0)",
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json)"
        " OVERRIDING SYSTEM VALUE VALUES (1, 'A', 'USER', '{}')"
        " ON CONFLICT (message_id) DO UPDATE SET payload_json = EXCLUDED.payload_json",
        ErrorCode.OUT_OF_ORDER,
    ),
    (
        "INSERT OR REPLACE INTO cassette_receipts (receipt_id, step_id, job_id, run_id,"
        " worker_id, fencing_token, outcome, receipt_json, created_at)"
        " SELECT receipt_id, step_id, job_id, run_id, worker_id, fencing_token, 'FAILURE', '{}',"
        " created_at FROM cassette_receipts",
        "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json, created_at) OVERRIDING SYSTEM VALUE"
        " SELECT receipt_id, step_id, job_id, run_id, worker_id, fencing_token, 'FAILURE', '{}',"
        " created_at FROM cassette_receipts"
        " ON CONFLICT (receipt_id) DO UPDATE SET outcome = EXCLUDED.outcome",
        ErrorCode.OUT_OF_ORDER,
    ),
]


@pytest.mark.parametrize("sql", APPEND_ONLY_SQL)
def test_append_only_through_the_package_connection(
    backend: Ledger,
    cassette: MessageCassette,
    states: dict[str, int],
    db_path: Path,
    sql: str | tuple[str, str, ErrorCode],
) -> None:
    """Each attack in both dialects: one statement, or (SQLite's, PostgreSQL's, the code
    PostgreSQL refuses it with)."""
    before = dump(db_path)
    code = ErrorCode.APPEND_ONLY
    if not isinstance(sql, str):
        sql, code = (sql[0], sql[1]), (sql[2] if backend.postgresql else code)
    with pytest.raises(CassetteError) as excinfo:
        attack(backend, cassette, sql)
    refused(code, excinfo)
    if not backend.postgresql:
        assert isinstance(excinfo.value.__cause__, sqlite3.Error)
        assert "APPEND_ONLY" in str(excinfo.value.__cause__)
    assert package_idle(cassette)
    assert dump(db_path) == before


# --------------------------------------------------------- illegal transitions


TRANSITIONS = [
    pytest.param(
        "pending",
        "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?",
        ErrorCode.ILLEGAL_TRANSITION,
        id="pending-to-committed",
    ),
    pytest.param(
        "pending",
        "UPDATE cassette_steps SET status = 'DONE' WHERE step_id = ?",
        ErrorCode.INVALID_STATUS,
        id="pending-to-unknown",
    ),
    pytest.param(
        "pending",
        (
            "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'x',"
            " lease_expires_at = cassette_now_ms() + 1000 WHERE step_id = ?",
            "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'x',"
            " lease_expires_at = (SELECT time_ms FROM cassette_head) + 1000 WHERE step_id = ?",
        ),
        ErrorCode.LEASE_FIELDS_LOCKED,
        id="claim-without-token-increment",
    ),
    pytest.param(
        "pending",
        "UPDATE cassette_steps SET lease_owner = 'x' WHERE step_id = ?",
        ErrorCode.LEASE_FIELDS_LOCKED,
        id="pending-lease-owner",
    ),
    pytest.param(
        "leased",
        "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?",
        ErrorCode.RECEIPT_REQUIRED,
        id="leased-to-committed-without-receipt",
    ),
    pytest.param(
        "leased",
        "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
        " lease_expires_at = NULL WHERE step_id = ?",
        ErrorCode.LEASE_NOT_EXPIRED,
        id="live-lease-to-pending",
    ),
    pytest.param(
        "leased",
        "UPDATE cassette_steps SET lease_owner = 'thief' WHERE step_id = ?",
        ErrorCode.LEASE_FIELDS_LOCKED,
        id="steal-lease",
    ),
    pytest.param(
        "leased",
        "UPDATE cassette_steps SET fencing_token = fencing_token + 5 WHERE step_id = ?",
        ErrorCode.LEASE_FIELDS_LOCKED,
        id="bump-token",
    ),
    pytest.param(
        "committed",
        "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
        " lease_expires_at = NULL WHERE step_id = ?",
        ErrorCode.ILLEGAL_TRANSITION,
        id="committed-to-pending",
    ),
    pytest.param(
        "committed",
        "UPDATE cassette_steps SET status = 'LEASED', fencing_token = fencing_token + 1"
        " WHERE step_id = ?",
        ErrorCode.ILLEGAL_TRANSITION,
        id="committed-to-leased",
    ),
    pytest.param(
        "pending",
        "UPDATE cassette_steps SET payload_json = '{\"forged\": 1}' WHERE step_id = ?",
        ErrorCode.IMMUTABLE_FIELD,
        id="payload-rewrite",
    ),
    pytest.param(
        "committed",
        "UPDATE cassette_steps SET run_id = 'B' WHERE step_id = ?",
        ErrorCode.IMMUTABLE_FIELD,
        id="run-rewrite",
    ),
]


@pytest.mark.parametrize(("state", "sql", "code"), TRANSITIONS)
def test_illegal_transitions_are_refused(
    backend: Ledger,
    cassette: MessageCassette,
    states: dict[str, int],
    db_path: Path,
    state: str,
    sql: str | tuple[str, str],
    code: ErrorCode,
) -> None:
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        attack(backend, cassette, sql, (states[state],))
    refused(code, excinfo)
    if not backend.postgresql:
        assert isinstance(excinfo.value.__cause__, sqlite3.Error)
    assert package_idle(cassette)
    assert dump(db_path) == before


def test_illegal_transitions_through_the_api(
    cassette: MessageCassette, states: dict[str, int], db_path: Path
) -> None:
    before = dump(db_path)
    pending, committed = states["pending"], states["committed"]
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", pending, "w4", 1, {}, "SUCCESS")
    refused(ErrorCode.NOT_LEASED, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", committed, "w1", 1, {"again": True}, "SUCCESS")
    refused(ErrorCode.DUPLICATE_RECEIPT, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", pending)
    refused(ErrorCode.NOT_LEASED, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", pending, worker_id="w4", fencing_token=1)
    refused(ErrorCode.APPEND_ONLY, excinfo)  # w4 already released it with token 1
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", committed, worker_id="w1", fencing_token=1)
    refused(ErrorCode.NOT_LEASED, excinfo)
    assert dump(db_path) == before


# ------------------------------------------------------------------ claim order


def test_claim_order_is_deterministic_within_one_millisecond(
    cassette: MessageCassette, clock: ManualClock
) -> None:
    start = clock.now_ms()
    # Interleave two runs; every post lands in the same millisecond.
    cassette.post_message(
        {
            "jobs": [
                {"intent": "first", "steps": [{"a": 0}, {"a": 1}, {"a": 2}]},
                {"intent": "second", "steps": [{"a": 3}]},
            ]
        },
        "A",
        "PLANNER",
    )
    cassette.post_message({"b": 0}, "B", "USER")
    cassette.post_message({"a": 4}, "A", "USER")
    cassette.post_message(
        {
            "jobs": [
                {"intent": "p", "steps": [{"b": 1}, {"b": 2}]},
                {"intent": "q", "steps": [{"b": 3}]},
                {"intent": "r", "steps": [{"b": 4}, {"b": 5}]},
            ]
        },
        "B",
        "PLANNER",
    )
    cassette.post_messages(
        [
            ({"jobs": [{"intent": "x", "steps": [{"a": 5}]}]}, "A", "SYSTEM", None),
            ({"b": 6}, "B", "WORKER", "kb"),
            (
                {
                    "jobs": [
                        {"intent": "y", "steps": [{"a": 6}, {"a": 7}]},
                        {"intent": "z", "steps": [{"a": 8}]},
                    ]
                },
                "A",
                "PLANNER",
                "ka",
            ),
        ]
    )
    for n in range(9, 15):
        cassette.post_message({"a": n}, "A", "USER")
        cassette.post_message({"b": n - 2}, "B", "USER")
    if isinstance(clock, ManualClock):  # a PostgreSQL ledger's time moves by itself
        assert clock.now_ms() == start
        assert {r[0] for r in count_rows(cassette, "SELECT created_at FROM cassette_steps")} == {
            start
        }

    # Alternate claims between the runs until both are drained.
    seen: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    live = ["A", "B"]
    while live:
        for run_id in list(live):
            try:
                seen[run_id].append(cassette.claim_step(run_id, f"w-{run_id}", 60))
            except CassetteError as error:
                assert error.code is ErrorCode.NO_PENDING_STEPS
                live.remove(run_id)

    assert [s["payload"] for s in seen["A"]] == [{"a": n} for n in range(15)]
    assert [s["payload"] for s in seen["B"]] == [{"b": n} for n in range(13)]
    for run_id, claimed in seen.items():
        assert {s["run_id"] for s in claimed} == {run_id}
        keys = [
            count_rows(
                cassette,
                "SELECT message_id, job_ordinal, ordinal, run_id FROM cassette_steps"
                " WHERE step_id = ?",
                s["step_id"],
            )[0]
            for s in claimed
        ]
        assert {k[3] for k in keys} == {run_id}
        assert keys == sorted(keys)
        assert len(set(keys)) == len(keys)
        assert all(s["fencing_token"] == 1 for s in claimed)


def test_claim_takes_the_oldest_pending_step_again(
    cassette: MessageCassette, clock: ManualClock
) -> None:
    cassette.post_message(
        {"jobs": [{"intent": "i", "steps": [{"n": 0}, {"n": 1}]}, {"intent": "j", "steps": [{}]}]},
        "A",
        "USER",
    )
    cassette.post_message({"n": 3}, "A", "USER")
    first, second, third = (cassette.claim_step("A", "w", 60) for _ in range(3))
    cassette.requeue("A", second["step_id"], worker_id="w", fencing_token=1)
    clock.advance(60_000)
    cassette.requeue("A")  # first and third expired
    order = [s["step_id"] for s in claim_all(cassette, "A")]
    assert order == [first["step_id"], second["step_id"], third["step_id"], third["step_id"] + 1]


def test_claim_steps_batch_follows_claim_order(cassette: MessageCassette) -> None:
    cassette.post_message({"jobs": [{"intent": "i", "steps": [{"n": 0}, {"n": 1}]}]}, "A", "USER")
    cassette.post_message({"n": 2}, "A", "USER")
    cassette.post_message({"other": True}, "B", "USER")
    batch = cassette.claim_steps("A", "w", 2, 30)
    assert [s["payload"] for s in batch] == [{"n": 0}, {"n": 1}]
    assert len({s["lease_expires_at"] for s in batch}) == 1
    rest = cassette.claim_steps("A", "w", 5, 30)
    assert [s["payload"] for s in rest] == [{"n": 2}]
    assert cassette.claim_steps("A", "w", 3, 30) == []
    with pytest.raises(CassetteError) as excinfo:
        cassette.claim_steps("A", "w", 0, 30)
    refused(ErrorCode.INVALID_ARGUMENT, excinfo)
    assert cassette.status("B")["steps"]["PENDING"] == 1


# ------------------------------------------------------------ fencing and lease


def test_stale_token_after_requeue_and_reclaim(
    cassette: MessageCassette, clock: ManualClock, db_path: Path
) -> None:
    cassette.post_message({"job": 1}, "A", "USER")
    old = cassette.claim_step("A", "w1", TTL_MS / 1000)
    clock.advance(TTL_MS)
    assert cassette.requeue("A") == [
        {"step_id": old["step_id"], "action": "requeued", "fencing_token": 1}
    ]
    new = cassette.claim_step("A", "w2", TTL_MS / 1000)
    assert (new["step_id"], new["fencing_token"]) == (old["step_id"], 2)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", old["step_id"], "w1", 1, {"late": True}, "SUCCESS")
    error = refused(ErrorCode.STALE_FENCING_TOKEN, excinfo)
    assert isinstance(error.__cause__, backends.DATABASE_ERRORS)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", old["step_id"], "w1", 2, {"late": True}, "SUCCESS")
    refused(ErrorCode.WRONG_WORKER, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", old["step_id"], "w1", 1, {"late": True}, "ABORTED")
    refused(ErrorCode.STALE_FENCING_TOKEN, excinfo)
    assert dump(db_path) == before
    cassette.complete_step("A", new["step_id"], "w2", 2, {"ok": True}, "SUCCESS")
    assert receipt_row(cassette, new["step_id"]) == ("w2", 2, "SUCCESS", '{"ok":true}')


def test_expired_lease_accepts_only_aborted(
    cassette: MessageCassette, clock: ManualClock, db_path: Path
) -> None:
    cassette.post_message({"job": 1}, "A", "USER")
    cassette.post_message({"job": 2}, "A", "USER")
    early = cassette.claim_step("A", "w", TTL_MS / 1000)
    late = cassette.claim_step("A", "w", TTL_MS / 1000)
    # A ManualClock stands still, so the lease's last millisecond is hit exactly; a
    # server's clock runs on by itself, so there the test keeps a second in hand.
    margin = 1 if isinstance(clock, ManualClock) else 1_000
    assert -margin < late["lease_expires_at"] - (clock.now_ms() + TTL_MS) <= 0
    clock.advance(TTL_MS - margin)
    cassette.complete_step("A", early["step_id"], "w", 1, {"in": "time"}, "SUCCESS")
    clock.advance(margin)  # the lease ends at lease_expires_at
    before = dump(db_path)
    for outcome in ("SUCCESS", "FAILURE"):
        with pytest.raises(CassetteError) as excinfo:
            cassette.complete_step("A", late["step_id"], "w", 1, {"too": "late"}, outcome)
        refused(ErrorCode.LEASE_EXPIRED, excinfo)
        assert package_idle(cassette)
    assert dump(db_path) == before
    cassette.complete_step("A", late["step_id"], "w", 1, {"gave": "up"}, "ABORTED")
    assert receipt_row(cassette, late["step_id"])[2] == "ABORTED"
    assert cassette.get_step(late["step_id"])["status"] == "COMMITTED"
    status = cassette.status("A")
    assert status["receipts"] == {"SUCCESS": 1, "FAILURE": 0, "ABORTED": 1}
    assert status["expired_leases"] == 0


def test_receipt_references(cassette: MessageCassette, db_path: Path) -> None:
    cassette.post_message({"job": "a"}, "A", "USER")
    cassette.post_message({"job": "b"}, "B", "USER")
    step = cassette.claim_step("A", "w", 60)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", 999_999, "w", 1, {}, "SUCCESS")
    refused(ErrorCode.STEP_NOT_FOUND, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("B", step["step_id"], "w", 1, {}, "SUCCESS")
    error = refused(ErrorCode.RUN_MISMATCH, excinfo)
    assert isinstance(error.__cause__, backends.DATABASE_ERRORS)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("B", step["step_id"])
    refused(ErrorCode.RUN_MISMATCH, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("B", step["step_id"], worker_id="w", fencing_token=1)
    refused(ErrorCode.RUN_MISMATCH, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", 999_999)
    refused(ErrorCode.STEP_NOT_FOUND, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", 999_999, worker_id="w", fencing_token=1)
    refused(ErrorCode.STEP_NOT_FOUND, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.get_step(999_999)
    refused(ErrorCode.STEP_NOT_FOUND, excinfo)
    assert dump(db_path) == before


# ----------------------------------------------------------------- idempotency


def test_idempotent_repost_returns_same_ids_and_writes_nothing(
    cassette: MessageCassette, clock: ManualClock, db_path: Path
) -> None:
    payload = {"jobs": [{"intent": "i", "steps": [{"x": 1, "y": 2}]}], "meta": {"a": 1, "b": 2}}
    first = cassette.post_message(payload, "A", "USER", "key-1")
    length = journal_len(cassette)
    before = dump(db_path)
    clock.advance(5_000)
    reordered = {"meta": {"b": 2, "a": 1}, "jobs": [{"steps": [{"y": 2, "x": 1}], "intent": "i"}]}
    assert cassette.post_message(reordered, "A", "USER", "key-1") == first
    assert cassette.post_messages([(payload, "A", "USER", "key-1")]) == [first]
    assert journal_len(cassette) == length
    assert dump(db_path) == before
    # Still the same answer once the step has moved on.
    step = cassette.claim_step("A", "w", 60)
    cassette.complete_step("A", step["step_id"], "w", 1, {}, "SUCCESS")
    length = journal_len(cassette)
    assert cassette.post_message(payload, "A", "USER", "key-1") == first
    assert journal_len(cassette) == length


def test_idempotency_conflicts(cassette: MessageCassette, db_path: Path) -> None:
    message_id, _ = cassette.post_message({"v": 1}, "A", "USER", "key-1")
    before = dump(db_path)
    for payload, source in (({"v": 2}, "USER"), ({"v": 1}, "SYSTEM"), ({}, "PLANNER")):
        with pytest.raises(CassetteError) as excinfo:
            cassette.post_message(payload, "A", source, "key-1")
        error = refused(ErrorCode.IDEMPOTENCY_CONFLICT, excinfo)
        assert error.detail["message_id"] == message_id
        assert package_idle(cassette)
    assert dump(db_path) == before


def test_keyless_posts_never_collide(cassette: MessageCassette) -> None:
    ids = [cassette.post_message({"same": True}, run, "USER") for run in ("A", "A", "B", "B")]
    assert len({m for m, _ in ids}) == 4
    assert len({j for _, j in ids}) == 4
    batch = cassette.post_messages([({"same": True}, "A", "USER", None)] * 3)
    assert len({m for m, _ in batch} | {m for m, _ in ids}) == 7
    assert cassette.status("A")["messages"] == 5
    assert cassette.status("B")["messages"] == 2


def test_same_key_in_two_runs_is_fine(cassette: MessageCassette) -> None:
    in_a = cassette.post_message({"v": 1}, "A", "USER", "shared")
    in_b = cassette.post_message({"v": 2}, "B", "SYSTEM", "shared")
    assert in_a != in_b
    assert cassette.post_message({"v": 1}, "A", "USER", "shared") == in_a
    assert cassette.post_message({"v": 2}, "B", "SYSTEM", "shared") == in_b
    assert count(cassette, "cassette_messages") == 2


def test_same_key_twice_in_one_batch(cassette: MessageCassette) -> None:
    ids = cassette.post_messages([({"v": 1}, "A", "USER", "k"), ({"v": 1}, "A", "USER", "k")])
    assert ids[0] == ids[1]
    assert count(cassette, "cassette_messages") == 1


# --------------------------------------------------------------------- requeue


def test_requeue_semantics(cassette: MessageCassette, clock: ManualClock, db_path: Path) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    cassette.post_message({"n": 1}, "A", "USER")
    live = cassette.claim_step("A", "w1", 60)
    short = cassette.claim_step("A", "w2", 1)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", live["step_id"])
    refused(ErrorCode.LEASE_NOT_EXPIRED, excinfo)
    assert cassette.requeue("A") == []  # nothing has expired yet
    assert dump(db_path) == before

    clock.advance(1_000)
    assert cassette.status("A")["expired_leases"] == 1
    assert cassette.requeue("A") == [
        {"step_id": short["step_id"], "action": "requeued", "fencing_token": 1}
    ]
    step = cassette.get_step(short["step_id"])
    assert (step["status"], step["lease_owner"], step["lease_expires_at"]) == (
        "PENDING",
        None,
        None,
    )
    assert step["fencing_token"] == 1  # a requeue keeps the token; the next claim adds 1
    assert cassette.get_step(live["step_id"])["status"] == "LEASED"


def test_release_by_the_holder_before_expiry(cassette: MessageCassette, db_path: Path) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    held = cassette.claim_step("A", "holder", 60)
    sid = held["step_id"]
    before = dump(db_path)
    for worker, token, code in (
        ("intruder", 1, ErrorCode.WRONG_WORKER),
        ("holder", 2, ErrorCode.STALE_FENCING_TOKEN),
        ("holder", 0, ErrorCode.STALE_FENCING_TOKEN),
    ):
        with pytest.raises(CassetteError) as excinfo:
            cassette.requeue("A", sid, worker_id=worker, fencing_token=token)
        error = refused(code, excinfo)
        assert isinstance(error.__cause__, backends.DATABASE_ERRORS)
    for kwargs in ({"worker_id": "holder"}, {"worker_id": "holder", "fencing_token": None}):
        with pytest.raises(CassetteError) as excinfo:
            cassette.requeue("A", sid, **kwargs)
        refused(ErrorCode.INVALID_ARGUMENT, excinfo)
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", worker_id="holder", fencing_token=1)
    refused(ErrorCode.INVALID_ARGUMENT, excinfo)
    assert dump(db_path) == before

    assert cassette.requeue("A", sid, worker_id="holder", fencing_token=1) == [
        {"step_id": sid, "action": "released", "fencing_token": 1}
    ]
    assert cassette.get_step(sid)["status"] == "PENDING"
    assert count(cassette, "cassette_releases", "step_id = ? AND worker_id = ?", sid, "holder")
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", sid, worker_id="holder", fencing_token=1)
    refused(ErrorCode.APPEND_ONLY, excinfo)  # the same release twice
    again = cassette.claim_step("A", "other", 60)
    assert (again["step_id"], again["fencing_token"]) == (sid, 2)


def test_max_attempts_closes_with_aborted_receipt(
    cassette: MessageCassette, clock: ManualClock
) -> None:
    cassette.post_message({"flaky": True}, "A", "USER")
    cassette.post_message({"other": True}, "A", "USER")
    first = cassette.claim_step("A", "w1", 1)
    clock.advance(1_000)
    assert cassette.requeue("A", max_attempts=2) == [
        {"step_id": first["step_id"], "action": "requeued", "fencing_token": 1}
    ]
    second = cassette.claim_step("A", "w2", 1)
    assert (second["step_id"], second["fencing_token"]) == (first["step_id"], 2)
    clock.advance(1_000)
    assert cassette.requeue("A", first["step_id"], max_attempts=2) == [
        {"step_id": first["step_id"], "action": "aborted", "fencing_token": 2}
    ]
    worker, token, outcome, body = receipt_row(cassette, first["step_id"])
    assert (worker, token, outcome) == ("w2", 2, "ABORTED")
    assert body == '{"attempts":2,"reason":"max_attempts"}'
    assert cassette.get_step(first["step_id"])["status"] == "COMMITTED"
    following = cassette.claim_step("A", "w3", 1)
    assert following["payload"] == {"other": True}
    with pytest.raises(CassetteError) as excinfo:
        cassette.requeue("A", max_attempts=0)
    refused(ErrorCode.INVALID_ARGUMENT, excinfo)
    assert cassette.verify_cassette().ok


# ------------------------------------------------------------------ batch APIs


def test_post_messages_batch(cassette: MessageCassette) -> None:
    ids = cassette.post_messages(
        [
            ({"n": 0}, "A", "USER", None),
            (
                {"jobs": [{"intent": "i", "steps": [{}, {}]}, {"intent": "j", "steps": [{}]}]},
                "A",
                "PLANNER",
                "k",
            ),
            ({"n": 2}, "B", "SYSTEM", None),
        ]
    )
    assert [m for m, _ in ids] == [1, 2, 3]
    assert [j for _, j in ids] == [1, 2, 4]
    assert count(cassette, "cassette_jobs") == 4
    assert count(cassette, "cassette_steps") == 5
    assert cassette.post_messages([]) == []


def test_post_messages_refused_item_refuses_the_batch(
    cassette: MessageCassette, db_path: Path
) -> None:
    cassette.post_message({"v": 1}, "A", "USER", "taken")
    before = dump(db_path)
    length = journal_len(cassette)
    with pytest.raises(CassetteError) as excinfo:
        cassette.post_messages(
            [
                ({"n": 0}, "A", "USER", None),
                ({"n": 1}, "B", "USER", "fresh"),
                ({"v": 2}, "A", "USER", "taken"),
                ({"n": 3}, "A", "USER", None),
            ]
        )
    error = refused(ErrorCode.IDEMPOTENCY_CONFLICT, excinfo)
    assert error.detail["index"] == 2
    assert package_idle(cassette)
    assert journal_len(cassette) == length
    assert dump(db_path) == before


def test_complete_steps_batch(cassette: MessageCassette, db_path: Path) -> None:
    for n in range(3):
        cassette.post_message({"n": n}, "A", "USER")
    a, b, c = cassette.claim_steps("A", "w", 3, 60)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_steps(
            [
                ("A", a["step_id"], "w", 1, {"ok": 0}, "SUCCESS"),
                ("A", b["step_id"], "w", 7, {"ok": 1}, "SUCCESS"),
                ("A", c["step_id"], "w", 1, {"ok": 2}, "SUCCESS"),
            ]
        )
    error = refused(ErrorCode.STALE_FENCING_TOKEN, excinfo)
    assert error.detail["index"] == 1
    assert isinstance(error.__cause__, backends.DATABASE_ERRORS)
    assert package_idle(cassette)
    assert dump(db_path) == before
    assert cassette.get_step(a["step_id"])["status"] == "LEASED"

    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_steps(
            [
                ("A", a["step_id"], "w", 1, {}, "SUCCESS"),
                ("A", 424_242, "w", 1, {}, "SUCCESS"),
            ]
        )
    assert refused(ErrorCode.STEP_NOT_FOUND, excinfo).detail["index"] == 1
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_steps(
            [
                ("A", a["step_id"], "w", 1, {}, "SUCCESS"),
                ("A", a["step_id"], "w", 1, {}, "FAILURE"),
            ]
        )
    assert refused(ErrorCode.DUPLICATE_RECEIPT, excinfo).detail["index"] == 1
    assert dump(db_path) == before

    receipts = cassette.complete_steps(
        [
            ("A", a["step_id"], "w", 1, {"ok": 0}, "SUCCESS"),
            ("A", b["step_id"], "w", 1, {"ok": 1}, "FAILURE"),
            ("A", c["step_id"], "w", 1, {"ok": 2}, "ABORTED"),
        ]
    )
    assert len(set(receipts)) == 3
    assert cassette.status("A")["receipts"] == {"SUCCESS": 1, "FAILURE": 1, "ABORTED": 1}
    assert cassette.complete_steps([]) == []


def test_batch_validation_refusal_names_the_item(cassette: MessageCassette, db_path: Path) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    step = cassette.claim_step("A", "w", 60)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.post_messages([({"n": 1}, "A", "USER", None), ({"n": 2}, "A", "ROBOT", None)])
    assert refused(ErrorCode.INVALID_SOURCE, excinfo).detail.get("index") == 1
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_steps(
            [
                ("A", step["step_id"], "w", 1, {}, "SUCCESS"),
                ("A", step["step_id"], "w", 1, {}, "MAYBE"),
            ]
        )
    assert refused(ErrorCode.INVALID_OUTCOME, excinfo).detail.get("index") == 1
    assert dump(db_path) == before


# ------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    "ttl", [0, -1, -0.5, 0.0004, 1e12, float("nan"), float("inf"), "5", None, True]
)
def test_claim_refuses_bad_ttl(cassette: MessageCassette, db_path: Path, ttl: Any) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        cassette.claim_step("A", "w", ttl)
    refused(ErrorCode.INVALID_TTL, excinfo)
    assert dump(db_path) == before


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.post_message([1, 2], "A", "USER"), ErrorCode.INVALID_PAYLOAD),
        (lambda c: c.post_message({"n": 1}, "A", "ROBOT"), ErrorCode.INVALID_SOURCE),
        (lambda c: c.post_message({"n": 1}, "", "USER"), ErrorCode.INVALID_RUN_ID),
        (lambda c: c.post_message({"n": 1}, "A", "USER", ""), ErrorCode.INVALID_IDEMPOTENCY_KEY),
        (lambda c: c.post_message({"jobs": []}, "A", "USER"), ErrorCode.INVALID_PAYLOAD),
        (
            lambda c: c.post_message({"jobs": [{"intent": "i", "steps": [1]}]}, "A", "USER"),
            ErrorCode.INVALID_PAYLOAD,
        ),
        (
            lambda c: c.post_message({"blob": "x" * (16 * 1024 * 1024)}, "A", "USER"),
            ErrorCode.PAYLOAD_TOO_LARGE,
        ),
        (lambda c: c.claim_step("A", ""), ErrorCode.INVALID_WORKER),
        (lambda c: c.complete_step("A", 1, "w", "1", {}, "SUCCESS"), ErrorCode.INVALID_TOKEN),
        (lambda c: c.complete_step("A", 1, "w", 1, {}, "DONE"), ErrorCode.INVALID_OUTCOME),
        (lambda c: c.complete_step("A", 1, "w", 1, [], "SUCCESS"), ErrorCode.INVALID_PAYLOAD),
        (lambda c: c.status(""), ErrorCode.INVALID_RUN_ID),
    ],
)
def test_api_argument_refusals_write_nothing(
    cassette: MessageCassette, db_path: Path, call: Any, code: ErrorCode
) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    cassette.claim_step("A", "w", 60)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        call(cassette)
    refused(code, excinfo)
    assert package_idle(cassette)
    assert dump(db_path) == before


TOO_BIG = 2**70


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param(
            lambda c: c.complete_step("A", 1, "w", TOO_BIG, {}, "SUCCESS"),
            ErrorCode.INVALID_TOKEN,
            id="complete-token",
        ),
        pytest.param(
            lambda c: c.complete_step("A", TOO_BIG, "w", 1, {}, "SUCCESS"),
            ErrorCode.STEP_NOT_FOUND,
            id="complete-step",
        ),
        pytest.param(
            lambda c: c.requeue("A", TOO_BIG), ErrorCode.STEP_NOT_FOUND, id="requeue-step"
        ),
        pytest.param(
            lambda c: c.requeue("A", 1, worker_id="w", fencing_token=TOO_BIG),
            ErrorCode.INVALID_TOKEN,
            id="release-token",
        ),
        pytest.param(
            lambda c: c.claim_step("A", "w", 10**400), ErrorCode.INVALID_TTL, id="claim-ttl"
        ),
    ],
)
def test_huge_integers_are_refused_with_a_code(
    cassette: MessageCassette, db_path: Path, call: Any, code: ErrorCode
) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    cassette.claim_step("A", "w", 60)
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        call(cassette)
    refused(code, excinfo)
    assert package_idle(cassette)
    assert dump(db_path) == before


# ----------------------------------------------------------- status and verify


def test_status_counts(cassette: MessageCassette, clock: ManualClock) -> None:
    assert cassette.status("A") == {
        "run_id": "A",
        "messages": 0,
        "steps": {"PENDING": 0, "LEASED": 0, "COMMITTED": 0},
        "receipts": {"SUCCESS": 0, "FAILURE": 0, "ABORTED": 0},
        "expired_leases": 0,
    }
    cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, "A", "PLANNER")
    for n in range(4):
        cassette.post_message({"n": n}, "A", "USER")
    cassette.post_message({"elsewhere": True}, "B", "USER")
    steps = cassette.claim_steps("A", "w", 6, 5)
    for step, outcome in zip(steps[:3], ("SUCCESS", "SUCCESS", "FAILURE"), strict=True):
        cassette.complete_step("A", step["step_id"], "w", 1, {}, outcome)
    cassette.claim_step("A", "w", 60)
    clock.advance(5_000)
    cassette.complete_step("A", steps[3]["step_id"], "w", 1, {}, "ABORTED")
    assert cassette.status("A") == {
        "run_id": "A",
        "messages": 5,
        "steps": {"PENDING": 0, "LEASED": 3, "COMMITTED": 4},
        "receipts": {"SUCCESS": 2, "FAILURE": 1, "ABORTED": 1},
        "expired_leases": 2,
    }
    assert cassette.status("B")["steps"] == {"PENDING": 1, "LEASED": 0, "COMMITTED": 0}
    assert cassette.requeue("A")[0]["action"] == "requeued"
    assert cassette.status("A")["steps"] == {"PENDING": 2, "LEASED": 1, "COMMITTED": 4}
    assert cassette.status("A")["expired_leases"] == 0


def test_verify_passes_on_a_healthy_ledger(
    cassette: MessageCassette, clock: ManualClock, states: dict[str, int]
) -> None:
    cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "B", "PLANNER", "k")
    cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "B", "PLANNER", "k")
    held = cassette.claim_step("B", "w", 1)
    clock.advance(1_000)
    cassette.requeue("B", max_attempts=1)
    assert cassette.get_step(held["step_id"])["status"] == "COMMITTED"
    report = cassette.verify_cassette()
    assert report.ok, report.findings
    assert report.errors == []
    assert report.journal_rows == journal_len(cassette)


def test_verify_scoped_to_a_run(cassette: MessageCassette, states: dict[str, int]) -> None:
    cassette.post_message({"other": True}, "B", "USER")
    for run_id in ("A", "B", "no-such-run"):
        report = cassette.verify_cassette(run_id)
        assert report.ok, report.findings


def test_reopened_ledger_keeps_its_state(db_path: Path, clock: ManualClock) -> None:
    with MessageCassette(db_path, clock=clock) as first:
        ids = first.post_message({"n": 0}, "A", "USER", "k")
        first.claim_step("A", "w", 60)
    with MessageCassette(db_path, clock=clock) as second:
        assert second.post_message({"n": 0}, "A", "USER", "k") == ids
        assert second.status("A")["steps"]["LEASED"] == 1
        assert second.verify_cassette().ok


# ----------------------------------------------------- failures leave no trace


def test_a_failed_call_leaves_no_transaction_and_no_partial_rows(
    backend: Ledger, cassette: MessageCassette, db_path: Path
) -> None:
    cassette.post_message({"n": 0}, "A", "USER")
    step = cassette.claim_step("A", "w", 60)
    before = dump(db_path)
    counts = {
        t: count(cassette, t)
        for t in ("cassette_messages", "cassette_jobs", "cassette_steps", "cassette_journal")
    }

    with pytest.raises(CassetteError):
        cassette.post_messages(
            [
                ({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, "A", "USER", "new"),
                ({"n": 1}, "A", "USER", "new"),  # same key, other payload
            ]
        )
    assert package_idle(cassette)
    with pytest.raises(CassetteError):
        cassette.complete_step("A", step["step_id"], "w", 99, {}, "SUCCESS")
    assert package_idle(cassette)
    with pytest.raises(CassetteError):
        attack(backend, cassette, "DELETE FROM cassette_steps")
    assert package_idle(cassette)
    if not backend.postgresql:  # a caller's own transaction on the package's connection
        with pytest.raises(RuntimeError), write_transaction(cassette.conn) as conn:
            conn.execute(
                "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
                " VALUES ('A', 'USER', '{}', (SELECT ms FROM cassette_ledger_time))"
            )
            raise RuntimeError("the caller failed half way")
        assert package_idle(cassette)

    assert {t: count(cassette, t) for t in counts} == counts
    assert dump(db_path) == before
    # The connection is still usable afterwards.
    assert cassette.post_message({"n": 1}, "A", "USER")[0] == 2


def test_trigger_refusal_keeps_the_sqlite_error_as_cause(
    cassette: MessageCassette, states: dict[str, int]
) -> None:
    with pytest.raises(CassetteError) as excinfo:
        cassette.complete_step("A", states["leased"], "w3", 1, {}, "SUCCESS")
    error = refused(ErrorCode.STALE_FENCING_TOKEN, excinfo)
    cause = error.__cause__
    assert isinstance(cause, (sqlite3.IntegrityError, *backends.DATABASE_ERRORS[1:]))
    assert str(cause).startswith("STALE_FENCING_TOKEN: ")
    assert error.message in str(cause)
    assert error.to_dict()["code"] == "STALE_FENCING_TOKEN"
