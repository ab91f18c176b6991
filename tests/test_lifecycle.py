"""The plan lifecycle and checkpoints (migration 0003).

1. A Hypothesis state machine appends random lifecycle and other actions over a few
   plans, against a pure-Python model of the lifecycle law: every move is first
   attacked through a raw default ``sqlite3.connect()`` (the guard is pure SQL, so the
   same code, or JOURNAL_REQUIRED for a legal row, and the dump unchanged), then made
   through the package (the exact code and nothing changed, or accepted).
2. The same law, case by case, through a raw connection and the package; raw writes to
   cassette_checkpoints.
3. Checkpoints: content addressing, tampering, pause and resume, plan status totals.

Regression tests pin two bugs found while writing them (fixed): an action of a finished
plan that also broke another lifecycle rule got that rule's code instead of PLAN_FINISHED,
and a refused pause left its checkpoint row.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, write_transaction
from catalytic_cassette.actions import COLUMNS, Action
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.verify import verify_path

from . import backends
from .backends import package_idle
from .conftest import dump

pytestmark = pytest.mark.both_backends

# ---------------------------------------------------------------------- the law

LIFECYCLE = ("PlanStarted", "PlanPaused", "PlanResumed", "PlanCompleted", "PlanAborted")
STEP_EVENTS = ("PlanStepCompleted", "PlanStepFailed", "PlanStepRetrying")
PLAN_TYPES = (*LIFECYCLE, "PlanStepStarted", *STEP_EVENTS)
OTHER_TYPES = ("CapabilityCall", "CapabilityResult", "InternalStep")
STATE_AFTER = {
    "PlanStarted": "running",
    "PlanResumed": "running",
    "PlanPaused": "paused",
    "PlanCompleted": "completed",
    "PlanAborted": "aborted",
}
MISSING_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
UNKNOWN_CHECKPOINT = "cp-" + "0" * 64


def canonical(value: Any) -> str:
    """The model's own canonical JSON: sorted keys, no whitespace (ASCII data only)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def checkpoint_id(plan_id: str, context: Any) -> str:
    """The documented id: 'cp-' + SHA-256 of the stored context_json."""
    text = canonical({"context": context, "plan_id": plan_id})
    return "cp-" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def valid_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def policy_is_valid(metadata: dict[str, Any]) -> bool:
    if "retries" in metadata:
        retries = metadata["retries"]
        if not isinstance(retries, dict) or not valid_count(retries.get("max")):
            return False
    return "timeout_ms" not in metadata or valid_count(metadata["timeout_ms"])


@dataclass
class StepModel:
    action_id: str
    plan_id: str
    function_name: str
    max_retries: int
    timeout_ms: int | None
    retries: int = 0
    outcome: str | None = None  # "completed" | "failed"


@dataclass
class PlanModel:
    state: str = "not_started"
    started: str | None = None
    actions: int = 0
    cost_micros: int = 0
    duration_ms: int = 0
    steps: list[str] = field(default_factory=list)
    last_pause: str | None = None


class Law:
    """The lifecycle law in plain Python: predicts every refusal code, in SQL order."""

    def __init__(self, plans: list[str]) -> None:
        self.plans = {p: PlanModel() for p in plans}
        self.steps: dict[str, StepModel] = {}
        self.actions: dict[str, tuple[str, str]] = {}  # action_id -> (plan_id, type)
        self.checkpoints: dict[str, tuple[str, Any]] = {}  # id -> (plan_id, context)

    def refusal(
        self, plan_id: str, action_type: str, parent: str | None, metadata: dict[str, Any]
    ) -> ErrorCode | None:
        if self.plans[plan_id].state in ("completed", "aborted"):
            return ErrorCode.PLAN_FINISHED
        return self.guard(plan_id, action_type, parent, metadata)

    def guard(
        self, plan_id: str, action_type: str, parent: str | None, metadata: dict[str, Any]
    ) -> ErrorCode | None:
        """Every rule but PLAN_FINISHED, in the order the lifecycle trigger checks them."""
        state = self.plans[plan_id].state
        if action_type == "PlanStarted" and state != "not_started":
            return ErrorCode.PLAN_ALREADY_STARTED
        if action_type in PLAN_TYPES and action_type != "PlanStarted" and state == "not_started":
            return ErrorCode.PLAN_NOT_STARTED
        if action_type == "PlanResumed" and state != "paused":
            return ErrorCode.PLAN_NOT_PAUSED
        if state == "paused" and action_type not in (
            "PlanStarted",
            "PlanResumed",
            "PlanAborted",
            *OTHER_TYPES,
        ):
            return ErrorCode.PLAN_NOT_RUNNING
        if action_type in STEP_EVENTS:
            step = self.steps.get(parent or "")
            if step is None or step.plan_id != plan_id:
                return ErrorCode.STEP_NOT_STARTED
            if step.outcome is not None:
                return ErrorCode.STEP_FINISHED
            if action_type == "PlanStepRetrying" and step.retries >= step.max_retries:
                return ErrorCode.RETRIES_EXHAUSTED
        if action_type == "PlanStepStarted" and not policy_is_valid(metadata):
            return ErrorCode.INVALID_POLICY
        if "checkpoint_id" in metadata:
            known = self.checkpoints.get(metadata["checkpoint_id"])
            if known is None or known[0] != plan_id:
                return ErrorCode.REFERENCE_MISSING
        return None

    def record(self, action: Action) -> None:
        plan = self.plans[action.plan_id]
        self.actions[action.action_id] = (action.plan_id, action.action_type)
        plan.actions += 1
        plan.cost_micros += round(action.cost * 1_000_000)
        plan.duration_ms += action.duration_ms
        kind = action.action_type
        if kind in STATE_AFTER:
            plan.state = STATE_AFTER[kind]
        if kind == "PlanStarted":
            plan.started = action.action_id
        if kind == "PlanPaused":
            plan.last_pause = action.metadata["checkpoint_id"]
        if kind == "PlanStepStarted":
            retries = action.metadata.get("retries") or {}
            self.steps[action.action_id] = StepModel(
                action.action_id,
                action.plan_id,
                action.function_name,
                retries.get("max", 0),
                action.metadata.get("timeout_ms"),
            )
            plan.steps.append(action.action_id)
        if kind in STEP_EVENTS:
            step = self.steps[action.parent_action_id or ""]
            if kind == "PlanStepRetrying":
                step.retries += 1
            else:
                step.outcome = "completed" if kind == "PlanStepCompleted" else "failed"


# ------------------------------------------------------------------- raw SQL

RAW_INSERT = (
    f"INSERT INTO cassette_actions ({', '.join(COLUMNS)})"
    f" VALUES ({', '.join(':' + c for c in COLUMNS)})"
)


def raw_action(conn: sqlite3.Connection | None, now_ms: int, **fields: Any) -> dict[str, Any]:
    """Every column of a valid-looking action row, next action_seq (None without a
    connection: a PostgreSQL server numbers it); fields override."""
    seq = "SELECT coalesce(max(action_seq), 0) + 1 FROM cassette_actions"
    row: dict[str, Any] = {
        "action_seq": None if conn is None else conn.execute(seq).fetchone()[0],
        "action_id": str(uuid.uuid4()),
        "parent_action_id": None,
        "plan_id": "plan",
        "intent_id": "intent",
        "session_id": None,
        "action_type": "InternalStep",
        "function_name": "fn",
        "arguments_json": None,
        "arguments_artifact": None,
        "result_json": None,
        "result_artifact": None,
        "success": 1,
        "error_message": None,
        "cost_micros": 0,
        "duration_ms": 0,
        "timestamp": now_ms,
        "metadata_json": "{}",
        "caused_by": None,
        "rationale": None,
        "category": None,
    }
    metadata = fields.pop("metadata", None)
    if metadata is not None:
        row["metadata_json"] = canonical(metadata)
    row.update(fields)
    return row


def sql_code_is(error: BaseException, code: str) -> bool:
    message = str(error)
    return message.startswith(f"{code}: ") or message == f"CHECK constraint failed: {code}"


