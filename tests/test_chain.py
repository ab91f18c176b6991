"""The causal chain: appends, raw-SQL refusals, queries and their plans, sessions,
artifact files, signatures and the chain's CLI commands."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import random
import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, payloads, signing
from catalytic_cassette.actions import COLUMNS, REASONING_LINKS, Action
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.migrate import current_version
from catalytic_cassette.verify import VerifyReport, verify_path

from . import backends
from .backends import Ledger, package_idle, sql_literal
from .conftest import dump, tamper

pytestmark = pytest.mark.both_backends

# ---------------------------------------------------------------------- helpers

CODE_LINE = re.compile(r"^error: ([A-Z][A-Z_]+): \S.*$")
MISSING_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"


def uid(n: int) -> str:
    """A lowercase UUID whose text sorts *against* n, so id order never equals seq order."""
    return f"{0xFFFFFFFF - n:08x}-0000-4000-8000-{n:012x}"


def act(**fields: Any) -> dict[str, Any]:
    """A valid action dict; keyword arguments override or add fields."""
    base: dict[str, Any] = {
        "plan_id": "plan",
        "intent_id": "intent",
        "action_type": "InternalStep",
        "function_name": "fn",
    }
    base.update(fields)
    return base


def ids(actions: list[Action]) -> list[str]:
    return [a.action_id for a in actions]


def refused(excinfo: pytest.ExceptionInfo[CassetteError], code: ErrorCode) -> CassetteError:
    error = excinfo.value
    assert error.code is code, (error.code, str(error))
    assert str(error).startswith(f"{code.value}: ")
    return error


def raw_row(chain: CausalChain, action_id: str) -> dict[str, Any]:
    """The stored row of an action, read through a raw connection of either backend."""
    found = backends.rows(
        chain.db_path,
        f"SELECT {', '.join(COLUMNS)} FROM cassette_actions WHERE action_id = ?",
        action_id,
    )
    assert found, action_id
    return dict(zip(COLUMNS, found[0], strict=True))


def row_count(path: Path | str) -> int:
    return int(backends.rows(path, "SELECT count(*) FROM cassette_actions")[0][0])


def at_now(ledger: Ledger, timestamp: int | None) -> bool:
    """Whether ``timestamp`` is the ledger's time now: exactly, on a ManualClock; within
    the last few seconds on PostgreSQL, whose server clock moves by itself."""
    now = ledger.now_ms()
    if not ledger.postgresql:
        return timestamp == now
    return timestamp is not None and now - 5_000 <= timestamp <= now


def kinds_for(report: VerifyReport, action_id: str) -> set[str]:
    return {f.kind for f in report.errors if f.table == "cassette_actions" and f.key == action_id}


@pytest.fixture
def chain(db_path: Path, clock: ManualClock) -> Iterator[CausalChain]:
    with CausalChain(db_path, clock=clock) as opened:
        yield opened


# ------------------------------------------------------------ 1. appends


def test_every_field_round_trips(chain: CausalChain, backend: Ledger) -> None:
    root = chain.append_action(
        Action(
            plan_id="plan-1",
            intent_id="intent-1",
            action_type="PlanStarted",
            function_name="start",
            action_id=uid(1),
        )
    )
    assert at_now(backend, root.timestamp)
    backend.advance(2_500)
    child = chain.append_action(
        {
            "plan_id": "plan-1",
            "intent_id": "intent-1",
            "action_type": "CapabilityResult",
            "function_name": "search.web",
            "action_id": uid(2),
            "parent_action_id": root.action_id,
            "session_id": "session-1",
            "arguments": ["query", 3, {"deep": [1.5, None, True]}, None],
            "result": {"hits": [1, 2], "empty": {}, "none": None},
            "success": False,
            "error_message": "partial failure",
            "cost": 1.25,
            "duration_ms": 987,
            "metadata": {"intent_id": "why-1", "note": "ü", "nested": {"a": [1]}},
        }
    )
    assert at_now(backend, child.timestamp)
    assert child.timestamp is not None and root.timestamp is not None
    if backend.postgresql:  # the server's time also moved by itself
        assert child.timestamp >= root.timestamp + 2_500
    else:
        assert child.timestamp == root.timestamp + 2_500
    assert child.action_seq is not None and root.action_seq is not None
    assert child.action_seq > root.action_seq

    stored = chain.get_action(child.action_id)
    assert stored == child
    assert stored.parent_action_id == root.action_id
    assert stored.session_id == "session-1"
    assert stored.arguments == ["query", 3, {"deep": [1.5, None, True]}, None]
    assert stored.result == {"hits": [1, 2], "empty": {}, "none": None}
    assert stored.success is False
    assert stored.error_message == "partial failure"
    assert stored.cost == 1.25
    assert stored.duration_ms == 987
    assert stored.metadata == {"intent_id": "why-1", "note": "ü", "nested": {"a": [1]}}
    assert stored.links == {"intent_id": "why-1"}
    assert chain.get_action(root.action_id) == root

    row = raw_row(chain, child.action_id)
    assert row["success"] == 0
    assert row["cost_micros"] == 1_250_000
    assert row["timestamp"] == child.timestamp
    assert json.loads(row["arguments_json"]) == stored.arguments
    assert row["arguments_artifact"] is None and row["result_artifact"] is None
    assert row["metadata_json"] == payloads.dumps(stored.metadata)  # canonical, sorted keys


@pytest.mark.parametrize(
    "result", [0, False, "", [], {}, 0.0, "null", [None]], ids=lambda v: repr(v)
)
def test_falsy_results_are_stored_not_dropped(chain: CausalChain, result: Any) -> None:
    stored = chain.append_action(act(result=result))
    read = chain.get_action(stored.action_id).result
    assert read == result
    assert type(read) is type(result)
    assert raw_row(chain, stored.action_id)["result_json"] == payloads.dumps(result)


def test_absent_and_null_result_are_sql_null(chain: CausalChain) -> None:
    """None (JSON null or a missing key) is stored as an absent result: SQL NULL."""
    absent = chain.append_action(act())
    null = chain.append_action(act(result=None, arguments=None))
    for action in (absent, null):
        row = raw_row(chain, action.action_id)
        assert row["result_json"] is None and row["result_artifact"] is None
        assert row["arguments_json"] is None and row["arguments_artifact"] is None
        read = chain.get_action(action.action_id)
        assert read.result is None and read.arguments is None
    empty = chain.append_action(act(arguments=[]))
    assert chain.get_action(empty.action_id).arguments == []


@pytest.mark.parametrize(
    ("cost", "micros"),
    [(0, 0), (0.000001, 1), (0.5, 500_000), (3, 3_000_000), (12345.678901, 12_345_678_901)],
)
def test_cost_is_integer_micro_units(chain: CausalChain, cost: float, micros: int) -> None:
    stored = chain.append_action(act(cost=cost))
    value = raw_row(chain, stored.action_id)["cost_micros"]
    assert type(value) is int and value == micros  # SQLite would hand back a REAL as float
    assert chain.get_action(stored.action_id).cost == micros / 1_000_000


def test_timestamp_and_seq_come_from_the_ledger(chain: CausalChain, backend: Ledger) -> None:
    first = chain.append_action(act(timestamp=5, action_seq=999))
    assert at_now(backend, first.timestamp)
    assert first.action_seq != 999
    backend.advance(7)
    batch = chain.append_actions([act(timestamp=1), Action("p", "i", "PlanStarted", "f")])
    assert at_now(backend, batch[0].timestamp)
    assert batch[0].timestamp == batch[1].timestamp  # one transaction, one time
    backend.advance(1)
    last = chain.append_action(act())
    assert at_now(backend, last.timestamp)
    seqs = [a.action_seq for a in [first, *batch, last]]
    assert all(isinstance(s, int) for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    listed = chain.find_actions()
    assert ids(listed) == ids([first, *batch, last])
    stamps = [a.timestamp for a in listed]
    assert stamps == [a.timestamp for a in [first, *batch, last]]
    assert all(isinstance(t, int) for t in stamps)
    steps = [b - a for a, b in itertools.pairwise(stamps)]  # type: ignore[operator]
    if backend.postgresql:  # at least what was advanced; the server's time moves too
        assert steps[0] >= 7 and steps[1] == 0 and steps[2] >= 1
    else:
        assert steps == [7, 0, 1]


def test_a_batch_may_hold_a_parent_before_its_children(chain: CausalChain) -> None:
    stored = chain.append_actions(
        [
            Action("p", "i", "PlanStarted", "plan", action_id=uid(1)),
            act(
                action_id=uid(2),
                parent_action_id=uid(1),
                action_type="PlanStepStarted",
                plan_id="p",
            ),
            Action("p", "i", "CapabilityCall", "tool", action_id=uid(3), parent_action_id=uid(2)),
            act(action_id=uid(4), parent_action_id=uid(1)),
        ]
    )
    assert ids(stored) == [uid(1), uid(2), uid(3), uid(4)]
    assert ids(chain.get_children(uid(1))) == [uid(2), uid(4)]
    assert ids(chain.subtree(uid(1))) == [uid(1), uid(2), uid(3), uid(4)]
    assert chain.append_actions([]) == []


BAD_ITEMS: list[tuple[str, dict[str, Any], ErrorCode]] = [
    ("unknown-parent", {"parent_action_id": MISSING_ID}, ErrorCode.REFERENCE_MISSING),
    ("parent-later-in-batch", {"parent_action_id": uid(99)}, ErrorCode.REFERENCE_MISSING),
    ("action-type", {"action_type": "PlanExploded"}, ErrorCode.INVALID_ACTION_TYPE),
    ("action-type-case", {"action_type": "planstarted"}, ErrorCode.INVALID_ACTION_TYPE),
    ("uuid-garbage", {"action_id": "not-a-uuid"}, ErrorCode.INVALID_ACTION_ID),
    ("uuid-upper", {"action_id": uid(7).upper()}, ErrorCode.INVALID_ACTION_ID),
    ("uuid-no-dashes", {"action_id": uid(7).replace("-", "")}, ErrorCode.INVALID_ACTION_ID),
    ("duplicate-id", {"action_id": uid(1)}, ErrorCode.APPEND_ONLY),
    ("arguments-object", {"arguments": {"a": 1}}, ErrorCode.INVALID_ARGUMENTS),
    ("arguments-string", {"arguments": "a"}, ErrorCode.INVALID_ARGUMENTS),
    ("arguments-tuple", {"arguments": (1, 2)}, ErrorCode.INVALID_ARGUMENTS),
    ("metadata-list", {"metadata": [1]}, ErrorCode.INVALID_METADATA),
    ("metadata-string", {"metadata": "{}"}, ErrorCode.INVALID_METADATA),
    ("success-int", {"success": 1}, ErrorCode.INVALID_SUCCESS),
    ("cost-negative", {"cost": -0.5}, ErrorCode.INVALID_COST),
    ("cost-bool", {"cost": True}, ErrorCode.INVALID_COST),
    ("duration-negative", {"duration_ms": -1}, ErrorCode.INVALID_DURATION),
    ("duration-float", {"duration_ms": 1.5}, ErrorCode.INVALID_DURATION),
    ("plan-empty", {"plan_id": ""}, ErrorCode.INVALID_PLAN_ID),
    ("session-empty", {"session_id": ""}, ErrorCode.INVALID_SESSION_ID),
    ("function-too-long", {"function_name": "f" * 201}, ErrorCode.INVALID_FUNCTION_NAME),
    ("intent-empty", {"intent_id": ""}, ErrorCode.INVALID_INTENT),
]


@pytest.mark.parametrize(("bad", "code"), [pytest.param(b, c, id=name) for name, b, c in BAD_ITEMS])
def test_a_bad_item_refuses_the_whole_batch(
    chain: CausalChain, db_path: Path, bad: dict[str, Any], code: ErrorCode
) -> None:
    earlier = chain.append_action(act(action_id=uid(0), session_id="s"))
    working = chain.load_session("s")
    before = dump(db_path)
    # Both forms on one ledger: a refused batch leaves it as it was (one ledger per case
    # keeps the PostgreSQL half cheap).
    for item in (act(**bad), Action(**act(**bad))):
        batch = [
            Action("p", "i", "PlanStarted", "plan", action_id=uid(1), session_id="s"),
            act(action_id=uid(2), parent_action_id=uid(1), session_id="s"),
            item,
            act(action_id=uid(99), parent_action_id=earlier.action_id),
        ]
        with pytest.raises(CassetteError) as excinfo:
            chain.append_actions(batch)
        assert refused(excinfo, code).detail["index"] == 2
        assert package_idle(chain)
        assert dump(db_path) == before
        assert ids(working.actions()) == [uid(0)]
        with pytest.raises(CassetteError):
            chain.get_action(uid(1))
    # the connection is usable and the same batch without the bad item goes in whole
    good = chain.append_actions([batch[0], batch[1], batch[3]])
    assert ids(good) == [uid(1), uid(2), uid(99)]


def test_an_unknown_field_refuses_the_batch(chain: CausalChain, db_path: Path) -> None:
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), act(colour="blue"), act()])
    assert refused(excinfo, ErrorCode.INVALID_PAYLOAD).detail["index"] == 1
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), {"plan_id": "p"}])
    assert refused(excinfo, ErrorCode.INVALID_PAYLOAD).detail["index"] == 1
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), act(), ["not", "an", "object"]])  # type: ignore[list-item]
    assert refused(excinfo, ErrorCode.INVALID_PAYLOAD).detail["index"] == 2
    assert dump(db_path) == before


@pytest.mark.parametrize(
    "bad",
    [
        {"arguments": [{1, 2}]},
        {"result": object()},
        {"metadata": {"x": object()}},
        {"arguments": [2**70]},
    ],
    ids=["arguments-set", "result-object", "metadata-object", "arguments-huge-int"],
)
def test_an_unencodable_item_is_named_by_index(
    chain: CausalChain, db_path: Path, bad: dict[str, Any]
) -> None:
    """Regression (ec588a5): the encoding refusal came without the item's index."""
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), act(**bad)])
    assert dump(db_path) == before
    assert refused(excinfo, ErrorCode.INVALID_PAYLOAD).detail.get("index") == 1


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        ({"duration_ms": 2**63}, ErrorCode.INVALID_DURATION),
        ({"cost": float("nan")}, ErrorCode.INVALID_COST),
        ({"cost": float("inf")}, ErrorCode.INVALID_COST),
        ({"cost": 1e14}, ErrorCode.INVALID_COST),
    ],
    ids=["duration-2**63", "cost-nan", "cost-inf", "cost-1e14"],
)
def test_out_of_range_numbers_are_refused_with_a_code(
    chain: CausalChain, db_path: Path, bad: dict[str, Any], code: ErrorCode
) -> None:
    """Regression (ec588a5): these escaped as raw OverflowError / ValueError."""
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), act(**bad)])
    assert refused(excinfo, code).detail.get("index") == 1
    assert package_idle(chain)
    assert dump(db_path) == before


