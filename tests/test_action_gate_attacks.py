"""The action rules' gates attacked (``sql/sqlite/schema/40_actions.sql``).

The readable-JSON and artifact checks of an action, and the plan lifecycle guard, live on
two views that store nothing (``cassette_actions_readable``,
``cassette_actions_lifecycle``), reached through small gate triggers; the state machine's
constant lists are comparisons; the ``*_journaled`` checks read the journal's last
entry; the journal guard hashes an entry with one call.

The main test is a battery of writes, each breaking one rule or several at once, run
through a raw connection and through a package connection: every write gets the code of
the rule it breaks (or none). The others attack the views and gates themselves.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import ManualClock, MessageCassette, connect
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.migrate import current_version, shipped_migrations
from catalytic_cassette.verify import verify_path

from .conftest import dump, file_digest

pytestmark = pytest.mark.sqlite_only(
    reason=("attacks on SQLite's action gates and views through sqlite3 connections")
)

HEX = "ab" * 32
NEW_ID = "00000000-0000-4000-8000-00000000ffff"
FAR = "4102444800000"  # 2100: later than anything the ManualClock dated


def _build(path: Path) -> dict[str, Any]:
    """A ledger with a running plan p (a started step), a paused plan q, a finished plan
    'done', a leased step and a pending one; returns the ids the battery names."""
    clock = ManualClock()
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
        cassette.post_message({"n": 2}, "r", "USER")
        leased = cassette.claim_step("r", "w", 600)
    with CausalChain(path, clock=clock) as chain:
        start = chain.append_action(_act("p", "PlanStarted")).action_id
        step = chain.append_action(_act("p", "PlanStepStarted", parent_action_id=start)).action_id
        chain.append_action(_act("q", "PlanStarted"))
        chain.append_action(_act("q", "PlanPaused"))
        chain.append_action(_act("done", "PlanStarted"))
        chain.append_action(_act("done", "PlanCompleted"))
        call = chain.append_action(_act("p", "CapabilityCall")).action_id
    return {
        "step": leased["step_id"],
        "token": leased["fencing_token"],
        "start": step,
        "call": call,
    }


def _act(plan: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"plan_id": plan, "intent_id": "i", "action_type": kind, "function_name": "f", **extra}


def _action(**values: str) -> str:
    """An insert of a legal next action (a capability call of plan p), some values changed."""
    columns = {
        "action_seq": "(SELECT max(action_seq) + 1 FROM cassette_actions)",
        "action_id": f"'{NEW_ID}'",
        "parent_action_id": "NULL",
        "plan_id": "'p'",
        "intent_id": "'i'",
        "action_type": "'CapabilityCall'",
        "function_name": "'f'",
        "arguments_json": "'[1]'",
        "arguments_artifact": "NULL",
        "result_json": "'{}'",
        "result_artifact": "NULL",
        "success": "1",
        "cost_micros": "0",
        "duration_ms": "0",
        "timestamp": FAR,
        "metadata_json": "'{}'",
        "caused_by": "NULL",
        **values,
    }
    names, literals = ", ".join(columns), ", ".join(columns.values())
    return f"INSERT INTO cassette_actions ({names}) VALUES ({literals})"


UNREADABLE = {"arguments_json": "'[1e400]'"}
BIG = {"result_json": "'{\"a\": 123456789012345678901234567890}'"}
SURROGATE = {"metadata_json": '\'{"a": "\\ud800"}\''}
LONG_DEEP = {"result_json": "'" + "[" * 1100 + "]" * 1100 + "'"}
BAD_PATH = {
    "result_json": "NULL",
    "result_artifact": f'\'{{"sha256": "{HEX}", "size": 1, "path": "../{HEX}"}}\'',
}
GOOD_ARTIFACT = {
    "result_json": "NULL",
    "result_artifact": f'\'{{"sha256": "{HEX}", "size": 1, "path": "a/{HEX}"}}\'',
}
UNREADABLE_ARTIFACT = {
    "result_json": "NULL",
    "result_artifact": f'\'{{"sha256": "{HEX}", "size": 1, "x": 1e999}}\'',
}
GAP = {"action_seq": "(SELECT max(action_seq) + 2 FROM cassette_actions)"}
BACKWARDS = {"timestamp": "1"}
RESUMED = {"action_type": "'PlanResumed'"}  # plan p is running, not paused
FINISHED = {"plan_id": "'done'"}
RESTART = {"action_type": "'PlanStarted'"}
NO_CAUSE = {"caused_by": "'nope'"}
BAD_SUGGESTED = {"metadata_json": "'{\"suggested_causes\": 1}'"}
BODY_ON_CALL = {"metadata_json": f'\'{{"plan_body": "x", "plan_hash": "{HEX}"}}\''}
NO_CHECKPOINT = {"metadata_json": '\'{"checkpoint_id": "cp-x"}\''}
DUPLICATE = {"action_id": "(SELECT action_id FROM cassette_actions WHERE action_seq = 1)"}
BAD_TYPE = {"action_type": "'Nope'"}


def _combine(*parts: dict[str, str]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for part in parts:
        merged.update(part)
    return merged


ACTION_DEFECTS: dict[str, dict[str, str]] = {
    "legal": {},
    "good-artifact": GOOD_ARTIFACT,
    "unreadable": UNREADABLE,
    "big-int": BIG,
    "surrogate": SURROGATE,
    "deep": LONG_DEEP,
    "bad-path": BAD_PATH,
    "unreadable-artifact": UNREADABLE_ARTIFACT,
    "bad-path+unreadable": _combine(BAD_PATH, UNREADABLE),
    "unreadable-artifact+surrogate": _combine(UNREADABLE_ARTIFACT, SURROGATE),
    "gap": GAP,
    "gap+unreadable": _combine(GAP, UNREADABLE),
    "backwards": BACKWARDS,
    "backwards+bad-path": _combine(BACKWARDS, BAD_PATH),
    "resumed": RESUMED,
    "resumed+unreadable": _combine(RESUMED, UNREADABLE),
    "resumed+gap": _combine(RESUMED, GAP),
    "finished": FINISHED,
    "finished+resumed": _combine(FINISHED, RESUMED),
    "restart": RESTART,
    "restart+no-cause": _combine(RESTART, NO_CAUSE),
    "no-checkpoint": NO_CHECKPOINT,
    "no-checkpoint+backwards": _combine(NO_CHECKPOINT, BACKWARDS),
    "suggested+unreadable": _combine(BAD_SUGGESTED, UNREADABLE),
    "plan-body+bad-path": _combine(BODY_ON_CALL, BAD_PATH),
    "duplicate+unreadable": _combine(DUPLICATE, UNREADABLE),
    "bad-type+unreadable": _combine(BAD_TYPE, UNREADABLE),
    "step-event-without-step": {"action_type": "'PlanStepCompleted'"},
}


def _battery(ids: dict[str, Any]) -> dict[str, str]:
    step, token = ids["step"], ids["token"]
    update = "UPDATE cassette_steps SET {} WHERE step_id = " + str(step)
    receipt = (
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json, created_at) SELECT step_id, job_id, {run}, {worker}, {token},"
        " {outcome}, '{{}}', " + FAR + " FROM cassette_steps WHERE step_id = " + str(step)
    )
    legal = {"run": "run_id", "worker": "'w'", "token": str(token), "outcome": "'SUCCESS'"}
    message = (
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES ((SELECT max(message_id) + {gap} FROM cassette_messages), 'r', {source},"
        " {payload}, " + FAR + ")"
    )
    battery = {f"action:{name}": _action(**values) for name, values in ACTION_DEFECTS.items()}
    battery.update(
        {
            "step:commit-without-receipt": update.format("status = 'COMMITTED'"),
            "step:bad-status": update.format("status = 'DONE'"),
            "step:null-status": update.format("status = NULL"),
            "step:bad-status+immutable": update.format("status = 'DONE', run_id = 'x'"),
            "step:bad-status+token": update.format("status = 'DONE', fencing_token = -1"),
            "step:immutable": update.format("payload_json = '{\"x\": 1}'"),
            "step:lease-fields": update.format("lease_owner = 'mallory'"),
            "step:requeue-live": update.format(
                "status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL"
            ),
            "step:insert-bad-status": (
                "INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal,"
                " status, fencing_token, payload_json, created_at) SELECT job_id, run_id,"
                " message_id, job_ordinal, 9, 'DONE', 0, '{}', " + FAR + " FROM cassette_steps"
                " WHERE step_id = " + str(step)
            ),
            "receipt:legal": receipt.format(**legal),
            "receipt:bad-outcome": receipt.format(**{**legal, "outcome": "'DONE'"}),
            "receipt:null-outcome": receipt.format(**{**legal, "outcome": "NULL"}),
            "receipt:bad-outcome+wrong-worker": receipt.format(
                **{**legal, "outcome": "'DONE'", "worker": "'mallory'"}
            ),
            "receipt:bad-outcome+stale": receipt.format(
                **{**legal, "outcome": "'DONE'", "token": str(token - 1)}
            ),
            "receipt:wrong-worker": receipt.format(**{**legal, "worker": "'mallory'"}),
            "receipt:bad-worker+bad-outcome": receipt.format(
                **{**legal, "outcome": "'DONE'", "worker": "''"}
            ),
            "receipt:run+outcome": receipt.format(**{**legal, "outcome": "'X'", "run": "'zz'"}),
            "message:legal": message.format(gap="1", source="'USER'", payload="'{}'"),
            "message:gap": message.format(gap="2", source="'USER'", payload="'{}'"),
            "message:unreadable": message.format(
                gap="1", source="'USER'", payload="'{\"a\": 1e400}'"
            ),
            "message:source": message.format(gap="1", source="'ADMIN'", payload="'{}'"),
            "message:null-source": message.format(gap="1", source="NULL", payload="'{}'"),
            "message:source+gap": message.format(gap="2", source="'ADMIN'", payload="'{}'"),
            "message:source+unreadable": message.format(
                gap="1", source="'ADMIN'", payload="'{\"a\": 1e400}'"
            ),
        }
    )
    return battery


def _outcome(conn: sqlite3.Connection, sql: str) -> str:
    """The code a write gets (or 'ok'), its transaction rolled back either way."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(sql)
        answer = "ok"
    except sqlite3.Error as exc:
        found = re.match(r"(?:CHECK constraint failed: )?([A-Z][A-Z_]+)\b", str(exc))
        answer = found.group(1) if found else f"{type(exc).__name__}: {exc}"
    finally:
        conn.execute("ROLLBACK")
    return answer


