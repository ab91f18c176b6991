"""One source per rule, for the inserts of the append-only tables: verify's judge of them
(``law.INSERT_RULES``, ``law.DENSE``, run by ``verify/inserts.py``) against the SQL guards.

- Readable JSON: the guards' prefilter and full check, for every JSON column they guard,
  are ``law.READABLE_PREFILTER`` and ``law.UNREADABLE`` (read out of the guards' text).
- Generated forged inserts (messages, jobs, actions of plans in every lifecycle state) are
  written through the package connection with every trigger in place (the guard's code),
  and again with the table's rules dropped inside a transaction rolled back (the judge's
  codes for that row, over the tables as they then stand): a row the guard refuses by a
  rule the judge knows is reported with that code, and a row the guard takes is not.
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

from catalytic_cassette import CausalChain, ManualClock, MessageCassette, law, sqlfiles
from catalytic_cassette.errors import ErrorCode
from catalytic_cassette.errors import translate as translate_sqlite
from catalytic_cassette.verify.inserts import broken_inserts

MINUTE_MS = 60_000

ROOT = Path(law.__file__).parent
SCHEMA = "".join(schema.kept for schema in sqlfiles.schema_files())


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("( ", "(").replace(" )", ")"))


def test_readable_json_is_the_guards_text() -> None:
    guarded = set(re.findall(r"NEW\.(\w+) GLOB '\*\[0-9\]\[eE\]\*'", SCHEMA))
    assert guarded == {c for columns in law.JSON_COLUMNS.values() for c in columns}
    flat = re.sub(r"\(\s+", "(", _flat(SCHEMA))
    for columns in law.JSON_COLUMNS.values():
        for column in columns:
            c = f"NEW.{column}"
            for text in (law.READABLE_PREFILTER, law.UNREADABLE):
                wanted = re.sub(r"\(\s+", "(", _flat(text.format(c=c)))
                assert wanted in flat, (column, text[:40])


STEP = "00000000-0000-4000-8000-0000000000a1"  # s's PlanStepStarted (retries.max 1)
CALL = "00000000-0000-4000-8000-0000000000a2"  # a plain call
MISSING = "00000000-0000-4000-8000-0000000000ff"
DEEP = "[" * 1500 + "]" * 1500
BIG = "1180591620717411303424"


class Plans:
    """A ledger with runs, messages, jobs, and plans p (completed), q (paused), s (running,
    one step started and retried once)."""

    def __init__(self, path: Path) -> None:
        self.clock = ManualClock()
        self.cassette = MessageCassette(path, clock=self.clock)
        for run in ("r", "r", "q"):
            self.cassette.post_message({"n": 1}, run, "USER")
        with CausalChain(path, clock=self.clock) as chain:
            for plan, kinds in (
                ("p", ("PlanStarted", "PlanCompleted")),
                ("q", ("PlanStarted", "PlanPaused")),
                ("s", ("PlanStarted",)),
            ):
                for kind in kinds:
                    chain.append_action(
                        {
                            "plan_id": plan,
                            "intent_id": "i",
                            "action_type": kind,
                            "function_name": "f",
                        }
                    )
            chain.append_action(
                {
                    "action_id": STEP,
                    "plan_id": "s",
                    "intent_id": "i",
                    "action_type": "PlanStepStarted",
                    "function_name": "f",
                    "metadata": {"retries": {"max": 1}},
                }
            )
            chain.append_action(
                {
                    "plan_id": "s",
                    "intent_id": "i",
                    "action_type": "PlanStepRetrying",
                    "function_name": "f",
                    "parent_action_id": STEP,
                }
            )
            chain.append_action(
                {
                    "action_id": CALL,
                    "plan_id": "s",
                    "intent_id": "i",
                    "action_type": "CapabilityCall",
                    "function_name": "f",
                }
            )
        self.clock.advance(MINUTE_MS)
        self.now = self.clock.now_ms()

    def codes(
        self, table: str, key: Any, sql: str, params: tuple[Any, ...]
    ) -> tuple[ErrorCode | None, set[ErrorCode]]:
        """The guard's code for the insert (None: taken), and the judge's codes for the
        row with the table's rules dropped."""
        conn = self.cassette.conn
        guard: ErrorCode | None = None
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(sql, params)
        except sqlite3.Error as exc:
            guard = translate_sqlite(exc).code
        finally:
            conn.execute("ROLLBACK")
        triggers = conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
            (table,),
        ).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for (name,) in triggers:
                conn.execute(f"DROP TRIGGER main.{name}")
            try:
                conn.execute(sql, params)
            except sqlite3.IntegrityError:
                return guard, set()  # (a constraint of the table itself)
            judged = {c for t, k, c, _ in broken_inserts(conn) if t == table and k == key}
        finally:
            conn.execute("ROLLBACK")
        return guard, judged


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plans]:
    ledger = Plans(tmp_path_factory.mktemp("plans") / "ledger.db")
    yield ledger
    ledger.cassette.close()