def assert_sql_code(error: BaseException, code: str) -> None:
    assert sql_code_is(error, code), (code, str(error))


# Tests that attack through SQLite's own connections (test_postgres_chain.py gives the
# same rows to PostgreSQL's owner and checks the same codes).
RAW_SQLITE3 = pytest.mark.sqlite_only(
    reason="attacked through a raw sqlite3 connection; PostgreSQL's raw inserts get the"
    " same codes in test_postgres_chain.py"
)
PACKAGE_CONNECTION = pytest.mark.sqlite_only(
    reason="a write through the package's own SQLite connection; PostgreSQL's raw"
    " checkpoint inserts are in test_postgres_chain.py"
)


def journal_length(conn: sqlite3.Connection | CausalChain) -> int:
    """Entries in the journal: through a SQLite connection, or a ledger of either backend."""
    if isinstance(conn, CausalChain):
        return int(backends.rows(conn.db_path, "SELECT count(*) FROM cassette_journal")[0][0])
    return int(conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])


def action_count(conn: sqlite3.Connection | CausalChain) -> int:
    """Actions stored: through a SQLite connection, or a ledger of either backend."""
    if isinstance(conn, CausalChain):
        return int(backends.rows(conn.db_path, "SELECT count(*) FROM cassette_actions")[0][0])
    return int(conn.execute("SELECT count(*) FROM cassette_actions").fetchone()[0])


def refused(excinfo: pytest.ExceptionInfo[CassetteError], code: ErrorCode) -> None:
    assert excinfo.value.code is code, (excinfo.value.code, str(excinfo.value))
    assert str(excinfo.value).startswith(f"{code.value}: ")


# --------------------------------------------------------- 1. the state machine

COSTS = st.sampled_from([0, 0.25, 1.5, 2])
DURATIONS = st.integers(min_value=0, max_value=50)
CONTEXTS = st.integers(min_value=0, max_value=3)
VALID_POLICY = st.fixed_dictionaries(
    {},
    optional={
        "retries": st.fixed_dictionaries({"max": st.integers(min_value=0, max_value=2)}),
        "timeout_ms": st.integers(min_value=0, max_value=10_000),
    },
)
RETRYING_POLICY = st.fixed_dictionaries(
    {"retries": st.fixed_dictionaries({"max": st.integers(min_value=0, max_value=2)})},
    optional={"timeout_ms": st.integers(min_value=0, max_value=10_000)},
)
INVALID_POLICY = st.sampled_from(
    [
        {"retries": {"max": -1}},
        {"retries": {"max": 1.5}},
        {"retries": {"max": "2"}},
        {"retries": {"max": True}},
        {"retries": {}},
        {"retries": 2},
        {"timeout_ms": -5},
        {"timeout_ms": 2.5},
        {"timeout_ms": "10"},
        {"retries": {"max": 1}, "timeout_ms": -1},
    ]
)


