"""The causal chain on PostgreSQL (issue 15): the same API, codes and journal bytes as the
SQLite ledger, held by the server (migration 0004_actions.sql).

1. The API on both backends: appends, batches, reads, checkpoints, pause and resume, plan
   status, refusals; a seeded random walk of lifecycle moves gets the same answer from both.
2. Raw SQL: the same rows inserted by hand get the same code on both; as the table's owner
   UPDATE, DELETE and TRUNCATE are refused; under the appender role only its functions
   write, and they refuse as SQLite does; the auditor reads and nothing else.
3. The journal: every entry the PostgreSQL ledger wrote for actions and checkpoints has the
   body, leaf hash and chain hash the SQLite ledger writes for the same rows.
4. Every public method of CausalChain runs on PostgreSQL or raises BACKEND_UNSUPPORTED.
"""

from __future__ import annotations

import inspect
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.actions import COLUMNS, Action
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.errors import translate
from catalytic_cassette.ledger import LedgerFile
from catalytic_cassette.plans import checkpoint_id_for, checkpoint_text
from catalytic_cassette.verify import verify_path

psycopg = pytest.importorskip("psycopg")

from catalytic_cassette.postgresql import connection as pg_connection  # noqa: E402
from catalytic_cassette.postgresql.chain import PgCausalChain  # noqa: E402
from catalytic_cassette.postgresql.ledger import PgLedger  # noqa: E402

MISSING_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
JOURNAL = "SELECT seq, body, leaf_hash, chain_hash, tbl, row_key FROM cassette_journal ORDER BY seq"
QUOTED = '"timestamp"'


def _checkpoint_row(text: str) -> dict[str, Any]:
    return {"checkpoint_id": checkpoint_id_for(text), "plan_id": "q", "context_json": text}


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def act(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "plan_id": "plan",
        "intent_id": "intent",
        "action_type": "InternalStep",
        "function_name": "fn",
    }
    base.update(fields)
    return base


def code_of(call: Callable[[], Any]) -> str:
    """The code a call is refused with, or ACCEPTED."""
    try:
        call()
    except CassetteError as error:
        return error.code.value
    return "ACCEPTED"


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new ledger: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "chain.db")
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def chain(target: str) -> Iterator[CausalChain]:
    with CausalChain(target) as opened:
        yield opened


@pytest.fixture
def pg_chain(pg_database: str) -> Iterator[CausalChain]:
    with CausalChain(pg_database) as opened:
        yield opened


@pytest.fixture
def sqlite_chain(tmp_path: Path) -> Iterator[CausalChain]:
    with CausalChain(tmp_path / "twin.db") as opened:
        yield opened


# ------------------------------------------------------------------ 1. the API


def test_a_postgresql_url_opens_the_postgresql_chain(pg_database: str) -> None:
    with CausalChain(pg_database) as chain:
        assert type(chain) is PgCausalChain
        assert isinstance(chain, CausalChain)


def test_appends_return_the_rows_as_stored(chain: CausalChain) -> None:
    started = chain.append_action(act(action_id=uid(1), action_type="PlanStarted"))
    batch = chain.append_actions(
        [
            act(
                action_id=uid(2),
                parent_action_id=uid(1),
                session_id="s",
                arguments=[1, "two", {"three": None}],
                result={"quote": '"', "nul": "\x00", "tab": "\t", "é": "☃"},
                success=False,
                error_message="it broke",
                cost=1.25,
                duration_ms=7,
                metadata={"constitutional_rule_id": "r-1"},
                caused_by=uid(1),
                rationale="because",
                category="decision",
            ),
            act(action_id=uid(3), parent_action_id=uid(2), session_id="s"),
        ]
    )
    assert [started.action_seq, *(a.action_seq for a in batch)] == [1, 2, 3]
    assert batch[0].timestamp == batch[1].timestamp  # one transaction, one time
    assert started.timestamp is not None and batch[0].timestamp is not None
    assert started.timestamp <= batch[0].timestamp
    for stored in (started, *batch):
        assert chain.get_action(stored.action_id) == stored
    assert chain.get_action(uid(2)).result["nul"] == "\x00"


def test_a_refused_item_refuses_the_batch_and_is_named(chain: CausalChain) -> None:
    chain.append_action(act(action_id=uid(1)))
    items = [act(action_id=uid(2)), act(action_id=uid(3)), act(parent_action_id=MISSING_ID)]
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions(items)
    assert excinfo.value.code is ErrorCode.REFERENCE_MISSING
    assert excinfo.value.detail["index"] == 2
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions([act(), act(action_type="Nope")])
    assert excinfo.value.code is ErrorCode.INVALID_ACTION_TYPE
    assert excinfo.value.detail["index"] == 1
    assert [a.action_id for a in chain.find_actions()] == [uid(1)]
    assert chain.append_action(act()).action_seq == 2  # dense after the refusals


