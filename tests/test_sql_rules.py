"""Every SQL rule, attacked the way an auditor with a raw connection or the sqlite3 shell would.

A realistic ledger is built through the API (MessageCassette on a ManualClock):

    step 1  r1  job 1 (message 1, job ordinal 0)  COMMITTED  w1, token 1, receipt 1
    step 2  r1  job 1 (message 1, job ordinal 0)  LEASED     w2, token 2 (w1's token 1 expired)
    step 3  r1  job 2 (message 1, job ordinal 1)  PENDING    token 1, after w3's release 1
    step 4  r1  job 3 (message 2)                 PENDING    token 0, never claimed
    step 5  r2  job 4 (message 3)                 LEASED     w9, token 1

Then a plain ``sqlite3.connect(path)`` (default settings: no registered functions, foreign
keys off), the sqlite3 shell and the package connection try to break each rule of LAW.md
section 3. Every refusal must carry its exact code, leave the dump and the bytes on disk
unchanged, and leave the connection usable.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import (
    CassetteError,
    ErrorCode,
    ManualClock,
    MessageCassette,
    sqlfiles,
    write_transaction,
)
from catalytic_cassette.errors import translate
from catalytic_cassette.hashing import chain_hash, leaf_hash

from .conftest import dump, file_digest

pytestmark = pytest.mark.sqlite_only(
    reason="every SQL rule through a raw sqlite3 connection and the sqlite3 shell"
    " (PostgreSQL's owner and role attacks, the status allow-list pair by pair among them:"
    " test_postgres_attacks.py)"
)

E = ErrorCode
ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000_000  # ManualClock's default start
NOW = T0 + 61_000  # the ledger clock when build_ledger is done
TS = str(NOW)  # rows are dated no earlier than the ledger's latest time
LATER = str(T0 + 999_000)  # a plausible future expiry for forged claims

STEP_COLUMNS = (
    "step_id, job_id, run_id, message_id, job_ordinal, ordinal, status, lease_owner,"
    " lease_expires_at, fencing_token"
)
LAYOUT = [
    (1, 1, "r1", 1, 0, 0, "COMMITTED", "w1", T0 + 60_000, 1),
    (2, 1, "r1", 1, 0, 1, "LEASED", "w2", T0 + 121_000, 2),
    (3, 2, "r1", 1, 1, 0, "PENDING", None, None, 1),
    (4, 3, "r1", 2, 0, 0, "PENDING", None, None, 0),
    (5, 4, "r2", 3, 0, 0, "LEASED", "w9", T0 + 121_000, 1),
]


# --------------------------------------------------------------------------- the ledger


def build_ledger(cassette: MessageCassette, clock: ManualClock) -> None:
    """Posts, claims, a complete, an expiry requeue, a re-claim and a release."""
    jobs = [
        {"intent": "fetch", "steps": [{"url": "a"}, {"url": "b"}]},
        {"intent": "sum", "steps": [{"op": "add"}]},
    ]
    cassette.post_message({"jobs": jobs}, "r1", "USER", "k1")
    cassette.post_message({"note": "plain"}, "r1", "PLANNER", "k2")
    cassette.post_message({"note": "other run"}, "r2", "SYSTEM", "k1")
    first = cassette.claim_step("r1", "w1", 60)
    cassette.complete_step(
        "r1", first["step_id"], "w1", first["fencing_token"], {"ok": 1}, "SUCCESS"
    )
    cassette.claim_step("r1", "w1", 60)
    clock.advance(61_000)
    assert cassette.requeue("r1") == [{"step_id": 2, "action": "requeued", "fencing_token": 1}]
    cassette.claim_step("r1", "w2", 60)
    third = cassette.claim_step("r1", "w3", 60)
    cassette.requeue("r1", third["step_id"], worker_id="w3", fencing_token=third["fencing_token"])
    cassette.claim_step("r2", "w9", 60)


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ledger above, built once through the API and closed (so checkpointed)."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    clock = ManualClock(T0)
    with MessageCassette(path, clock=clock) as cassette:
        build_ledger(cassette, clock)
        assert clock.now_ms() == NOW
        assert cassette.verify_cassette().ok
    assert not Path(f"{path}-wal").exists()
    return path


@pytest.fixture
def clock() -> ManualClock:
    """Overrides conftest's clock: the ledger clock where build_ledger left it."""
    return ManualClock(NOW)