class LifecycleMachine(RuleBasedStateMachine):
    """Random lifecycle moves over 2-3 plans, each predicted by ``Law``."""

    def __init__(self) -> None:
        super().__init__()
        self.open_ledger()
        self.plan_ids = ["plan-0", "plan-1", "plan-2"]
        self.law = Law(self.plan_ids)

    def open_ledger(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cassette-lifecycle-"))
        self.path: Path | str = self.dir / "ledger.db"
        self.clock: Any = ManualClock()
        self.chain = CausalChain(self.path, clock=self.clock)
        self.raw: Any = sqlite3.connect(self.path)  # default settings, as an attacker opens it

    def raw_idle(self) -> bool:
        return not self.raw.in_transaction

    def teardown(self) -> None:
        self.raw.close()
        self.chain.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(
        data=st.data(),
        count=st.integers(min_value=2, max_value=3),
        started=st.lists(st.booleans(), min_size=2, max_size=2),
    )
    def choose_plans(self, data: st.DataObject, count: int, started: list[bool]) -> None:
        """2-3 plans; the first is started, each other one maybe (the rest stay unstarted)."""
        self.plan_ids = self.plan_ids[:count]
        self.law = Law(self.plan_ids)
        for plan_id, start in zip(self.plan_ids, [True, *started], strict=False):
            if start:
                self.append(data, plan_id, "PlanStarted", None, {})

    # ------------------------------------------------------------ drawing

    def draw_plan(
        self, data: st.DataObject, prefer: str | None = None, *, steps: bool = False
    ) -> str:
        """Any plan; mostly one in the ``prefer`` state when there is one, with an open
        step if ``steps`` (so that short runs still reach deep states)."""
        preferred = [p for p in self.plan_ids if self.law.plans[p].state == prefer]
        if prefer == "running" and steps:
            with_open = [
                p
                for p in preferred
                if any(self.law.steps[s].outcome is None for s in self.law.plans[p].steps)
            ]
            preferred = with_open or preferred
        biased = data.draw(st.integers(min_value=0, max_value=3), label="bias") > 0
        if preferred and biased:
            return data.draw(st.sampled_from(preferred), label="plan")
        return data.draw(st.sampled_from(self.plan_ids), label="plan")

    def draw_action(self, data: st.DataObject, label: str) -> str | None:
        if not self.law.actions:
            return None
        return data.draw(st.none() | st.sampled_from(sorted(self.law.actions)), label=label)

    def draw_checkpoint_ref(self, data: st.DataObject, plan_id: str) -> dict[str, Any]:
        choice = data.draw(st.sampled_from(["none", "none", "own", "other", "unknown"]))
        own = sorted(k for k, (p, _) in self.law.checkpoints.items() if p == plan_id)
        other = sorted(k for k, (p, _) in self.law.checkpoints.items() if p != plan_id)
        if choice == "own" and own:
            return {"checkpoint_id": data.draw(st.sampled_from(own))}
        if choice == "other" and other:
            return {"checkpoint_id": data.draw(st.sampled_from(other))}
        if choice == "unknown":
            return {"checkpoint_id": UNKNOWN_CHECKPOINT}
        return {}

    # ------------------------------------------------------------- moves

    @staticmethod
    def tolerated(
        expected: ErrorCode | None,
        plan_id: str,
        action_type: str,
        parent: str | None,
        metadata: dict[str, Any],
    ) -> set[str]:
        """The one code the law gives, or JOURNAL_REQUIRED for a legal raw row."""
        return {expected.value if expected else "JOURNAL_REQUIRED"}

    def attack_raw(self, codes: set[str], **fields: Any) -> None:
        """The same row through a raw connection: the law's code, or JOURNAL_REQUIRED."""
        row = raw_action(self.raw, self.clock.now_ms(), **fields)
        before = dump(self.path)
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            self.raw.execute(RAW_INSERT, row)
        self.raw.rollback()
        assert any(sql_code_is(excinfo.value, code) for code in codes), (codes, excinfo.value)
        assert dump(self.path) == before

    def append(  # the appended action's id, or None when refused
        self,
        data: st.DataObject,
        plan_id: str,
        action_type: str,
        parent: str | None,
        metadata: dict[str, Any],
        fault: str | None = None,
    ) -> str | None:
        self.clock.advance(1)
        fields: dict[str, Any] = {
            "plan_id": plan_id,
            "intent_id": f"intent-{plan_id}",
            "action_type": action_type,
            "function_name": f"fn-{action_type}",
            "parent_action_id": parent,
            "metadata": metadata,
            "cost": data.draw(COSTS, label="cost"),
            "duration_ms": data.draw(DURATIONS, label="duration"),
        }
        expected = self.law.refusal(plan_id, action_type, parent, metadata)
        if expected is None and fault == "category":
            fields["category"] = "reasoning"
            expected = ErrorCode.INVALID_CATEGORY
        elif expected is None and fault == "cause":
            fields["caused_by"] = MISSING_ID
            expected = ErrorCode.REFERENCE_MISSING
        elif expected is None and self.law.actions and data.draw(st.booleans(), label="cause"):
            fields["caused_by"] = data.draw(st.sampled_from(sorted(self.law.actions)))
            fields["category"] = data.draw(st.sampled_from(["decision", "tool_use", None]))
        codes = self.tolerated(expected, plan_id, action_type, parent, metadata)
        event(f"{action_type}: {expected.value if expected else 'accepted'}")
        self.attack_raw(
            codes,
            **{k: v for k, v in fields.items() if k not in ("cost", "duration_ms")},
            cost_micros=round(fields["cost"] * 1_000_000),
            duration_ms=fields["duration_ms"],
        )
        before = journal_length(self.chain)
        if expected is None:
            stored = self.chain.append_action(fields)
            assert journal_length(self.chain) == before + 1
            self.law.record(stored)
            return stored.action_id
        with pytest.raises(CassetteError) as excinfo:
            self.chain.append_action(fields)
        assert excinfo.value.code.value in codes, (codes, str(excinfo.value))
        assert journal_length(self.chain) == before
        return None

    @rule(data=st.data(), action_type=st.sampled_from(["PlanStarted", "PlanResumed"]))
    def lifecycle_action(self, data: st.DataObject, action_type: str) -> None:
        """PlanStarted or PlanResumed appended directly (PlanPaused only via pause)."""
        plan_id = self.draw_plan(data, "paused" if action_type == "PlanResumed" else None)
        metadata = self.draw_checkpoint_ref(data, plan_id)
        self.append(data, plan_id, action_type, self.draw_action(data, "parent"), metadata)

    @rule(data=st.data(), action_type=st.sampled_from(["PlanCompleted", "PlanAborted"]))
    def finish_plan(self, data: st.DataObject, action_type: str) -> None:
        plan_id = self.draw_plan(data, "running")
        metadata = self.draw_checkpoint_ref(data, plan_id)
        self.append(data, plan_id, action_type, self.draw_action(data, "parent"), metadata)

    @rule(
        data=st.data(),
        action_type=st.sampled_from(OTHER_TYPES),
        fault=st.sampled_from([None, None, None, "category", "cause"]),
    )
    def other_action(self, data: st.DataObject, action_type: str, fault: str | None) -> None:
        plan_id = self.draw_plan(data)
        metadata = self.draw_checkpoint_ref(data, plan_id)
        parent = self.draw_action(data, "parent")
        self.append(data, plan_id, action_type, parent, metadata, fault)

    @rule(data=st.data(), policy=VALID_POLICY | VALID_POLICY | INVALID_POLICY)
    def start_step(self, data: st.DataObject, policy: dict[str, Any]) -> None:
        plan_id = self.draw_plan(data, "running")
        self.append(data, plan_id, "PlanStepStarted", self.draw_action(data, "parent"), policy)

    @rule(
        data=st.data(),
        policy=RETRYING_POLICY | VALID_POLICY,
        events=st.lists(st.sampled_from(STEP_EVENTS[:2] + STEP_EVENTS[2:] * 3), max_size=5),
    )
    def step_run(self, data: st.DataObject, policy: dict[str, Any], events: list[str]) -> None:
        """A step and a run of its own events: retries up to and past the declared max,
        events after its completion."""
        plan_id = self.draw_plan(data, "running")
        step = self.append(data, plan_id, "PlanStepStarted", None, policy)
        for action_type in events:
            self.append(data, plan_id, action_type, step, {})

    @rule(
        data=st.data(),
        action_type=st.sampled_from((*STEP_EVENTS, "PlanStepRetrying", "PlanStepRetrying")),
        kind=st.sampled_from(["own", "own", "own", "other_plan", "not_a_step", "none"]),
    )
    def step_event(self, data: st.DataObject, action_type: str, kind: str) -> None:
        plan_id = self.draw_plan(data, "running", steps=True)
        own = self.law.plans[plan_id].steps
        open_steps = [p for p in own if self.law.steps[p].outcome is None]
        mostly_open = data.draw(st.integers(min_value=0, max_value=3), label="open step") > 0
        if open_steps and mostly_open:
            own = open_steps
        foreign = sorted(s for s, m in self.law.steps.items() if m.plan_id != plan_id)
        others = sorted(a for a in self.law.actions if a not in self.law.steps)
        parent: str | None = None
        if kind == "own" and own:
            parent = data.draw(st.sampled_from(own), label="step")
        elif kind == "other_plan" and foreign:
            parent = data.draw(st.sampled_from(foreign), label="foreign step")
        elif kind == "not_a_step" and others:
            parent = data.draw(st.sampled_from(others), label="not a step")
        self.append(data, plan_id, action_type, parent, {})

    @rule(data=st.data(), n=CONTEXTS)
    def pause(self, data: st.DataObject, n: int) -> None:
        plan_id = self.draw_plan(data, "running")
        context = {"n": n, "note": f"ctx-{n}"}
        cp = checkpoint_id(plan_id, context)
        plan = self.law.plans[plan_id]
        self.clock.advance(1)
        expected = self.law.refusal(plan_id, "PlanPaused", plan.started, {})
        codes = self.tolerated(expected, plan_id, "PlanPaused", plan.started, {})
        event(f"pause: {expected.value if expected else 'accepted'}")
        self.attack_raw(
            codes,
            plan_id=plan_id,
            intent_id=f"intent-{plan_id}",
            action_type="PlanPaused",
            parent_action_id=plan.started,
        )
        before, actions_before = journal_length(self.chain), action_count(self.chain)
        new_checkpoint = 0 if cp in self.law.checkpoints else 1
        if expected is None:
            stored = self.chain.pause(plan_id, context)
            assert stored.action_type == "PlanPaused"
            assert stored.parent_action_id == plan.started
            assert stored.metadata == {"checkpoint_id": cp}
            assert journal_length(self.chain) == before + 1 + new_checkpoint
            self.law.checkpoints[cp] = (plan_id, context)
            self.law.record(stored)
            return
        with pytest.raises(CassetteError) as excinfo:
            self.chain.pause(plan_id, context)
        assert excinfo.value.code.value in codes, (codes, str(excinfo.value))
        assert action_count(self.chain) == actions_before
        assert journal_length(self.chain) == before  # a refused pause stores no checkpoint

    @rule(data=st.data(), choice=st.sampled_from(["latest", "latest", "own", "other", "unknown"]))
    def resume(self, data: st.DataObject, choice: str) -> None:
        plan_id = self.draw_plan(data, "paused")
        plan = self.law.plans[plan_id]
        own = sorted(k for k, (p, _) in self.law.checkpoints.items() if p == plan_id)
        other = sorted(k for k, (p, _) in self.law.checkpoints.items() if p != plan_id)
        given: str | None = None
        if choice == "own" and own:
            given = data.draw(st.sampled_from(own), label="own checkpoint")
        elif choice == "other" and other:
            given = data.draw(st.sampled_from(other), label="foreign checkpoint")
        elif choice != "latest":
            given = UNKNOWN_CHECKPOINT
        chosen = given or plan.last_pause
        self.clock.advance(1)
        metadata = {"checkpoint_id": chosen} if chosen else {}
        law = self.law.refusal(plan_id, "PlanResumed", plan.started, metadata)
        self.attack_raw(
            self.tolerated(law, plan_id, "PlanResumed", plan.started, metadata),
            plan_id=plan_id,
            intent_id=f"intent-{plan_id}",
            action_type="PlanResumed",
            parent_action_id=plan.started,
            metadata=metadata,
        )
        expected: ErrorCode | None = None
        if plan.state != "paused":
            expected = ErrorCode.PLAN_NOT_PAUSED
        elif chosen not in self.law.checkpoints or self.law.checkpoints[chosen][0] != plan_id:
            expected = ErrorCode.NOT_FOUND
        event(f"resume: {expected.value if expected else 'accepted'}")
        before = journal_length(self.chain)
        if expected is not None:
            with pytest.raises(CassetteError) as excinfo:
                self.chain.resume(plan_id, given)
            refused(excinfo, expected)
            assert journal_length(self.chain) == before
            return
        assert chosen is not None
        result = self.chain.resume(plan_id, given)
        assert result["checkpoint_id"] == chosen
        assert result["context"] == self.law.checkpoints[chosen][1]
        action = result["action"]
        assert action.action_type == "PlanResumed"
        assert action.parent_action_id == plan.started
        assert action.metadata == {"checkpoint_id": chosen}
        assert journal_length(self.chain) == before + 1
        self.law.record(action)

    # -------------------------------------------------------- invariants

    @invariant()
    def no_transaction_is_left_open(self) -> None:
        assert package_idle(self.chain)
        assert self.raw_idle()

    @invariant()
    def the_journal_holds_exactly_the_accepted_rows(self) -> None:
        expected = len(self.law.actions) + len(self.law.checkpoints)
        assert journal_length(self.chain) == expected

    @invariant()
    def plan_status_matches_the_model(self) -> None:
        for plan_id in self.plan_ids:
            plan = self.law.plans[plan_id]
            if plan.actions == 0:
                with pytest.raises(CassetteError) as excinfo:
                    self.chain.plan_status(plan_id)
                refused(excinfo, ErrorCode.NOT_FOUND)
                continue
            status = self.chain.plan_status(plan_id)
            assert status["state"] == plan.state
            assert status["actions"] == plan.actions
            assert status["total_cost"] == plan.cost_micros / 1_000_000
            assert status["total_duration_ms"] == plan.duration_ms
            steps = [
                (s["action_id"], s["state"], s["retries"], s["max_retries"], s["timeout_ms"])
                for s in status["steps"]
            ]
            expected = []
            for step_id in plan.steps:
                step = self.law.steps[step_id]
                state = step.outcome or "running"
                expected.append((step_id, state, step.retries, step.max_retries, step.timeout_ms))
            assert steps == expected


TestLifecycleLaw = pytest.mark.slow(
    pytest.mark.sqlite_only(
        reason="the SQLite run of the machine: each rule also attacked through a raw sqlite3"
        " connection; test_the_lifecycle_law_on_postgresql runs it as the database owner"
    )(LifecycleMachine.TestCase)
)
LIFECYCLE_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLifecycleLaw.settings = LIFECYCLE_SETTINGS


class PgLifecycleMachine(LifecycleMachine):
    """The same law on a PostgreSQL ledger (a database copied per run from the session's
    migrated template); the raw attacker is the database owner. The owner's insert of a
    row the law allows is an append the server numbers, dates and journals (LAW.md
    section 14), not an attack: only the rows the law refuses are tried raw."""

    server = ""
    template = ""

    def open_ledger(self) -> None:
        import psycopg

        from . import postgres

        self.path = postgres.clone_database(self.server, self.template)
        self.clock = backends.ServerClock(self.path)  # advance(1): the owner's offset
        self.chain = CausalChain(self.path)
        self.raw = psycopg.connect(self.path)  # the owner, in a transaction of its own

    def raw_idle(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.raw.info.transaction_status == TransactionStatus.IDLE)

    def attack_raw(self, codes: set[str], **fields: Any) -> None:
        refusals = codes - {"JOURNAL_REQUIRED"}
        if not refusals:
            return
        import psycopg

        from catalytic_cassette.postgresql.connection import translate

        row = raw_action(None, 0, **fields)
        columns = [c for c, v in row.items() if c not in ("action_seq", "timestamp")]
        before = dump(self.path)
        with pytest.raises(psycopg.Error) as excinfo:
            self.raw.execute(
                f"INSERT INTO cassette_actions ({', '.join(columns)})"
                f" VALUES ({', '.join('%s' for _ in columns)})",
                [row[c] for c in columns],
            )
        self.raw.rollback()
        assert translate(excinfo.value).code.value in refusals, (refusals, excinfo.value)
        assert dump(self.path) == before

    def teardown(self) -> None:
        from . import postgres

        self.raw.close()
        self.chain.close()
        postgres.drop_database(self.server, str(self.path))


@pytest.mark.slow
def test_the_lifecycle_law_on_postgresql(pg_server: str, pg_template: str) -> None:
    PgLifecycleMachine.server, PgLifecycleMachine.template = pg_server, pg_template
    # fewer runs than SQLite's 30: each copies a database and reads through the server
    run_state_machine_as_test(
        PgLifecycleMachine, settings=settings(LIFECYCLE_SETTINGS, max_examples=10)
    )


# ------------------------------------------------- 2. case by case, raw and package


@pytest.fixture
def chain(db_path: Path, clock: ManualClock) -> Iterator[CausalChain]:
    with CausalChain(db_path, clock=clock) as opened:
        yield opened


@dataclass
class Ledger:
    """Plans in every state: run (running), held (paused), done (completed),
    free (actions but no lifecycle); steps in run: open (max 1, retried once),
    fresh (max 2), closed (completed); held has a step too."""

    ids: dict[str, str]
    checkpoint: str


@pytest.fixture
def ledger(chain: CausalChain, clock: ManualClock) -> Ledger:
    ids: dict[str, str] = {}

    def add(name: str, **fields: Any) -> None:
        clock.advance(10)
        base = {"intent_id": "intent", "function_name": name, "cost": 0.5, "duration_ms": 7}
        ids[name] = chain.append_action({**base, **fields}).action_id

    add("run", plan_id="run", action_type="PlanStarted")
    add("open", plan_id="run", action_type="PlanStepStarted", metadata={"retries": {"max": 1}})
    add("retry", plan_id="run", action_type="PlanStepRetrying", parent_action_id=ids["open"])
    add("fresh", plan_id="run", action_type="PlanStepStarted", metadata={"retries": {"max": 2}})
    add("closed", plan_id="run", action_type="PlanStepStarted")
    add("closing", plan_id="run", action_type="PlanStepCompleted", parent_action_id=ids["closed"])
    add("held", plan_id="held", action_type="PlanStarted")
    add("held-step", plan_id="held", action_type="PlanStepStarted")
    add("done", plan_id="done", action_type="PlanStarted")
    add("done-end", plan_id="done", action_type="PlanCompleted")
    add("free", plan_id="free", action_type="CapabilityCall")
    paused = chain.pause("held", {"cursor": 3})
    return Ledger(ids, paused.metadata["checkpoint_id"])


# (name, fields given the ledger, expected code or None for a legal row)
LAW_CASES: list[tuple[str, Callable[[Ledger], dict[str, Any]], ErrorCode | None]] = [
    ("finished-any", lambda g: {"plan_id": "done"}, ErrorCode.PLAN_FINISHED),
    (
        "finished-abort",
        lambda g: {"plan_id": "done", "action_type": "PlanAborted"},
        ErrorCode.PLAN_FINISHED,
    ),
    (
        "started-twice",
        lambda g: {"plan_id": "run", "action_type": "PlanStarted"},
        ErrorCode.PLAN_ALREADY_STARTED,
    ),
    (
        "started-while-paused",
        lambda g: {"plan_id": "held", "action_type": "PlanStarted"},
        ErrorCode.PLAN_ALREADY_STARTED,
    ),
    (
        "complete-unstarted",
        lambda g: {"plan_id": "free", "action_type": "PlanCompleted"},
        ErrorCode.PLAN_NOT_STARTED,
    ),
    (
        "abort-unstarted",
        lambda g: {"plan_id": "new", "action_type": "PlanAborted"},
        ErrorCode.PLAN_NOT_STARTED,
    ),
    (
        "step-unstarted",
        lambda g: {"plan_id": "free", "action_type": "PlanStepStarted"},
        ErrorCode.PLAN_NOT_STARTED,
    ),
    (
        "resume-unstarted",
        lambda g: {"plan_id": "free", "action_type": "PlanResumed"},
        ErrorCode.PLAN_NOT_STARTED,
    ),
    (
        "step-event-unstarted",
        lambda g: {
            "plan_id": "free",
            "action_type": "PlanStepFailed",
            "parent_action_id": g.ids["open"],
        },
        ErrorCode.PLAN_NOT_STARTED,
    ),
    (
        "resume-running",
        lambda g: {"plan_id": "run", "action_type": "PlanResumed"},
        ErrorCode.PLAN_NOT_PAUSED,
    ),
    (
        "pause-paused",
        lambda g: {"plan_id": "held", "action_type": "PlanPaused"},
        ErrorCode.PLAN_NOT_RUNNING,
    ),
    (
        "complete-paused",
        lambda g: {"plan_id": "held", "action_type": "PlanCompleted"},
        ErrorCode.PLAN_NOT_RUNNING,
    ),
    (
        "step-start-paused",
        lambda g: {"plan_id": "held", "action_type": "PlanStepStarted"},
        ErrorCode.PLAN_NOT_RUNNING,
    ),
    (
        "step-event-paused",
        lambda g: {
            "plan_id": "held",
            "action_type": "PlanStepCompleted",
            "parent_action_id": g.ids["held-step"],
        },
        ErrorCode.PLAN_NOT_RUNNING,
    ),
    (
        "step-parent-none",
        lambda g: {"plan_id": "run", "action_type": "PlanStepCompleted"},
        ErrorCode.STEP_NOT_STARTED,
    ),
    (
        "step-parent-not-a-step",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepFailed",
            "parent_action_id": g.ids["run"],
        },
        ErrorCode.STEP_NOT_STARTED,
    ),
    (
        "step-parent-other-plan",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepRetrying",
            "parent_action_id": g.ids["held-step"],
        },
        ErrorCode.STEP_NOT_STARTED,
    ),
    (
        "step-parent-a-step-event",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepCompleted",
            "parent_action_id": g.ids["retry"],
        },
        ErrorCode.STEP_NOT_STARTED,
    ),
    (
        "step-finished-complete",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepCompleted",
            "parent_action_id": g.ids["closed"],
        },
        ErrorCode.STEP_FINISHED,
    ),
    (
        "step-finished-retry",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepRetrying",
            "parent_action_id": g.ids["closed"],
        },
        ErrorCode.STEP_FINISHED,
    ),
    (
        "retries-exhausted",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepRetrying",
            "parent_action_id": g.ids["open"],
        },
        ErrorCode.RETRIES_EXHAUSTED,
    ),
    (
        "policy-negative-max",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepStarted",
            "metadata": {"retries": {"max": -1}},
        },
        ErrorCode.INVALID_POLICY,
    ),
    (
        "policy-real-max",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepStarted",
            "metadata": {"retries": {"max": 0.5}},
        },
        ErrorCode.INVALID_POLICY,
    ),
    (
        "policy-text-timeout",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepStarted",
            "metadata": {"timeout_ms": "100"},
        },
        ErrorCode.INVALID_POLICY,
    ),
    (
        "policy-negative-timeout",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepStarted",
            "metadata": {"timeout_ms": -1},
        },
        ErrorCode.INVALID_POLICY,
    ),
    (
        "checkpoint-of-another-plan",
        lambda g: {"plan_id": "run", "metadata": {"checkpoint_id": g.checkpoint}},
        ErrorCode.REFERENCE_MISSING,
    ),
    (
        "checkpoint-unknown",
        lambda g: {
            "plan_id": "held",
            "action_type": "PlanResumed",
            "metadata": {"checkpoint_id": UNKNOWN_CHECKPOINT},
        },
        ErrorCode.REFERENCE_MISSING,
    ),
    (
        "cause-missing",
        lambda g: {"plan_id": "run", "caused_by": MISSING_ID},
        ErrorCode.REFERENCE_MISSING,
    ),
    (
        "category-unknown",
        lambda g: {"plan_id": "run", "category": "reasoning"},
        ErrorCode.INVALID_CATEGORY,
    ),
    # legal rows: a raw connection still cannot write them (JOURNAL_REQUIRED)
    ("legal-other-running", lambda g: {"plan_id": "run"}, None),
    ("legal-other-paused", lambda g: {"plan_id": "held", "action_type": "CapabilityCall"}, None),
    ("legal-other-no-lifecycle", lambda g: {"plan_id": "free"}, None),
    ("legal-other-new-plan", lambda g: {"plan_id": "new", "action_type": "CapabilityResult"}, None),
    ("legal-start", lambda g: {"plan_id": "free", "action_type": "PlanStarted"}, None),
    ("legal-abort-paused", lambda g: {"plan_id": "held", "action_type": "PlanAborted"}, None),
    (
        "legal-resume",
        lambda g: {
            "plan_id": "held",
            "action_type": "PlanResumed",
            "metadata": {"checkpoint_id": g.checkpoint},
        },
        None,
    ),
    (
        "legal-retry",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepRetrying",
            "parent_action_id": g.ids["fresh"],
        },
        None,
    ),
    (
        "legal-fail-after-retry",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepFailed",
            "parent_action_id": g.ids["open"],
        },
        None,
    ),
    (
        "legal-step-policy",
        lambda g: {
            "plan_id": "run",
            "action_type": "PlanStepStarted",
            "metadata": {"retries": {"max": 0}, "timeout_ms": 0, "on_fail": "abort"},
        },
        None,
    ),
    (
        "legal-cause-and-category",
        lambda g: {"plan_id": "run", "caused_by": g.ids["run"], "category": "decision"},
        None,
    ),
]


