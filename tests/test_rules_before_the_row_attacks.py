"""Every rule before the row, attacked (the SQLite law, ``sql/sqlite/schema/``).

SQLite runs a connection's TEMP triggers before the file's, and RAISE(IGNORE) in an AFTER
trigger ends the row's remaining triggers with the row kept. A rule checked after the row
would be skipped by a raw client with
``CREATE TEMP TRIGGER skip AFTER INSERT ON main.<table> BEGIN SELECT RAISE(IGNORE); END``:
the journal, dense ids, readable JSON, ledger time. So each of those rules is checked
before the row, the journal entry is written before it, and an ignoring TEMP trigger skips
nothing that matters: AFTER, the rules have run; BEFORE, the row is dropped and nothing is
written.

Every table is attacked here as a raw client (no function of the package) and as a
journaling client (a package connection with its own TEMP trigger added).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import ManualClock, MessageCassette, connect
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.seals import record_seal
from catalytic_cassette.verify import verify_path

from .conftest import dump, file_digest, unguarded

pytestmark = pytest.mark.sqlite_only(
    reason=("SQLite's TEMP triggers and RAISE(IGNORE); PostgreSQL has neither")
)

FAR = "4102444800000"  # 2100: later than anything the ManualClock dated
TOP = "9223372036854775807"  # 2^63 - 1: the id that would brick a table
SIG = "'" + "A" * 86 + "=='"
KEY_ID = "'0123456789abcdef'"
UNREADABLE = "'{\"a\": 1e400}'"
NEW_ACTION = "00000000-0000-4000-8000-00000000ffff"


def _context_id(text: str) -> str:
    return "cp-" + hashlib.sha256(text.encode()).hexdigest()


def _build(path: Path) -> dict[str, Any]:
    """A ledger with a row in every table: three messages (one step leased by w, one
    released, the rest pending), a running plan p with a checkpoint, and a seal."""
    clock = ManualClock()
    with MessageCassette(path, clock=clock) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, "r", "USER")
        released = cassette.claim_step("r", "w", 600)
        cassette.requeue(
            "r", released["step_id"], worker_id="w", fencing_token=released["fencing_token"]
        )
        leased = cassette.claim_step("r", "w", 600)
        assert leased["step_id"] == released["step_id"]
    with CausalChain(path, clock=clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        chain.save_checkpoint("p", {"at": 1})
        record_seal(chain.conn, Ed25519PrivateKey.generate(), now_ms=clock.now_ms(), origin=None)
    conn = sqlite3.connect(path)
    try:
        pending = conn.execute(
            "SELECT step_id FROM cassette_steps WHERE status = 'PENDING' ORDER BY step_id LIMIT 1"
        ).fetchone()[0]
        seal = conn.execute("SELECT * FROM cassette_seals ORDER BY seal_id DESC LIMIT 1").fetchone()
    finally:
        conn.close()
    return {"leased": leased["step_id"], "pending": pending, "seal": seal}


def _inserts(ids: dict[str, Any], **change: str) -> dict[str, str]:
    """For each ledger table, an insert (or update) that breaks no rule but the journal's,
    with the values in ``change`` (id, json, time) put in where the table has them."""
    nid = change.get("id")
    payload = change.get("json", "'{}'")
    at = change.get("time", FAR)
    leased, pending = ids["leased"], ids["pending"]
    context = change.get("context", '\'{"plan_id": "p"}\'')
    checkpoint_id = _context_id(context.strip("'").replace("''", "'"))
    return {
        "messages": (
            "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
            f" VALUES ({nid or '(SELECT max(message_id) + 1 FROM cassette_messages)'}, 'r',"
            f" 'USER', {payload}, {at})"
        ),
        "jobs": (
            "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
            f" SELECT {nid or 'NULL'}, message_id, run_id, 'x', 9, {at}"
            " FROM cassette_jobs ORDER BY job_id DESC LIMIT 1"
        ),
        "steps": (
            "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal,"
            " ordinal, status, fencing_token, payload_json, created_at)"
            f" SELECT {nid or 'NULL'}, job_id, run_id, message_id, job_ordinal, 9, 'PENDING', 0,"
            f" {payload}, {at} FROM cassette_steps WHERE step_id = {pending}"
        ),
        "receipts": (
            "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
            " fencing_token, outcome, receipt_json, created_at)"
            f" SELECT {nid or 'NULL'}, step_id, job_id, run_id, lease_owner, fencing_token,"
            f" 'SUCCESS', {payload}, {at} FROM cassette_steps WHERE step_id = {leased}"
        ),
        "releases": (
            "INSERT INTO cassette_releases (release_id, step_id, run_id, worker_id,"
            " fencing_token, created_at)"
            f" SELECT {nid or 'NULL'}, step_id, run_id, lease_owner, fencing_token, {at}"
            f" FROM cassette_steps WHERE step_id = {leased}"
        ),
        "actions": (
            "INSERT INTO cassette_actions (action_seq, action_id, plan_id, intent_id, action_type,"
            " function_name, arguments_json, result_json, success, cost_micros, duration_ms,"
            f" timestamp, metadata_json) VALUES ({nid or 'NULL'}, '{NEW_ACTION}', 'p', 'i',"
            f" 'CapabilityCall', 'f', '[1]', {payload}, 1, 0, 0, {at}, '{{}}')"
        ),
        "checkpoints": (
            "INSERT INTO cassette_checkpoints (checkpoint_seq, checkpoint_id, plan_id,"
            f" context_json, created_at) VALUES ({nid or 'NULL'}, '{checkpoint_id}', 'p',"
            f" {context}, {at})"
        ),
        "attestations": (
            "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id, step_id,"
            " fencing_token, worker_id, key_id, signature, created_at)"
            f" SELECT {nid or '(SELECT count(*) + 1 FROM cassette_attestations)'}, 'claim',"
            f" run_id, NULL, step_id, fencing_token + 1, 'w', {KEY_ID}, {SIG}, {at}"
            f" FROM cassette_steps WHERE step_id = {pending}"
        ),
        "steps-update": (
            "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'w',"
            f" lease_expires_at = {at} + 60000, fencing_token = fencing_token + 1"
            f" WHERE step_id = {pending}"
        ),
    }


TABLES = list(_inserts({"leased": 0, "pending": 0}))
WITH_JSON = ("messages", "steps", "receipts", "actions")


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "ledger.db"
    return path, _build(path)


def _target(table: str) -> str:
    return "cassette_" + table.removesuffix("-update")


def _raw(path: Path, table: str, timing: str) -> sqlite3.Connection:
    """A raw connection whose own TEMP trigger ends every row of ``table`` with IGNORE."""
    raw = sqlite3.connect(path, isolation_level=None)
    event = "UPDATE" if table.endswith("-update") else "INSERT"
    raw.execute(
        f"CREATE TEMP TRIGGER skip {timing} {event} ON main.{_target(table)}"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    return raw


def _attempts(ids: dict[str, Any], table: str) -> Iterator[str]:
    yield _inserts(ids)[table]  # legal but for the journal
    if table != "steps-update":
        yield _inserts(ids, id=TOP)[table]  # the id that would brick the table
        yield _inserts(ids, time="1")[table]  # before the ledger's time
    if table in WITH_JSON:
        yield _inserts(ids, json=UNREADABLE)[table]
    if table == "checkpoints":
        yield _inserts(ids, context='\'{"plan_id": "p", "x": 1e400}\'')[table]


@pytest.mark.parametrize("table", TABLES)
def test_a_raw_client_that_ignores_after_the_row_stores_nothing(
    ledger: tuple[Path, dict[str, Any]], table: str
) -> None:
    """The attack of LAW.md 12 (a), on every table: unjournaled, out of order, dated before
    the ledger, unreadable; each refused, and the file is what it was."""
    path, ids = ledger
    before = (dump(path), file_digest(path))
    raw = _raw(path, table, "AFTER")
    try:
        for sql in _attempts(ids, table):
            with pytest.raises(sqlite3.IntegrityError) as refused:
                raw.execute(sql)
            assert str(refused.value).split(":")[0] in {
                "JOURNAL_REQUIRED",
                "OUT_OF_ORDER",
                "TIME_BACKWARDS",
                "INVALID_TTL",
                "APPEND_ONLY",
            }, (sql, refused.value)
        with pytest.raises(sqlite3.IntegrityError, match=r"^JOURNAL_REQUIRED: "):
            raw.execute(_inserts(ids)[table])
    finally:
        raw.close()
    assert (dump(path), file_digest(path)) == before
    assert verify_path(str(path)).ok


@pytest.mark.parametrize("table", TABLES)
def test_a_raw_client_that_ignores_before_the_row_writes_nothing(
    ledger: tuple[Path, dict[str, Any]], table: str
) -> None:
    """IGNORE in a BEFORE trigger drops the row: the statement succeeds and writes nothing,
    neither the row nor anything a trigger of the file would have written."""
    path, ids = ledger
    before = (dump(path), file_digest(path))
    raw = _raw(path, table, "BEFORE")
    try:
        for sql in _attempts(ids, table):
            raw.execute(sql)
    finally:
        raw.close()
    assert (dump(path), file_digest(path)) == before


def test_a_raw_client_cannot_even_prepare_a_seal(ledger: tuple[Path, dict[str, Any]]) -> None:
    """A seal's guard computes the root with the package's functions: a raw connection
    cannot prepare an insert into cassette_seals, whatever its TEMP triggers."""
    path, ids = ledger
    raw = _raw(path, "seals", "AFTER")
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such function"):
            raw.execute(f"INSERT INTO cassette_seals VALUES {tuple(ids['seal'])}")
    finally:
        raw.close()


# ------------------------------------------------- a journaling client: the package's functions


def _package(path: Path, table: str) -> sqlite3.Connection:
    """A package connection (its functions and TEMP journal triggers) with an ignoring TEMP
    AFTER trigger of its own, re-created journal triggers after it (which made them fire
    first before 0011)."""
    conn = connect(path, clock=ManualClock(), migrate=False)
    event = "UPDATE" if table.endswith("-update") else "INSERT"
    conn.execute(
        f"CREATE TEMP TRIGGER skip AFTER {event} ON main.{_target(table)}"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_temp_master WHERE type = 'trigger' AND name LIKE '%journal%'"
    ).fetchall():
        conn.execute(f"DROP TRIGGER temp.{name}")
        conn.execute(sql.replace("CREATE TRIGGER", "CREATE TEMP TRIGGER", 1))
    return conn


def _refusal(conn: sqlite3.Connection, sql: str) -> str:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(sql)
        return "ok"
    except sqlite3.IntegrityError as exc:
        return str(exc).split(":")[0]
    finally:
        conn.execute("ROLLBACK")


@pytest.mark.parametrize("table", [t for t in TABLES if t != "steps-update"])
def test_a_journaling_client_that_ignores_after_the_row_is_refused_by_each_rule(
    ledger: tuple[Path, dict[str, Any]], table: str
) -> None:
    """The rules that do not depend on the journal hold for a client that journals: the id
    far ahead (OUT_OF_ORDER), a date before the ledger's time (TIME_BACKWARDS), unreadable
    JSON (INVALID_PAYLOAD). The legal row is accepted (and rolled back)."""
    path, ids = ledger
    before = dump(path)  # (a package connection may checkpoint the WAL: the rows are compared)
    conn = _package(path, table)
    try:
        assert _refusal(conn, _inserts(ids)[table]) == "ok"
        assert _refusal(conn, _inserts(ids, id=TOP)[table]) == "OUT_OF_ORDER"
        assert _refusal(conn, _inserts(ids, time="1")[table]) == "TIME_BACKWARDS"
        if table in WITH_JSON:
            assert _refusal(conn, _inserts(ids, json=UNREADABLE)[table]) == "INVALID_PAYLOAD"
        if table == "checkpoints":
            context = '\'{"plan_id": "p", "x": 1e400}\''
            assert _refusal(conn, _inserts(ids, context=context)[table]) == "INVALID_PAYLOAD"
    finally:
        conn.close()
    assert dump(path) == before


def test_a_journaling_client_cannot_plant_a_seal_far_ahead(
    ledger: tuple[Path, dict[str, Any]],
) -> None:
    path, ids = ledger
    seal = list(ids["seal"])
    conn = _package(path, "seals")
    try:
        columns = "seal_id, tree_size, root_hex, origin, key_id, note, created_at"
        for seal_id, code in ((seal[0] + 1, "ok"), (int(TOP), "OUT_OF_ORDER")):
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    f"INSERT INTO cassette_seals ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (seal_id, *seal[1:6], int(FAR)),
                )
                answer = "ok"
            except sqlite3.IntegrityError as exc:
                answer = str(exc).split(":")[0]
            finally:
                conn.execute("ROLLBACK")
            assert answer == code
    finally:
        conn.close()


def test_the_journal_entry_must_be_the_rows_own_and_the_last(
    ledger: tuple[Path, dict[str, Any]],
) -> None:
    """A client that journals a body of its own (another payload, the same key) and then
    inserts the row is refused: the last entry must be exactly the body the row gives.
    So is a row whose entry is followed by another."""
    path, ids = ledger
    conn = connect(path, clock=ManualClock(), migrate=False)
    try:
        conn.execute("DROP TRIGGER temp.cassette_messages_journal")
        (last,) = conn.execute("SELECT max(message_id) FROM cassette_messages").fetchone()
        forged = json.dumps(
            {
                "table": "cassette_messages",
                "op": "INSERT",
                "key": last + 1,
                "row": {
                    "message_id": last + 1,
                    "run_id": "r",
                    "source": "USER",
                    "idempotency_key": None,
                    "payload_json": '{"x":1}',
                    "created_at": int(FAR),
                },
            },
            separators=(",", ":"),
        )
        journal = (
            "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)"
            " SELECT s, b, cassette_leaf_hash(b), cassette_chain_hash(s, p, cassette_leaf_hash(b))"
            " FROM (SELECT max(seq) + 1 AS s, ? AS b,"
            " (SELECT chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1) AS p"
            " FROM cassette_journal)"
        )
        conn.execute(
            "CREATE TEMP TRIGGER forge BEFORE INSERT ON main.cassette_messages BEGIN "
            + journal.replace("?", "'" + forged.replace("'", "''") + "'")
            + "; END"
        )
        assert _refusal(conn, _inserts(ids)["messages"]) == "JOURNAL_REQUIRED"  # {} vs {"x":1}
        right = forged.replace('{\\"x\\":1}', "{}")
        conn.execute("DROP TRIGGER temp.forge")
        conn.execute(
            "CREATE TEMP TRIGGER forge BEFORE INSERT ON main.cassette_messages BEGIN "
            + journal.replace("?", "'" + right.replace("'", "''") + "'")
            + "; INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json,"
            " created_at) VALUES ('"
            + _context_id('{"plan_id": "p"}')
            + "', 'p', '{\"plan_id\": \"p\"}', "
            + FAR
            + "); END"
        )
        assert _refusal(conn, _inserts(ids)["messages"]) == "JOURNAL_REQUIRED"  # not the last
        conn.execute("DROP TRIGGER temp.forge")
        conn.execute(
            "CREATE TEMP TRIGGER forge BEFORE INSERT ON main.cassette_messages BEGIN "
            + journal.replace("?", "'" + right.replace("'", "''") + "'")
            + "; END"
        )
        assert _refusal(conn, _inserts(ids)["messages"]) == "ok"  # its own body: journaled
    finally:
        conn.close()


# ------------------------------------------------------------- what verify still detects


def test_verify_reports_the_rows_the_gap_let_in(tmp_path: Path) -> None:
    """Rows stored past the rules (an unjournaled action and a journaled message, both at
    2^63 - 1, as the gap of a file's AFTER rules let in; here planted with the tables'
    triggers out of the way): verify reports them (id_order, unjournaled_row), and the
    same attacks on an intact ledger are refused."""
    path = tmp_path / "planted.db"
    ids = _build(path)
    with unguarded(path, "cassette_actions") as raw:
        raw.execute(_inserts(ids, id=TOP)["actions"])
    with unguarded(path, "cassette_messages"):
        conn = connect(path, clock=ManualClock(), migrate=False)  # journals the row
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_inserts(ids, id=TOP)["messages"])
            conn.execute("COMMIT")
        finally:
            conn.close()
    report = verify_path(str(path))
    kinds = {f.kind.value for f in report.findings}
    assert not report.ok and {"id_order", "unjournaled_row"} <= kinds
    planted = sorted((f.table, str(f.key)) for f in report.findings if f.kind.value == "id_order")
    assert planted == [("cassette_actions", NEW_ACTION), ("cassette_messages", TOP)]

    fresh = tmp_path / "fresh.db"
    ids = _build(fresh)
    raw = _raw(fresh, "actions", "AFTER")
    try:
        with pytest.raises(sqlite3.IntegrityError, match=r"^JOURNAL_REQUIRED: "):
            raw.execute(_inserts(ids, id=TOP)["actions"])
    finally:
        raw.close()
    conn = _package(fresh, "messages")
    try:
        assert _refusal(conn, _inserts(ids, id=TOP)["messages"]) == "OUT_OF_ORDER"
    finally:
        conn.close()
    assert verify_path(str(fresh)).ok


def test_insert_or_ignore_of_a_row_a_constraint_skips_leaves_no_entry(
    ledger: tuple[Path, dict[str, Any]],
) -> None:
    """The entry is written before the row, and INSERT OR IGNORE skips a row that fails a
    NOT NULL or CHECK constraint after the BEFORE triggers ran: the package's journal
    triggers write only for a row those constraints take, so nothing of it stays."""
    path, ids = ledger
    before = dump(path)
    conn = connect(path, clock=ManualClock(), migrate=False)
    try:
        for sql in (
            _inserts(ids)["messages"].replace("'USER'", "'ADMIN'"),  # INVALID_SOURCE
            _inserts(ids)["jobs"].replace("'x'", "''"),  # INVALID_INTENT
            _inserts(ids, time="NULL")["releases"],  # NOT NULL
        ):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql.replace("INSERT", "INSERT OR IGNORE", 1))
            conn.execute("COMMIT")
    finally:
        conn.close()
    assert dump(path) == before
    assert verify_path(str(path)).ok
