"""Plan lifecycle reads and checkpoints. The lifecycle rules themselves are SQL
(schema/40_actions.sql)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from . import payloads
from .actions import COST_SCALE
from .errors import CassetteError, ErrorCode
from .hashing import sha256_hex

PLAN_STATES = {
    None: "not_started",
    "PlanStarted": "running",
    "PlanResumed": "running",
    "PlanPaused": "paused",
    "PlanCompleted": "completed",
    "PlanAborted": "aborted",
}
# The partial index cassette_actions_plan_lifecycle is used only by a query that repeats its
# WHERE clause exactly (schema/40_actions.sql: comparisons, not an IN list).
_LIFECYCLE = (
    "(action_type = 'PlanStarted' OR action_type = 'PlanPaused' OR action_type = 'PlanResumed'"
    " OR action_type = 'PlanCompleted' OR action_type = 'PlanAborted')"
)


def plan_state(conn: sqlite3.Connection, plan_id: str) -> str:
    row = conn.execute(
        "SELECT action_type FROM cassette_actions"
        f" WHERE plan_id = ? AND {_LIFECYCLE} ORDER BY action_seq DESC LIMIT 1",
        (plan_id,),
    ).fetchone()
    return PLAN_STATES[row[0] if row else None]


def plan_started_id(conn: sqlite3.Connection, plan_id: str) -> str | None:
    row = conn.execute(
        "SELECT action_id FROM cassette_actions WHERE plan_id = ? AND action_type = 'PlanStarted'"
        " ORDER BY action_seq LIMIT 1",
        (plan_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def plan_status(conn: sqlite3.Connection, plan_id: str) -> dict[str, Any]:
    """State, steps with their states and retry counts, and totals of cost and duration."""
    steps = conn.execute(
        """
        SELECT s.action_id, s.function_name, s.metadata_json,
               (SELECT count(*) FROM cassette_actions c
                 WHERE c.parent_action_id = s.action_id AND c.action_type = 'PlanStepRetrying'),
               (SELECT c.action_type FROM cassette_actions c
                 WHERE c.parent_action_id = s.action_id
                   AND c.action_type IN ('PlanStepCompleted', 'PlanStepFailed')
                 ORDER BY c.action_seq LIMIT 1)
          FROM cassette_actions s
         WHERE s.plan_id = ? AND s.action_type = 'PlanStepStarted'
         ORDER BY s.action_seq
        """,
        (plan_id,),
    ).fetchall()
    totals = conn.execute(
        "SELECT count(*), coalesce(sum(cost_micros), 0), coalesce(sum(duration_ms), 0)"
        " FROM cassette_actions WHERE plan_id = ?",
        (plan_id,),
    ).fetchone()
    return plan_status_of(plan_id, steps, totals, lambda: plan_state(conn, plan_id))


def plan_status_of(
    plan_id: str,
    step_rows: Iterable[tuple[Any, ...]],
    totals: tuple[Any, ...],
    state: Callable[[], str],
) -> dict[str, Any]:
    """``plan_status`` from its rows, as any backend reads them: each PlanStepStarted
    (action_id, function_name, metadata_json, retries, closing type) and the plan's
    (count, cost_micros, duration_ms)."""
    steps = []
    for action_id, function_name, metadata_json, retries, outcome in step_rows:
        policy = payloads.loads_object(metadata_json, f"the metadata of action {action_id}")
        steps.append(
            {
                "action_id": action_id,
                "function_name": function_name,
                "state": {"PlanStepCompleted": "completed", "PlanStepFailed": "failed"}.get(
                    outcome, "running"
                ),
                "retries": retries,
                "max_retries": _max_retries(policy.get("retries")),
                "timeout_ms": policy.get("timeout_ms"),
                "on_fail": policy.get("on_fail"),
            }
        )
    count, cost, duration = totals
    if count == 0:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no actions for plan {plan_id}")
    return {
        "plan_id": plan_id,
        "state": state(),
        "steps": steps,
        "actions": count,
        "total_cost": cost / COST_SCALE,
        "total_duration_ms": duration,
    }


def checkpoint_text(plan_id: str, context: Any) -> str:
    """The stored bytes of a checkpoint: canonical JSON of the plan and its context."""
    return payloads.dumps({"context": context, "plan_id": plan_id})


def checkpoint_id_for(text: str) -> str:
    digest = sha256_hex(text)
    assert digest is not None
    return "cp-" + digest


def load_checkpoint(conn: sqlite3.Connection, checkpoint_id: str) -> dict[str, Any]:
    """The stored checkpoint, its hash checked on read."""
    row = conn.execute(
        "SELECT checkpoint_id, plan_id, context_json, created_at FROM cassette_checkpoints"
        " WHERE checkpoint_id = ?",
        (checkpoint_id,),
    ).fetchone()
    return checkpoint_of(checkpoint_id, row)


def checkpoint_of(checkpoint_id: str, row: tuple[Any, ...] | None) -> dict[str, Any]:
    """A checkpoint from its row (checkpoint_id, plan_id, context_json, created_at), or
    None when there is none; its hash checked."""
    if row is None:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no checkpoint {checkpoint_id}")
    if checkpoint_id_for(row[2]) != row[0]:
        raise CassetteError(
            ErrorCode.CHECKPOINT_MISMATCH, f"checkpoint {checkpoint_id} does not match its hash"
        )
    what = f"the context of checkpoint {row[0]}"
    stored = payloads.loads_object(row[2], what)
    if "context" not in stored:  # a row and its id rewritten together by hand
        raise CassetteError(ErrorCode.UNREADABLE_ROW, f"{what} holds no context")
    return {
        "checkpoint_id": row[0],
        "plan_id": row[1],
        "context": stored["context"],
        "created_at": row[3],
    }


def latest_checkpoint_id(conn: sqlite3.Connection, plan_id: str) -> str | None:
    """The checkpoint of the plan's last pause, else the plan's newest checkpoint."""
    row = conn.execute(
        "SELECT json_extract(metadata_json, '$.checkpoint_id') FROM cassette_actions"
        " WHERE plan_id = ? AND action_type = 'PlanPaused'"
        " AND json_extract(metadata_json, '$.checkpoint_id') IS NOT NULL"
        " ORDER BY action_seq DESC LIMIT 1",
        (plan_id,),
    ).fetchone()
    if row is not None:
        return str(row[0])
    row = conn.execute(
        "SELECT checkpoint_id FROM cassette_checkpoints WHERE plan_id = ?"
        " ORDER BY checkpoint_seq DESC LIMIT 1",
        (plan_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def _max_retries(retries: Any) -> Any:
    """A step's ``retries.max`` as stored (the SQL checks its shape on insert)."""
    return retries.get("max", 0) if isinstance(retries, dict) else 0