@pytest.mark.parametrize(
    "odd",
    [{"error_message": 5}, {"plan_id": 5}, {"function_name": 7}, {"session_id": 3}],
    ids=lambda d: str(d),
)
def test_an_accepted_signed_append_always_verifies(
    tmp_path: Path, clock: ManualClock, odd: dict[str, Any]
) -> None:
    """Regression (ec588a5): a non-string text field was accepted, stored as text by
    the STRICT table, and its signature (over the integer) then failed verify."""
    db = tmp_path / "odd.db"
    key_path, pub_path = signing.generate(str(tmp_path / "k"))
    with CausalChain(db, clock=clock, signing_key=key_path) as signed:
        try:
            stored = signed.append_action(act(**odd))
        except CassetteError:
            assert row_count(db) == 0
            return  # refusing the value is correct too
        assert signed.get_action(stored.action_id) == stored
    report = verify_path(str(db), public_key=signing.load_public(pub_path))
    assert report.ok, report.findings


def test_append_returns_the_action_as_stored(chain: CausalChain) -> None:
    """Regression (ec588a5): a sub-micro cost was returned unrounded."""
    try:
        stored = chain.append_action(act(cost=0.1234567))
    except CassetteError:
        return  # refusing sub-micro precision is correct too
    assert chain.get_action(stored.action_id) == stored


# ------------------------------------------------------ 2. raw-SQL attacks