# What the judge knows of the inserts of these tables.
JUDGED = {code for rule in law.INSERT_RULES for code, _, _ in rule.cases} | {ErrorCode.OUT_OF_ORDER}


def _agree(guard: ErrorCode | None, judged: set[ErrorCode]) -> None:
    if guard is None or guard is ErrorCode.JOURNAL_REQUIRED:
        assert not judged, judged
    elif guard in JUDGED:
        assert guard in judged, (guard, judged)
    else:  # a rule judged elsewhere (a CHECK, uniqueness): the judge adds nothing wrong
        assert judged <= JUDGED


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ACTION_TYPES = (*law.LIFECYCLE, "PlanStepStarted", *law.STEP_EVENTS, "CapabilityCall")


@SETTINGS
@given(
    plan=st.sampled_from(["p", "q", "s", "new"]),
    kind=st.sampled_from(ACTION_TYPES),
    parent=st.sampled_from([None, STEP, CALL, MISSING]),
    cause=st.sampled_from([None, CALL, MISSING]),
    metadata=st.sampled_from(
        ["{}", '{"retries":{"max":-1}}', '{"timeout_ms":"x"}', '{"checkpoint_id":"cp-x"}']
    ),
    arguments=st.sampled_from(["[]", f"[{BIG}]", f"[{DEEP}]", "[1e999]"]),
    seq=st.sampled_from([None, 99]),
)
def test_an_action_gets_the_guards_code_the_judge_gives(
    plans: Plans,
    plan: str,
    kind: str,
    parent: str | None,
    cause: str | None,
    metadata: str,
    arguments: str,
    seq: int | None,
) -> None:
    action_id = "00000000-0000-4000-8000-0000000000ee"
    guard, judged = plans.codes(
        "cassette_actions",
        action_id,
        "INSERT INTO cassette_actions (action_seq, action_id, parent_action_id, plan_id,"
        " intent_id, action_type, function_name, arguments_json, success, cost_micros,"
        " duration_ms, timestamp, metadata_json, caused_by)"
        " VALUES (?, ?, ?, ?, 'i', ?, 'f', ?, 1, 0, 0, ?, ?, ?)",
        (seq, action_id, parent, plan, kind, arguments, plans.now, metadata, cause),
    )
    _agree(guard, judged)


@SETTINGS
@given(
    skip=st.integers(0, 1),
    run=st.sampled_from(["r", "q"]),
    payload=st.sampled_from(["{}", f'{{"n":{BIG}}}', f'{{"a":{DEEP}}}', '{"x":"\\ud800"}']),
    message=st.sampled_from([1, 3, 99]),
)
def test_a_message_and_a_job_get_the_guards_code_the_judge_gives(
    plans: Plans, skip: int, run: str, payload: str, message: int
) -> None:
    message_id = 4 + skip
    guard, judged = plans.codes(
        "cassette_messages",
        message_id,
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
        " VALUES (?, ?, 'USER', ?, ?)",
        (message_id, run, payload, plans.now),
    )
    _agree(guard, judged)
    job_id = 4 + skip
    guard, judged = plans.codes(
        "cassette_jobs",
        job_id,
        "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
        " VALUES (?, ?, ?, 'i', 1, ?)",
        (job_id, message, run, plans.now),
    )
    _agree(guard, judged)