@pytest.mark.parametrize(
    ("item", "code"),
    [
        (act(action_id="ABC"), "INVALID_ACTION_ID"),
        (act(plan_id=""), "INVALID_PLAN_ID"),
        (act(category="gossip"), "INVALID_CATEGORY"),
        (act(arguments={"a": 1}), "INVALID_ARGUMENTS"),
        (act(cost=-1), "INVALID_COST"),
        (act(parent_action_id=MISSING_ID), "REFERENCE_MISSING"),
        (act(caused_by=MISSING_ID), "REFERENCE_MISSING"),
        (act(action_type="PlanPaused"), "PLAN_NOT_STARTED"),
        (act(action_type="PlanStarted", metadata={"plan_body": 3}), "INVALID_PLAN_BODY"),
        (
            act(action_type="PlanStarted", metadata={"plan_body": "b", "plan_hash": "0" * 64}),
            "PLAN_HASH_MISMATCH",
        ),
        (act(metadata={"plan_body": "b"}), "INVALID_PLAN_BODY"),
        (act(metadata={"suggested_causes": [{"action_id": uid(1)}]}), "INVALID_METADATA"),
        (
            act(metadata={"suggested_causes": [{"action_id": MISSING_ID, "reason": "r"}]}),
            "REFERENCE_MISSING",
        ),
        (act(metadata={"checkpoint_id": "cp-" + "0" * 64}), "REFERENCE_MISSING"),
        (act(metadata={"n": 2**64}), "INVALID_PAYLOAD"),
        (act(arguments=[1e308 * 10]), "INVALID_PAYLOAD"),
    ],
)
def test_refusals_have_the_same_codes(chain: CausalChain, item: dict[str, Any], code: str) -> None:
    assert code_of(lambda: chain.append_action(item)) == code
    assert chain.find_actions() == []