def _valid_raw(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "action_id": uid(500),
        "parent_action_id": None,
        "plan_id": "p",
        "intent_id": "i",
        "session_id": None,
        "action_type": "InternalStep",
        "function_name": "f",
        "arguments_json": "[1]",
        "arguments_artifact": None,
        "result_json": '{"ok":true}',
        "result_artifact": None,
        "success": 1,
        "error_message": None,
        "cost_micros": 0,
        "duration_ms": 0,
        "timestamp": 1_700_000_000_000,
        "metadata_json": "{}",
    }
    row.update(overrides)
    return row


def _raw_insert(conn: sqlite3.Connection, row: dict[str, Any], verb: str = "INSERT") -> None:
    names = list(row)
    conn.execute(
        f"{verb} INTO cassette_actions ({', '.join(names)})"
        f" VALUES ({', '.join(':' + n for n in names)})",
        row,
    )


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _insert_sql(row: dict[str, Any], verb: str = "INSERT", tail: str = "") -> str:
    """An INSERT of ``row`` as literal SQL, which either backend's shell takes."""
    names = ", ".join(f'"{name}"' for name in row)
    values = ", ".join(_literal(value) for value in row.values())
    return f"{verb} INTO cassette_actions ({names}) VALUES ({values}){tail}"


@pytest.fixture
def attacked(chain: CausalChain) -> CausalChain:
    chain.append_action(act(action_id=uid(1), action_type="PlanStarted"))
    chain.append_action(act(action_id=uid(2), parent_action_id=uid(1), arguments=[1]))
    return chain


_QUOTED = ", ".join(f'"{name}"' for name in COLUMNS)
_COPY_ROW = f"SELECT {_QUOTED} FROM cassette_actions WHERE action_id = '{uid(2)}'"
# PostgreSQL has no REPLACE: its way to overwrite a row by its key is an upsert.
_UPSERT = ' ON CONFLICT ({key}) DO UPDATE SET "function_name" = EXCLUDED."function_name"'

# (name, SQL, PostgreSQL's SQL when it differs, code); run by a shell of either backend.
RAW_ATTACKS: list[tuple[str, str, str | None, str]] = [
    (
        "update-one",
        f"UPDATE cassette_actions SET function_name = 'x' WHERE action_id = '{uid(2)}'",
        None,
        "APPEND_ONLY",
    ),
    (
        "update-all-metadata",
        "UPDATE cassette_actions SET metadata_json = '{\"a\":1}'",
        None,
        "APPEND_ONLY",
    ),
    (
        "delete-one",
        f"DELETE FROM cassette_actions WHERE action_id = '{uid(2)}'",
        None,
        "APPEND_ONLY",
    ),
    ("delete-all", "DELETE FROM cassette_actions", None, "APPEND_ONLY"),
    (
        "insert-or-replace-same-row",
        f"INSERT OR REPLACE INTO cassette_actions ({_QUOTED}) {_COPY_ROW}",
        f"INSERT INTO cassette_actions ({_QUOTED}) {_COPY_ROW}" + _UPSERT.format(key="action_id"),
        "APPEND_ONLY",
    ),
    (
        "insert-or-replace-same-id-new-seq",
        _insert_sql(_valid_raw(action_id=uid(2), action_seq=50), "INSERT OR REPLACE"),
        _insert_sql(
            _valid_raw(action_id=uid(2), action_seq=50), tail=_UPSERT.format(key="action_id")
        ),
        "APPEND_ONLY",
    ),
    (
        "replace-into-same-seq",
        _insert_sql(_valid_raw(action_seq=1), "REPLACE"),
        _insert_sql(_valid_raw(action_seq=1), tail=_UPSERT.format(key="action_seq")),
        "APPEND_ONLY",
    ),
    (
        "replace-into-same-id",
        _insert_sql(_valid_raw(action_id=uid(1)), "REPLACE"),
        _insert_sql(_valid_raw(action_id=uid(1)), tail=_UPSERT.format(key="action_id")),
        "APPEND_ONLY",
    ),
    (
        "unknown-parent",
        _insert_sql(_valid_raw(parent_action_id=MISSING_ID)),
        None,
        "REFERENCE_MISSING",
    ),
    (
        "action-type",
        _insert_sql(_valid_raw(action_type="Hack", parent_action_id=uid(1))),
        None,
        "INVALID_ACTION_TYPE",
    ),
    ("action-id-short", _insert_sql(_valid_raw(action_id="abc")), None, "INVALID_ACTION_ID"),
    (
        "action-id-upper",
        _insert_sql(_valid_raw(action_id=uid(500).upper())),
        None,
        "INVALID_ACTION_ID",
    ),
    (
        "action-id-dash-moved",
        _insert_sql(_valid_raw(action_id="0000000-00000-4000-8000-000000000001")),
        None,
        "INVALID_ACTION_ID",
    ),
    (
        "action-id-six-groups",
        _insert_sql(_valid_raw(action_id="00000000-0000-4000-8000-0000000-0001")),
        None,
        "INVALID_ACTION_ID",
    ),
    (
        "arguments-object",
        _insert_sql(_valid_raw(arguments_json='{"a":1}')),
        None,
        "INVALID_ARGUMENTS",
    ),
    (
        "arguments-not-json",
        _insert_sql(_valid_raw(arguments_json="[1,")),
        None,
        "INVALID_ARGUMENTS",
    ),
    ("metadata-array", _insert_sql(_valid_raw(metadata_json="[]")), None, "INVALID_METADATA"),
    ("metadata-not-json", _insert_sql(_valid_raw(metadata_json="{")), None, "INVALID_METADATA"),
    (
        "inline-and-artifact",
        _insert_sql(_valid_raw(arguments_artifact='{"sha256":"00","size":1}')),
        None,
        "INVALID_ARTIFACT",
    ),
    ("action-seq-zero", _insert_sql(_valid_raw(action_seq=0)), None, "INVALID_ID"),
    ("action-seq-negative", _insert_sql(_valid_raw(action_seq=-3)), None, "INVALID_ID"),
    ("valid-looking", _insert_sql(_valid_raw()), None, "JOURNAL_REQUIRED"),
    (
        "valid-looking-child",
        _insert_sql(_valid_raw(parent_action_id=uid(2), session_id="s")),
        None,
        "JOURNAL_REQUIRED",
    ),
]


@pytest.mark.parametrize(
    ("sql", "pg_sql", "code"),
    [pytest.param(sql, pg_sql, code, id=name) for name, sql, pg_sql, code in RAW_ATTACKS],
)
def test_raw_sql_attacks_get_precise_codes(
    attacked: CausalChain, backend: Ledger, sql: str, pg_sql: str | None, code: str
) -> None:
    before = backend.dump()
    statement = pg_sql if backend.postgresql and pg_sql is not None else sql
    if backend.postgresql and code == "JOURNAL_REQUIRED":
        # The server's triggers journal every session's insert (LAW.md section 14): the
        # owner's legal-looking row is an append like the package's, journaled, given the
        # next id and dated by the server, so it forges nothing.
        assert backend.raw_sql(statement) is None
        assert row_count(backend.target) == 3
        (stamp,) = backend.rows(
            "SELECT timestamp FROM cassette_actions WHERE action_id = ?", uid(500)
        )[0]
        assert stamp != 1_700_000_000_000 and at_now(backend, stamp)
        assert verify_path(backend.target).ok
        return
    assert backend.raw_sql(statement) is ErrorCode[code]
    assert backend.dump() == before
    assert row_count(backend.target) == 2


@pytest.mark.sqlite_only(
    reason="the message of sqlite3's own exception; PostgreSQL's SQLSTATE and message"
    " are tests/test_postgres_attacks.py's"
)
def test_a_raw_sqlite3_shell_reads_the_code_in_the_message(
    attacked: CausalChain, db_path: Path
) -> None:
    """What a sqlite3 shell prints names the code itself (a RAISE message or a named CHECK)."""
    conn = sqlite3.connect(db_path)
    try:
        for _name, sql, _pg_sql, code in RAW_ATTACKS:
            with pytest.raises(sqlite3.IntegrityError) as excinfo:
                conn.execute(sql)
            message = str(excinfo.value)
            assert message.startswith(f"{code}: ") or message == f"CHECK constraint failed: {code}"
            conn.rollback()
    finally:
        conn.close()


