"""Causes proposed, not observed: recent actions of the same scope, and whether a cause
chain runs forward in time. Each query is one SQL statement on an index."""

from __future__ import annotations

import itertools
import sqlite3
from typing import Any

from .errors import CassetteError, ErrorCode
from .reasoning import Fetch, sqlite_fetch, summary

DEFAULT_WINDOW_MS = 3_600_000  # the last hour
DEFAULT_LIMIT = 5
MAX_SUGGESTIONS = 20  # the SQL guard on metadata.suggested_causes admits at most this many
SCOPES = {"plan": "plan_id", "session": "session_id", "intent": "intent_id"}

# Newest first by action_seq (the order of truth) on the (scope, action_seq) index; the
# window only filters. The scope column is spliced in from SCOPES, never from input.
_CANDIDATES = """
SELECT action_id, action_type, function_name, rationale, success, timestamp
  FROM cassette_actions
 WHERE {column} = :value AND action_seq < :before_seq
   AND timestamp BETWEEN :since AND :at
 ORDER BY action_seq DESC LIMIT :limit
"""

_UP = """
WITH RECURSIVE up(action_id, hops) AS (
    SELECT :id, 0
    UNION ALL
    SELECT a.caused_by, up.hops + 1
      FROM up JOIN cassette_actions a ON a.action_id = up.action_id
     WHERE a.caused_by IS NOT NULL AND up.hops < :cap
)
SELECT up.hops, up.action_id, a.caused_by, a.timestamp
  FROM up LEFT JOIN cassette_actions a ON a.action_id = up.action_id
 ORDER BY up.hops
"""

_SCOPE_ROW = "SELECT {column}, timestamp, action_seq FROM cassette_actions WHERE action_id = :id"
_CAP = "SELECT coalesce(max(action_seq), 0) FROM cassette_actions"

# The named reads, one per scope where the scope column is spliced in (from SCOPES).
SQLITE_READS: dict[str, str] = {
    "dependencies_up": _UP,
    "dependencies_cap": _CAP,
    **{f"candidates_{s}": _CANDIDATES.format(column=c) for s, c in SCOPES.items()},
    **{f"scope_row_{s}": _SCOPE_ROW.format(column=c) for s, c in SCOPES.items()},
}


def _positive(value: Any, what: str, highest: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"{what} must be a positive integer")
    if highest is not None and value > highest:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"{what} must be at most {highest}")
    return value


def _scope(scope: str) -> str:
    if scope not in SCOPES:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"scope must be one of {sorted(SCOPES)}")
    return SCOPES[scope]