def test_queries(chain: CausalChain) -> None:
    chain.append_action(act(action_id=uid(1), session_id="s1"))
    chain.append_actions(
        [
            act(action_id=uid(n), parent_action_id=uid(n // 2))
            | {"plan_id": f"p{n % 2}", "intent_id": f"i{n % 3}", "session_id": f"s{n % 2}"}
            | {"action_type": ("CapabilityCall", "InternalStep")[n % 2], "function_name": f"f{n}"}
            for n in range(2, 12)
        ]
    )
    seqs = {a.action_id: a.action_seq for a in chain.find_actions()}
    assert list(seqs.values()) == list(range(1, 12))

    def ids(actions: list[Action]) -> list[int]:
        return [seqs[a.action_id] for a in actions]

    assert ids(chain.actions_for_plan("p0")) == [2, 4, 6, 8, 10]
    assert ids(chain.actions_for_intent("i1")) == [4, 7, 10]
    assert ids(chain.actions_for_session("s1")) == [1, 3, 5, 7, 9, 11]
    assert ids(chain.find_actions(plan_id="p1", action_type="InternalStep")) == [3, 5, 7, 9, 11]
    assert ids(chain.find_actions(function_name="f5")) == [5]
    assert ids(chain.find_actions(since_seq=8)) == [9, 10, 11]
    assert ids(chain.find_actions(newest_first=True, limit=3)) == [11, 10, 9]
    assert ids(list(chain.iter_actions(limit=2, offset=3))) == [4, 5]
    assert ids(chain.find_actions(after=0, before=1)) == []
    assert ids(chain.get_children(uid(1))) == [2, 3]
    assert ids(chain.get_children(uid(3))) == [6, 7]
    assert ids(chain.subtree(uid(2))) == [2, 4, 5, 8, 9, 10, 11]
    assert chain.get_parent(uid(1)) is None
    parent = chain.get_parent(uid(9))
    assert parent is not None and parent.action_id == uid(4)
    latest = chain.latest(plan_id="p0")
    assert latest is not None and latest.action_id == uid(10)
    assert chain.latest(plan_id="nothing") is None
    for call in (
        lambda: chain.get_action(MISSING_ID),
        lambda: chain.get_children(MISSING_ID),
        lambda: chain.subtree(MISSING_ID),
    ):
        assert code_of(call) == "NOT_FOUND"
    for bad in ({"limit": 0}, {"offset": -1}, {"since_seq": "3"}, {"limit": True}):
        assert code_of(lambda bad=bad: chain.iter_actions(**bad)) == "INVALID_ARGUMENT"
    chain.load_session("s0")
    assert chain.loaded_sessions == ("s0",)


def test_checkpoints_pause_resume_and_status(chain: CausalChain) -> None:
    started = chain.append_action(
        act(plan_id="p", action_type="PlanStarted", metadata={"plan_body": "1. look\n"})
    )
    step = chain.append_action(
        act(
            plan_id="p",
            action_type="PlanStepStarted",
            parent_action_id=started.action_id,
            metadata={"retries": {"max": 1}, "timeout_ms": 5},
            cost=0.5,
            duration_ms=3,
        )
    )
    chain.append_action(
        act(plan_id="p", action_type="PlanStepRetrying", parent_action_id=step.action_id)
    )
    saved = chain.save_checkpoint("p", {"k": [1, 2]})
    assert saved == checkpoint_id_for(checkpoint_text("p", {"k": [1, 2]}))
    assert chain.save_checkpoint("p", {"k": [1, 2]}) == saved  # idempotent
    assert chain.load_checkpoint(saved)["context"] == {"k": [1, 2]}
    assert chain.latest_checkpoint("p") is not None
    assert code_of(lambda: chain.load_checkpoint("cp-" + "1" * 64)) == "NOT_FOUND"
    assert code_of(lambda: chain.save_checkpoint("", {})) == "INVALID_PLAN_ID"
    assert code_of(lambda: chain.resume("p")) == "PLAN_NOT_PAUSED"
    paused = chain.pause("p", {"resume": "here"})
    assert paused.parent_action_id == started.action_id
    latest = chain.latest_checkpoint("p")
    assert latest is not None and latest["context"] == {"resume": "here"}
    assert code_of(lambda: chain.pause("p", {"again": 1})) == "PLAN_NOT_RUNNING"
    assert chain.latest_checkpoint("p") == latest  # the refused pause stored nothing
    status = chain.plan_status("p")
    assert status["state"] == "paused" and status["actions"] == 4
    assert status["total_cost"] == 0.5 and status["total_duration_ms"] == 3
    assert status["steps"][0]["retries"] == 1 and status["steps"][0]["max_retries"] == 1
    assert status["steps"][0]["timeout_ms"] == 5
    assert type(status["total_duration_ms"]) is int
    resumed = chain.resume("p")
    assert resumed["context"] == {"resume": "here"}
    assert resumed["action"].metadata["checkpoint_id"] == latest["checkpoint_id"]
    assert chain.plan_status("p")["state"] == "running"
    assert chain.plan_body("p")["plan_body"] == "1. look\n"
    assert code_of(lambda: chain.plan_body("nope")) == "NOT_FOUND"
    assert code_of(lambda: chain.plan_status("nope")) == "NOT_FOUND"
    assert code_of(lambda: chain.resume("nope")) == "PLAN_NOT_PAUSED"
    assert code_of(lambda: chain.pause("nope", {})) == "PLAN_NOT_STARTED"


def test_a_random_walk_of_the_lifecycle_gets_the_same_answers(
    sqlite_chain: CausalChain, pg_chain: CausalChain
) -> None:
    """Seeded random moves over three plans, each made on both ledgers: the same code or
    the same accepted row, every time."""
    rng = random.Random(15)
    types = [
        "PlanStarted",
        "PlanPaused",
        "PlanResumed",
        "PlanCompleted",
        "PlanAborted",
        "PlanStepStarted",
        "PlanStepStarted",
        "PlanStepRetrying",
        "PlanStepCompleted",
        "PlanStepFailed",
        "PlanStepRetrying",
        "InternalStep",
    ]
    made: dict[str, list[str]] = {"p0": [], "p1": [], "p2": []}
    checkpoints: list[str] = []
    answers = []
    for n in range(1, 241):
        plan = f"p{rng.randrange(3)}"
        kind = rng.choice(types)
        item = act(action_id=uid(n), plan_id=plan, action_type=kind)
        if made[plan] and rng.random() < 0.9:
            item["parent_action_id"] = rng.choice(made[plan][-4:])
        if kind == "PlanStepStarted":
            item["metadata"] = rng.choice(
                [{}, {"retries": {"max": rng.randrange(3)}}, {"retries": {"max": -1}},
                 {"timeout_ms": 1.5}, {"retries": {"max": 1e2}}]
            )  # fmt: skip
        if checkpoints and rng.random() < 0.2:
            item["metadata"] = {"checkpoint_id": rng.choice(checkpoints)}
        if rng.random() < 0.1:
            saved = [
                code_of(lambda c=c, p=plan, k=n: checkpoints.append(c.save_checkpoint(p, {"n": k})))
                for c in (sqlite_chain, pg_chain)
            ]
            assert saved[0] == saved[1]
        results = [
            code_of(lambda c=c, i=item: c.append_action(i)) for c in (sqlite_chain, pg_chain)
        ]
        assert results[0] == results[1], (n, item, results)
        answers.append(results[0])
        if results[0] == "ACCEPTED":
            made[plan].append(uid(n))
    assert len(set(answers)) >= 9, sorted(set(answers))  # the walk met most rules
    for plan in ("p0", "p1", "p2"):
        states = [code_of(lambda c=c, p=plan: c.plan_status(p)) for c in (sqlite_chain, pg_chain)]
        assert states[0] == states[1]
    assert [a.action_id for a in sqlite_chain.find_actions()] == [
        a.action_id for a in pg_chain.find_actions()
    ]


def test_the_chain_shares_the_ledger_with_the_message_cassette(pg_database: str) -> None:
    with MessageCassette(pg_database) as cassette, CausalChain(pg_database) as chain:
        cassette.post_message({"nul": "\x00"}, run_id="r", source="USER")
        chain.append_action(act(arguments=["\x00"]))
        assert chain.find_actions()[0].arguments == ["\x00"]


# -------------------------------------------------------------------- 2. raw SQL

_RAW_BASE: dict[str, Any] = {
    "action_id": uid(900),
    "plan_id": "q",
    "intent_id": "i",
    "action_type": "InternalStep",
    "function_name": "f",
    "success": 1,
    "cost_micros": 0,
    "duration_ms": 0,
    "metadata_json": "{}",
}
_REF = '{"sha256":"' + "0" * 64 + '","size":1}'
RAW_ROWS: list[dict[str, Any]] = [
    {},
    {"plan_id": "p", "parent_action_id": MISSING_ID, "caused_by": MISSING_ID},
    {"parent_action_id": MISSING_ID, "caused_by": MISSING_ID},
    {"action_type": "PlanPaused", "parent_action_id": MISSING_ID},
    {"action_type": "PlanPaused", "metadata_json": "[]"},
    {"action_type": "PlanPaused", "metadata_json": "{"},
    {"plan_id": "p", "action_type": "Hack"},
    {"parent_action_id": MISSING_ID, "action_type": "Hack"},
    {
        "plan_id": "p",
        "action_type": "PlanStarted",
        "metadata_json": '{"plan_body":"x","plan_hash":"' + "0" * 64 + '"}',
    },
    {"metadata_json": '{"plan_body":"x","plan_hash":"' + "0" * 64 + '"}', "action_type": "Hack"},
    {"action_id": "BAD", "plan_id": ""},
    {"action_id": uid(900).upper()},
    {"plan_id": "", "intent_id": ""},
    {"intent_id": "x" * 201},
    {"session_id": ""},
    {"function_name": ""},
    {"arguments_json": '{"a":1}', "metadata_json": "[]"},
    {"arguments_json": "[1,"},
    {"result_json": "{"},
    {"metadata_json": "nope"},
    {"arguments_json": "[1e999]", "metadata_json": '{"suggested_causes":5}'},
    {"arguments_json": "[1e999]", "result_json": "1e999"},
    {"arguments_json": "[99999999999999999999]"},
    {"metadata_json": '{"x":"\\ud800"}'},
    {"metadata_json": '{"x":"\\u0000"}'},
    {"metadata_json": '{"suggested_causes":5, "plan_body":1}'},
    {"metadata_json": '{"plan_body":1}', "caused_by": uid(1)},
    {"metadata_json": '{"suggested_causes":[{"action_id":"' + uid(1) + '","reason":"r"}]}'},
    {"metadata_json": '{"suggested_causes":[{"action_id":"' + uid(1) + '","reason":""}]}'},
    {"metadata_json": '{"suggested_causes":[{"action_id":"' + uid(9) + '","reason":"x"}]}'},
    {"metadata_json": '{"suggested_causes":[1]}'},
    {"metadata_json": '{"checkpoint_id":"cp-x"}'},
    {"metadata_json": '{"checkpoint_id":null}'},
    {"action_type": "PlanStepStarted", "plan_id": "p2", "metadata_json": '{"retries":{"max":-1}}'},
    {"arguments_artifact": _REF},
    {"arguments_artifact": _REF, "arguments_json": "[1]"},
    {"arguments_artifact": '{"sha256":"00","size":1}'},
    {"result_artifact": '{"sha256":"' + "0" * 64 + '","size":1,"path":"/abs"}'},
    {"result_artifact": "[1]", "success": 2},
    {"arguments_artifact": '{"sha256":5}'},
    {"action_seq": 1},
    {"action_seq": 1, "caused_by": MISSING_ID},
    {"action_seq": 0},
    {"action_seq": -3},
    {"action_seq": 7},
    {"action_seq": 3},
    {"success": 2, "cost_micros": -1},
    {"category": "x", "success": 2},
    {"category": "x"},
    {"duration_ms": -1},
    {"caused_by": uid(1), "category": "research", "rationale": "r"},
    {"action_id": uid(1)},
    {"plan_id": None},
    {"metadata_json": None, "action_type": "Hack"},
]


def _insert_sql(row: dict[str, Any], style: str) -> str:
    names = list(row)
    marks = ", ".join(
        (":" if style == "sqlite" else "%(") + n + ("" if style == "sqlite" else ")s")
        for n in names
    )
    return f"INSERT INTO cassette_actions ({', '.join(names)}) VALUES ({marks})"


def _raw_sqlite(chain: CausalChain, row: dict[str, Any]) -> str:
    row = {**row, "timestamp": chain.now_ms() + 10}
    chain.conn.execute("BEGIN IMMEDIATE")
    try:
        chain.conn.execute(_insert_sql(row, "sqlite"), row)
    except sqlite3.Error as exc:
        return translate(exc).code.value
    finally:
        chain.conn.execute("ROLLBACK")
    return "ACCEPTED"


def _raw_pg(conn: Any, row: dict[str, Any]) -> str:
    try:
        with conn.transaction():
            conn.execute(_insert_sql(row, "pg"), row)
            raise _Rollback
    except _Rollback:
        return "ACCEPTED"
    except psycopg.Error as exc:
        return pg_connection.translate(exc).code.value


class _Rollback(Exception):
    pass


@pytest.fixture
def raw_pair(sqlite_chain: CausalChain, pg_chain: CausalChain) -> Iterator[tuple[CausalChain, Any]]:
    """Both ledgers holding the same two actions (a finished plan p); a raw owner session
    on the PostgreSQL one."""
    for chain in (sqlite_chain, pg_chain):
        chain.append_action(act(action_id=uid(1), plan_id="p", action_type="PlanStarted"))
        chain.append_action(
            act(action_id=uid(2), plan_id="p", action_type="PlanCompleted", parent_action_id=uid(1))
        )
    assert isinstance(pg_chain, PgCausalChain)
    with psycopg.connect(pg_chain.db_path, autocommit=True) as conn:
        yield sqlite_chain, conn


@pytest.mark.parametrize("overrides", RAW_ROWS, ids=[str(i) for i in range(len(RAW_ROWS))])
def test_raw_inserts_get_the_codes_sqlite_gives(
    raw_pair: tuple[CausalChain, Any], overrides: dict[str, Any]
) -> None:
    sqlite_chain, conn = raw_pair
    row = {**_RAW_BASE, **overrides}
    expected = _raw_sqlite(sqlite_chain, row)
    if expected == "JOURNAL_REQUIRED":  # pragma: no cover - the package connection journals
        pytest.fail("the SQLite side must be a package connection")
    assert _raw_pg(conn, row) == expected


def test_raw_inserts_of_checkpoints_get_the_codes_sqlite_gives(
    raw_pair: tuple[CausalChain, Any],
) -> None:
    sqlite_chain, conn = raw_pair
    good = checkpoint_text("q", {"a": 1})
    rows = [
        {"checkpoint_id": checkpoint_id_for(good), "plan_id": "q", "context_json": good},
        {"checkpoint_id": "cp-" + "0" * 64, "plan_id": "q", "context_json": good},
        {"checkpoint_id": checkpoint_id_for(good), "plan_id": "other", "context_json": good},
        {"checkpoint_id": checkpoint_id_for("[1]"), "plan_id": "q", "context_json": "[1]"},
        {"checkpoint_id": checkpoint_id_for("{"), "plan_id": "q", "context_json": "{"},
        {"checkpoint_id": checkpoint_id_for(good), "plan_id": "", "context_json": good},
        {**_checkpoint_row(good), "checkpoint_seq": 0},
        {**_checkpoint_row(good), "checkpoint_seq": 4},
        {"checkpoint_id": None, "plan_id": "q", "context_json": None},
    ]  # fmt: skip
    for extra in ('{"plan_id":"q","n":1e999}', '{"plan_id":5}', '{"plan_id":"q","s":"\\ud800"}'):
        rows.append(
            {"checkpoint_id": checkpoint_id_for(extra), "plan_id": "q", "context_json": extra}
        )
    answers = []
    for row in rows:
        full = {**row, "created_at": sqlite_chain.now_ms() + 10}
        names = list(full)
        sqlite_chain.conn.execute("BEGIN IMMEDIATE")
        try:
            sqlite_chain.conn.execute(
                f"INSERT INTO cassette_checkpoints ({', '.join(names)})"
                f" VALUES ({', '.join(':' + n for n in names)})",
                full,
            )
            expected = "ACCEPTED"
        except sqlite3.Error as exc:
            expected = translate(exc).code.value
        finally:
            sqlite_chain.conn.execute("ROLLBACK")
        try:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO cassette_checkpoints ({', '.join(row)})"
                    f" VALUES ({', '.join('%(' + n + ')s' for n in row)})",
                    row,
                )
                raise _Rollback
        except _Rollback:
            got = "ACCEPTED"
        except psycopg.Error as exc:
            got = pg_connection.translate(exc).code.value
        assert got == expected, (row, got, expected)
        answers.append(got)
    assert {"ACCEPTED", "CHECKPOINT_MISMATCH", "INVALID_PAYLOAD", "OUT_OF_ORDER"} <= set(answers)


OWNER_ATTACKS = [
    "UPDATE cassette_actions SET function_name = 'x'",
    "DELETE FROM cassette_actions",
    "TRUNCATE cassette_actions",
    "TRUNCATE cassette_actions CASCADE",
    "UPDATE cassette_checkpoints SET context_json = '{}'",
    "DELETE FROM cassette_checkpoints",
    "TRUNCATE cassette_checkpoints",
    "TRUNCATE cassette_actions, cassette_checkpoints, cassette_journal",
    "INSERT INTO cassette_actions SELECT * FROM cassette_actions",
    "INSERT INTO cassette_actions SELECT * FROM cassette_actions ON CONFLICT (action_id)"
    " DO UPDATE SET plan_id = 'x'",
]


@pytest.mark.parametrize("sql", OWNER_ATTACKS)
def test_the_owner_cannot_change_or_remove_a_row(pg_chain: CausalChain, sql: str) -> None:
    pg_chain.append_action(act(action_id=uid(1)))
    pg_chain.save_checkpoint("plan", {"a": 1})
    before = _journal(pg_chain)
    with (
        psycopg.connect(pg_chain.db_path, autocommit=True) as conn,
        pytest.raises(psycopg.Error) as excinfo,
    ):
        conn.execute(sql)
    assert pg_connection.translate(excinfo.value).code is ErrorCode.APPEND_ONLY
    assert _journal(pg_chain) == before
    assert len(pg_chain.find_actions()) == 1


def _journal(chain: CausalChain) -> list[tuple[Any, ...]]:
    with psycopg.connect(chain.db_path) as conn:
        return conn.execute(JOURNAL).fetchall()


def _as_role(chain: CausalChain, role: str) -> Any:
    conn = psycopg.connect(chain.db_path, autocommit=True)
    conn.execute(f"SET ROLE {role}")
    return conn


def _call_code(conn: Any, sql: str, params: dict[str, Any] | None = None) -> str:
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return pg_connection.translate(exc).code.value
    return "ACCEPTED"


def _append_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "action_id": uid(50),
        "parent_action_id": None,
        "plan_id": "plan",
        "intent_id": "i",
        "session_id": None,
        "action_type": "InternalStep",
        "function_name": "f",
        "arguments_json": None,
        "arguments_artifact": None,
        "result_json": None,
        "result_artifact": None,
        "success": 1,
        "error_message": None,
        "cost_micros": 0,
        "duration_ms": 0,
        "metadata_json": "{}",
        "caused_by": None,
        "rationale": None,
        "category": None,
    }
    params.update(overrides)
    return params