@pytest.fixture
def db_path(tmp_path: Path, template: Path) -> Path:
    """Overrides conftest's db_path: a private copy of the template, which conftest's
    ``cassette`` fixture then opens with the ManualClock above."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(template, path)
    return path


@pytest.fixture
def ledger(cassette: MessageCassette, db_path: Path) -> Path:
    """The ledger, with the API connection left open beside the attacker."""
    layout = cassette.conn.execute(f"SELECT {STEP_COLUMNS} FROM cassette_steps ORDER BY step_id")
    assert layout.fetchall() == LAYOUT
    counts = [
        cassette.conn.execute(f"SELECT count(*) FROM cassette_{table}").fetchone()[0]
        for table in ("messages", "jobs", "receipts", "releases")
    ]
    assert counts == [3, 4, 1, 1]
    return db_path


def snapshot(path: Path) -> tuple[list[str], str]:
    """Every schema object and row, and the bytes of the file and its WAL."""
    return dump(path), file_digest(path)


class Auditor:
    """A raw ``sqlite3.connect(path)`` with default settings, as an auditor opens it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path)

    def refused(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Error:
        """Run one attack: it must fail, change nothing and leave the connection usable."""
        before = snapshot(self.path)
        with pytest.raises(sqlite3.Error) as caught:
            self.conn.execute(sql, params)
        assert file_digest(self.path) == before[1], "the open transaction reached the disk"
        self.conn.rollback()
        self.assert_usable()
        assert snapshot(self.path) == before, "the refused statement changed the ledger"
        return caught.value

    def assert_usable(self) -> None:
        assert not self.conn.in_transaction
        assert self.conn.execute("SELECT count(*) FROM cassette_steps").fetchone() == (5,)


@pytest.fixture
def auditor(ledger: Path) -> Iterator[Auditor]:
    opened = Auditor(ledger)
    yield opened
    opened.conn.close()


def assert_code(error: BaseException, code: ErrorCode) -> None:
    """Refused by a trigger (``CODE: ...``) or a named CHECK, and translated to that code."""
    text = str(error)
    assert isinstance(error, sqlite3.IntegrityError), f"{type(error).__name__}: {text}"
    precise = text.startswith(f"{code.value}: ") or text == f"CHECK constraint failed: {code.value}"
    assert precise, f"expected {code.value}, got: {text}"
    assert translate(error).code is code


def code_of(error: BaseException) -> str:
    match = re.match(r"(?:CHECK constraint failed: )?([A-Z][A-Z_]+)\b", str(error))
    return match.group(1) if match else str(error)


# ------------------------------------------------------------------------- SQL builders

M, J, S = "cassette_messages", "cassette_jobs", "cassette_steps"
R, L = "cassette_receipts", "cassette_releases"
LEGAL_ROWS: dict[str, dict[str, str]] = {
    # a new message of run r1
    M: {
        "run_id": "'r1'",
        "source": "'USER'",
        "idempotency_key": "NULL",
        "payload_json": "'{}'",
        "created_at": TS,
    },
    # a second job (ordinal 1) of message 2
    J: {"message_id": "2", "run_id": "'r1'", "intent": "'extra'", "ordinal": "1", "created_at": TS},
    # a second step (ordinal 1) of job 3
    S: {
        "job_id": "3",
        "run_id": "'r1'",
        "message_id": "2",
        "job_ordinal": "0",
        "ordinal": "1",
        "status": "'PENDING'",
        "lease_owner": "NULL",
        "lease_expires_at": "NULL",
        "fencing_token": "0",
        "payload_json": "'{}'",
        "created_at": TS,
    },
    # w2's receipt for step 2 with its current token
    R: {
        "step_id": "2",
        "job_id": "1",
        "run_id": "'r1'",
        "worker_id": "'w2'",
        "fencing_token": "2",
        "outcome": "'SUCCESS'",
        "receipt_json": "'{}'",
        "created_at": TS,
    },
    # w2's release of step 2 with its current token
    L: {
        "step_id": "2",
        "run_id": "'r1'",
        "worker_id": "'w2'",
        "fencing_token": "2",
        "created_at": TS,
    },
}


def row(table: str, verb: str = "INSERT", tail: str = "", **values: str) -> str:
    """An insert of the table's legal-looking row above, with some values overridden."""
    columns = {**LEGAL_ROWS[table], **values}
    names, literals = ", ".join(columns), ", ".join(columns.values())
    return f"{verb} INTO {table} ({names}) VALUES ({literals}){tail}"


def upd(step_id: int, assignments: str) -> str:
    return f"UPDATE cassette_steps SET {assignments} WHERE step_id = {step_id}"


def cases(rules: dict[ErrorCode, dict[str, str]]) -> list[Any]:
    """``{code: {case id: sql}}`` as pytest params ``(sql, code)``."""
    return [
        pytest.param(sql, code, id=case_id)
        for code, attacks in rules.items()
        for case_id, sql in attacks.items()
    ]


CLAIM = f"status = 'LEASED', lease_owner = 'mallory', lease_expires_at = {LATER}"
REQUEUE = "status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL"
LONG = "'" + "x" * 201 + "'"
LAST_SEQ = "(SELECT max(seq) FROM cassette_journal)"
ON = " ON CONFLICT"
RELEASE_1 = {"step_id": "3", "worker_id": "'w3'", "fencing_token": "1"}  # w3's release

# ------------------------------------------------------------- 1. append-only rewrites

APPEND_ONLY_CASES = cases(
    {
        E.APPEND_ONLY: {
            "messages-update": "UPDATE cassette_messages SET source = 'USER' WHERE message_id = 2",
            "messages-noop-update-of-all": "UPDATE cassette_messages SET created_at = created_at",
            "messages-delete": "DELETE FROM cassette_messages WHERE message_id = 3",
            "messages-delete-all": "DELETE FROM cassette_messages",
            "messages-insert-or-replace-by-pk": row(
                M, "INSERT OR REPLACE", message_id="2", source="'PLANNER'", idempotency_key="'k2'"
            ),
            "messages-replace-into-by-pk": row(M, "REPLACE", message_id="2"),
            "messages-insert-or-ignore-by-pk": row(M, "INSERT OR IGNORE", message_id="2"),
            "messages-upsert-by-pk": row(
                M, tail=f"{ON} (message_id) DO UPDATE SET source = 'SYSTEM'", message_id="2"
            ),
            "jobs-update": "UPDATE cassette_jobs SET intent = 'forged' WHERE job_id = 2",
            "jobs-delete": "DELETE FROM cassette_jobs WHERE job_id = 4",
            "jobs-delete-all": "DELETE FROM cassette_jobs",
            "jobs-insert-or-replace-by-pk": row(
                J, "INSERT OR REPLACE", job_id="3", intent="'default'", ordinal="0"
            ),
            "jobs-replace-into-by-message-ordinal": row(J, "REPLACE", message_id="1", ordinal="1"),
            "jobs-upsert-by-pk": row(
                J, tail=f"{ON} (job_id) DO UPDATE SET intent = 'x'", job_id="1"
            ),
            "jobs-upsert-by-message-ordinal": row(
                J, tail=f"{ON} (message_id, ordinal) DO UPDATE SET intent = 'x'", ordinal="0"
            ),
            "steps-delete-committed": "DELETE FROM cassette_steps WHERE step_id = 1",
            "steps-delete-leased": "DELETE FROM cassette_steps WHERE step_id = 2",
            "steps-delete-pending": "DELETE FROM cassette_steps WHERE step_id = 4",
            "steps-delete-all": "DELETE FROM cassette_steps",
            "steps-insert-or-replace-by-pk": row(
                S, "INSERT OR REPLACE", step_id="2", job_id="1", message_id="1", ordinal="1"
            ),
            "steps-replace-into-by-job-ordinal": row(
                S, "REPLACE", job_id="1", message_id="1", ordinal="0"
            ),
            "steps-upsert-by-pk": row(
                S, tail=f"{ON} (step_id) DO UPDATE SET status = 'COMMITTED'", step_id="4"
            ),
            "steps-upsert-by-job-ordinal": row(
                S, tail=f"{ON} (job_id, ordinal) DO NOTHING", ordinal="0"
            ),
            "receipts-update": "UPDATE cassette_receipts SET outcome = 'ABORTED'",
            "receipts-delete": "DELETE FROM cassette_receipts WHERE receipt_id = 1",
            "receipts-delete-all": "DELETE FROM cassette_receipts",
            "receipts-insert-or-replace-by-pk": row(
                R,
                "INSERT OR REPLACE",
                receipt_id="1",
                step_id="1",
                worker_id="'w1'",
                fencing_token="1",
            ),
            "receipts-replace-into-by-pk-with-valid-receipt": row(R, "REPLACE", receipt_id="1"),
            "receipts-upsert-by-pk": row(
                R, tail=f"{ON} (receipt_id) DO UPDATE SET outcome = 'FAILURE'", receipt_id="1"
            ),
            "releases-update": "UPDATE cassette_releases SET worker_id = 'w2' WHERE release_id = 1",
            "releases-delete": "DELETE FROM cassette_releases WHERE release_id = 1",
            "releases-delete-all": "DELETE FROM cassette_releases",
            "releases-insert-or-replace-by-pk": row(
                L,
                "INSERT OR REPLACE",
                release_id="1",
                step_id="3",
                worker_id="'w3'",
                fencing_token="1",
            ),
            "releases-replace-into-by-pk-with-valid-release": row(L, "REPLACE", release_id="1"),
            "releases-upsert-by-pk": row(
                L, tail=f"{ON} (release_id) DO UPDATE SET worker_id = 'x'", release_id="1"
            ),
            "releases-insert-again-by-step-token": row(L, **RELEASE_1),
            "releases-insert-or-replace-by-step-token": row(L, "INSERT OR REPLACE", **RELEASE_1),
            "releases-replace-into-by-step-token": row(L, "REPLACE", **RELEASE_1),
            "releases-upsert-by-step-token": row(
                L, tail=f"{ON} (step_id, fencing_token) DO UPDATE SET worker_id = 'x'", **RELEASE_1
            ),
            # journal inserts of every kind: test_raw_journal_insert_fails_closed
            "journal-update-body": "UPDATE cassette_journal SET body = '{}' WHERE seq = 0",
            "journal-update-last-hash": (
                f"UPDATE cassette_journal SET chain_hash = zeroblob(32) WHERE seq = {LAST_SEQ}"
            ),
            "journal-renumber": "UPDATE cassette_journal SET seq = seq + 1000",
            "journal-delete-last": f"DELETE FROM cassette_journal WHERE seq = {LAST_SEQ}",
            "journal-delete-all": "DELETE FROM cassette_journal",
            "meta-update": "UPDATE cassette_meta SET value = 'forged' WHERE key = 'format'",
            "meta-delete": "DELETE FROM cassette_meta WHERE key = 'format'",
            "meta-delete-all": "DELETE FROM cassette_meta",
            "meta-insert-or-replace": (
                "INSERT OR REPLACE INTO cassette_meta (key, value) VALUES ('format', 'forged')"
            ),
            "meta-upsert": (
                "INSERT INTO cassette_meta (key, value) VALUES ('format', 'x')"
                f"{ON} (key) DO UPDATE SET value = excluded.value"
            ),
            "migrations-update": "UPDATE cassette_migrations SET name = 'forged' WHERE version = 1",
            "migrations-delete": "DELETE FROM cassette_migrations",
            "migrations-replace-into": (
                "REPLACE INTO cassette_migrations (version, name, sha256)"
                " VALUES (1, 'forged', hex(zeroblob(32)))"
            ),
        },
        E.IDEMPOTENCY_CONFLICT: {
            "messages-insert-or-replace-by-idempotency-key": row(
                M, "INSERT OR REPLACE", idempotency_key="'k1'"
            ),
            "messages-replace-into-by-idempotency-key": row(M, "REPLACE", idempotency_key="'k2'"),
            "messages-upsert-by-idempotency-key": row(
                M,
                tail=f"{ON} (run_id, idempotency_key) DO UPDATE SET source = 'SYSTEM'",
                idempotency_key="'k1'",
            ),
            "messages-upsert-do-nothing-by-idempotency-key": row(
                M, tail=f"{ON} DO NOTHING", run_id="'r2'", idempotency_key="'k1'"
            ),
        },
        E.DUPLICATE_RECEIPT: {
            "receipts-insert-or-replace-by-step": row(
                R, "INSERT OR REPLACE", step_id="1", worker_id="'w1'", fencing_token="1"
            ),
            "receipts-upsert-by-step": row(
                R,
                tail=f"{ON} (step_id) DO UPDATE SET outcome = 'FAILURE'",
                step_id="1",
                worker_id="'w1'",
                fencing_token="1",
            ),
        },
    }
)

# -------------------------------------------------- 2. a step is inserted only PENDING

STEP_INSERT_CASES = cases(
    {
        E.ILLEGAL_TRANSITION: {
            "insert-step-as-leased": row(
                S, status="'LEASED'", lease_owner="'w1'", lease_expires_at=LATER, fencing_token="1"
            ),
            "insert-step-as-committed": row(S, status="'COMMITTED'"),
            "insert-step-as-committed-with-lease": row(
                S,
                status="'COMMITTED'",
                lease_owner="'w1'",
                lease_expires_at=LATER,
                fencing_token="1",
            ),
        },
        E.LEASE_FIELDS_LOCKED: {
            "insert-pending-step-with-token-1": row(S, fencing_token="1"),
            "insert-pending-step-with-owner": row(S, lease_owner="'w1'"),
            "insert-pending-step-with-expiry": row(S, lease_expires_at=LATER),
            "insert-pending-step-with-full-lease": row(
                S, lease_owner="'w1'", lease_expires_at=LATER, fencing_token="1"
            ),
        },
    }
)

# ------------------------------------------------------------------- 3. lease fields

LEASE_CASES = cases(
    {
        E.LEASE_FIELDS_LOCKED: {
            # by hand, without a status change
            "clear-owner-of-leased": upd(2, "lease_owner = NULL"),
            "change-owner-of-leased": upd(2, "lease_owner = 'mallory'"),
            "clear-expiry-of-leased": upd(2, "lease_expires_at = NULL"),
            "extend-lease": upd(2, "lease_expires_at = lease_expires_at + 3600000"),
            "bump-token-of-leased": upd(2, "fencing_token = fencing_token + 1"),
            "rewind-token-of-leased": upd(2, "fencing_token = 1"),
            "steal-lease-keeping-token": upd(2, f"lease_owner = 'm', lease_expires_at = {LATER}"),
            "set-owner-of-pending": upd(3, "lease_owner = 'mallory'"),
            "set-expiry-of-pending": upd(3, f"lease_expires_at = {LATER}"),
            "reset-token-of-pending": upd(3, "fencing_token = 0"),
            "clear-owner-of-committed": upd(1, "lease_owner = NULL"),
            "clear-expiry-of-committed": upd(1, "lease_expires_at = NULL"),
            "bump-token-of-committed": upd(1, "fencing_token = fencing_token + 1"),
            "clear-owner-of-other-runs-lease": upd(5, "lease_owner = NULL"),
            # claims (PENDING -> LEASED): owner and expiry set, token exactly +1
            "claim-token-plus-two": upd(4, f"{CLAIM}, fencing_token = fencing_token + 2"),
            "claim-token-unchanged": upd(4, CLAIM),
            "claim-token-plus-two-after-release": upd(3, f"{CLAIM}, fencing_token = 3"),
            "claim-without-owner": upd(
                4, f"status = 'LEASED', lease_expires_at = {LATER}, fencing_token = 1"
            ),
            "claim-with-empty-owner": upd(4, f"{CLAIM}, lease_owner = '', fencing_token = 1"),
            "claim-with-201-char-owner": upd(
                4, f"{CLAIM}, lease_owner = {LONG}, fencing_token = 1"
            ),
            "claim-without-expiry": upd(
                4, "status = 'LEASED', lease_owner = 'm', fencing_token = 1"
            ),
            "claim-without-lease-fields": upd(4, "status = 'LEASED', fencing_token = 1"),
            # requeues (LEASED -> PENDING): owner and expiry cleared, token kept
            "requeue-keeping-owner": upd(2, "status = 'PENDING', lease_expires_at = NULL"),
            "requeue-keeping-expiry": upd(2, "status = 'PENDING', lease_owner = NULL"),
            "requeue-resetting-token": upd(2, f"{REQUEUE}, fencing_token = 0"),
            "requeue-bumping-token": upd(2, f"{REQUEUE}, fencing_token = fencing_token + 1"),
            # commits (LEASED -> COMMITTED) keep every lease field
            "commit-changing-owner": upd(2, "status = 'COMMITTED', lease_owner = 'mallory'"),
            "commit-bumping-token": upd(
                2, "status = 'COMMITTED', fencing_token = fencing_token + 1"
            ),
            "commit-clearing-expiry": upd(2, "status = 'COMMITTED', lease_expires_at = NULL"),
        }
    }
)

IMMUTABLE_VALUES = {
    "step_id": "99",
    "job_id": "4",
    "run_id": "'r2'",
    "message_id": "3",
    "job_ordinal": "1",
    "ordinal": "7",
    "payload_json": "'{}'",
    "created_at": "0",
}
IMMUTABLE_CASES = cases(
    {
        E.IMMUTABLE_FIELD: {
            **{
                f"{column}-of-{status}": upd(step_id, f"{column} = {value}")
                for (column, value), (status, step_id) in product(
                    IMMUTABLE_VALUES.items(), [("committed", 1), ("leased", 2), ("pending", 4)]
                )
            },
            "claim-that-edits-payload": upd(
                4, f"{CLAIM}, fencing_token = 1, payload_json = '{{}}'"
            ),
            "update-or-replace-onto-step-1": (
                "UPDATE OR REPLACE cassette_steps SET step_id = 1 WHERE step_id = 4"
            ),
            "renumber-rowid": upd(4, "rowid = 99"),
            "rewrite-every-payload": "UPDATE cassette_steps SET payload_json = '{}'",
        }
    }
)

# --------------------------------------------------------------- 4. receipts and releases

RECEIPT_CASES = cases(
    {
        E.NOT_LEASED: {
            "receipt-for-released-step": row(
                R, step_id="3", job_id="2", worker_id="'w3'", fencing_token="1"
            ),
            "receipt-for-never-claimed-step": row(R, step_id="4", job_id="3", fencing_token="0"),
            "release-of-never-claimed-step": row(L, step_id="4", fencing_token="0"),
            "release-of-committed-step": row(L, step_id="1", worker_id="'w1'", fencing_token="1"),
        },
        E.DUPLICATE_RECEIPT: {
            "receipt-for-committed-step": row(
                R, step_id="1", worker_id="'w1'", fencing_token="1", outcome="'FAILURE'"
            ),
        },
        E.WRONG_WORKER: {
            "receipt-from-wrong-worker": row(R, worker_id="'w1'"),
            "receipt-from-other-runs-worker": row(R, worker_id="'w9'"),
            "release-by-wrong-worker": row(L, worker_id="'w1'"),
        },
        E.STALE_FENCING_TOKEN: {
            "receipt-from-expired-holder-with-its-token": row(
                R, worker_id="'w1'", fencing_token="1"
            ),
            "receipt-with-old-token": row(R, fencing_token="1"),
            "receipt-with-future-token": row(R, fencing_token="3"),
            "release-with-old-token": row(L, fencing_token="1"),
        },
        E.RUN_MISMATCH: {
            "receipt-naming-other-run": row(R, run_id="'r2'"),
            "receipt-for-other-runs-step": row(
                R, step_id="5", job_id="4", worker_id="'w9'", fencing_token="1"
            ),
            "release-naming-other-run": row(L, run_id="'r2'"),
        },
        E.REFERENCE_MISMATCH: {"receipt-naming-wrong-job": row(R, job_id="2")},
        E.STEP_NOT_FOUND: {
            "receipt-for-missing-step": row(R, step_id="99"),
            "release-of-missing-step": row(L, step_id="99"),
        },
        E.APPEND_ONLY: {
            "receipt-reusing-receipt-id": row(R, receipt_id="1"),
            "release-reusing-release-id": row(L, release_id="1"),
        },
        E.RECEIPT_REQUIRED: {
            "commit-leased-step-without-receipt": upd(2, "status = 'COMMITTED'"),
            "commit-other-runs-step-without-receipt": upd(5, "status = 'COMMITTED'"),
            "commit-every-leased-step": (
                "UPDATE cassette_steps SET status = 'COMMITTED' WHERE status = 'LEASED'"
            ),
        },
    }
)

# ------------------------------------------------------------------------ 5. references

REFERENCE_CASES = cases(
    {
        E.REFERENCE_MISSING: {
            "job-for-missing-message": row(J, message_id="99"),
            "step-for-missing-job": row(S, job_id="99"),
        },
        E.RUN_MISMATCH: {
            "job-with-other-run-id": row(J, run_id="'r2'"),
            "job-for-message-of-other-run": row(J, message_id="3"),
            "step-with-other-run-id": row(S, run_id="'r2'"),
        },
        E.REFERENCE_MISMATCH: {
            "step-with-wrong-message": row(S, message_id="1"),
            "step-with-missing-message": row(S, message_id="99"),
            "step-with-wrong-job-ordinal": row(S, job_ordinal="1"),
        },
    }
)

# -------------------------------------------------------------------- 6. values and JSON

NOT_AN_OBJECT = {
    "not-json": "'not json'",
    "truncated": "'{\"a\":'",
    "empty": "''",
    "array": "'[1,2]'",
    "string": "'\"text\"'",
    "number": "'42'",
    "null": "'null'",
    "integer": "42",
}
VALUE_CASES = cases(
    {
        E.INVALID_PAYLOAD: {
            **{f"message-payload-{k}": row(M, payload_json=v) for k, v in NOT_AN_OBJECT.items()},
            **{f"step-payload-{k}": row(S, payload_json=v) for k, v in NOT_AN_OBJECT.items()},
            **{f"receipt-json-{k}": row(R, receipt_json=v) for k, v in NOT_AN_OBJECT.items()},
        },
        E.INVALID_SOURCE: {
            "source-unknown": row(M, source="'ADMIN'"),
            "source-lower-case": row(M, source="'user'"),
            "source-empty": row(M, source="''"),
        },
        E.INVALID_OUTCOME: {
            "outcome-unknown": row(R, outcome="'DONE'"),
            "outcome-lower-case": row(R, outcome="'success'"),
            "outcome-misspelt": row(R, outcome="'ABORT'"),
        },
        E.INVALID_RUN_ID: {
            "run-id-empty": row(M, run_id="''"),
            "run-id-201-chars": row(M, run_id=LONG),
        },
        E.INVALID_IDEMPOTENCY_KEY: {
            "idempotency-key-empty": row(M, idempotency_key="''"),
            "idempotency-key-201-chars": row(M, idempotency_key=LONG),
        },
        E.INVALID_INTENT: {
            "intent-empty": row(J, intent="''"),
            "intent-201-chars": row(J, intent=LONG),
        },
        E.INVALID_ORDINAL: {
            "job-ordinal-negative": row(J, ordinal="-1"),
            "step-ordinal-negative": row(S, ordinal="-1"),
        },
        E.INVALID_STATUS: {
            "insert-step-unknown-status": row(S, status="'DONE'"),
            "insert-step-null-status": row(S, status="NULL"),
            "update-to-unknown-status": upd(4, "status = 'DONE'"),
            "update-to-lower-case-status": upd(2, "status = 'committed'"),
            "update-to-null-status": upd(1, "status = NULL"),
        },
        E.INVALID_TOKEN: {
            "insert-step-negative-token": row(S, fencing_token="-1"),
            "insert-step-null-token": row(S, fencing_token="NULL"),
            "update-to-negative-token": upd(4, "fencing_token = -1"),
            "claim-with-negative-token": upd(4, f"{CLAIM}, fencing_token = -1"),
        },
        E.INVALID_WORKER: {
            "receipt-empty-worker": row(R, worker_id="''"),
            "receipt-null-worker": row(R, worker_id="NULL"),
            "receipt-201-char-worker": row(R, worker_id=LONG),
            "release-empty-worker": row(L, worker_id="''"),
            "release-201-char-worker": row(L, worker_id=LONG),
        },
        E.INVALID_ID: {
            "message-id-zero": row(M, message_id="0"),
            # (-2: since 0011 an explicit -1 reads as NULL before the row, see JOURNAL_REQUIRED)
            "message-id-negative": row(M, message_id="-2"),
            "job-id-negative": row(J, job_id="-2"),
            "step-id-zero": row(S, step_id="0"),
            "receipt-id-negative": row(R, receipt_id="-2"),
            "release-id-negative": row(L, release_id="-2"),
        },
    }
)


def strict(sql: str, kind: str, column: str) -> Any:
    where = column.split()[-1]
    return pytest.param(sql, f"cannot store {kind} value in {column}", id=f"{kind}-in-{where}")


# STRICT tables: a value of the wrong storage class is refused by SQLite itself.
STRICT_CASES = [
    strict(row(M, created_at="'yesterday'"), "TEXT", "INTEGER column cassette_messages.created_at"),
    strict(row(M, created_at="1.5"), "REAL", "INTEGER column cassette_messages.created_at"),
    strict(row(M, payload_json="X'7B7D'"), "BLOB", "TEXT column cassette_messages.payload_json"),
    strict(row(J, ordinal="'first'"), "TEXT", "INTEGER column cassette_jobs.ordinal"),
    strict(row(R, created_at="'now'"), "TEXT", "INTEGER column cassette_receipts.created_at"),
    strict(row(L, fencing_token="'two'"), "TEXT", "INTEGER column cassette_releases.fencing_token"),
    strict(
        upd(4, f"{CLAIM.replace(LATER, repr('soon'))}, fencing_token = 1"),
        "TEXT",
        "INTEGER column cassette_steps.lease_expires_at",
    ),
    pytest.param(
        row(M, created_at="NULL"),
        "NOT NULL constraint failed: cassette_messages.created_at",
        id="null-created-at",
    ),
]

# --------------------------------------------- 7. legal-looking raw writes fail closed

JOURNAL_REQUIRED_CASES = cases(
    {
        E.JOURNAL_REQUIRED: {
            # In a BEFORE trigger SQLite gives an INTEGER PRIMARY KEY inserted as NULL the
            # value -1, so the rules (all before the row since 0011) take an explicit -1 as
            # the next id and refuse the unjournaled row first (INVALID_ID before 0011).
            "message-id-minus-one": row(M, message_id="-1"),
            "job-id-minus-one": row(J, job_id="-1"),
            "new-message": row(M),
            "new-message-with-new-key": row(M, idempotency_key="'k3'"),
            "new-message-in-new-run": row(M, run_id="'r3'", source="'WORKER'"),
            "new-job": row(J),
            "new-step": row(S),
            "claim-never-claimed-step": upd(4, f"{CLAIM}, fencing_token = fencing_token + 1"),
            "claim-released-step": upd(3, f"{CLAIM}, fencing_token = fencing_token + 1"),
            "requeue-leased-step": upd(2, REQUEUE),
            "receipt": row(R),
            "aborted-receipt": row(R, outcome="'ABORTED'"),
            "receipt-in-other-run": row(
                R, step_id="5", job_id="4", run_id="'r2'", worker_id="'w9'", fencing_token="1"
            ),
            "release": row(L),
        }
    }
)

RAW_CASES = [
    *APPEND_ONLY_CASES,
    *STEP_INSERT_CASES,
    *LEASE_CASES,
    *IMMUTABLE_CASES,
    *RECEIPT_CASES,
    *REFERENCE_CASES,
    *VALUE_CASES,
    *JOURNAL_REQUIRED_CASES,
]
CASES_BY_ID = {param.id: param for param in RAW_CASES}
assert len(CASES_BY_ID) == len(RAW_CASES), "case ids must be unique"


@pytest.mark.parametrize(("sql", "code"), APPEND_ONLY_CASES)
def test_append_only_rows_cannot_be_updated_deleted_or_replaced(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), STEP_INSERT_CASES)
def test_steps_are_inserted_only_pending_with_token_0_and_no_lease(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), LEASE_CASES)
def test_lease_fields_change_only_in_a_claim_or_requeue(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), IMMUTABLE_CASES)
def test_step_columns_other_than_status_and_lease_are_immutable(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), RECEIPT_CASES)
def test_only_the_lease_holders_receipt_commits_or_release_requeues(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), REFERENCE_CASES)
def test_references_are_checked_with_foreign_keys_off(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert auditor.conn.execute("PRAGMA foreign_keys").fetchone() == (0,)
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "code"), VALUE_CASES)
def test_json_enums_names_tokens_and_ids_are_checked(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


@pytest.mark.parametrize(("sql", "message"), STRICT_CASES)
def test_strict_tables_refuse_the_wrong_storage_class(
    auditor: Auditor, sql: str, message: str
) -> None:
    error = auditor.refused(sql)
    assert isinstance(error, sqlite3.IntegrityError)
    assert str(error) == message
    assert translate(error).code is E.CONSTRAINT_VIOLATION


@pytest.mark.parametrize(("sql", "code"), JOURNAL_REQUIRED_CASES)
def test_legal_looking_raw_write_fails_closed_with_journal_required(
    auditor: Auditor, sql: str, code: ErrorCode
) -> None:
    assert_code(auditor.refused(sql), code)


# ------------------------------------------------------ 2. the step state machine

STATUSES = ("PENDING", "LEASED", "COMMITTED")
STEP_IN = {"PENDING": 4, "LEASED": 2, "COMMITTED": 1}
LEGAL = {("PENDING", "LEASED"), ("LEASED", "COMMITTED"), ("LEASED", "PENDING")}
# What a forger sets beside the status to make the target state look right.
DRESS = {
    "PENDING": ", lease_owner = NULL, lease_expires_at = NULL",
    "LEASED": f", lease_owner = 'm', lease_expires_at = {LATER}, fencing_token = fencing_token + 1",
    "COMMITTED": "",
}


def expected_transition_code(old: str, new: str, dressed: bool) -> ErrorCode:
    if (old, new) not in LEGAL:
        # LEASED -> LEASED with a new owner and token is a lease-field change, not a transition
        relabel = dressed and old == new == "LEASED"
        return E.LEASE_FIELDS_LOCKED if relabel else E.ILLEGAL_TRANSITION
    if new == "COMMITTED":
        return E.RECEIPT_REQUIRED  # only inserting the receipt commits
    # a claim or requeue: bare it breaks the lease rules; dressed it is legal but unjournaled
    return E.JOURNAL_REQUIRED if dressed else E.LEASE_FIELDS_LOCKED


@pytest.mark.parametrize("dressed", [False, True], ids=["status-only", "with-target-lease"])
@pytest.mark.parametrize(("old", "new"), list(product(STATUSES, STATUSES)), ids=str.lower)
def test_every_status_pair_follows_the_allow_list(
    auditor: Auditor, old: str, new: str, dressed: bool
) -> None:
    sql = upd(STEP_IN[old], f"status = '{new}'" + (DRESS[new] if dressed else ""))
    assert_code(auditor.refused(sql), expected_transition_code(old, new, dressed))


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE cassette_steps SET status = status",
        upd(3, "status = 'PENDING'"),
        upd(5, "status = 'LEASED'"),
        "UPDATE cassette_steps SET status = 'PENDING' WHERE status = 'COMMITTED'",
        "UPDATE cassette_steps SET status = 'LEASED' WHERE status = 'COMMITTED'",
    ],
    ids=["all-to-themselves", "pending-to-itself", "leased-to-itself", "un-commit", "re-lease"],
)
def test_rewriting_states_in_bulk_is_illegal_transition(auditor: Auditor, sql: str) -> None:
    assert_code(auditor.refused(sql), E.ILLEGAL_TRANSITION)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO cassette_meta (key, value) VALUES ('anchor', 'forged')",
        "INSERT INTO cassette_migrations (version, name, sha256)"
        " SELECT max(version) + 1, 'forged', hex(zeroblob(32)) FROM cassette_migrations",
    ],
    ids=["meta-new-key", "migrations-next-version"],
)
def test_raw_append_to_meta_or_migrations_is_refused(auditor: Auditor, sql: str) -> None:
    error = auditor.refused(sql)
    if isinstance(error, sqlite3.OperationalError):  # failing closed like the journal is fine
        assert str(error).startswith("no such function: "), str(error)
    else:
        assert code_of(error) == E.JOURNAL_REQUIRED.value, str(error)