def _case_fields(ledger: Ledger, make: Callable[[Ledger], dict[str, Any]]) -> dict[str, Any]:
    fields = make(ledger)
    return {"intent_id": "intent", "action_type": "InternalStep", "function_name": "fn", **fields}


@RAW_SQLITE3
@pytest.mark.parametrize(
    ("make", "code"), [pytest.param(m, c, id=name) for name, m, c in LAW_CASES]
)
def test_the_law_holds_for_raw_connections_and_the_package(
    ledger: Ledger,
    chain: CausalChain,
    db_path: Path,
    clock: ManualClock,
    make: Callable[[Ledger], dict[str, Any]],
    code: ErrorCode | None,
) -> None:
    fields = _case_fields(ledger, make)
    raw = sqlite3.connect(db_path)  # default settings: no package functions or triggers
    try:
        before = dump(db_path)
        row = raw_action(raw, clock.now_ms(), **fields)
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            raw.execute(RAW_INSERT, row)
        raw.rollback()
        assert_sql_code(excinfo.value, code.value if code else "JOURNAL_REQUIRED")
        assert dump(db_path) == before
    finally:
        raw.close()
    journal = journal_length(chain)
    if code is None:
        stored = chain.append_action(fields)
        assert journal_length(chain) == journal + 1
        assert chain.get_action(stored.action_id) == stored
    else:
        with pytest.raises(CassetteError) as refusal:
            chain.append_action(fields)
        refused(refusal, code)
        assert dump(db_path) == before
    assert package_idle(chain)


