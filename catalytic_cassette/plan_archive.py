"""A plan's body archived on its PlanStarted action (metadata.plan_body, text) with
its SHA-256 (metadata.plan_hash); SQL checks both on append (migration 7 and a TEMP
trigger), and a read checks the hash again."""

from __future__ import annotations

import sqlite3
from typing import Any

from .errors import CassetteError, ErrorCode
from .hashing import sha256_hex
from .payloads import loads_object


def with_plan_hash(action_type: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata with plan_hash filled in when a PlanStarted carries a text plan_body
    and no hash; anything else is left for the SQL guards to judge."""
    body = metadata.get("plan_body")
    if action_type == "PlanStarted" and isinstance(body, str) and "plan_hash" not in metadata:
        return {**metadata, "plan_hash": sha256_hex(body)}
    return metadata


def plan_body(conn: sqlite3.Connection, plan_id: str) -> dict[str, Any]:
    """The archived body of a plan, its hash checked on read (PLAN_HASH_MISMATCH)."""
    row = conn.execute(
        "SELECT action_id, metadata_json FROM cassette_actions"
        " WHERE plan_id = ? AND action_type = 'PlanStarted' ORDER BY action_seq LIMIT 1",
        (plan_id,),
    ).fetchone()
    return body_of(plan_id, row)


def body_of(plan_id: str, row: tuple[Any, ...] | None) -> dict[str, Any]:
    """The body from the plan's PlanStarted row (action_id, metadata_json), or None when
    the plan has not started; its hash checked."""
    if row is None:
        raise CassetteError(ErrorCode.NOT_FOUND, f"plan {plan_id} has not started")
    metadata = loads_object(row[1], f"the metadata of action {row[0]}")
    body = metadata.get("plan_body")
    if not isinstance(body, str):
        raise CassetteError(ErrorCode.NOT_FOUND, f"plan {plan_id} carries no plan body")
    if metadata.get("plan_hash") != sha256_hex(body):
        raise CassetteError(
            ErrorCode.PLAN_HASH_MISMATCH, f"the body of plan {plan_id} does not match its hash"
        )
    return {
        "plan_id": plan_id,
        "action_id": row[0],
        "plan_hash": metadata["plan_hash"],
        "plan_body": body,
    }