# --------------------------------------------------------------- 7. the journal, raw

JOURNAL_INSERT = "INTO cassette_journal (seq, body, leaf_hash, chain_hash)"
GARBAGE = "'{}', zeroblob(32), zeroblob(32)"


@pytest.mark.parametrize(
    "sql",
    [
        f"INSERT {JOURNAL_INSERT} SELECT max(seq) + 1, {GARBAGE} FROM cassette_journal",
        f"INSERT OR REPLACE {JOURNAL_INSERT} VALUES (0, {GARBAGE})",
        f"REPLACE {JOURNAL_INSERT} SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal",
        f"INSERT {JOURNAL_INSERT} VALUES (0, {GARBAGE}){ON} (seq) DO UPDATE SET body = '{{}}'",
        f"INSERT OR IGNORE {JOURNAL_INSERT} VALUES (0, {GARBAGE})",
    ],
    ids=["append", "insert-or-replace", "replace-into-copy", "upsert", "insert-or-ignore"],
)
def test_raw_journal_insert_fails_closed(auditor: Auditor, sql: str) -> None:
    error = auditor.refused(sql)
    assert isinstance(error, sqlite3.OperationalError)
    assert str(error) == "no such function: cassette_leaf_hash"


def test_raw_journal_append_with_correct_hashes_still_fails_closed(auditor: Auditor) -> None:
    """Even a perfectly forged next entry cannot be written, so JOURNAL_REQUIRED holds."""
    seq, prev = auditor.conn.execute(
        "SELECT seq, chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    body = (
        '{"table":"cassette_messages","op":"INSERT","key":4,"row":{"message_id":4,'
        '"run_id":"r1","source":"USER","idempotency_key":null,"payload_json":"{}",'
        f'"created_at":{T0}}}}}'
    )
    leaf = leaf_hash(body.encode("utf-8"))
    forged = (seq + 1, body, leaf, chain_hash(seq + 1, prev, leaf))
    error = auditor.refused(f"INSERT {JOURNAL_INSERT} VALUES (?, ?, ?, ?)", forged)
    assert isinstance(error, sqlite3.OperationalError)
    assert str(error) == "no such function: cassette_leaf_hash"
    # and the message that entry would have vouched for is refused on its own
    assert_code(auditor.refused(row(M, message_id="4")), E.JOURNAL_REQUIRED)