def test_a_default_retries_max_is_zero(chain: CausalChain) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    chain.append_action({**base, "action_type": "PlanStarted"})
    step = chain.append_action({**base, "action_type": "PlanStepStarted"})
    with pytest.raises(CassetteError) as excinfo:
        chain.append_action(
            {**base, "action_type": "PlanStepRetrying", "parent_action_id": step.action_id}
        )
    refused(excinfo, ErrorCode.RETRIES_EXHAUSTED)
    chain.append_action(
        {**base, "action_type": "PlanStepFailed", "parent_action_id": step.action_id}
    )
    assert chain.plan_status("p")["steps"][0]["state"] == "failed"


def test_retries_up_to_the_declared_max_then_exhausted(chain: CausalChain) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    chain.append_action({**base, "action_type": "PlanStarted"})
    step = chain.append_action(
        {**base, "action_type": "PlanStepStarted", "metadata": {"retries": {"max": 2}}}
    )
    retry = {**base, "action_type": "PlanStepRetrying", "parent_action_id": step.action_id}
    chain.append_actions([retry, {**retry, "action_id": str(uuid.uuid4())}])
    with pytest.raises(CassetteError) as excinfo:
        chain.append_action(retry | {"action_id": str(uuid.uuid4())})
    refused(excinfo, ErrorCode.RETRIES_EXHAUSTED)
    assert excinfo.value.detail["index"] == 0
    (status,) = chain.plan_status("p")["steps"]
    assert (status["retries"], status["max_retries"], status["state"]) == (2, 2, "running")