def _answers(path: Path, battery: dict[str, str]) -> dict[tuple[str, str], str]:
    answers: dict[tuple[str, str], str] = {}
    raw = sqlite3.connect(path, isolation_level=None)
    package = connect(path, clock=ManualClock(), migrate=False)
    try:
        for name, sql in battery.items():
            answers[("raw", name)] = _outcome(raw, sql)
            answers[("package", name)] = _outcome(package, sql)
    finally:
        raw.close()
        package.close()
    return answers


def test_every_write_gets_the_answer_of_the_rule_it_breaks(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ids = _build(path)
    after = _answers(path, _battery(ids))
    # the battery reaches the rules it is about, not only JOURNAL_REQUIRED
    package = {name: code for (side, name), code in after.items() if side == "package"}
    assert package["action:legal"] == package["action:good-artifact"] == "ok"
    assert package["action:unreadable"] == package["action:surrogate"] == "INVALID_PAYLOAD"
    assert package["action:deep"] == package["action:big-int"] == "INVALID_PAYLOAD"
    assert package["action:bad-path+unreadable"] == "INVALID_ARTIFACT"
    assert package["action:gap+unreadable"] == "INVALID_PAYLOAD"
    assert package["action:resumed+unreadable"] == "PLAN_NOT_PAUSED"
    assert package["action:finished+resumed"] == "PLAN_FINISHED"
    assert package["action:no-checkpoint"] == "REFERENCE_MISSING"
    assert package["step:bad-status+immutable"] == "INVALID_STATUS"
    assert package["receipt:bad-outcome+wrong-worker"] == "INVALID_OUTCOME"
    assert package["receipt:legal"] == package["message:legal"] == "ok"
    assert package["message:source+unreadable"] == "INVALID_SOURCE"  # a CHECK, before AFTER
    assert after[("raw", "action:legal")] == after[("raw", "message:legal")] == "JOURNAL_REQUIRED"
    assert after[("raw", "action:unreadable")] == "JOURNAL_REQUIRED"  # journaled fires first
    assert after[("raw", "action:resumed")] == "PLAN_NOT_PAUSED"  # a BEFORE rule


# --------------------------------------------------------------- the views themselves


@pytest.fixture
def ledger10(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "ledger.db"
    return path, _build(path)


READABLE_INSERT = (
    "INSERT INTO cassette_actions_readable"
    " (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)"
    " VALUES ({})"
)
LIFECYCLE_INSERT = (
    "INSERT INTO cassette_actions_lifecycle (plan_id, action_type, parent_action_id,"
    " metadata_json) VALUES ({})"
)


@pytest.mark.parametrize(
    ("values", "code"),
    [
        ("'[1]', '{}', '{}', NULL, NULL", None),
        ("'[1e400]', NULL, '{}', NULL, NULL", "INVALID_PAYLOAD"),
        ("NULL, '{\"a\": 99999999999999999999}', '{}', NULL, NULL", "INVALID_PAYLOAD"),
        ('NULL, NULL, \'{"a": "\\udfff"}\', NULL, NULL', "INVALID_PAYLOAD"),
        (f'NULL, NULL, \'{{}}\', \'{{"sha256": "{HEX}", "size": -1}}\', NULL', "INVALID_ARTIFACT"),
        (f'NULL, NULL, \'{{}}\', NULL, \'{{"sha256": "{HEX}", "size": 1}}\'', None),
    ],
)
def test_a_raw_insert_into_the_readable_view_checks_and_stores_nothing(
    ledger10: tuple[Path, dict[str, Any]], values: str, code: str | None
) -> None:
    path = ledger10[0]
    before = (dump(path), file_digest(path))
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        if code is None:
            raw.execute(READABLE_INSERT.format(values))
        else:
            with pytest.raises(sqlite3.IntegrityError, match=f"^{code}: "):
                raw.execute(READABLE_INSERT.format(values))
        assert raw.execute("SELECT count(*) FROM cassette_actions_readable").fetchone() == (0,)
    finally:
        raw.close()
    assert (dump(path), file_digest(path)) == before


@pytest.mark.parametrize(
    ("values", "code"),
    [
        ("'p', 'PlanStarted', NULL, '{}'", "PLAN_ALREADY_STARTED"),
        ("'new', 'PlanPaused', NULL, '{}'", "PLAN_NOT_STARTED"),
        ("'p', 'PlanResumed', NULL, '{}'", "PLAN_NOT_PAUSED"),
        ("'q', 'PlanStepStarted', NULL, '{}'", "PLAN_NOT_RUNNING"),
        ("'p', 'PlanStepCompleted', 'nope', '{}'", "STEP_NOT_STARTED"),
        ("'p', 'CapabilityCall', NULL, '{\"checkpoint_id\": \"cp-x\"}'", "REFERENCE_MISSING"),
        ("'p', 'PlanStepStarted', NULL, '[1]'", "INVALID_METADATA"),
        ("'new', 'PlanStarted', NULL, '{}'", None),
        ("'q', 'PlanResumed', NULL, '{}'", None),
    ],
)
def test_a_raw_insert_into_the_lifecycle_view_checks_and_stores_nothing(
    ledger10: tuple[Path, dict[str, Any]], values: str, code: str | None
) -> None:
    path = ledger10[0]
    before = (dump(path), file_digest(path))
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        if code is None:
            raw.execute(LIFECYCLE_INSERT.format(values))
        else:
            with pytest.raises(sqlite3.IntegrityError, match=f"^{code}: "):
                raw.execute(LIFECYCLE_INSERT.format(values))
        assert raw.execute("SELECT count(*) FROM cassette_actions_lifecycle").fetchone() == (0,)
    finally:
        raw.close()
    assert (dump(path), file_digest(path)) == before


@pytest.mark.parametrize("view", ["cassette_actions_readable", "cassette_actions_lifecycle"])
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {} SET metadata_json = '{{}}'",
        "DELETE FROM {}",
        "INSERT OR REPLACE INTO {} (metadata_json) VALUES ('{{}}')",
    ],
)
def test_the_views_take_no_update_or_delete(
    ledger10: tuple[Path, dict[str, Any]], view: str, statement: str
) -> None:
    path = ledger10[0]
    before = (dump(path), file_digest(path))
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        if statement.startswith("INSERT"):
            raw.execute(statement.format(view))  # checks, stores nothing
        else:
            with pytest.raises(
                sqlite3.OperationalError, match=r"cannot modify .* because it is a view"
            ):
                raw.execute(statement.format(view))
    finally:
        raw.close()
    assert (dump(path), file_digest(path)) == before