# ------------------------------------------------ the raw session as a whole, and pragmas


def test_one_autocommit_session_survives_every_refusal(ledger: Path) -> None:
    """Every attack above, in one shell-like autocommit session: nothing lands."""
    before = snapshot(ledger)
    conn = sqlite3.connect(ledger, isolation_level=None)
    try:
        for param in RAW_CASES:
            sql, code = param.values
            with pytest.raises(sqlite3.IntegrityError) as caught:
                conn.execute(sql)
            assert code_of(caught.value) == code.value, f"{param.id}: {caught.value}"
            assert not conn.in_transaction, param.id
        assert conn.execute("SELECT count(*) FROM cassette_steps").fetchone() == (5,)
    finally:
        conn.close()
    assert snapshot(ledger) == before


def test_commit_after_a_refusal_persists_nothing(
    auditor: Auditor, cassette: MessageCassette
) -> None:
    before = dump(auditor.path)
    for sql in (row(M), upd(2, "status = 'COMMITTED'"), "DELETE FROM cassette_steps"):
        with pytest.raises(sqlite3.IntegrityError):
            auditor.conn.execute(sql)
        auditor.conn.commit()  # what a careless auditor does next
        assert not auditor.conn.in_transaction
    # SQLite may rewrite identical pages on COMMIT, so the bytes can differ; the rows do not
    assert dump(auditor.path) == before
    assert cassette.verify_cassette().ok