def candidates(
    conn: sqlite3.Connection,
    scope: str,
    value: str,
    *,
    at_ms: int,
    before_seq: int | None = None,
    window_ms: int = DEFAULT_WINDOW_MS,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Actions of the same scope in ``[at_ms - window_ms, at_ms]`` (and before action
    ``before_seq``), newest first, each with the reason it is proposed."""
    return candidates_of(
        sqlite_fetch(conn, SQLITE_READS),
        scope,
        value,
        at_ms=at_ms,
        before_seq=before_seq,
        window_ms=window_ms,
        limit=limit,
    )


def candidates_of(
    fetch: Fetch,
    scope: str,
    value: str,
    *,
    at_ms: int,
    before_seq: int | None = None,
    window_ms: int = DEFAULT_WINDOW_MS,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """``candidates`` through any backend's reads."""
    _scope(scope)
    _positive(window_ms, "window_ms")
    _positive(limit, "limit", MAX_SUGGESTIONS)
    rows = fetch(
        f"candidates_{scope}",
        {
            "value": value,
            "before_seq": (1 << 63) - 1 if before_seq is None else before_seq,
            "since": at_ms - window_ms,
            "at": at_ms,
            "limit": limit,
        },
    )
    found = []
    for action_id, action_type, function_name, rationale, success, timestamp in rows:
        age = at_ms - timestamp
        found.append(
            {
                "action_id": action_id,
                "reason": f"same {scope} {value!r}, {age} ms earlier: "
                + summary(action_type, function_name, rationale, success),
                "timestamp": timestamp,
                "age_ms": age,
            }
        )
    return found


def detect_dependencies(conn: sqlite3.Connection, **query: Any) -> list[dict[str, Any]]:
    """Candidate causes, newest first (``dependencies_of``), read from SQLite."""
    return dependencies_of(sqlite_fetch(conn, SQLITE_READS), **query)


def dependencies_of(
    fetch: Fetch,
    *,
    now_ms: int,
    plan_id: str | None = None,
    session_id: str | None = None,
    intent_id: str | None = None,
    action_id: str | None = None,
    scope: str = "plan",
    at_ms: int | None = None,
    window_ms: int = DEFAULT_WINDOW_MS,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Candidate causes, newest first, each with its reason.

    For an existing action (``action_id``): actions of its ``scope`` (plan, session or
    intent) appended before it, within ``window_ms`` before its timestamp. Otherwise
    exactly one of plan_id, session_id, intent_id, and a time ``at_ms`` (default now).
    """
    _scope(scope)  # whichever form is asked: a misspelt scope never passes unseen
    given = {k: v for k, v in (("plan", plan_id), ("session", session_id), ("intent", intent_id))}
    named = {k: v for k, v in given.items() if v is not None}
    if action_id is not None:
        if named or at_ms is not None:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, "give an action, or a scope and a time, not both"
            )
        found = fetch(f"scope_row_{scope}", {"id": action_id})
        if not found:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")
        row = found[0]
        if row[0] is None:
            return []  # an action without a session has no session neighbours
        return candidates_of(
            fetch,
            scope,
            row[0],
            at_ms=row[1],
            before_seq=row[2],
            window_ms=window_ms,
            limit=limit,
        )
    if len(named) != 1:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT, "give exactly one of plan, session or intent (or an action)"
        )
    ((scope_name, value),) = named.items()
    when = now_ms if at_ms is None else at_ms
    if isinstance(when, bool) or not isinstance(when, int):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "at must be epoch milliseconds")
    return candidates_of(fetch, scope_name, value, at_ms=when, window_ms=window_ms, limit=limit)


def validate_causal_chain(conn: sqlite3.Connection, action_id: str) -> dict[str, Any]:
    """``validate_causal_chain_of``, read from SQLite."""
    return validate_causal_chain_of(sqlite_fetch(conn, SQLITE_READS), action_id)


def validate_causal_chain_of(fetch: Fetch, action_id: str) -> dict[str, Any]:
    """Walk the causes of one action up to its root: every cause must exist and carry a
    timestamp no later than its effect's. A ledger whose triggers were intact never
    fails this (LAW.md 6c); rows written before migration 7, or by hand with the
    triggers dropped, can. One recursive query; cycles (possible only in a forged
    file) stop at the ledger's size."""
    cap = fetch("dependencies_cap", {})[0][0]
    rows = fetch("dependencies_up", {"id": action_id, "cap": cap})
    if rows[0][3] is None:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")
    problems: list[dict[str, Any]] = []
    for effect, cause in itertools.pairwise(rows):
        _, effect_id, _, effect_time = effect
        _, cause_id, _, cause_time = cause
        if cause_time is None:
            problems.append({"kind": "cause_missing", "effect": effect_id, "cause": cause_id})
        elif cause_time > effect_time:
            problems.append(
                {
                    "kind": "cause_after_effect",
                    "effect": effect_id,
                    "cause": cause_id,
                    "effect_timestamp": effect_time,
                    "cause_timestamp": cause_time,
                }
            )
    return {
        "action_id": action_id,
        "ok": not problems,
        "length_nodes": len(rows),
        "chain": [r[1] for r in rows],
        "problems": problems,
    }