def test_the_appender_writes_only_through_its_functions(pg_chain: CausalChain) -> None:
    from catalytic_cassette.postgresql.sqlfiles import query

    pg_chain.append_action(act(action_id=uid(1), plan_id="done", action_type="PlanStarted"))
    pg_chain.append_action(
        act(action_id=uid(2), plan_id="done", action_type="PlanAborted", parent_action_id=uid(1))
    )
    before = _journal(pg_chain)
    with _as_role(pg_chain, "cassette_appender") as conn:
        row = {**_RAW_BASE}
        denied = [
            _call_code(conn, _insert_sql(row, "pg"), row),
            _call_code(conn, "UPDATE cassette_actions SET plan_id = 'x'"),
            _call_code(conn, "DELETE FROM cassette_actions"),
            _call_code(conn, "TRUNCATE cassette_actions"),
            _call_code(conn, "INSERT INTO cassette_checkpoints (checkpoint_id) VALUES ('x')"),
            _call_code(conn, "SELECT cassette_tx_ms()"),
            _call_code(conn, "SELECT cassette_journal_append('a', 'b', '1', '{}')"),
            _call_code(conn, "SELECT cassette_journal_append('a', 'b', '1', '1', '{}')"),
            _call_code(conn, "SELECT cassette_advance_clock(1000)"),
            _call_code(conn, "UPDATE cassette_head SET time_ms = 0"),
        ]
        assert denied == ["PERMISSION_DENIED"] * len(denied)
        assert _journal(pg_chain) == before
        refused = {
            "action_type": ("Hack", "INVALID_ACTION_TYPE"),
            "action_id": (uid(1), "APPEND_ONLY"),
            "plan_id": ("done", "PLAN_FINISHED"),
            "parent_action_id": (MISSING_ID, "REFERENCE_MISSING"),
            "metadata_json": ('{"n":1e999}', "INVALID_PAYLOAD"),
            "success": (2, "INVALID_SUCCESS"),
        }
        for field, (value, code) in refused.items():
            params = _append_params(**{field: value})
            assert _call_code(conn, query("append_action"), params) == code, field
        text = checkpoint_text("plan", {"a": 1})
        forged = {"checkpoint_id": "cp-" + "0" * 64, "plan_id": "plan", "context_json": text}
        assert _call_code(conn, query("save_checkpoint"), forged) == "CHECKPOINT_MISMATCH"
        assert _journal(pg_chain) == before
        good = _append_params()
        assert _call_code(conn, query("append_action"), good) == "ACCEPTED"
        saved = {"checkpoint_id": checkpoint_id_for(text), "plan_id": "plan", "context_json": text}
        assert _call_code(conn, query("save_checkpoint"), saved) == "ACCEPTED"
        assert conn.execute("SELECT count(*) FROM cassette_actions").fetchone()[0] == 3
    assert len(_journal(pg_chain)) == len(before) + 2