def test_a_batch_is_checked_row_by_row_and_refused_whole(chain: CausalChain) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    journal = journal_length(chain)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_actions(
            [
                {**base, "action_type": "PlanStarted"},
                {**base, "action_type": "PlanCompleted"},
                {**base, "action_type": "InternalStep"},  # the plan is finished by now
            ]
        )
    refused(excinfo, ErrorCode.PLAN_FINISHED)
    assert excinfo.value.detail["index"] == 2
    assert journal_length(chain) == journal
    assert package_idle(chain)


# (name, fields given the finished plan's open step and its checkpoint)
FINISHED_CASES: list[tuple[str, Callable[[str, str], dict[str, Any]], bool]] = [
    ("other", lambda step, cp: {}, False),
    ("capability-with-missing-cause", lambda step, cp: {"caused_by": MISSING_ID}, False),
    ("completed", lambda step, cp: {"action_type": "PlanCompleted"}, False),
    ("aborted", lambda step, cp: {"action_type": "PlanAborted"}, False),
    ("paused", lambda step, cp: {"action_type": "PlanPaused"}, False),
    ("step-started", lambda step, cp: {"action_type": "PlanStepStarted"}, False),
    (
        "step-completed",
        lambda step, cp: {"action_type": "PlanStepCompleted", "parent_action_id": step},
        False,
    ),
    ("own-checkpoint", lambda step, cp: {"metadata": {"checkpoint_id": cp}}, False),
    ("started", lambda step, cp: {"action_type": "PlanStarted"}, True),
    ("resumed", lambda step, cp: {"action_type": "PlanResumed"}, True),
    (
        "step-retrying",
        lambda step, cp: {"action_type": "PlanStepRetrying", "parent_action_id": step},
        True,
    ),
    ("step-failed-without-parent", lambda step, cp: {"action_type": "PlanStepFailed"}, True),
    (
        "step-started-bad-policy",
        lambda step, cp: {"action_type": "PlanStepStarted", "metadata": {"timeout_ms": -1}},
        True,
    ),
    (
        "unknown-checkpoint",
        lambda step, cp: {"metadata": {"checkpoint_id": UNKNOWN_CHECKPOINT}},
        True,
    ),
]