@pytest.mark.sqlite_only(
    reason="the package's own sqlite3 connection and its TEMP journaling trigger;"
    " PostgreSQL journals in the server (LAW.md section 14)"
)
def test_the_package_connection_translates_the_same_guards(chain: CausalChain) -> None:
    from catalytic_cassette.errors import translate

    chain.append_action(act(action_id=uid(1)))
    attempts = {
        "UPDATE cassette_actions SET plan_id = 'q'": ErrorCode.APPEND_ONLY,
        "DELETE FROM cassette_actions": ErrorCode.APPEND_ONLY,
    }
    for sql, code in attempts.items():
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            chain.conn.execute(sql)
        assert translate(excinfo.value).code is code
    # journaled by the TEMP trigger, an action_seq past the next one meets the dense-id guard
    chain.conn.execute("BEGIN IMMEDIATE")
    try:
        _raw_insert(chain.conn, _valid_raw(action_id=uid(10), action_seq=2))
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            _raw_insert(chain.conn, _valid_raw(action_id=uid(5), action_seq=5))
        assert translate(excinfo.value).code is ErrorCode.OUT_OF_ORDER
    finally:
        chain.conn.execute("ROLLBACK")
    assert package_idle(chain)
    assert ids(chain.find_actions()) == [uid(1)]


# --------------------------------------------------------------- 3. queries

N_QUERY = 30


# Types outside the plan lifecycle (migration 0003 enforces it), so any order is legal.
FREE_TYPES = ("CapabilityCall", "CapabilityResult", "InternalStep")


def _spec(n: int) -> dict[str, Any]:
    """Action n of the query ledger: two trees (0..19 and 20..29), varied attributes."""
    if n in (0, 20):
        parent = None
    elif n < 20:
        parent = uid((n - 1) // 2)
    else:
        parent = uid(20 + (n - 21) // 2)
    metadata: dict[str, Any] = {"n": n}
    if n % 2 == 0:
        metadata["intent_id"] = f"why-{n % 3}"
    if n % 3 == 0:
        metadata["constitutional_rule_id"] = "rule-1"
    if n % 5 == 1:
        metadata["delegation_decision_id"] = f"del-{n % 2}"
    if n % 7 == 2:
        metadata["capability_attestation_id"] = "att-1"
    if n == 4:
        metadata["decoy"] = "rule-1"  # a value under another key never matches a link
    return {
        "action_id": uid(n),
        "parent_action_id": parent,
        "plan_id": f"plan-{n % 3}",
        "intent_id": f"intent-{n % 4}",
        "session_id": None if n % 5 == 0 else f"s-{n % 2}",
        "action_type": FREE_TYPES[n % len(FREE_TYPES)],
        "function_name": f"fn-{n}",
        "arguments": [n],
        "metadata": metadata,
    }


SPECS = [_spec(n) for n in range(N_QUERY)]


def _expected(pred: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [s["action_id"] for s in SPECS if pred(s)]


@pytest.fixture
def queried(chain: CausalChain) -> CausalChain:
    chain.append_actions(SPECS[:7])
    for spec in SPECS[7:15]:
        chain.append_action(Action(**spec))
    chain.append_actions(SPECS[15:])
    # noise in another plan/intent/session that must never leak into the results
    chain.append_action(act(plan_id="other", intent_id="other", session_id="other"))
    return chain


def test_get_action(queried: CausalChain) -> None:
    found = queried.get_action(uid(5))
    assert found.function_name == "fn-5" and found.action_seq == 6
    for unknown in (MISSING_ID, "nonsense", ""):
        with pytest.raises(CassetteError) as excinfo:
            queried.get_action(unknown)
        refused(excinfo, ErrorCode.NOT_FOUND)


def test_actions_by_plan_intent_and_session(queried: CausalChain) -> None:
    for k in range(3):
        assert ids(queried.actions_for_plan(f"plan-{k}")) == _expected(
            lambda s, k=k: s["plan_id"] == f"plan-{k}"
        )
    for k in range(4):
        assert ids(queried.actions_for_intent(f"intent-{k}")) == _expected(
            lambda s, k=k: s["intent_id"] == f"intent-{k}"
        )
    for k in range(2):
        assert ids(queried.actions_for_session(f"s-{k}")) == _expected(
            lambda s, k=k: s["session_id"] == f"s-{k}"
        )
    assert queried.actions_for_plan("nope") == []
    assert queried.actions_for_session("nope") == []


def test_actions_for_each_reasoning_link(queried: CausalChain) -> None:
    values: dict[str, set[str]] = {link: set() for link in REASONING_LINKS}
    for spec in SPECS:
        for link in REASONING_LINKS:
            if link in spec["metadata"]:
                values[link].add(spec["metadata"][link])
    for link, seen in values.items():
        assert seen, link
        for value in seen:
            expected = _expected(lambda s, li=link, v=value: s["metadata"].get(li) == v)
            found = queried.actions_for_link(link, value)
            assert ids(found) == expected, (link, value)
            assert all(a.links[link] == value for a in found)
        assert queried.actions_for_link(link, "absent") == []
    assert uid(4) not in ids(queried.actions_for_link("constitutional_rule_id", "rule-1"))
    with pytest.raises(CassetteError) as excinfo:
        queried.actions_for_link("decoy", "rule-1")
    refused(excinfo, ErrorCode.INVALID_ARGUMENT)


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"plan_id": "plan-1"},
        {"intent_id": "intent-2"},
        {"session_id": "s-0"},
        {"action_type": "PlanCompleted"},
        {"plan_id": "plan-0", "session_id": "s-1"},
        {"plan_id": "plan-2", "intent_id": "intent-1", "action_type": "PlanAborted"},
        {"plan_id": "plan-1", "intent_id": "intent-0", "session_id": "s-1"},
    ],
    ids=lambda f: ",".join(f) or "none",
)
def test_find_actions_filters_and_limit(queried: CausalChain, filters: dict[str, str]) -> None:
    def pred(s: dict[str, Any]) -> bool:
        return all(s[k] == v for k, v in filters.items())

    expected = _expected(pred)
    if not filters:
        expected.append(queried.find_actions()[-1].action_id)  # the noise row
    assert ids(queried.find_actions(**filters)) == expected  # type: ignore[arg-type]
    for limit in (1, 2, 5, 1000):
        assert ids(queried.find_actions(**filters, limit=limit)) == expected[:limit]  # type: ignore[arg-type]


def test_children_and_parent(queried: CausalChain) -> None:
    for n in range(N_QUERY):
        spec = SPECS[n]
        assert ids(queried.get_children(uid(n))) == _expected(
            lambda s, n=n: s["parent_action_id"] == uid(n)
        )
        parent = queried.get_parent(uid(n))
        if spec["parent_action_id"] is None:
            assert parent is None
        else:
            assert parent is not None and parent.action_id == spec["parent_action_id"]
    assert queried.get_children(uid(19)) == []
    for method in (queried.get_children, queried.get_parent, queried.subtree):
        with pytest.raises(CassetteError) as excinfo:
            method(MISSING_ID)
        refused(excinfo, ErrorCode.NOT_FOUND)


def _walk(chain: CausalChain, root: str) -> list[str]:
    """The naive descendant set: repeated get_children, then ordered by action_seq."""
    seen: dict[str, int] = {}
    stack = [chain.get_action(root)]
    while stack:
        node = stack.pop()
        assert node.action_id not in seen
        assert node.action_seq is not None
        seen[node.action_id] = node.action_seq
        stack.extend(chain.get_children(node.action_id))
    return sorted(seen, key=seen.__getitem__)


def _descendants(parents: list[int | None], root: int) -> list[int]:
    """Pure-Python oracle over the parent list (node i is appended i-th)."""
    inside = {root}
    for node in range(root + 1, len(parents)):
        parent = parents[node]
        if parent is not None and parent in inside:
            inside.add(node)
    return sorted(inside)


def _build_tree(chain: CausalChain, parents: list[int | None]) -> None:
    chain.append_actions(
        act(action_id=uid(i), parent_action_id=None if p is None else uid(p), arguments=[i])
        for i, p in enumerate(parents)
    )


def test_subtree_of_the_query_ledger(queried: CausalChain) -> None:
    assert ids(queried.subtree(uid(0))) == [uid(n) for n in range(20)]
    assert ids(queried.subtree(uid(20))) == [uid(n) for n in range(20, 30)]
    assert ids(queried.subtree(uid(19))) == [uid(19)]
    assert ids(queried.subtree(uid(1))) == _walk(queried, uid(1))