PRAGMA_ATTACKS = [
    "messages-insert-or-replace-by-pk",
    "steps-delete-leased",
    "claim-token-plus-two",
    "receipt-with-old-token",
    "step-for-missing-job",
    "source-unknown",
    "new-message",
]


@pytest.mark.parametrize("case_id", PRAGMA_ATTACKS)
@pytest.mark.parametrize(
    "pragma",
    [
        "foreign_keys = ON",
        "recursive_triggers = ON",
        "ignore_check_constraints = ON",
        "defer_foreign_keys = ON",
        "reverse_unordered_selects = ON",
    ],
)
def test_connection_pragmas_do_not_switch_rules_off(
    auditor: Auditor, pragma: str, case_id: str
) -> None:
    sql, code = CASES_BY_ID[case_id].values
    auditor.conn.execute(f"PRAGMA {pragma}")
    if pragma.startswith("ignore_check_constraints") and code is E.INVALID_SOURCE:
        code = E.JOURNAL_REQUIRED  # the CHECK is skipped; the fail-closed trigger still refuses
    assert_code(auditor.refused(sql), code)


UNSAFE_SCHEMA = re.compile(r"(malformed database schema \(\w+\) - )?unsafe use of json_\w+\(\)")


@pytest.mark.parametrize("case_id", PRAGMA_ATTACKS)
def test_untrusted_schema_connection_fails_closed(ledger: Path, case_id: str) -> None:
    """A hardened auditor (trusted_schema OFF) cannot write either.

    SQLite 3.40 does not mark the JSON functions innocuous, so such a connection cannot
    even load the schema ("unsafe use of json_valid()"); a SQLite that does may refuse
    with the rule's code instead. Either way nothing changes.
    """
    sql, code = CASES_BY_ID[case_id].values
    before = snapshot(ledger)
    conn = sqlite3.connect(ledger)
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        with pytest.raises(sqlite3.Error) as caught:
            conn.execute(sql)
        if UNSAFE_SCHEMA.fullmatch(str(caught.value)) is None:
            assert_code(caught.value, code)
        conn.rollback()
        conn.execute("PRAGMA trusted_schema = ON")
        assert conn.execute("SELECT count(*) FROM cassette_steps").fetchone() == (5,)
    finally:
        conn.close()
    assert snapshot(ledger) == before


