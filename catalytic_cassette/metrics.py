"""Counts, failures, durations and cost of actions grouped by one dimension: one SQL
statement per call (window functions rank durations for the percentiles)."""

from __future__ import annotations

import sqlite3
from typing import Any

from .actions import COST_SCALE
from .errors import CassetteError, ErrorCode

# dimension -> (grouping column, the actions it counts). "capability" is what a
# capability call named: CapabilityCall actions by function_name.
DIMENSIONS = {
    "plan": ("plan_id", "1 = 1"),
    "intent": ("intent_id", "1 = 1"),
    "session": ("session_id", "1 = 1"),
    "function": ("function_name", "1 = 1"),
    "capability": ("function_name", "action_type = 'CapabilityCall'"),
}

# Nearest-rank percentiles: the value at rank ceil(p * n / 100) of the sorted durations.
_METRICS = """
SELECT k, count(*), sum(success = 0), sum(duration_ms), sum(cost_micros),
       max(CASE WHEN r = (n * 50 + 99) / 100 THEN duration_ms END),
       max(CASE WHEN r = (n * 95 + 99) / 100 THEN duration_ms END)
  FROM (SELECT {column} AS k, success, duration_ms, cost_micros,
               row_number() OVER (PARTITION BY {column} ORDER BY duration_ms) AS r,
               count(*) OVER (PARTITION BY {column}) AS n
          FROM cassette_actions WHERE {where})
 GROUP BY k ORDER BY k
"""


def grouping(by: str) -> tuple[str, str]:
    """The grouping column and the condition of the actions counted, for ``by``."""
    if by not in DIMENSIONS:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"by must be one of {sorted(DIMENSIONS)}")
    return DIMENSIONS[by]


def metrics(conn: sqlite3.Connection, by: str) -> list[dict[str, Any]]:
    """One row per value of ``by`` (plan, intent, session, function or capability);
    actions without a session form the group whose ``session`` is null."""
    column, where = grouping(by)
    return metric_rows(by, conn.execute(_METRICS.format(column=column, where=where)).fetchall())


def metric_rows(by: str, rows: list[Any]) -> list[dict[str, Any]]:
    """The result of either backend's query: one dict per group, in the query's order."""
    return [
        {
            by: key,
            "count": count,
            "failures": int(failures),
            "failure_rate": round(int(failures) / count, 6),
            "total_duration_ms": None if duration is None else int(duration),
            "p50_duration_ms": p50,
            "p95_duration_ms": p95,
            "total_cost": None if cost is None else int(cost) / COST_SCALE,
        }
        for key, count, failures, duration, cost, p50, p95 in rows
    ]