def test_subtree_of_a_random_tree_of_hundreds(tmp_path: Path) -> None:
    rng = random.Random(1122)
    parents: list[int | None] = [None]
    for i in range(1, 400):
        parents.append(None if rng.random() < 0.02 else rng.randrange(i))
    with CausalChain(tmp_path / "tree.db", clock=ManualClock(), durability="normal") as chain:
        _build_tree(chain, parents)
        for root in [0, *rng.sample(range(400), 8)]:
            expected = [uid(i) for i in _descendants(parents, root)]
            found = chain.subtree(uid(root))
            assert ids(found) == expected
            assert ids(found) == _walk(chain, uid(root))
            assert [a.arguments for a in found] == [[int(a.action_id[-12:], 16)] for a in found]


@st.composite
def random_forests(draw: st.DrawFn) -> list[int | None]:
    size = draw(st.integers(min_value=1, max_value=300))
    shape = draw(st.lists(st.integers(0, 2**32), min_size=size, max_size=size))
    parents: list[int | None] = []
    for i, value in enumerate(shape):
        parents.append(None if i == 0 or value % 25 == 0 else value % i)
    return parents


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parents=random_forests(), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
def test_subtree_matches_a_naive_walk(parents: list[int | None], picks: list[int]) -> None:
    with CausalChain(":memory:", clock=ManualClock()) as chain:
        _build_tree(chain, parents)
        for pick in [0, *picks]:
            root = pick % len(parents)
            expected = [uid(i) for i in _descendants(parents, root)]
            assert ids(chain.subtree(uid(root))) == expected
            assert _walk(chain, uid(root)) == expected


# ----------------------------------------------------------- 4. query plans


def _statements(chain: CausalChain, call: Callable[[], Any]) -> list[str]:
    """The exact SELECT statements (values bound) that one method call runs."""
    seen: list[str] = []
    chain.conn.set_trace_callback(seen.append)
    try:
        call()
    finally:
        chain.conn.set_trace_callback(None)
    reads = [s for s in seen if s.lstrip().upper().startswith(("SELECT", "WITH"))]
    assert reads, seen
    return reads


def _plan(conn: sqlite3.Connection, sql: str) -> list[str]:
    return [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]


def _assert_no_full_scan(details: list[str]) -> None:
    for detail in details:
        if detail.startswith("SCAN"):
            # only the recursive CTE itself may be scanned, never the actions table
            assert detail in ("SCAN t", "SCAN tree"), details
    assert any(
        d.startswith("SEARCH") or "USING INDEX" in d or "USING COVERING INDEX" in d for d in details
    ), details


PLAN_CASES: list[tuple[str, Callable[[CausalChain], Any], tuple[str, ...]]] = [
    ("get_action", lambda c: c.get_action(uid(3)), ("(action_id=?)",)),
    ("actions_for_plan", lambda c: c.actions_for_plan("plan-1"), ("cassette_actions_by_plan",)),
    (
        "actions_for_intent",
        lambda c: c.actions_for_intent("intent-1"),
        ("cassette_actions_by_intent",),
    ),
    (
        "actions_for_session",
        lambda c: c.actions_for_session("s-1"),
        ("cassette_actions_by_session",),
    ),
    (
        "link-intent",
        lambda c: c.actions_for_link("intent_id", "why-1"),
        ("cassette_actions_by_link_intent",),
    ),
    (
        "link-rule",
        lambda c: c.actions_for_link("constitutional_rule_id", "rule-1"),
        ("cassette_actions_by_link_rule",),
    ),
    (
        "link-delegation",
        lambda c: c.actions_for_link("delegation_decision_id", "del-1"),
        ("cassette_actions_by_link_delegation",),
    ),
    (
        "link-attestation",
        lambda c: c.actions_for_link("capability_attestation_id", "att-1"),
        ("cassette_actions_by_link_attestation",),
    ),
    ("find-plan", lambda c: c.find_actions(plan_id="plan-1"), ("cassette_actions_by_plan",)),
    (
        "find-intent",
        lambda c: c.find_actions(intent_id="intent-1", limit=3),
        ("cassette_actions_by_intent",),
    ),
    ("find-session", lambda c: c.find_actions(session_id="s-0"), ("cassette_actions_by_session",)),
    (
        "find-type",
        lambda c: c.find_actions(action_type="PlanStarted"),
        ("cassette_actions_by_type",),
    ),
    (
        "find-plan-and-type",
        lambda c: c.find_actions(plan_id="plan-1", action_type="PlanCompleted"),
        ("USING INDEX",),
    ),
    (
        "find-all-three",
        lambda c: c.find_actions(plan_id="plan-1", intent_id="intent-1", session_id="s-1"),
        ("USING INDEX",),
    ),
    ("get_children", lambda c: c.get_children(uid(1)), ("cassette_actions_by_parent",)),
    ("get_parent", lambda c: c.get_parent(uid(5)), ("(action_id=?)",)),
    (
        "subtree",
        lambda c: c.subtree(uid(0)),
        ("SEARCH a USING INDEX cassette_actions_by_parent (parent_action_id=?)",),
    ),
]


@pytest.mark.sqlite_only(
    reason="SQLite's EXPLAIN QUERY PLAN of the statements traced on its sqlite3 connection"
)
@pytest.mark.parametrize(
    ("call", "needles"), [pytest.param(c, n, id=name) for name, c, n in PLAN_CASES]
)
def test_query_plans_use_indexes(
    queried: CausalChain, call: Callable[[CausalChain], Any], needles: tuple[str, ...]
) -> None:
    statements = _statements(queried, lambda: call(queried))
    plans = [_plan(queried.conn, sql) for sql in statements]
    for details in plans:
        _assert_no_full_scan(details)
    # the statement that returns rows uses the index meant for it
    main = plans[-1]
    for needle in needles:
        assert any(needle in d for d in main), (needle, main)


@pytest.mark.sqlite_only(reason="SQLite's EXPLAIN QUERY PLAN of the recursive CTE")
def test_the_subtree_recursion_searches_by_parent(queried: CausalChain) -> None:
    from catalytic_cassette import chain as chain_module

    details = _plan(queried.conn, chain_module._SUBTREE.replace("?", f"'{uid(0)}'"))
    _assert_no_full_scan(details)
    step = details.index("RECURSIVE STEP")
    assert any(
        d.startswith("SEARCH") and "cassette_actions_by_parent" in d for d in details[step:]
    ), details


# ---------------------------------------------------------------- 5. sessions


def test_opening_loads_nothing(db_path: Path, clock: ManualClock) -> None:
    with CausalChain(db_path, clock=clock) as first:
        first.append_actions([act(session_id="s"), act(session_id="t")])
        first.load_session("s")
        assert first.loaded_sessions == ("s",)
    with CausalChain(db_path, clock=clock) as second:
        assert second.loaded_sessions == ()
        assert len(second.actions_for_session("s")) == 1
        assert second.loaded_sessions == ()


def test_load_session_builds_an_indexed_working_set(queried: CausalChain) -> None:
    working = queried.load_session("s-1")
    assert queried.loaded_sessions == ("s-1",)
    expected = _expected(lambda s: s["session_id"] == "s-1")
    assert working.session_id == "s-1"
    assert len(working) == len(expected)
    assert ids(working.actions()) == expected
    assert set(working.by_id) == set(expected)
    assert all(a.session_id == "s-1" for a in working.actions())
    assert uid(2) not in working and uid(0) not in working and uid(1) in working
    got = working.get(uid(3))
    assert got is not None and got == queried.get_action(uid(3))
    for spec in SPECS:
        if spec["session_id"] == "s-1":
            kids = _expected(
                lambda s, sp=spec: (
                    s["parent_action_id"] == sp["action_id"] and s["session_id"] == "s-1"
                )
            )
            assert ids(working.children_of(spec["action_id"])) == kids
    for k in range(3):
        assert ids(working.plan(f"plan-{k}")) == _expected(
            lambda s, k=k: s["session_id"] == "s-1" and s["plan_id"] == f"plan-{k}"
        )
    assert working.plan("nope") == [] and working.get(MISSING_ID) is None