@RAW_SQLITE3
@pytest.mark.parametrize(
    "make",
    [pytest.param(m, id=name, marks=[]) for name, m, bug in FINISHED_CASES],
)
@pytest.mark.parametrize("end", ["PlanCompleted", "PlanAborted"])
def test_every_action_of_a_finished_plan_is_plan_finished(
    chain: CausalChain,
    db_path: Path,
    clock: ManualClock,
    end: str,
    make: Callable[[str, str], dict[str, Any]],
) -> None:
    base = {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
    chain.append_action({**base, "action_type": "PlanStarted"})
    step = chain.append_action({**base, "action_type": "PlanStepStarted"}).action_id
    cp = chain.save_checkpoint("p", {"at": "end"})
    chain.append_action({**base, "action_type": end})
    fields = {**base, **make(step, cp)}
    before = dump(db_path)
    raw = sqlite3.connect(db_path)
    try:
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            raw.execute(RAW_INSERT, raw_action(raw, clock.now_ms(), **fields))
        raw.rollback()
    finally:
        raw.close()
    with pytest.raises(CassetteError) as refusal:
        chain.append_action(fields)
    assert dump(db_path) == before
    assert (str(excinfo.value).split(":")[0], refusal.value.code) == (
        "PLAN_FINISHED",
        ErrorCode.PLAN_FINISHED,
    )


# raw writes to cassette_checkpoints: (name, SQL, params given the checkpoint row, code)
CHECKPOINT_ATTACKS: list[tuple[str, str, Callable[[dict[str, Any]], tuple[Any, ...]], str]] = [
    (
        "update-context",
        "UPDATE cassette_checkpoints SET context_json = ? WHERE checkpoint_id = ?",
        lambda r: (r["context_json"].replace("3", "4"), r["checkpoint_id"]),
        "APPEND_ONLY",
    ),
    (
        "update-created-at",
        "UPDATE cassette_checkpoints SET created_at = created_at + 1",
        lambda r: (),
        "APPEND_ONLY",
    ),
    (
        "update-id-and-context",
        "UPDATE cassette_checkpoints SET checkpoint_id = ?, context_json = ?",
        lambda r: (
            checkpoint_id(r["plan_id"], {"cursor": 4}),
            canonical({"context": {"cursor": 4}, "plan_id": r["plan_id"]}),
        ),
        "APPEND_ONLY",
    ),
    ("delete", "DELETE FROM cassette_checkpoints", lambda r: (), "APPEND_ONLY"),
    (
        "replace-same-id",
        "REPLACE INTO cassette_checkpoints VALUES (?, ?, ?, ?, ?)",
        lambda r: (
            r["checkpoint_seq"],
            r["checkpoint_id"],
            r["plan_id"],
            r["context_json"],
            r["created_at"] + 1,
        ),
        "APPEND_ONLY",
    ),
    (
        "replace-same-seq",
        "INSERT OR REPLACE INTO cassette_checkpoints VALUES (?, ?, ?, ?, ?)",
        lambda r: (
            r["checkpoint_seq"],
            checkpoint_id(r["plan_id"], {"cursor": 4}),
            r["plan_id"],
            canonical({"context": {"cursor": 4}, "plan_id": r["plan_id"]}),
            r["created_at"],
        ),
        "APPEND_ONLY",
    ),
    (
        "upsert",
        "INSERT INTO cassette_checkpoints VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (checkpoint_id) DO UPDATE SET context_json = excluded.context_json",
        lambda r: (
            r["checkpoint_seq"] + 1,
            r["checkpoint_id"],
            r["plan_id"],
            r["context_json"],
            r["created_at"],
        ),
        "APPEND_ONLY",
    ),
    (
        "insert-valid-new",
        "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
        " VALUES (?, ?, ?, ?)",
        lambda r: (
            checkpoint_id(r["plan_id"], {"cursor": 9}),
            r["plan_id"],
            canonical({"context": {"cursor": 9}, "plan_id": r["plan_id"]}),
            r["created_at"],
        ),
        "JOURNAL_REQUIRED",
    ),
    (
        # the hash guard needs SHA-256, so it is a TEMP trigger of package connections:
        # a raw connection still fails closed, on the journal
        "insert-wrong-hash",
        "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
        " VALUES (?, ?, ?, ?)",
        lambda r: (
            UNKNOWN_CHECKPOINT,
            r["plan_id"],
            canonical({"context": {"cursor": 9}, "plan_id": r["plan_id"]}),
            r["created_at"],
        ),
        "JOURNAL_REQUIRED",
    ),
    (
        "insert-malformed-id",
        "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
        " VALUES ('cp-XYZ', ?, ?, ?)",
        lambda r: (r["plan_id"], r["context_json"].replace("3", "5"), r["created_at"]),
        "INVALID_CHECKPOINT_ID",
    ),
    (
        "insert-context-of-another-plan",
        "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
        " VALUES (?, 'elsewhere', ?, ?)",
        lambda r: (
            checkpoint_id(r["plan_id"], {"cursor": 9}),
            canonical({"context": {"cursor": 9}, "plan_id": r["plan_id"]}),
            r["created_at"],
        ),
        "INVALID_PAYLOAD",
    ),
]


@RAW_SQLITE3
@pytest.mark.parametrize(
    ("sql", "params", "code"),
    [pytest.param(s, p, c, id=name) for name, s, p, c in CHECKPOINT_ATTACKS],
)
def test_raw_writes_to_checkpoints_are_refused(
    ledger: Ledger,
    db_path: Path,
    sql: str,
    params: Callable[[dict[str, Any]], tuple[Any, ...]],
    code: str,
) -> None:
    raw = sqlite3.connect(db_path)
    try:
        raw.row_factory = sqlite3.Row
        row = dict(raw.execute("SELECT * FROM cassette_checkpoints").fetchone())
        assert row["checkpoint_id"] == ledger.checkpoint
        before = dump(db_path)
        with pytest.raises(sqlite3.IntegrityError) as excinfo:
            raw.execute(sql, params(row))
        raw.rollback()
        assert_sql_code(excinfo.value, code)
        assert dump(db_path) == before
    finally:
        raw.close()


# -------------------------------------------------------------- 3. checkpoints


def test_checkpoints_are_content_addressed(chain: CausalChain) -> None:
    context = {"cursor": 7, "todo": ["a", "b"], "nested": {"z": 1, "a": None}}
    first = chain.save_checkpoint("p", context)
    again = chain.save_checkpoint(
        "p", {"todo": ["a", "b"], "nested": {"a": None, "z": 1}, "cursor": 7}
    )
    assert first == again == checkpoint_id("p", context)
    rows = backends.rows(
        chain.db_path, "SELECT checkpoint_id, plan_id, context_json FROM cassette_checkpoints"
    )
    assert len(rows) == 1
    stored_id, plan_id, text = rows[0]
    assert (stored_id, plan_id) == (first, "p")
    assert stored_id == "cp-" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert json.loads(text) == {"context": context, "plan_id": "p"}
    other = chain.save_checkpoint("p", {**context, "cursor": 8})
    same_context_other_plan = chain.save_checkpoint("q", context)
    assert len({first, other, same_context_other_plan}) == 3
    assert backends.rows(chain.db_path, "SELECT count(*) FROM cassette_checkpoints")[0][0] == 3
    assert journal_length(chain) == 3


@pytest.mark.parametrize(
    "context",
    [None, 0, "text", [1, 2], {"unicode": "é✓"}, {"deep": {"er": [{"x": 1.5}]}}, {}],
)
def test_load_checkpoint_returns_the_context(chain: CausalChain, context: Any) -> None:
    cp = chain.save_checkpoint("plan", context)
    loaded = chain.load_checkpoint(cp)
    assert loaded["checkpoint_id"] == cp
    assert loaded["plan_id"] == "plan"
    assert loaded["context"] == context
    text = backends.rows(
        chain.db_path, "SELECT context_json FROM cassette_checkpoints WHERE checkpoint_id = ?", cp
    )[0][0]
    assert cp == "cp-" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_save_checkpoint_refusals(chain: CausalChain) -> None:
    for plan_id in ("", "x" * 201, None):
        with pytest.raises(CassetteError) as excinfo:
            chain.save_checkpoint(plan_id, {})  # type: ignore[arg-type]
        refused(excinfo, ErrorCode.INVALID_PLAN_ID)
    with pytest.raises(CassetteError) as excinfo:
        chain.load_checkpoint(UNKNOWN_CHECKPOINT)
    refused(excinfo, ErrorCode.NOT_FOUND)
    assert journal_length(chain) == 0


@contextmanager
def persistent_triggers_dropped(path: Path) -> Iterator[sqlite3.Connection]:
    """A raw autocommit connection with every persistent trigger dropped, then restored."""
    conn = sqlite3.connect(path, isolation_level=None)
    saved = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for name, _ in saved:
        conn.execute(f'DROP TRIGGER "{name}"')
    try:
        yield conn
    finally:
        for _, sql in saved:
            conn.execute(sql)
        conn.close()


def test_a_tampered_checkpoint_is_refused_on_load_and_named_by_verify(
    chain: CausalChain, db_path: Path
) -> None:
    chain.append_action(
        {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
    )
    paused = chain.pause("p", {"cursor": 3})
    cp = paused.metadata["checkpoint_id"]
    assert verify_path(str(db_path)).ok
    forged = canonical({"context": {"cursor": 99}, "plan_id": "p"})
    if backends.is_postgresql(db_path):  # the owner turns the table's rules off, then on
        assert backends.raw_script(
            db_path,
            "ALTER TABLE cassette_checkpoints DISABLE TRIGGER USER",
            f"UPDATE cassette_checkpoints SET context_json = '{forged}'"
            f" WHERE checkpoint_id = '{cp}'",
            "ALTER TABLE cassette_checkpoints ENABLE TRIGGER USER",
        )
    else:
        with persistent_triggers_dropped(db_path) as raw:
            raw.execute(
                "UPDATE cassette_checkpoints SET context_json = ? WHERE checkpoint_id = ?",
                (forged, cp),
            )
    with pytest.raises(CassetteError) as excinfo:
        chain.load_checkpoint(cp)
    refused(excinfo, ErrorCode.CHECKPOINT_MISMATCH)
    with pytest.raises(CassetteError) as excinfo:
        chain.latest_checkpoint("p")
    refused(excinfo, ErrorCode.CHECKPOINT_MISMATCH)
    journal = journal_length(chain)
    with pytest.raises(CassetteError) as excinfo:
        chain.resume("p")
    refused(excinfo, ErrorCode.CHECKPOINT_MISMATCH)
    assert journal_length(chain) == journal
    assert chain.plan_status("p")["state"] == "paused"
    report = verify_path(str(db_path))
    assert not report.ok
    named = {(f.kind, f.table, f.key) for f in report.errors}
    assert ("state_mismatch", "cassette_checkpoints", cp) in named, report.to_dict()
    assert all(f.table == "cassette_checkpoints" for f in report.errors), report.to_dict()


@PACKAGE_CONNECTION
@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda text: UNKNOWN_CHECKPOINT, id="another-hash"),
        pytest.param(
            lambda text: "cp-" + hashlib.sha256((text + " ").encode()).hexdigest(), id="near-hash"
        ),
        pytest.param(
            lambda text: "cp-" + hashlib.sha256(text.encode()).hexdigest().upper(), id="uppercase"
        ),
        pytest.param(lambda text: hashlib.sha256(text.encode()).hexdigest(), id="no-prefix"),
        pytest.param(lambda text: "cp-" + hashlib.md5(text.encode()).hexdigest(), id="md5"),
    ],
)
def test_a_wrong_checkpoint_id_through_the_package_connection(
    chain: CausalChain, db_path: Path, forge: Callable[[str], str]
) -> None:
    text = canonical({"context": {"cursor": 1}, "plan_id": "p"})
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo, write_transaction(chain.conn) as conn:
        conn.execute(
            "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
            " VALUES (?, 'p', ?, 0)",
            (forge(text), text),
        )
    refused(excinfo, ErrorCode.CHECKPOINT_MISMATCH)
    assert package_idle(chain)
    assert dump(db_path) == before
    with write_transaction(chain.conn) as conn:  # the right id is accepted and journaled
        conn.execute(
            "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
            " VALUES (?, 'p', ?, 0)",
            (checkpoint_id("p", {"cursor": 1}), text),
        )
    assert journal_length(chain) == 1
    assert verify_path(str(db_path)).ok


def _start(chain: CausalChain, plan_id: str = "p") -> Action:
    return chain.append_action(
        {
            "plan_id": plan_id,
            "intent_id": f"intent-{plan_id}",
            "action_type": "PlanStarted",
            "function_name": "start",
        }
    )