@pytest.mark.parametrize(
    ("ddl", "kind"),
    [
        ("DROP TRIGGER cassette_actions_rules", "schema_missing"),  # the gate since 0011
        ("DROP TRIGGER cassette_actions_lifecycle_gate", "schema_missing"),
        ("DROP TRIGGER cassette_actions_artifact_refs", "schema_missing"),
        ("DROP TRIGGER cassette_actions_lifecycle_guard", "schema_missing"),
        ("DROP VIEW cassette_actions_readable", "schema_missing"),
        ("DROP VIEW cassette_actions_lifecycle", "schema_missing"),
        ("RECREATE cassette_actions_rules", "schema_changed"),  # fires first now
        ("RECREATE cassette_actions_lifecycle_gate", "schema_changed"),
        ("RECREATE cassette_steps_update_guard", "schema_changed"),
        ("RECREATE cassette_receipts_insert_guard", "schema_changed"),
        (
            "DROP TRIGGER cassette_actions_rules;"
            " CREATE TRIGGER cassette_actions_rules BEFORE INSERT ON cassette_actions"
            " WHEN 0 BEGIN SELECT 1; END",
            "schema_changed",
        ),
        (
            "DROP VIEW cassette_actions_readable;"
            " CREATE VIEW cassette_actions_readable (arguments_json, result_json, metadata_json,"
            " arguments_artifact, result_artifact) AS SELECT 1, 1, 1, 1, 1",
            "schema_changed",
        ),
    ],
)
def test_ddl_on_the_gates_is_what_verify_reports(
    ledger10: tuple[Path, dict[str, Any]], ddl: str, kind: str
) -> None:
    path = ledger10[0]
    assert verify_path(str(path)).ok
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        if ddl.startswith("RECREATE "):
            name = ddl.split()[1]
            (sql,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            raw.executescript(f"DROP TRIGGER {name}; {sql};")
        else:
            raw.executescript(ddl + ";")
    finally:
        raw.close()
    report = verify_path(str(path))
    assert not report.ok
    assert kind in {str(finding.kind) for finding in report.errors}, report.to_dict()


def test_a_raw_action_is_refused_whatever_the_last_entry_names(
    ledger10: tuple[Path, dict[str, Any]],
) -> None:
    """A raw insert of an action whose key the journal's last entry names is a duplicate
    (APPEND_ONLY, a BEFORE rule); any other raw insert is not journaled (JOURNAL_REQUIRED),
    with the readable checks behind their gate or not."""
    path = ledger10[0]
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        last = raw.execute(
            "SELECT tbl, row_key FROM cassette_journal ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        assert last[0] == "cassette_actions"
        with pytest.raises(sqlite3.IntegrityError, match=r"^APPEND_ONLY: "):
            raw.execute(_action(action_id=f"'{last[1]}'"))
        for values in ({}, UNREADABLE, GOOD_ARTIFACT, BAD_PATH):
            with pytest.raises(sqlite3.IntegrityError, match=r"^JOURNAL_REQUIRED: "):
                raw.execute(_action(**values))
    finally:
        raw.close()


def test_the_migration_is_recorded_and_the_ledger_verifies(
    ledger10: tuple[Path, dict[str, Any]],
) -> None:
    path = ledger10[0]
    conn = sqlite3.connect(path)
    try:
        recorded = conn.execute("SELECT version, name, sha256 FROM cassette_migrations")
        assert tuple(recorded.fetchall()) == shipped_migrations()
        assert current_version() == len(shipped_migrations())
    finally:
        conn.close()
    assert verify_path(str(path)).ok


def test_a_temp_trigger_that_ignores_cannot_skip_the_files_after_rules(
    ledger10: tuple[Path, dict[str, Any]],
) -> None:
    """SQLite runs TEMP triggers first, and RAISE(IGNORE) in an AFTER trigger ends the
    row's remaining triggers, the file's included, with the row kept. Until 0011 a raw
    connection could so store an unjournaled action with an id far ahead, which made every
    later append fail (OUT_OF_ORDER). Since 0011 every rule runs before the row: refused.
    (tests/test_rules_before_the_row_attacks.py attacks every table so, and checks what
    verify reports of rows a version-10 ledger let in.)"""
    path = ledger10[0]
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute(
            "CREATE TEMP TRIGGER skip AFTER INSERT ON main.cassette_actions"
            " BEGIN SELECT RAISE(IGNORE); END"
        )
        with pytest.raises(sqlite3.IntegrityError, match=r"^JOURNAL_REQUIRED: "):
            raw.execute(_action(action_seq="9223372036854775807", **UNREADABLE))
    finally:
        raw.close()
    assert verify_path(str(path)).ok


def test_the_lifecycle_lookups_use_the_partial_index(tmp_path: Path) -> None:
    """A partial index serves only a query that repeats its WHERE clause: the package's
    plan_state and the guards' lookups (same text) must use cassette_actions_plan_lifecycle,
    not scan every action of the plan."""
    from catalytic_cassette import plans

    conn = connect(tmp_path / "ledger.db")
    try:
        query = (
            "SELECT action_type FROM cassette_actions"
            f" WHERE plan_id = ? AND {plans._LIFECYCLE} ORDER BY action_seq DESC LIMIT 1"
        )
        plan = conn.execute("EXPLAIN QUERY PLAN " + query, ("p",)).fetchall()
        assert "USING INDEX cassette_actions_plan_lifecycle" in str(plan)
        triggers = [
            str(sql)
            for (sql,) in conn.execute(
                "SELECT sql FROM sqlite_master WHERE name IN"
                " ('cassette_actions_plan_finished', 'cassette_actions_lifecycle_guard')"
            )
        ]
        text = " ".join(" ".join(sql.split()) for sql in triggers)
        assert text.count(" ".join(plans._LIFECYCLE.split())) == 5  # 1 + 4 lookups
    finally:
        conn.close()