@pytest.mark.sqlite_only(
    reason="traces COMMIT on the package's sqlite3 connection (set_trace_callback)"
)
def test_appends_join_a_loaded_session_only_after_commit(chain: CausalChain) -> None:
    root = chain.append_action(act(action_id=uid(0), session_id="s"))
    working = chain.load_session("s")
    assert ids(working.actions()) == [root.action_id]

    in_set_at_commit: list[bool] = []

    def trace(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            in_set_at_commit.append(uid(1) in working)

    chain.conn.set_trace_callback(trace)
    try:
        stored = chain.append_action(act(action_id=uid(1), parent_action_id=uid(0), session_id="s"))
    finally:
        chain.conn.set_trace_callback(None)
    assert in_set_at_commit == [False]
    assert working.get(uid(1)) == stored
    assert stored.action_seq is not None and stored.timestamp is not None
    assert ids(working.children_of(uid(0))) == [uid(1)]
    assert ids(working.plan("plan")) == [uid(0), uid(1)]

    # a refused batch leaves the working set as it was
    with pytest.raises(CassetteError):
        chain.append_actions(
            [act(action_id=uid(2), session_id="s"), act(parent_action_id=MISSING_ID)]
        )
    assert ids(working.actions()) == [uid(0), uid(1)]
    assert ids(working.children_of(uid(0))) == [uid(1)]
    with pytest.raises(CassetteError):
        chain.append_action(act(action_id=uid(1), session_id="s"))  # a duplicate id
    assert len(working) == 2

    # another session's actions never enter it, and no working set appears for them
    chain.append_action(act(action_id=uid(3), session_id="other"))
    chain.append_action(act(action_id=uid(4)))
    assert ids(working.actions()) == [uid(0), uid(1)]
    assert chain.loaded_sessions == ("s",)


def test_unload_evicts_and_later_appends_do_not_reload(chain: CausalChain) -> None:
    chain.append_action(act(action_id=uid(0), session_id="s"))
    working = chain.load_session("s")
    chain.load_session("t")
    assert chain.loaded_sessions == ("s", "t")
    chain.unload_session("s")
    chain.unload_session("never-loaded")  # harmless
    assert chain.loaded_sessions == ("t",)
    chain.append_action(act(action_id=uid(1), session_id="s"))
    assert chain.loaded_sessions == ("t",)
    assert ids(working.actions()) == [uid(0)]  # the evicted set is no longer fed
    reloaded = chain.load_session("s")
    assert ids(reloaded.actions()) == [uid(0), uid(1)]
    fed = chain.load_session("t")
    chain.append_action(act(action_id=uid(2), session_id="t"))
    assert ids(fed.actions()) == [uid(2)]


# --------------------------------------------------------------- 6. artifacts

THRESHOLD = 64


@pytest.fixture
def artifacts(backend: Ledger, tmp_path: Path) -> Path:
    """Where the ledger keeps artifact files: by default beside a SQLite file; a
    PostgreSQL ledger keeps them only in a folder it is given (``artifact_dir``)."""
    if backend.postgresql:
        return tmp_path / "artifacts"
    return Path(f"{backend.target}.artifacts")


def artifact_options(backend: Ledger, artifacts: Path) -> dict[str, Any]:
    """What opens the ledger with its artifact folder (SQLite's default is not passed)."""
    return {"artifact_dir": artifacts} if backend.postgresql else {}


@pytest.fixture
def small(
    db_path: Path, clock: ManualClock, backend: Ledger, artifacts: Path
) -> Iterator[CausalChain]:
    options = artifact_options(backend, artifacts)
    with CausalChain(db_path, clock=clock, artifact_threshold=THRESHOLD, **options) as opened:
        yield opened


def _digest(value: Any) -> str:
    return hashlib.sha256(payloads.dumps(value).encode("utf-8")).hexdigest()


BIG_ARGS = ["a" * 200, {"k": list(range(30))}]
BIG_RESULT = {"text": "r" * 300, "ok": True}


def test_large_values_live_in_artifact_files(
    small: CausalChain, db_path: Path, artifacts: Path
) -> None:
    stored = small.append_action(act(arguments=BIG_ARGS, result=BIG_RESULT))
    row = raw_row(small, stored.action_id)
    assert row["arguments_json"] is None and row["result_json"] is None
    for column, value in (("arguments_artifact", BIG_ARGS), ("result_artifact", BIG_RESULT)):
        ref = json.loads(row[column])
        data = payloads.dumps(value).encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        assert ref == {"sha256": digest, "size": len(data), "path": f"{artifacts.name}/{digest}"}
        file = artifacts / digest
        assert file.read_bytes() == data
    read = small.get_action(stored.action_id)
    assert read.arguments == BIG_ARGS and read.result == BIG_RESULT
    assert small.actions_for_plan("plan")[0].arguments == BIG_ARGS
    assert verify_path(str(db_path), artifact_root=artifacts).ok


def test_the_threshold_is_inclusive(small: CausalChain) -> None:
    exact = ["x" * (THRESHOLD - 4)]  # ["xx..."] is THRESHOLD bytes
    over = ["x" * (THRESHOLD - 3)]
    assert len(payloads.dumps(exact)) == THRESHOLD
    inline = raw_row(small, small.append_action(act(arguments=exact)).action_id)
    assert inline["arguments_json"] == payloads.dumps(exact)
    assert inline["arguments_artifact"] is None
    moved = raw_row(small, small.append_action(act(arguments=over)).action_id)
    assert moved["arguments_json"] is None
    assert json.loads(moved["arguments_artifact"])["size"] == THRESHOLD + 1


def test_same_content_is_one_file_never_rewritten(
    small: CausalChain, db_path: Path, artifacts: Path
) -> None:
    value = ["same" * 40]
    first = small.append_action(act(arguments=value, result=value))
    files = sorted(p.name for p in artifacts.iterdir())
    assert files == [_digest(value)]
    target = artifacts / files[0]
    os.utime(target, ns=(1_000_000_000, 1_000_000_000))  # an old, recognisable mtime
    before = target.stat()
    second = small.append_actions([act(arguments=value), act(result=value)])
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    assert sorted(p.name for p in artifacts.iterdir()) == files  # no temp files
    for action in (first, *second):
        row = raw_row(small, action.action_id)
        refs = [row["arguments_artifact"], row["result_artifact"]]
        assert any(r is not None and _digest(value) in r for r in refs)


@pytest.mark.sqlite_only(
    reason="traces the INSERT and COMMIT on the package's sqlite3 connection (set_trace_callback)"
)
def test_the_file_exists_before_the_row(small: CausalChain, db_path: Path, artifacts: Path) -> None:
    value = ["before" * 30]
    target = artifacts / _digest(value)
    present_at: dict[str, bool] = {}

    def trace(sql: str) -> None:
        text = sql.strip().upper()
        if text.startswith("INSERT INTO CASSETTE_ACTIONS"):
            present_at["insert"] = target.is_file()
        elif text == "COMMIT":
            present_at["commit"] = target.is_file()

    small.conn.set_trace_callback(trace)
    try:
        small.append_action(act(arguments=value))
    finally:
        small.conn.set_trace_callback(None)
    assert present_at == {"insert": True, "commit": True}


def test_a_refused_append_may_leave_a_file_but_never_a_row(
    small: CausalChain, db_path: Path, artifacts: Path, backend: Ledger
) -> None:
    value = ["orphan" * 30]
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        small.append_action(act(arguments=value, parent_action_id=MISSING_ID))
    refused(excinfo, ErrorCode.REFERENCE_MISSING)
    assert dump(db_path) == before
    assert (artifacts / _digest(value)).is_file()
    assert verify_path(str(db_path)).ok  # an unreferenced file is harmless
    # and every row that names an artifact has its file
    stored = small.append_action(act(arguments=value))
    ref = json.loads(raw_row(small, stored.action_id)["arguments_artifact"])
    assert (artifacts / ref["sha256"]).is_file()
    if not backend.postgresql:  # the path it records is relative to the SQLite file
        assert (Path(db_path).parent / ref["path"]).is_file()


def _break_artifact(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "flipped":
        data = bytearray(path.read_bytes())
        data[5] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(path.read_bytes() + b" ")


@pytest.mark.parametrize(
    ("how", "kind", "code"),
    [
        ("deleted", "artifact_missing", ErrorCode.ARTIFACT_MISSING),
        ("flipped", "artifact_altered", ErrorCode.ARTIFACT_CORRUPT),
        ("extended", "artifact_altered", ErrorCode.ARTIFACT_CORRUPT),
    ],
)
def test_a_broken_artifact_is_named(
    small: CausalChain, db_path: Path, artifacts: Path, how: str, kind: str, code: ErrorCode
) -> None:
    intact = small.append_action(act(action_id=uid(1), arguments=["fine" * 30]))
    broken = small.append_action(act(action_id=uid(2), result={"gone": "g" * 100}))
    assert verify_path(str(db_path), artifact_root=artifacts).ok
    _break_artifact(artifacts / _digest({"gone": "g" * 100}), how)
    report = verify_path(str(db_path), artifact_root=artifacts)
    assert not report.ok
    assert kinds_for(report, broken.action_id) == {kind}
    assert kinds_for(report, intact.action_id) == set()
    with pytest.raises(CassetteError) as excinfo:
        small.get_action(broken.action_id)
    refused(excinfo, code)
    assert small.get_action(intact.action_id).arguments == ["fine" * 30]


# ----------------------------------------------------------------- 7. signing


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return signing.generate(str(tmp_path / "signer"))


def test_generate_writes_a_private_and_public_key(keys: tuple[Path, Path], tmp_path: Path) -> None:
    key_path, pub_path = keys
    assert key_path == tmp_path / "signer.key" and pub_path == tmp_path / "signer.pub"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in key_path.read_bytes()
    assert b"PUBLIC KEY" in pub_path.read_bytes() and b"PRIVATE" not in pub_path.read_bytes()
    private = signing.load_private(key_path)
    assert signing.key_id(private.public_key()) == signing.key_id(signing.load_public(pub_path))
    saved = (key_path.read_bytes(), pub_path.read_bytes())
    with pytest.raises(CassetteError) as excinfo:
        signing.generate(str(tmp_path / "signer"))
    refused(excinfo, ErrorCode.KEY_ERROR)
    assert (key_path.read_bytes(), pub_path.read_bytes()) == saved
    # one half present is enough to refuse, and the other half is not written
    key_path.unlink()
    with pytest.raises(CassetteError):
        signing.generate(str(tmp_path / "signer"))
    assert not key_path.exists() and pub_path.read_bytes() == saved[1]


def _ledger_bytes(db: Path) -> bytes:
    return b"".join(
        Path(f"{db}{suffix}").read_bytes()
        for suffix in ("", "-wal", "-shm")
        if Path(f"{db}{suffix}").exists()
    )


def test_every_action_is_signed_and_the_key_stays_out(
    keys: tuple[Path, Path], db_path: Path, clock: ManualClock, backend: Ledger, artifacts: Path
) -> None:
    from cryptography.hazmat.primitives import serialization

    key_path, pub_path = keys
    private = signing.load_private(key_path)
    options = artifact_options(backend, artifacts)
    expected_id = signing.key_id(signing.load_public(pub_path))
    with CausalChain(
        db_path, clock=clock, signing_key=key_path, artifact_threshold=64, **options
    ) as chain:
        one = chain.append_action(act(action_id=uid(1), metadata={"intent_id": "w"}))
        more = chain.append_actions(
            [act(parent_action_id=uid(1), arguments=["big" * 40]), act(result={"r": 1})]
        )
        for action in (one, *more):
            stored = chain.get_action(action.action_id)
            assert stored.metadata["key_id"] == expected_id
            assert base64.b64decode(stored.metadata["signature"], validate=True)
            assert stored.metadata == action.metadata
        assert chain.get_action(uid(1)).metadata["intent_id"] == "w"
    with CausalChain(db_path, clock=clock, signing_key=private) as by_object:
        by_object.append_action(act(action_id=uid(4)))
        assert by_object.get_action(uid(4)).metadata["key_id"] == expected_id

    raw_private = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    pem_lines = [
        line for line in key_path.read_bytes().splitlines() if line and b"-----" not in line
    ]
    # every byte of the SQLite file; on PostgreSQL every row (the server's files are its own)
    on_disk = (
        b"\n".join(line.encode() for line in backend.dump())
        if backend.postgresql
        else _ledger_bytes(db_path)
    )
    assert on_disk
    for secret in [
        raw_private,
        raw_private.hex().encode(),
        base64.b64encode(raw_private),
        *pem_lines,
    ]:
        assert secret not in on_disk
    report = verify_path(str(db_path), public_key=signing.load_public(pub_path))
    assert report.ok, report.findings
    assert not any("public key" in note for note in report.notes)


def test_verify_names_unsigned_and_foreign_actions(
    keys: tuple[Path, Path], db_path: Path, clock: ManualClock, tmp_path: Path
) -> None:
    key_path, pub_path = keys
    with CausalChain(db_path, clock=clock, signing_key=key_path) as signed:
        signed.append_action(act(action_id=uid(1)))
    with CausalChain(db_path, clock=clock) as unsigned:
        unsigned.append_action(act(action_id=uid(2), parent_action_id=uid(1)))
    report = verify_path(str(db_path), public_key=signing.load_public(pub_path))
    assert not report.ok
    assert kinds_for(report, uid(2)) == {"unsigned_action"}
    assert kinds_for(report, uid(1)) == set()
    assert verify_path(str(db_path)).ok  # without a key, signatures are not checked

    _other_key, other_pub = signing.generate(str(tmp_path / "other"))
    foreign = verify_path(str(db_path), public_key=signing.load_public(other_pub))
    assert kinds_for(foreign, uid(1)) == {"unknown_key"}
    assert kinds_for(foreign, uid(2)) == {"unsigned_action"}


@pytest.mark.parametrize("edit", ["signature", "signature-garbage", "function_name"])
def test_an_edited_signed_row_is_a_bad_signature(
    keys: tuple[Path, Path], db_path: Path, clock: ManualClock, edit: str
) -> None:
    """A signed action's row edited by someone who owns the storage (SQLite's triggers
    dropped; PostgreSQL's superuser with triggers off): verify names the signature."""
    key_path, pub_path = keys
    with CausalChain(db_path, clock=clock, signing_key=key_path) as chain:
        first = chain.append_action(act(action_id=uid(1)))
        second = chain.append_action(act(action_id=uid(2)))
    if edit == "function_name":
        change = "function_name = 'forged'"
    else:  # a real signature, but of another action; or none at all
        signature = second.metadata["signature"] if edit == "signature" else "not base64!"
        assert signature != first.metadata["signature"]
        metadata = json.dumps({**first.metadata, "signature": signature})
        change = f"metadata_json = {sql_literal(metadata)}"
    tamper(db_path, f"UPDATE cassette_actions SET {change} WHERE action_id = '{uid(1)}'")
    report = verify_path(str(db_path), public_key=signing.load_public(pub_path))
    found = kinds_for(report, uid(1))
    assert "bad_signature" in found
    assert "state_mismatch" in found
    assert kinds_for(report, uid(2)) == set()


# --------------------------------------------------------------------- 8. CLI


def invoke(db: Path | str, *args: str, stdin: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args], input=stdin)


def out(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None
    return json.loads(result.stdout)


def assert_refused(result: Result, code: str, exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    match = CODE_LINE.match(lines[0])
    assert match is not None and match.group(1) == code, lines[0]


def _append(db: Path, value: Any, *extra: str) -> Result:
    return invoke(db, "action", "append", "--actions", "-", *extra, stdin=json.dumps(value))


@pytest.fixture
def cli_db(db_path: Path) -> Path:
    return db_path


def test_cli_append_one_object_and_show(cli_db: Path) -> None:
    stored = out(_append(cli_db, act(action_id=uid(1), arguments=[1, "a"], cost=0.25)))
    assert isinstance(stored, list) and len(stored) == 1
    assert stored[0]["action_id"] == uid(1)
    assert stored[0]["action_seq"] == 1 and isinstance(stored[0]["timestamp"], int)
    shown = out(invoke(cli_db, "action", "show", uid(1)))
    assert shown == stored[0]
    assert shown["arguments"] == [1, "a"] and shown["cost"] == 0.25
    assert_refused(invoke(cli_db, "action", "show", MISSING_ID), "NOT_FOUND")


def test_cli_append_an_array_is_one_transaction(cli_db: Path) -> None:
    out(_append(cli_db, act(action_id=uid(0))))
    before = dump(cli_db)
    bad = [act(action_id=uid(1)), act(action_id=uid(2), parent_action_id=MISSING_ID)]
    assert_refused(_append(cli_db, bad), "REFERENCE_MISSING")
    assert dump(cli_db) == before
    good = [
        act(action_id=uid(1), parent_action_id=uid(0)),
        act(action_id=uid(2), parent_action_id=uid(1)),
    ]
    stored = out(_append(cli_db, good))
    assert [a["action_id"] for a in stored] == [uid(1), uid(2)]
    assert stored[0]["timestamp"] == stored[1]["timestamp"]
    assert stored[1]["action_seq"] == stored[0]["action_seq"] + 1


@pytest.mark.parametrize(
    ("stdin", "code"),
    [
        ("{not json", "INVALID_PAYLOAD"),
        (b"\xff\xfe", "INVALID_PAYLOAD"),
        ('"a string"', "INVALID_PAYLOAD"),
        (json.dumps(act(action_type="Nope")), "INVALID_ACTION_TYPE"),
        (json.dumps(act(parent_action_id=MISSING_ID)), "REFERENCE_MISSING"),
        (json.dumps(act(arguments={"a": 1})), "INVALID_ARGUMENTS"),
    ],
    ids=["not-json", "not-utf8", "not-object", "type", "parent", "arguments"],
)
def test_cli_append_refusals(cli_db: Path, stdin: str | bytes, code: str) -> None:
    out(_append(cli_db, act()))
    before = dump(cli_db)
    assert_refused(invoke(cli_db, "action", "append", "--actions", "-", stdin=stdin), code)
    assert dump(cli_db) == before


@pytest.fixture
def cli_ledger(cli_db: Path) -> Path:
    items = [
        act(
            action_id=uid(0), plan_id="P", intent_id="I", session_id="S", action_type="PlanStarted"
        ),
        act(action_id=uid(1), parent_action_id=uid(0), plan_id="P", intent_id="J"),
        act(action_id=uid(2), parent_action_id=uid(0), plan_id="Q", intent_id="I", session_id="S"),
        act(action_id=uid(3), parent_action_id=uid(1), plan_id="P", intent_id="I", session_id="T"),
    ]
    out(_append(cli_db, items))
    return cli_db


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), [0, 1, 2, 3]),
        (("--plan", "P"), [0, 1, 3]),
        (("--intent", "I"), [0, 2, 3]),
        (("--session", "S"), [0, 2]),
        (("--type", "InternalStep"), [1, 2, 3]),
        (("--plan", "P", "--type", "InternalStep"), [1, 3]),
        (("--plan", "P", "--limit", "2"), [0, 1]),
        (("--plan", "nope"), []),
    ],
    ids=["all", "plan", "intent", "session", "type", "plan-type", "limit", "none"],
)
def test_cli_actions_filters(cli_ledger: Path, args: tuple[str, ...], expected: list[int]) -> None:
    listed = out(invoke(cli_ledger, "actions", *args))
    assert [a["action_id"] for a in listed] == [uid(n) for n in expected]