# ----------------------------------------------------------------- 8. the sqlite3 shell

SHELL_ATTACKS = [
    "messages-update",
    "messages-insert-or-replace-by-pk",
    "messages-upsert-by-idempotency-key",
    "jobs-replace-into-by-message-ordinal",
    "steps-delete-all",
    "receipts-insert-or-replace-by-step",
    "journal-delete-last",
    "insert-step-as-leased",
    "extend-lease",
    "claim-token-plus-two",
    "requeue-keeping-owner",
    "payload_json-of-committed",
    "receipt-for-released-step",
    "receipt-with-old-token",
    "receipt-from-wrong-worker",
    "commit-leased-step-without-receipt",
    "job-for-missing-message",
    "step-with-wrong-message",
    "message-payload-array",
    "outcome-unknown",
    "update-to-unknown-status",
    "receipt-empty-worker",
    "releases-insert-or-replace-by-step-token",
    "message-id-negative",
    "new-message",
    "claim-never-claimed-step",
]


@pytest.fixture
def shell() -> str:
    found = shutil.which("sqlite3")
    if found is None:
        if os.environ.get("CASSETTE_REQUIRE_SQLITE3_SHELL"):
            pytest.fail("CASSETTE_REQUIRE_SQLITE3_SHELL is set but sqlite3 is not on PATH")
        pytest.skip("the sqlite3 command-line shell is not installed (CI installs it)")
    return found


@pytest.fixture
def quiet_ledger(ledger: Path, cassette: MessageCassette) -> Path:
    """The ledger with the API connection closed: a checkpointed file, as a shell finds it."""
    cassette.close()
    return ledger