def test_pause_and_resume_record_their_actions(chain: CausalChain, clock: ManualClock) -> None:
    started = _start(chain)
    clock.advance(5)
    paused = chain.pause("p", {"cursor": 3}, metadata={"reason": "waiting"}, rationale="wait")
    cp = checkpoint_id("p", {"cursor": 3})
    assert paused.action_type == "PlanPaused"
    assert paused.parent_action_id == started.action_id
    assert paused.intent_id == "intent-p"
    assert paused.function_name == "pause"
    assert paused.metadata == {"reason": "waiting", "checkpoint_id": cp}
    assert paused.rationale == "wait"
    assert chain.get_action(paused.action_id) == paused
    assert chain.plan_status("p")["state"] == "paused"
    latest = chain.latest_checkpoint("p")
    assert latest is not None
    assert (latest["checkpoint_id"], latest["context"]) == (cp, {"cursor": 3})

    clock.advance(5)
    result = chain.resume("p")
    assert (result["checkpoint_id"], result["context"]) == (cp, {"cursor": 3})
    resumed = result["action"]
    assert resumed.action_type == "PlanResumed"
    assert resumed.parent_action_id == started.action_id
    assert resumed.metadata == {"checkpoint_id": cp}
    assert resumed.intent_id == "intent-p"
    assert chain.get_action(resumed.action_id) == resumed
    assert chain.plan_status("p")["state"] == "running"

    journal = journal_length(chain)
    with pytest.raises(CassetteError) as excinfo:
        chain.resume("p")
    refused(excinfo, ErrorCode.PLAN_NOT_PAUSED)
    with pytest.raises(CassetteError) as excinfo:
        chain.resume("nobody")
    refused(excinfo, ErrorCode.PLAN_NOT_PAUSED)
    assert journal_length(chain) == journal


def test_resume_an_unknown_or_foreign_checkpoint_is_not_found(chain: CausalChain) -> None:
    _start(chain, "p")
    _start(chain, "q")
    chain.pause("p", {"at": "p"})
    foreign = chain.pause("q", {"at": "q"}).metadata["checkpoint_id"]
    journal = journal_length(chain)
    for wrong in (UNKNOWN_CHECKPOINT, foreign):
        with pytest.raises(CassetteError) as excinfo:
            chain.resume("p", wrong)
        refused(excinfo, ErrorCode.NOT_FOUND)
    assert journal_length(chain) == journal
    assert chain.plan_status("p")["state"] == "paused"
    assert chain.resume("q", foreign)["context"] == {"at": "q"}


def test_latest_checkpoint_follows_the_last_pause(chain: CausalChain) -> None:
    _start(chain)
    assert chain.latest_checkpoint("p") is None
    contexts = [{"n": 1}, {"n": 2}, {"n": 1}]  # the third pause reuses the first row
    for context in contexts:
        paused = chain.pause("p", context)
        latest = chain.latest_checkpoint("p")
        assert latest is not None
        assert latest["context"] == context
        assert latest["checkpoint_id"] == paused.metadata["checkpoint_id"]
        assert chain.resume("p")["context"] == context
    count = backends.rows(chain.db_path, "SELECT count(*) FROM cassette_checkpoints")[0][0]
    assert count == 2
    # resume may name any earlier checkpoint of the plan
    chain.pause("p", {"n": 3})
    older = checkpoint_id("p", {"n": 2})
    assert chain.resume("p", older)["context"] == {"n": 2}
    latest = chain.latest_checkpoint("p")
    assert latest is not None and latest["context"] == {"n": 3}
    # a plan that never paused: its newest saved checkpoint
    chain.save_checkpoint("r", {"first": True})
    chain.save_checkpoint("r", {"second": True})
    latest = chain.latest_checkpoint("r")
    assert latest is not None and latest["context"] == {"second": True}


def test_resume_without_any_checkpoint_is_not_found(chain: CausalChain) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    started = _start(chain)
    chain.append_action({**base, "action_type": "PlanPaused"})  # paused, no checkpoint named
    journal = journal_length(chain)
    with pytest.raises(CassetteError) as excinfo:
        chain.resume("p")
    refused(excinfo, ErrorCode.NOT_FOUND)
    assert journal_length(chain) == journal
    assert chain.latest_checkpoint("p") is None
    # a checkpoint saved for the plan is then the one resumed from
    cp = chain.save_checkpoint("p", {"saved": "later"})
    result = chain.resume("p")
    assert (result["checkpoint_id"], result["context"]) == (cp, {"saved": "later"})
    assert result["action"].parent_action_id == started.action_id


def test_a_context_over_16_mib_is_refused(chain: CausalChain, db_path: Path) -> None:
    _start(chain)
    before = dump(db_path)
    huge = {"blob": "x" * (16 * 1024 * 1024)}
    with pytest.raises(CassetteError) as excinfo:
        chain.save_checkpoint("p", huge)
    refused(excinfo, ErrorCode.PAYLOAD_TOO_LARGE)
    with pytest.raises(CassetteError) as excinfo:
        chain.pause("p", huge)
    refused(excinfo, ErrorCode.PAYLOAD_TOO_LARGE)
    assert dump(db_path) == before
    assert chain.plan_status("p")["state"] == "running"


def test_pause_then_abort_while_paused(chain: CausalChain) -> None:
    _start(chain)
    chain.pause("p", {})
    chain.append_action(
        {"plan_id": "p", "intent_id": "i", "action_type": "PlanAborted", "function_name": "stop"}
    )
    assert chain.plan_status("p")["state"] == "aborted"
    with pytest.raises(CassetteError) as excinfo:
        chain.resume("p")
    refused(excinfo, ErrorCode.PLAN_NOT_PAUSED)


@pytest.mark.parametrize("setup", ["finished", "paused", "not-started", "no-actions"])
def test_a_refused_pause_changes_nothing(chain: CausalChain, db_path: Path, setup: str) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    if setup == "finished":
        chain.append_actions(
            [{**base, "action_type": "PlanStarted"}, {**base, "action_type": "PlanCompleted"}]
        )
    elif setup == "paused":
        _start(chain)
        chain.pause("p", {"first": True})
    elif setup == "not-started":
        chain.append_action({**base, "action_type": "CapabilityCall"})
    before = dump(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.pause("p", {"second": True})
    assert excinfo.value.code in (
        ErrorCode.PLAN_FINISHED,
        ErrorCode.PLAN_NOT_RUNNING,
        ErrorCode.PLAN_NOT_STARTED,
    )
    assert dump(db_path) == before


def test_plan_status_totals_cost_and_duration(chain: CausalChain) -> None:
    base = {"plan_id": "p", "intent_id": "i", "function_name": "f"}
    started = chain.append_action({**base, "action_type": "PlanStarted", "cost": 0.1})
    step = chain.append_action(
        {
            **base,
            "action_type": "PlanStepStarted",
            "function_name": "fetch",
            "cost": 0.2,
            "duration_ms": 30,
            "metadata": {"retries": {"max": 1}, "timeout_ms": 500, "on_fail": "retry"},
            "parent_action_id": started.action_id,
        }
    )
    chain.append_actions(
        [
            {**base, "action_type": "CapabilityCall", "cost": 1.25, "duration_ms": 100},
            {
                **base,
                "action_type": "PlanStepRetrying",
                "parent_action_id": step.action_id,
                "duration_ms": 5,
            },
            {
                **base,
                "action_type": "PlanStepCompleted",
                "parent_action_id": step.action_id,
                "cost": 0.000001,
            },
            {**base, "plan_id": "other", "action_type": "InternalStep", "cost": 99.0},
        ]
    )
    chain.pause("p", {"x": 1})
    chain.resume("p")
    chain.append_action({**base, "action_type": "PlanCompleted", "duration_ms": 1})
    status = chain.plan_status("p")
    assert status == {
        "plan_id": "p",
        "state": "completed",
        "steps": [
            {
                "action_id": step.action_id,
                "function_name": "fetch",
                "state": "completed",
                "retries": 1,
                "max_retries": 1,
                "timeout_ms": 500,
                "on_fail": "retry",
            }
        ],
        "actions": 8,
        "total_cost": 1.550001,
        "total_duration_ms": 136,
    }
    assert chain.plan_status("other")["total_cost"] == 99.0
    assert chain.plan_status("other")["state"] == "not_started"
    with pytest.raises(CassetteError) as excinfo:
        chain.plan_status("missing")
    refused(excinfo, ErrorCode.NOT_FOUND)
