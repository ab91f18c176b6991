"""One source per rule: the law as data (catalytic_cassette/law.py), which verify's history
judge reads, against the SQL guards of both backends.

- The allow-list of the step machine is read out of the guards' text (SQLite's update
  guard, PostgreSQL's newest ``cassette_steps_update``) and must be ``law.EDGES``.
- Generated revisions of real steps (every status, lease fields and token, an immutable
  column changed or not) and generated receipts are written raw, as an attacker with a
  shell writes them, and each guard's verdict and code must be the one ``law`` gives. A
  revision the law allows is refused only for want of the package's journal (SQLite's
  ``JOURNAL_REQUIRED`` on a raw connection) or taken (PostgreSQL's owner, rolled back).

The clock rules are left out where the backends order them differently (SQLite's TEMP
clock guard fires before the update guard; PostgreSQL checks a claim's fields first): a
claim's expiry here is always valid and a leased step always expired.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import ErrorCode, law
from catalytic_cassette.errors import translate as translate_sqlite
from catalytic_cassette.verify.tables import TABLES

from .backends import Ledger

pytestmark = pytest.mark.both_backends

ROOT = Path(law.__file__).parent
STEP_COLUMNS = TABLES["cassette_steps"].columns
RECEIPT_COLUMNS = TABLES["cassette_receipts"].columns
HOUR = 3_600_000


def _edges(text: str) -> set[tuple[str, str]]:
    return set(re.findall(r"OLD\.status = '(\w+)' AND NEW\.status (?:IS|=) '(\w+)'", text))


def test_the_allow_list_in_the_guards_text_is_the_laws() -> None:
    sqlite_text = (ROOT / "sql/sqlite/schema/30_steps.sql").read_text()
    guard = sqlite_text[sqlite_text.index("CREATE TRIGGER cassette_steps_update_guard") :]
    guard = guard[: guard.index("END;")]
    allow = guard[guard.index("ILLEGAL_TRANSITION") :]
    assert _edges(allow[: allow.index("SELECT RAISE")]) == set(law.EDGES)
    newest = ""
    for path in sorted((ROOT / "sql/postgresql/migrations").glob("*.sql")):
        text = path.read_text()
        if "FUNCTION cassette_steps_update() RETURNS" in text:
            newest = text[text.rindex("FUNCTION cassette_steps_update() RETURNS") :]
    body = newest[: newest.index("ILLEGAL_TRANSITION")]
    assert _edges(body[body.rindex("IF NOT ((") :]) == set(law.EDGES)


class Steps:
    """A ledger with a step in each state, and a raw writer that rolls back."""

    def __init__(self, backend: Ledger) -> None:
        self.backend = backend
        with backend.open() as cassette:
            for n in range(4):
                cassette.post_message({"n": n}, "r", "USER")
            done = cassette.claim_step("r", "w", 60)
            cassette.complete_step("r", done["step_id"], "w", 1, {}, "SUCCESS")
            back = cassette.claim_step("r", "w", 60)
            cassette.requeue("r", back["step_id"], worker_id="w", fencing_token=1)
            cassette.claim_step("r", "w", 1)  # (the released one again: token 2)
            cassette.claim_step("r", "v", 1)
            backend.advance(2_000)  # (both leases expired)
        self.now = backend.now_ms()

    def rows(self, table: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
        found = self.backend.rows(f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1")
        return [dict(zip(columns, row, strict=True)) for row in found]

    def write(self, statement: str, params: tuple[Any, ...]) -> ErrorCode | None:
        if not self.backend.postgresql:
            conn = sqlite3.connect(self.backend.target, isolation_level=None)
            try:
                conn.execute("BEGIN")
                conn.execute(statement, params)
                return None
            except sqlite3.Error as exc:
                return translate_sqlite(exc).code
            finally:
                conn.execute("ROLLBACK") if conn.in_transaction else None
                conn.close()
        import psycopg

        from catalytic_cassette.postgresql.connection import translate

        with psycopg.connect(self.backend.target) as owner:
            try:
                owner.execute("SELECT cassette_tx_ms()")  # (the head, as a write takes it)
                owner.execute(statement.replace("?", "%s"), params)
                return None
            except psycopg.Error as exc:
                return translate(exc).code
            finally:
                owner.rollback()


@pytest.fixture
def steps(backend: Ledger) -> Iterator[Steps]:
    yield Steps(backend)


def _lawful_or_journal(code: ErrorCode | None) -> bool:
    return code in (None, ErrorCode.JOURNAL_REQUIRED)


def _check(expected: law.Verdict, code: ErrorCode | None) -> None:
    if expected is None:
        assert _lawful_or_journal(code), code
    else:
        assert code == expected[0], (expected, code)


revision = st.fixed_dictionaries(
    {
        "status": st.sampled_from([*law.STATUSES, "DONE"]),
        "owner": st.sampled_from([None, "w", "v", "x", "", "o" * 201]),
        "expiry": st.sampled_from(["none", "old", "valid"]),
        "token": st.integers(-1, 2),
        "immutable": st.sampled_from(
            [None, None, None, None, "payload_json", "ordinal", "run_id", "created_at"]
        ),
    }
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(which=st.integers(0, 3), change=revision)
def test_a_step_revision_gets_the_guards_code_the_law_gives(
    steps: Steps, which: int, change: dict[str, Any]
) -> None:
    olds = steps.rows("cassette_steps", STEP_COLUMNS)
    old = olds[which % len(olds)]
    new = dict(old)
    new["status"] = change["status"]
    new["lease_owner"] = change["owner"]
    new["lease_expires_at"] = {
        "none": None,
        "old": old["lease_expires_at"],
        "valid": steps.now + HOUR,
    }[change["expiry"]]
    new["fencing_token"] = old["fencing_token"] + change["token"]
    column = change["immutable"]
    if column is not None:
        new[column] = {"payload_json": '{"x":1}', "ordinal": 7, "run_id": "q"}.get(
            column, old[column] + 1 if isinstance(old[column], int) else old[column]
        )
    expected = law.step_update(old, new, receipt=False, released=False)
    assigned = [c for c in STEP_COLUMNS if c != "step_id"]
    code = steps.write(
        f"UPDATE cassette_steps SET {', '.join(f'{c} = ?' for c in assigned)} WHERE step_id = ?",
        (*[new[c] for c in assigned], old["step_id"]),
    )
    _check(expected, code)


receipt_change = st.fixed_dictionaries(
    {
        "worker": st.sampled_from(["w", "v", "x", ""]),
        "token": st.integers(-1, 1),
        "outcome": st.sampled_from([*law.OUTCOMES, "MAYBE"]),
        "run": st.sampled_from(["r", "q"]),
        "job": st.integers(0, 1),
        "step": st.sampled_from([2, 3, 2, 3, 1, 4, 9]),  # (the leased ones mostly)
    }
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(change=receipt_change)
def test_a_receipt_gets_the_guards_code_the_law_gives(steps: Steps, change: dict[str, Any]) -> None:
    by_id = {row["step_id"]: row for row in steps.rows("cassette_steps", STEP_COLUMNS)}
    receipted = {row["step_id"] for row in steps.rows("cassette_receipts", RECEIPT_COLUMNS)}
    step = by_id.get(change["step"])
    receipt_id = len(receipted) + 1
    row = {
        "receipt_id": receipt_id,
        "step_id": change["step"],
        "job_id": (step["job_id"] if step else 1) + change["job"],
        "run_id": change["run"],
        "worker_id": change["worker"],
        "fencing_token": (step["fencing_token"] if step else 0) + change["token"],
        "outcome": change["outcome"],
        "receipt_json": "{}",
        "created_at": steps.now,
    }
    # (SQLite's expiry rule is a TEMP trigger of package connections: not on a raw one)
    now: int | None = steps.backend.now_ms() if steps.backend.postgresql else None
    expected = law.receipt(step, row, has_receipt=change["step"] in receipted, now_ms=now)
    code = steps.write(
        f"INSERT INTO cassette_receipts ({', '.join(RECEIPT_COLUMNS)})"
        f" VALUES ({', '.join('?' for _ in RECEIPT_COLUMNS)})",
        tuple(row[c] for c in RECEIPT_COLUMNS),
    )
    if expected is None and code is not None and code is not ErrorCode.JOURNAL_REQUIRED:
        # a lawful receipt written by hand meets what the law leaves to the write path
        # (PostgreSQL's JOURNAL_BROKEN: entries come from the package's triggers only)
        assert code in (ErrorCode.JOURNAL_BROKEN, ErrorCode.SIGNATURE_REQUIRED), code
        return
    _check(expected, code)