@pytest.mark.parametrize("role", ["cassette_auditor", "cassette_worker"])
def test_readers_cannot_append(pg_chain: CausalChain, role: str) -> None:
    from catalytic_cassette.postgresql.sqlfiles import query

    pg_chain.append_action(act(action_id=uid(1)))
    with _as_role(pg_chain, role) as conn:
        assert conn.execute("SELECT count(*) FROM cassette_actions").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM cassette_checkpoints").fetchone()[0] == 0
        assert _call_code(conn, query("append_action"), _append_params()) == "PERMISSION_DENIED"
        text = checkpoint_text("p", {})
        params = {"checkpoint_id": checkpoint_id_for(text), "plan_id": "p", "context_json": text}
        assert _call_code(conn, query("save_checkpoint"), params) == "PERMISSION_DENIED"


def test_an_appender_login_uses_the_api(pg_chain: CausalChain) -> None:
    """A login role that is a member of cassette_appender opens the ledger and appends."""
    from .postgres import database_name

    role = "appender_" + database_name(pg_chain.db_path)[-12:]
    with psycopg.connect(pg_chain.db_path, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE cassette_appender")
    try:
        url = pg_chain.db_path.replace("postgres@", f"{role}@", 1)
        if url == pg_chain.db_path:
            pytest.skip("the server URL names no user to replace")
        with CausalChain(url) as chain:
            started = chain.append_action(act(action_type="PlanStarted"))
            chain.pause("plan", {"ctx": 1})
            assert chain.resume("plan")["context"] == {"ctx": 1}
            assert chain.get_action(started.action_id) == started
    finally:
        with psycopg.connect(pg_chain.db_path, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


# ---------------------------------------------------------------- 3. the journal


def test_journal_entries_are_byte_identical_to_sqlite(
    pg_chain: CausalChain, sqlite_chain: CausalChain
) -> None:
    """Rows written through the PostgreSQL API, then the same rows (same ids, same times)
    inserted into a SQLite ledger through its package connection: the same body, leaf
    hash and chain hash for every entry, and the SQLite copy verifies."""
    started = pg_chain.append_action(
        act(
            plan_id="pl",
            action_type="PlanStarted",
            session_id="séance",
            metadata={"plan_body": '1. é\n2. "q"\\\x01\x1f\x7f\u2028☃𝄞\n', "k": [1, -2, 3.5]},
        )
    )
    pg_chain.append_actions(
        [
            act(
                plan_id="pl",
                parent_action_id=started.action_id,
                arguments=["\x00", "\b\f\n\r\t", "<tag>&'", 2**63 - 1, -(2**63), 1.5e300, True],
                result={"nested": {"deep": [None, False]}, "": ""},
                success=False,
                error_message="line1\nline2 \ud7ff \x1b[31m",
                cost=12.345678,
                duration_ms=2**40,
                caused_by=started.action_id,
                rationale='why "not"',
                category="tool_use",
            ),
            act(plan_id="other", intent_id="ï" * 200, function_name="f" * 200, result=0),
        ]
    )
    pg_chain.pause("pl", {"ctx": ["\x00", "é", {"a": None}]})
    pg_chain.resume("pl")
    pg_chain.save_checkpoint("pl", "just text")

    assert isinstance(pg_chain, PgCausalChain)
    with psycopg.connect(pg_chain.db_path) as conn:
        entries = conn.execute(JOURNAL).fetchall()
        actions = {
            r[1]: r
            for r in conn.execute(
                f"SELECT {', '.join(COLUMNS).replace('timestamp', QUOTED)} FROM cassette_actions"
            )
        }
        checkpoints = {
            r[1]: r
            for r in conn.execute(
                "SELECT checkpoint_seq, checkpoint_id, plan_id, context_json, created_at"
                " FROM cassette_checkpoints"
            )
        }
    assert [e[4] for e in entries].count("cassette_checkpoints") == 2
    assert len(entries) == len(actions) + len(checkpoints) == 7

    twin = sqlite_chain.conn
    first = twin.execute("SELECT coalesce(max(seq), -1) + 1 FROM cassette_journal").fetchone()[0]
    assert first == 0, "a new SQLite ledger's journal is empty"
    for _seq, _body, _leaf, _chain, tbl, key in entries:
        if tbl == "cassette_actions":
            values = dict(zip(COLUMNS, actions[key], strict=True))
        else:
            values = dict(
                zip(
                    ("checkpoint_seq", "checkpoint_id", "plan_id", "context_json", "created_at"),
                    checkpoints[key],
                    strict=True,
                )
            )
        twin.execute("BEGIN IMMEDIATE")
        twin.execute(
            f"INSERT INTO {tbl} ({', '.join(values)})"
            f" VALUES ({', '.join(':' + n for n in values)})",
            values,
        )
        twin.execute("COMMIT")
    copied = twin.execute(JOURNAL).fetchall()
    assert [tuple(e[:4]) for e in copied] == [
        (e[0], e[1], bytes(e[2]), bytes(e[3])) for e in entries
    ]
    assert [(e[4], str(e[5])) for e in copied] == [(e[4], e[5]) for e in entries]
    sqlite_chain.close()
    assert verify_path(sqlite_chain.db_path).ok


# -------------------------------------------------------- 4. nothing else runs

# Public methods PgCausalChain inherits because they only call other public methods.
PURE = {
    "append_action",
    "find_actions",
    "get_children",
    "get_parent",
    "latest",
    "load_session",
    "unload_session",
    "loaded_sessions",
}


def test_every_public_method_is_ported_or_pure() -> None:
    public = {
        name for cls in (CausalChain, LedgerFile) for name in vars(cls) if not name.startswith("_")
    }
    ported = set(vars(PgCausalChain)) | set(vars(PgLedger))
    inherited = public - ported
    assert inherited == PURE


UNSUPPORTED: list[tuple[str, Callable[[CausalChain], Any]]] = [
    ("write", lambda c: c.write()),
    ("ledger_now", lambda c: c.ledger_now(None)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call"), UNSUPPORTED, ids=[n for n, _ in UNSUPPORTED])
def test_what_is_not_ported_says_so(
    pg_chain: CausalChain, name: str, call: Callable[[CausalChain], Any]
) -> None:
    assert code_of(lambda: call(pg_chain)) == "BACKEND_UNSUPPORTED"
    assert pg_chain.find_actions() == []


def test_the_server_keeps_the_time(pg_database: str) -> None:
    from catalytic_cassette import ManualClock

    assert code_of(lambda: CausalChain(pg_database, clock=ManualClock())) == "INVALID_ARGUMENT"


def test_inspect_finds_no_sqlite_connection_use() -> None:
    source = inspect.getsource(PgCausalChain)
    assert "self.conn" not in source


def test_nul_outside_json_is_unsupported(pg_chain: CausalChain) -> None:
    """PostgreSQL text cannot hold U+0000; inside JSON it is the escape \\u0000."""
    with pytest.raises(CassetteError) as excinfo:
        pg_chain.append_actions([act(), act(error_message="a\x00b")])
    assert excinfo.value.code is ErrorCode.BACKEND_UNSUPPORTED
    assert excinfo.value.detail["index"] == 1
    assert pg_chain.find_actions() == []
    assert pg_chain.append_action(act(arguments=["a\x00b"])).arguments == ["a\x00b"]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"nul": "\x00"}, "ACCEPTED"),
        ({"real": 1.5e300, "small": -2.5e-300, "int": -(2**63)}, "ACCEPTED"),
        ({"n": 2**64}, "INVALID_PAYLOAD"),
    ],
)
def test_message_payloads_0004_fixed(target: str, payload: dict[str, Any], code: str) -> None:
    """Regression (0001, fixed by 0004): PostgreSQL refused payloads SQLite accepts."""
    with MessageCassette(target) as cassette:
        assert code_of(lambda: cassette.post_message(payload, run_id="r", source="USER")) == code
