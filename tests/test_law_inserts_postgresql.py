"""One source per rule, for the inserts of the append-only tables, on PostgreSQL: the same
generated forged inserts as ``tests/test_law_inserts.py`` (messages, jobs, actions of plans
in every lifecycle state) are written by the database owner with every trigger in place,
on a PostgreSQL ledger in the same state as the SQLite one, and rolled back. The code the
PostgreSQL guards refuse each row with must be the one the law gives for that row
(``law.INSERT_RULES``, judged on the SQLite twin with the table's rules dropped): a row the
guards refuse by a rule the law knows is reported by the judge with that code, and a row
the guards take is reported by none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CausalChain, MessageCassette
from catalytic_cassette.errors import ErrorCode

from .test_law_inserts import (
    ACTION_TYPES,
    BIG,
    CALL,
    DEEP,
    MISSING,
    STEP,
    Plans,
    _agree,
)

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql

ACTION = "00000000-0000-4000-8000-0000000000ee"
INSERT_ACTION = (
    "INSERT INTO cassette_actions (action_seq, action_id, parent_action_id, plan_id,"
    " intent_id, action_type, function_name, arguments_json, success, cost_micros,"
    " duration_ms, timestamp, metadata_json, caused_by)"
    " VALUES (?, ?, ?, ?, 'i', ?, 'f', ?, 1, 0, 0, ?, ?, ?)"
)
INSERT_MESSAGE = (
    "INSERT INTO cassette_messages (message_id, run_id, source, payload_json, created_at)"
    " VALUES (?, ?, 'USER', ?, ?)"
)
INSERT_JOB = (
    "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal, created_at)"
    " VALUES (?, ?, ?, 'i', 1, ?)"
)


class PgPlans:
    """The PostgreSQL ledger in the state ``Plans`` makes: the same runs, messages and
    plans (p completed, q paused, s running with its step started and retried once), the
    step and the call under the same ids. The server keeps its own time."""

    def __init__(self, url: str) -> None:
        self.url = url
        with MessageCassette(url) as cassette:
            for run in ("r", "r", "q"):
                cassette.post_message({"n": 1}, run, "USER")
        with CausalChain(url) as chain:
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

    def guard(self, sql: str, params: tuple[Any, ...]) -> ErrorCode | None:
        """The code the owner's insert is refused with, every trigger on (None: taken);
        rolled back either way. Dates are the ledger's time (the guards set them)."""
        from catalytic_cassette.postgresql.connection import translate

        with psycopg.connect(self.url) as owner:
            try:
                (now,) = owner.execute("SELECT cassette_tx_ms()").fetchone()  # (the head)
                owner.execute(sql.replace("?", "%s"), tuple(now if p is NOW else p for p in params))
                return None
            except psycopg.Error as exc:
                return translate(exc).code
            finally:
                owner.rollback()


NOW = object()  # (the ledger's time, as each backend reads it)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plans]:
    ledger = Plans(Path(tmp_path_factory.mktemp("twin")) / "ledger.db")
    yield ledger
    ledger.cassette.close()


@pytest.fixture
def pg_plans(pg_ledger: str) -> PgPlans:
    return PgPlans(pg_ledger)


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _on_sqlite(params: tuple[Any, ...], now: int) -> tuple[Any, ...]:
    return tuple(now if p is NOW else p for p in params)


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
def test_an_action_gets_from_the_postgresql_guards_the_code_the_law_gives(
    plans: Plans,
    pg_plans: PgPlans,
    plan: str,
    kind: str,
    parent: str | None,
    cause: str | None,
    metadata: str,
    arguments: str,
    seq: int | None,
) -> None:
    params = (seq, ACTION, parent, plan, kind, arguments, NOW, metadata, cause)
    _, judged = plans.codes(
        "cassette_actions", ACTION, INSERT_ACTION, _on_sqlite(params, plans.now)
    )
    _agree(pg_plans.guard(INSERT_ACTION, params), judged)


@SETTINGS
@given(
    skip=st.integers(0, 1),
    run=st.sampled_from(["r", "q"]),
    payload=st.sampled_from(["{}", f'{{"n":{BIG}}}', f'{{"a":{DEEP}}}', '{"x":"\\ud800"}']),
    message=st.sampled_from([1, 3, 99]),
)
def test_a_message_and_a_job_get_from_the_postgresql_guards_the_code_the_law_gives(
    plans: Plans, pg_plans: PgPlans, skip: int, run: str, payload: str, message: int
) -> None:
    message_id = 4 + skip
    params: tuple[Any, ...] = (message_id, run, payload, NOW)
    _, judged = plans.codes(
        "cassette_messages", message_id, INSERT_MESSAGE, _on_sqlite(params, plans.now)
    )
    _agree(pg_plans.guard(INSERT_MESSAGE, params), judged)
    job_id = 4 + skip
    params = (job_id, message, run, NOW)
    _, judged = plans.codes("cassette_jobs", job_id, INSERT_JOB, _on_sqlite(params, plans.now))
    _agree(pg_plans.guard(INSERT_JOB, params), judged)
