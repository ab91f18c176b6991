"""The ledger's read-only queries as MCP tools over stdio (optional extra: mcp).

Every tool call opens its own read-only connection and reads one snapshot, so the
server never writes, never migrates, and never holds a read transaction between calls.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import dependencies, reasoning
from .actions import SELECT_COLUMNS, from_row
from .artifacts import ArtifactStore, default_root
from .connection import connect_readonly, read_transaction
from .errors import CassetteError, ErrorCode
from .metrics import metrics as compute_metrics
from .migrate import current_version, schema_version
from .timeline import parse_time

SERVER_NAME = "catalytic-cassette"
_SCOPES = (("plan_id", "plan_id"), ("session_id", "session_id"), ("intent_id", "intent_id"))


def _server_class() -> Any:
    """MCPServer (mcp 2), or FastMCP, its name in mcp 1."""
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP  # type: ignore[attr-defined,unused-ignore]

        return FastMCP


@contextmanager
def _reading(db: str) -> Iterator[sqlite3.Connection]:
    conn = connect_readonly(db)
    try:
        version = schema_version(conn)
        if not 0 < version <= current_version():
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"{db} is not a ledger of this version")
        with read_transaction(conn):
            yield conn
    finally:
        conn.close()


def build_server(db: str) -> Any:
    """A server whose tools read ``db``; ``run()`` serves it on stdio."""
    server = _server_class()(SERVER_NAME)

    def build_causal_chain(action_id: str, max_depth: int | None = None) -> dict[str, Any]:
        """The cause chain of an action, root cause first (depth 0)."""
        with _reading(db) as conn:
            return reasoning.build_causal_chain(conn, action_id, max_depth)

    def reconstruct_reasoning(action_id: str) -> dict[str, Any]:
        """Why an action happened: category, rationale, direct cause and parent."""
        with _reading(db) as conn:
            return reasoning.reconstruct_reasoning(conn, action_id)

    def get_causality_stats(
        plan_id: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """Causality statistics, under the ledger's and the causality engine's definitions."""
        with _reading(db) as conn:
            return reasoning.causality_stats(conn, plan_id, session_id)

    def detect_dependencies(
        action_id: str | None = None,
        plan_id: str | None = None,
        session_id: str | None = None,
        intent_id: str | None = None,
        scope: str = "plan",
        at: str | None = None,
        window_ms: int = dependencies.DEFAULT_WINDOW_MS,
        limit: int = dependencies.DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """Candidate causes, newest first, each with its reason (proposals, not facts)."""
        import time

        with _reading(db) as conn:
            found = dependencies.detect_dependencies(
                conn,
                now_ms=time.time_ns() // 1_000_000,
                action_id=action_id,
                plan_id=plan_id,
                session_id=session_id,
                intent_id=intent_id,
                scope=scope,
                at_ms=None if at is None else parse_time(at),
                window_ms=window_ms,
                limit=limit,
            )
        return {"candidates": found}

    def latest(
        plan_id: str | None = None, session_id: str | None = None, intent_id: str | None = None
    ) -> dict[str, Any]:
        """The newest action of a plan, session or intent (or of the ledger)."""
        return {"action": newest_action(db, plan_id, session_id, intent_id)}

    def metrics(by: str) -> dict[str, Any]:
        """Count, failures, failure rate, durations and cost per plan, intent, session,
        function or capability."""
        with _reading(db) as conn:
            return {"by": by, "groups": compute_metrics(conn, by)}

    def verify(session_id: str | None = None) -> dict[str, Any]:
        """Verify the whole ledger, or one session without reading the rest."""
        if session_id is not None:
            from .session_verify import verify_session_path

            return verify_session_path(db, session_id).to_dict()
        from .verify import verify_path

        report = verify_path(db)
        return {"ok": report.ok, **report.to_dict()}

    tools = (
        build_causal_chain,
        reconstruct_reasoning,
        get_causality_stats,
        detect_dependencies,
        latest,
        metrics,
        verify,
    )
    for tool in tools:
        server.tool()(tool)
    return server


def newest_action(
    db: str, plan_id: str | None, session_id: str | None, intent_id: str | None
) -> dict[str, Any] | None:
    clauses, params = ["1"], []
    for column, value in (
        ("plan_id", plan_id),
        ("session_id", session_id),
        ("intent_id", intent_id),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    store = ArtifactStore(default_root(db).resolve(), Path(db).resolve().parent)
    with _reading(db) as conn:
        row = conn.execute(
            f"SELECT {SELECT_COLUMNS} FROM cassette_actions WHERE {' AND '.join(clauses)}"
            " ORDER BY action_seq DESC LIMIT 1",
            params,
        ).fetchone()
        return None if row is None else from_row(tuple(row), store.get).to_dict()


def serve(db: str) -> None:
    """Serve on stdio until the client closes the stream. Refuses a missing ledger first."""
    with _reading(db):
        pass
    build_server(db).run()
