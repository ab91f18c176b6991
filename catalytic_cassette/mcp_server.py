"""The ledger's read-only queries as MCP tools over stdio (optional extra: mcp).

Every tool call opens the ledger read-only (a SQLite file or a ``postgresql://`` URL)
and reads one snapshot, so the server never writes, never migrates, and never holds a
read transaction between calls. The answers are ``CausalChain``'s own (reasoning.py,
dependencies.py, metrics.py through either backend's named reads): the same JSON from
either backend for the same ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import dependencies
from .chain import CausalChain
from .timeline import parse_time

SERVER_NAME = "catalytic-cassette"


def _server_class() -> Any:
    """MCPServer (mcp 2), or FastMCP, its name in mcp 1."""
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP  # type: ignore[attr-defined,unused-ignore]

        return FastMCP


@contextmanager
def _reading(db: str) -> Iterator[CausalChain]:
    """The ledger opened read-only (never created, migrated or written: CANNOT_OPEN,
    NOT_A_CASSETTE, SCHEMA_OUTDATED otherwise), its reads in one snapshot, then closed."""
    chain = CausalChain(db, read_only=True)
    try:
        with chain.read_snapshot():
            yield chain
    finally:
        chain.close()


def build_server(db: str) -> Any:
    """A server whose tools read ``db``; ``run()`` serves it on stdio."""
    server = _server_class()(SERVER_NAME)

    def build_causal_chain(action_id: str, max_depth: int | None = None) -> dict[str, Any]:
        """The cause chain of an action, root cause first (depth 0)."""
        with _reading(db) as chain:
            return chain.build_causal_chain(action_id, max_depth)

    def reconstruct_reasoning(action_id: str) -> dict[str, Any]:
        """Why an action happened: category, rationale, direct cause and parent."""
        with _reading(db) as chain:
            return chain.reconstruct_reasoning(action_id)

    def get_causality_stats(
        plan_id: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """Causality statistics, under the ledger's and the causality engine's definitions."""
        with _reading(db) as chain:
            return chain.causality_stats(plan_id, session_id)

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
        with _reading(db) as chain:
            found = chain.detect_dependencies(
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
        with _reading(db) as chain:
            found = chain.latest(plan_id=plan_id, session_id=session_id, intent_id=intent_id)
            return {"action": None if found is None else found.to_dict()}

    def metrics(by: str) -> dict[str, Any]:
        """Count, failures, failure rate, durations and cost per plan, intent, session,
        function or capability."""
        with _reading(db) as chain:
            return {"by": by, "groups": chain.metrics(by)}

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


def serve(db: str) -> None:
    """Serve on stdio until the client closes the stream. Refuses a missing ledger first."""
    with _reading(db):
        pass
    build_server(db).run()