def test_cli_actions_output_modes(cli_ledger: Path) -> None:
    default = invoke(cli_ledger, "actions", "--plan", "P")
    as_json = out(default)
    assert default.stdout.startswith("[\n")
    lines = invoke(cli_ledger, "actions", "--plan", "P", "--nl")
    assert lines.exit_code == 0, lines.stderr
    per_line = [json.loads(line) for line in lines.stdout.splitlines()]
    assert per_line == as_json and len(per_line) == 3
    table = invoke(cli_ledger, "actions", "--plan", "P", "-t")
    assert table.exit_code == 0, table.stderr
    rows = table.stdout.splitlines()
    header = rows[0].split()
    assert header[:4] == ["plan_id", "intent_id", "action_type", "function_name"]
    assert "action_id" in header and "action_seq" in header
    assert set(rows[1].replace(" ", "")) == {"-"}
    assert len(rows) == 2 + 3
    for row, item in zip(rows[2:], as_json, strict=True):
        assert item["action_id"] in row
    long_form = invoke(cli_ledger, "actions", "--table", "--limit", "1")
    assert long_form.exit_code == 0 and len(long_form.stdout.splitlines()) == 3
    assert invoke(cli_ledger, "actions", "--limit", "0").exit_code == 2


def test_cli_children_and_parent(cli_ledger: Path) -> None:
    kids = out(invoke(cli_ledger, "children", uid(0)))
    assert [k["action_id"] for k in kids] == [uid(1), uid(2)]
    nl = invoke(cli_ledger, "children", uid(0), "--nl")
    assert [json.loads(x)["action_id"] for x in nl.stdout.splitlines()] == [uid(1), uid(2)]
    assert out(invoke(cli_ledger, "children", uid(3))) == []
    assert out(invoke(cli_ledger, "parent", uid(3)))["action_id"] == uid(1)
    root = invoke(cli_ledger, "parent", uid(0))
    assert out(root) is None and root.stdout.strip() == "null"
    assert_refused(invoke(cli_ledger, "children", MISSING_ID), "NOT_FOUND")
    assert_refused(invoke(cli_ledger, "parent", MISSING_ID), "NOT_FOUND")