def run_shell(
    shell: str, path: Path, script: str, *options: str
) -> subprocess.CompletedProcess[str]:
    command = [shell, *options, str(path)]
    return subprocess.run(command, input=script, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("case_id", SHELL_ATTACKS)
def test_shell_attack_is_refused_with_its_code(
    shell: str, quiet_ledger: Path, case_id: str
) -> None:
    sql, code = CASES_BY_ID[case_id].values
    before = snapshot(quiet_ledger)
    result = run_shell(shell, quiet_ledger, f"{sql};\nSELECT 'still-running';\n", "-bail")
    assert result.returncode != 0, result
    refusal = rf"(CHECK constraint failed: {code.value}\b|\b{code.value}: )"
    assert re.search(refusal, result.stderr), result.stderr
    assert "still-running" not in result.stdout
    assert snapshot(quiet_ledger) == before


@pytest.mark.parametrize(
    ("script", "message"),
    [
        pytest.param(
            f"INSERT {JOURNAL_INSERT} SELECT max(seq) + 1, {GARBAGE} FROM cassette_journal;",
            "no such function: cassette_leaf_hash",
            id="journal-insert",
        ),
        pytest.param(
            row(M, created_at="'yesterday'") + ";",
            "cannot store TEXT value in INTEGER column cassette_messages.created_at",
            id="strict-type",
        ),
    ],
)
def test_shell_journal_insert_and_strict_typing_fail(
    shell: str, quiet_ledger: Path, script: str, message: str
) -> None:
    before = snapshot(quiet_ledger)
    result = run_shell(shell, quiet_ledger, script + "\n")
    assert result.returncode != 0
    assert message in result.stderr
    assert snapshot(quiet_ledger) == before


def test_shell_transaction_of_attacks_commits_nothing(shell: str, quiet_ledger: Path) -> None:
    """Without -bail the shell carries on past every error and COMMITs: still nothing lands."""
    before = dump(quiet_ledger)
    attacks = [CASES_BY_ID[case_id].values for case_id in SHELL_ATTACKS]
    script = "BEGIN;\n" + "".join(f"{sql};\n" for sql, _ in attacks) + "COMMIT;\n"
    result = run_shell(shell, quiet_ledger, script)
    assert result.returncode != 0
    assert len(result.stderr.splitlines()) == len(attacks), result.stderr
    for line, (_, code) in zip(result.stderr.splitlines(), attacks, strict=True):
        assert code.value in line
    assert dump(quiet_ledger) == before
    with MessageCassette(quiet_ledger, clock=ManualClock(NOW)) as reopened:
        assert reopened.verify_cassette().ok


def test_shell_with_triggers_disabled_is_caught_by_verify(shell: str, quiet_ledger: Path) -> None:
    """LAW.md section 10: someone who switches the triggers off is not stopped, only detected.

    ``.dbconfig enable_trigger off`` turns every trigger rule off for that shell; the named
    CHECKs still hold, and verify names the edited row.
    """
    off = ".dbconfig enable_trigger off\n"
    refused = run_shell(shell, quiet_ledger, f"{off}{row(M, source=repr('ADMIN'))};\n", "-bail")
    assert "CHECK constraint failed: INVALID_SOURCE" in refused.stderr
    edit = "UPDATE cassette_messages SET payload_json = '{}' WHERE message_id = 2;\n"
    edited = run_shell(shell, quiet_ledger, off + edit, "-bail")
    assert edited.returncode == 0, edited.stderr
    with MessageCassette(quiet_ledger, clock=ManualClock(NOW)) as reopened:
        report = reopened.verify_cassette()
    assert not report.ok
    assert any(f.table == M and f.key == 2 for f in report.errors), report.to_dict()


# ------------------------------------------------ 9. through the package connection

PACKAGE_CASES = cases(
    {
        E.APPEND_ONLY: {
            "update-message": "UPDATE cassette_messages SET source = 'SYSTEM' WHERE message_id = 1",
            "replace-message": row(M, "REPLACE", message_id="2", idempotency_key="'k2'"),
            "delete-step": "DELETE FROM cassette_steps WHERE step_id = 1",
            "delete-journal": "DELETE FROM cassette_journal",
        },
        E.IDEMPOTENCY_CONFLICT: {"reuse-idempotency-key": row(M, idempotency_key="'k1'")},
        E.OUT_OF_ORDER: {"message-id-beyond-the-next": row(M, message_id="6")},
        E.ILLEGAL_TRANSITION: {
            "pending-to-committed": upd(4, "status = 'COMMITTED'"),
            "un-commit": upd(1, REQUEUE),
        },
        E.RECEIPT_REQUIRED: {"commit-without-receipt": upd(2, "status = 'COMMITTED'")},
        E.LEASE_FIELDS_LOCKED: {
            "change-owner": upd(2, "lease_owner = 'mallory'"),
            "claim-token-plus-two": upd(4, f"{CLAIM}, fencing_token = 2"),
        },
        E.IMMUTABLE_FIELD: {"edit-payload": upd(4, "payload_json = '{}'")},
        E.INVALID_TTL: {
            "claim-expiring-in-the-past": upd(4, f"{CLAIM.replace(LATER, TS)}, fencing_token = 1"),
            "claim-for-over-30-days": upd(
                4, f"{CLAIM.replace(LATER, str(NOW + 2_592_000_001))}, fencing_token = 1"
            ),
        },
        E.LEASE_NOT_EXPIRED: {"requeue-live-lease": upd(2, REQUEUE)},
        E.NOT_LEASED: {
            "receipt-for-pending": row(
                R, step_id="3", job_id="2", worker_id="'w3'", fencing_token="1"
            )
        },
        E.STALE_FENCING_TOKEN: {"receipt-old-token": row(R, fencing_token="1")},
        E.WRONG_WORKER: {
            "receipt-wrong-worker": row(R, worker_id="'w1'"),
            "release-wrong-worker": row(L, worker_id="'w9'"),
        },
        E.DUPLICATE_RECEIPT: {
            "receipt-twice": row(R, step_id="1", worker_id="'w1'", fencing_token="1")
        },
        E.STEP_NOT_FOUND: {"receipt-missing-step": row(R, step_id="99")},
        E.RUN_MISMATCH: {"receipt-other-run": row(R, run_id="'r2'")},
        E.REFERENCE_MISMATCH: {"receipt-wrong-job": row(R, job_id="3")},
        E.REFERENCE_MISSING: {"job-missing-message": row(J, message_id="99")},
        E.INVALID_PAYLOAD: {"payload-not-object": row(M, payload_json="'[]'")},
        E.INVALID_SOURCE: {"unknown-source": row(M, source="'ADMIN'")},
        E.INVALID_OUTCOME: {"unknown-outcome": row(R, outcome="'DONE'")},
        E.INVALID_ORDINAL: {"negative-ordinal": row(J, ordinal="-1")},
        E.JOURNAL_BROKEN: {
            "journal-replace": (
                f"INSERT OR REPLACE {JOURNAL_INSERT}"
                " SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq = 0"
            ),
            "journal-forged-leaf": (
                f"INSERT {JOURNAL_INSERT} SELECT max(seq) + 1, {GARBAGE} FROM cassette_journal"
            ),
            "journal-forged-chain": (
                f"INSERT {JOURNAL_INSERT} SELECT max(seq) + 1, '{{}}',"
                " cassette_leaf_hash('{}'), zeroblob(32) FROM cassette_journal"
            ),
        },
        E.CONSTRAINT_VIOLATION: {"strict-type": row(M, created_at="'yesterday'")},
    }
)


@pytest.mark.parametrize(("sql", "code"), PACKAGE_CASES)
def test_package_transaction_with_a_refused_statement_rolls_back_whole(
    ledger: Path, cassette: MessageCassette, sql: str, code: ErrorCode
) -> None:
    conn = cassette.conn
    before = snapshot(ledger)
    # legal and journaled (an explicit id is allowed if it is the next one): must vanish
    partial = row(M, message_id="4", payload_json="'{\"partial\":true}'")
    with pytest.raises(CassetteError) as caught, write_transaction(conn) as tx:
        tx.execute(partial)
        tx.execute(sql)
    error = caught.value
    assert error.code is code, str(error)
    assert isinstance(error.__cause__, sqlite3.IntegrityError)
    assert translate(error.__cause__).code is code
    assert not conn.in_transaction
    assert snapshot(ledger) == before
    partials = "SELECT count(*) FROM cassette_messages WHERE payload_json LIKE '%partial%'"
    assert conn.execute(partials).fetchone() == (0,)
    # the connection and the ledger remain fit for use
    cassette.post_message({"after": "refusal"}, "r1", "USER")
    assert cassette.verify_cassette().ok


AFTER_EXPIRY_CASES = cases(
    {
        E.LEASE_EXPIRED: {
            "holders-late-success": row(R),
            "holders-late-failure": row(R, outcome="'FAILURE'"),
        },
        # a receipt that is wrong anyway gets its own code, not LEASE_EXPIRED
        E.RUN_MISMATCH: {"late-receipt-naming-other-run": row(R, run_id="'r2'")},
        E.REFERENCE_MISMATCH: {"late-receipt-naming-wrong-job": row(R, job_id="2")},
        E.WRONG_WORKER: {"late-receipt-from-wrong-worker": row(R, worker_id="'w1'")},
        E.STALE_FENCING_TOKEN: {"late-receipt-with-old-token": row(R, fencing_token="1")},
    }
)


@pytest.mark.parametrize(("sql", "code"), AFTER_EXPIRY_CASES)
def test_package_receipt_after_expiry(
    ledger: Path, cassette: MessageCassette, clock: ManualClock, sql: str, code: ErrorCode
) -> None:
    clock.advance(60_001)  # step 2 (w2, token 2) is now past its expiry
    before = snapshot(ledger)
    with pytest.raises(CassetteError) as caught, write_transaction(cassette.conn) as tx:
        tx.execute(sql)
    assert caught.value.code is code, str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
    assert not cassette.conn.in_transaction
    assert snapshot(ledger) == before
    # only ABORTED closes an expired attempt
    cassette.complete_step("r1", 2, "w2", 2, {"late": True}, "ABORTED")
    assert cassette.get_step(2)["status"] == "COMMITTED"


Call = Callable[[MessageCassette], Any]
API_CASES: dict[ErrorCode, dict[str, Call]] = {
    E.WRONG_WORKER: {
        "complete-by-wrong-worker": lambda c: c.complete_step("r1", 2, "w1", 2, {}, "SUCCESS"),
        "release-by-wrong-worker": lambda c: c.requeue("r1", 2, worker_id="w1", fencing_token=2),
    },
    E.STALE_FENCING_TOKEN: {
        "complete-after-requeue": lambda c: c.complete_step("r1", 2, "w1", 1, {}, "SUCCESS"),
        "release-with-old-token": lambda c: c.requeue("r1", 2, worker_id="w2", fencing_token=1),
    },
    E.DUPLICATE_RECEIPT: {
        "complete-twice": lambda c: c.complete_step("r1", 1, "w1", 1, {}, "FAILURE"),
        "complete-batch-twice": lambda c: c.complete_steps([("r1", 2, "w2", 2, {}, "SUCCESS")] * 2),
    },
    E.NOT_LEASED: {
        "complete-after-release": lambda c: c.complete_step("r1", 3, "w3", 1, {}, "SUCCESS"),
    },
    E.APPEND_ONLY: {
        "release-twice": lambda c: c.requeue("r1", 3, worker_id="w3", fencing_token=1),
    },
    E.RUN_MISMATCH: {
        "complete-in-other-run": lambda c: c.complete_step("r1", 5, "w9", 1, {}, "SUCCESS"),
    },
}


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param(call, code, id=case_id)
        for code, calls in API_CASES.items()
        for case_id, call in calls.items()
    ],
)
def test_api_refusals_come_from_the_triggers(
    ledger: Path, cassette: MessageCassette, call: Call, code: ErrorCode
) -> None:
    before = snapshot(ledger)
    with pytest.raises(CassetteError) as caught:
        call(cassette)
    assert caught.value.code is code, str(caught.value)
    cause = caught.value.__cause__
    assert isinstance(cause, sqlite3.IntegrityError)
    assert str(cause).startswith(f"{code.value}: ")
    assert not cassette.conn.in_transaction
    assert snapshot(ledger) == before


