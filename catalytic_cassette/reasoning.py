"""Why it happened: cause chains, reasoning, statistics. Each is one SQL query.

The logic reads through a ``Fetch`` (a named statement and its parameters -> rows), so
each backend supplies its own SQL: SQLite's is here (``sqlite_fetch``), PostgreSQL's in
``sql/postgresql/queries.sql`` under the same names.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from .actions import CATEGORIES
from .connection import read_transaction
from .errors import CassetteError, ErrorCode

SUMMARY_WIDTH = 100
_HAS_CAUSALITY = "(caused_by IS NOT NULL OR rationale IS NOT NULL OR category IS NOT NULL)"

# From the action up its caused_by links; hops counts from the action (0) upwards.
_UP = """
WITH RECURSIVE up(action_id, caused_by, hops) AS (
    SELECT action_id, caused_by, 0 FROM cassette_actions WHERE action_id = :id
    UNION ALL
    SELECT a.action_id, a.caused_by, up.hops + 1
      FROM up JOIN cassette_actions a ON a.action_id = up.caused_by
     WHERE :limit < 0 OR up.hops < :limit
)
SELECT up.hops, a.action_id, a.caused_by, a.category, a.timestamp, a.function_name,
       a.action_type, a.rationale, a.success
  FROM up JOIN cassette_actions a ON a.action_id = up.action_id
 ORDER BY up.hops DESC
"""

_DOWN = """
WITH RECURSIVE down(action_id) AS (
    SELECT action_id FROM cassette_actions WHERE caused_by = :id
    UNION
    SELECT a.action_id FROM down JOIN cassette_actions a ON a.caused_by = down.action_id
)
SELECT a.action_id FROM cassette_actions a
 WHERE a.action_id IN (SELECT action_id FROM down) ORDER BY a.action_seq
"""


_ACTION_BRIEF = (
    "SELECT action_id, caused_by, category, rationale, action_type, function_name, success,"
    " parent_action_id, timestamp FROM cassette_actions WHERE action_id = :id"
)
_SUMMARY_OF = (
    "SELECT action_type, function_name, rationale, success FROM cassette_actions"
    " WHERE action_id = :id"
)

# A named read: the statement's name and its parameters -> its rows.
Fetch = Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]

SQLITE_READS: dict[str, str] = {
    "reasoning_action": _ACTION_BRIEF,
    "reasoning_summary_of": _SUMMARY_OF,
    "reasoning_up": _UP,
    "reasoning_down": _DOWN,
}


def sqlite_fetch(conn: sqlite3.Connection, statements: Mapping[str, str] = SQLITE_READS) -> Fetch:
    """A ``Fetch`` over a SQLite connection and these named statements."""

    def fetch(name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in conn.execute(statements[name], params)]

    return fetch


def summary(action_type: str, function_name: str, rationale: str | None, success: Any) -> str:
    """One line for people: type, function, outcome and the start of the rationale."""
    line = f"{action_type} {function_name}" + ("" if success in (1, True) else " (failed)")
    if rationale:
        line += f": {' '.join(str(rationale).split())}"
    return line if len(line) <= SUMMARY_WIDTH else line[: SUMMARY_WIDTH - 3] + "..."


def _require(fetch: Fetch, action_id: str) -> tuple[Any, ...]:
    rows = fetch("reasoning_action", {"id": action_id})
    if not rows:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")
    return rows[0]


def build_causal_chain(
    conn: sqlite3.Connection, action_id: str, max_depth: int | None = None
) -> dict[str, Any]:
    """The cause chain from its root down to the action, in one recursive query."""
    return causal_chain_of(sqlite_fetch(conn), action_id, max_depth)


def causal_chain_of(fetch: Fetch, action_id: str, max_depth: int | None = None) -> dict[str, Any]:
    """``build_causal_chain`` through any backend's reads.

    ``max_depth`` limits how many causes above the action are walked; ``truncated``
    says whether the walk was cut before reaching the root.
    """
    if max_depth is not None and (
        isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0
    ):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "max_depth must be a non-negative integer")
    _require(fetch, action_id)
    rows = fetch("reasoning_up", {"id": action_id, "limit": -1 if max_depth is None else max_depth})
    entries = []
    truncated = False
    for depth, row in enumerate(rows):
        _hops, aid, caused_by, category, timestamp, function_name, action_type, rationale, ok = row
        if depth == 0 and caused_by is not None:
            truncated = True
        entries.append(
            {
                "depth": depth,
                "action_id": aid,
                "caused_by": caused_by,
                "category": category,
                "timestamp": timestamp,
                "function_name": function_name,
                "action_type": action_type,
                "summary": summary(action_type, function_name, rationale, ok),
            }
        )
    return {
        "action_id": action_id,
        "truncated": truncated,
        "length": len(entries),
        "chain": entries,
    }


def reconstruct_reasoning(conn: sqlite3.Connection, action_id: str) -> dict[str, Any]:
    """The action's category, rationale and summary, its direct cause and its parent."""
    return reasoning_of(sqlite_fetch(conn), action_id)


def reasoning_of(fetch: Fetch, action_id: str) -> dict[str, Any]:
    """``reconstruct_reasoning`` through any backend's reads."""
    aid, caused_by, category, rationale, action_type, function_name, ok, parent, _ = _require(
        fetch, action_id
    )
    result: dict[str, Any] = {
        "action_id": aid,
        "category": category,
        "rationale": rationale,
        "summary": summary(action_type, function_name, rationale, ok),
        "cause": _brief(fetch, caused_by),
        "parent": _brief(fetch, parent),
        "has_causality": caused_by is not None or rationale is not None or category is not None,
    }
    if not result["has_causality"]:
        result["message"] = "no causality data: this action names no cause, rationale or category"
    return result