def test_cli_keygen_sign_and_verify(cli_db: Path, tmp_path: Path) -> None:
    prefix = str(tmp_path / "cli-key")
    made = out(CliRunner().invoke(cli, ["keygen", "--out", prefix]))
    assert made["private_key"] == f"{prefix}.key" and made["public_key"] == f"{prefix}.pub"
    assert made["key_id"] == signing.key_id(signing.load_public(f"{prefix}.pub"))
    assert stat.S_IMODE(os.stat(f"{prefix}.key").st_mode) == 0o600
    assert_refused(CliRunner().invoke(cli, ["keygen", "--out", prefix]), "KEY_ERROR")

    stored = out(_append(cli_db, [act(), act(session_id="s")], "--signing-key", f"{prefix}.key"))
    assert all(a["metadata"]["key_id"] == made["key_id"] for a in stored)
    passed = invoke(cli_db, "verify", "--action-key", f"{prefix}.pub")
    assert passed.exit_code == 0, (passed.stdout, passed.stderr)
    assert "PASS" in passed.stderr

    as_json = invoke(cli_db, "verify", "--json", "--action-key", f"{prefix}.pub")
    assert as_json.exit_code == 0
    report = json.loads(as_json.stdout)
    assert report["ok"] is True and report["findings"] == []
    assert report["journal_rows"] == 2

    missing = invoke(cli_db, "verify", "--action-key", str(tmp_path / "missing.pub"))
    assert_refused(missing, "NOT_FOUND", exit_code=2)  # a missing input file: usage, exit 2
    bad_key = invoke(
        cli_db,
        "action",
        "append",
        "--actions",
        "-",
        "--signing-key",
        "nope.key",
        stdin=json.dumps(act()),
    )
    assert_refused(bad_key, "NOT_FOUND", exit_code=2)

    out(_append(cli_db, act(action_id=uid(9))))  # unsigned
    failed = invoke(cli_db, "verify", "--json", "--action-key", f"{prefix}.pub")
    assert failed.exit_code == 1
    found = json.loads(failed.stdout)
    assert found["ok"] is False
    assert [(f["kind"], f["key"]) for f in found["findings"]] == [("unsigned_action", uid(9))]


def test_cli_verify_json_without_a_key(cli_ledger: Path) -> None:
    result = invoke(cli_ledger, "verify", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert any("public key" in note for note in report["notes"])


def test_cli_migrate_check_and_apply(tmp_path: Path, cli_ledger: Path) -> None:
    current = invoke(cli_ledger, "migrate", "--check")
    assert out(current)["pending"] == []
    assert out(current)["latest"] == backends.schema_version(cli_ledger)
    if backends.is_postgresql(cli_ledger):
        return  # what follows makes a fresh SQLite file
    fresh = tmp_path / "fresh.db"
    check = invoke(fresh, "migrate", "--check")
    assert check.exit_code == 1
    assert json.loads(check.stdout)["pending"] == list(range(1, current_version() + 1))
    assert not fresh.exists()  # a check writes nothing

    applied = out(invoke(fresh, "migrate"))
    assert applied["applied"] == list(range(1, current_version() + 1))
    assert applied["schema_version"] == current_version()
    assert out(invoke(fresh, "migrate", "--check"))["pending"] == []
    assert out(invoke(fresh, "migrate"))["applied"] == []
    assert out(invoke(fresh, "actions")) == []