@pytest.mark.parametrize(
    ("forged", "next_write"),
    [
        pytest.param(row(J, job_id="-1"), lambda c: c.post_message({}, "r1", "USER"), id="job"),
        pytest.param(row(S, step_id="-1"), lambda c: c.post_message({}, "r1", "USER"), id="step"),
        pytest.param(
            row(R, receipt_id="-1"),
            lambda c: c.complete_step("r2", 5, "w9", 1, {}, "SUCCESS"),
            id="receipt",
        ),
        pytest.param(
            row(L, release_id="-1"),
            lambda c: c.requeue("r2", 5, worker_id="w9", fencing_token=1),
            id="release",
        ),
    ],
)
def test_a_negative_id_is_refused_and_blocks_no_later_insert(
    ledger: Path, cassette: MessageCassette, forged: str, next_write: Call
) -> None:
    """Regression: in a BEFORE INSERT trigger NEW.<id> is -1 while SQLite has yet to assign
    the id, so a stored row with id -1 made every later insert "APPEND_ONLY: ... exists"."""
    before = snapshot(ledger)
    with pytest.raises(CassetteError) as caught, write_transaction(cassette.conn) as tx:
        tx.execute(forged)
    assert caught.value.code is E.INVALID_ID
    assert snapshot(ledger) == before
    next_write(cassette)
    assert cassette.verify_cassette().ok


# ---------------------------------------------------- the codes in the SQL are the enum

SQLITE_SQL = ROOT / "catalytic_cassette" / "sql" / "sqlite"
SQL_FILES = sorted([*SQLITE_SQL.glob("migrations/*.sql"), *SQLITE_SQL.glob("schema/*.sql")])
RAISE_ANY = re.compile(r"\bRAISE\s*\(", re.IGNORECASE)
RAISE_CODED = re.compile(r"\bRAISE\s*\(\s*ABORT\s*,\s*'([A-Z][A-Z0-9_]*): ", re.IGNORECASE)
NAMED_CHECK = re.compile(r"\bCONSTRAINT\s+(\w+)\s+CHECK\b", re.IGNORECASE)


def sql_text(path: Path) -> str:
    """The file without ``--`` comments (no string literal in it contains ``--``)."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text("utf-8").splitlines())


def codes_in(path: Path) -> set[str]:
    return codes_in_text(path.read_text("utf-8"))


def codes_in_text(sql: str) -> set[str]:
    text = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    return set(RAISE_CODED.findall(text)) | set(NAMED_CHECK.findall(text))


CORE_FILES = ("10_ledger.sql", "20_messages.sql", "30_steps.sql", "50_journal.sql")


def test_the_sql_files_are_found() -> None:
    names = {path.relative_to(SQLITE_SQL).as_posix() for path in SQL_FILES}
    assert {"migrations/0001_baseline.sql", "schema/10_ledger.sql", "schema/30_steps.sql"} <= names


@pytest.mark.parametrize(
    "path", SQL_FILES, ids=lambda path: path.relative_to(SQLITE_SQL).as_posix()
)
def test_every_refusal_in_the_sql_is_an_error_code(path: Path) -> None:
    text = sql_text(path)
    coded = RAISE_CODED.findall(text)
    assert len(coded) == len(RAISE_ANY.findall(text)), "every RAISE is RAISE(ABORT, 'CODE: ...')"
    enum = {code.value for code in ErrorCode}
    raised = set(coded)
    checks = set(NAMED_CHECK.findall(text))
    assert raised <= enum, f"RAISE codes missing from ErrorCode: {sorted(raised - enum)}"
    assert checks <= enum, f"CHECK names missing from ErrorCode: {sorted(checks - enum)}"


def test_the_schema_files_raise_exactly_what_the_migrations_raise() -> None:
    migrations = set().union(*(codes_in(path) for path in SQLITE_SQL.glob("migrations/*.sql")))
    kept = set().union(*(codes_in_text(schema.kept) for schema in sqlfiles.schema_files()))
    assert kept == migrations


# The codes of the core machine's rules (messages, jobs, steps, receipts, releases, the
# journal and the ledger's own tables): this file provokes each of them. The other codes
# of those files (time, signatures, migrations) are provoked where their rules are tested.
CORE_CODES = {
    "APPEND_ONLY", "DUPLICATE_RECEIPT", "IDEMPOTENCY_CONFLICT", "ILLEGAL_TRANSITION",
    "IMMUTABLE_FIELD", "INVALID_ID", "INVALID_IDEMPOTENCY_KEY", "INVALID_INTENT",
    "INVALID_ORDINAL", "INVALID_OUTCOME", "INVALID_PAYLOAD", "INVALID_RUN_ID", "INVALID_SOURCE",
    "INVALID_STATUS", "INVALID_TOKEN", "INVALID_WORKER", "JOURNAL_BROKEN", "JOURNAL_REQUIRED",
    "LEASE_FIELDS_LOCKED", "NOT_LEASED", "OUT_OF_ORDER", "RECEIPT_REQUIRED",
    "REFERENCE_MISMATCH", "REFERENCE_MISSING", "RUN_MISMATCH", "STALE_FENCING_TOKEN",
    "STEP_NOT_FOUND", "WRONG_WORKER",
}  # fmt: skip


def test_every_code_of_the_core_machine_is_provoked_here() -> None:
    """This file is complete for the core machine: each code its rules raise is provoked."""
    clock_rules = {"INVALID_TTL", "LEASE_EXPIRED", "LEASE_NOT_EXPIRED"}
    assert clock_rules <= codes_in_text(sqlfiles.connection_sql())
    law_files = set().union(*(codes_in(SQLITE_SQL / "schema" / name) for name in CORE_FILES))
    assert law_files >= CORE_CODES
    wanted = CORE_CODES | clock_rules
    provoked = {param.values[1].value for param in [*RAW_CASES, *PACKAGE_CASES]}
    provoked |= {param.values[1].value for param in AFTER_EXPIRY_CASES}
    assert wanted - provoked == set()