def _brief(fetch: Fetch, action_id: str | None) -> dict[str, Any] | None:
    if action_id is None:
        return None
    rows = fetch("reasoning_summary_of", {"id": action_id})
    return {"action_id": action_id, "summary": summary(*rows[0])} if rows else None


def downstream(conn: sqlite3.Connection, action_id: str) -> list[str]:
    """Every action caused, directly or transitively, by this one (insertion order)."""
    return downstream_of(sqlite_fetch(conn), action_id)


def downstream_of(fetch: Fetch, action_id: str) -> list[str]:
    """``downstream`` through any backend's reads."""
    _require(fetch, action_id)
    return [row[0] for row in fetch("reasoning_down", {"id": action_id})]


def causality_stats(
    conn: sqlite3.Connection, plan_id: str | None = None, session_id: str | None = None
) -> dict[str, Any]:
    """Aggregates over every matching action (SQL, never a sample): three aggregate
    statements in one read transaction, so they describe the same snapshot.

    The chain length of an action with a cause is the number of caused_by links from it
    up to its root cause, followed across the whole ledger (a cause may lie outside the
    filter); average and maximum are over the matching actions that have a cause.
    """
    where = ["1"]
    params: dict[str, Any] = {}
    if plan_id is not None:
        where.append("a.plan_id = :plan")
        params["plan"] = plan_id
    if session_id is not None:
        where.append("a.session_id = :session")
        params["session"] = session_id
    scope = " AND ".join(where)
    with read_transaction(conn):
        return _stats(conn, scope, params, plan_id, session_id)


def _stats(
    conn: sqlite3.Connection,
    scope: str,
    params: dict[str, Any],
    plan_id: str | None,
    session_id: str | None,
) -> dict[str, Any]:
    totals = conn.execute(
        f"SELECT count(*), sum({_HAS_CAUSALITY}), sum(caused_by IS NOT NULL),"
        " sum(caused_by IS NOT NULL AND rationale IS NULL),"
        " sum(caused_by IS NULL AND EXISTS (SELECT 1 FROM cassette_actions e"
        "     WHERE e.caused_by = a.action_id)),"
        f" sum(caused_by IS NULL AND {_HAS_CAUSALITY})"
        f" FROM cassette_actions a WHERE {scope}",
        params,
    ).fetchone()
    category_rows = conn.execute(
        f"SELECT category, count(*) FROM cassette_actions a WHERE {scope}"
        " AND category IS NOT NULL GROUP BY category",
        params,
    ).fetchall()
    # Top-down from every root cause: each action is reached once, so this is linear.
    lengths = conn.execute(
        f"""
        WITH RECURSIVE depth(action_id, length) AS (
            SELECT r.action_id, 0 FROM cassette_actions r
             WHERE r.caused_by IS NULL
               AND EXISTS (SELECT 1 FROM cassette_actions e WHERE e.caused_by = r.action_id)
            UNION ALL
            SELECT c.action_id, depth.length + 1
              FROM depth JOIN cassette_actions c ON c.caused_by = depth.action_id
        )
        SELECT avg(depth.length), max(depth.length), sum(depth.length)
          FROM depth JOIN cassette_actions a ON a.action_id = depth.action_id
         WHERE depth.length > 0 AND {scope}
        """,
        params,
    ).fetchone()
    return stats_of(plan_id, session_id, tuple(totals), category_rows, tuple(lengths))


def stats_of(
    plan_id: str | None,
    session_id: str | None,
    totals: tuple[Any, ...],
    category_rows: list[tuple[Any, ...]],
    lengths: tuple[Any, ...],
) -> dict[str, Any]:
    """``causality_stats`` from any backend's three reads: the totals (count, with
    causality, with a cause, a cause without rationale, root causes, isolated roots), the
    (category, count) rows, and the chain lengths (average, maximum, sum)."""
    categories = dict.fromkeys(CATEGORIES, 0)
    for category, count in category_rows:
        categories[category] = count
    return {
        "plan_id": plan_id,
        "session_id": session_id,
        "actions": totals[0],
        "with_causality": totals[1] or 0,
        "with_cause": totals[2] or 0,
        "cause_without_rationale": totals[3] or 0,
        "root_causes": totals[4] or 0,
        "categories": categories,
        "average_chain_length": round(lengths[0], 3) if lengths[0] is not None else 0.0,
        "max_chain_length": lengths[1] or 0,
        **_engine_figures(totals[1] or 0, totals[2] or 0, totals[5] or 0, lengths),
    }


def _engine_figures(
    with_causality: int, with_cause: int, roots: int, lengths: tuple[Any, ...]
) -> dict[str, Any]:
    """The causality engine's definitions, beside ours (LAW.md 6a): every action with
    causality data and no cause is a root (an isolated decision too), and a chain's
    length counts nodes, the action included, over every action with causality data.
    An action without a cause is a chain of one node; one with a cause, links + 1."""
    links = lengths[2] or 0
    if with_causality == 0:
        average, longest = 0.0, 0
    else:
        average = round((with_causality + links) / with_causality, 3)
        longest = (lengths[1] or 0) + 1 if with_cause else 1
    return {
        "root_causes_including_isolated": roots,
        "average_chain_nodes": average,
        "max_chain_nodes": longest,
    }
