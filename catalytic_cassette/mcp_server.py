"""The ledger's read-only queries as MCP tools over stdio (optional extra: mcp, 2.3 or later).

Every tool call opens the ledger read-only (a SQLite file or a ``postgresql://`` URL)
and reads one snapshot, so the server never writes, never migrates, and never holds a
read transaction between calls. The answers are ``CausalChain``'s own (reasoning.py,
dependencies.py, metrics.py through either backend's named reads): the same JSON from
either backend for the same ledger.

A refusal is the SDK's tool error (``is_error``) whose text is ``CODE: message``, the
code and message also as structured content, so an agent can branch on the code. The
arguments are checked by the same rules, with the same codes, as the API's: the JSON
Schema the SDK publishes (types, enumerations taken from the API's own tables) and the
API's validation behind it. Nothing a caller can send is a crash: the server's stderr
stays quiet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from inspect import signature
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import Field, Strict, ValidationError

from . import dependencies
from .chain import CausalChain
from .errors import CassetteError, ErrorCode
from .metrics import DIMENSIONS
from .payloads import require_int64, require_text
from .timeline import parse_time

SERVER_NAME = "catalytic-cassette"

# Strict: an agent that sends "5" or true for a number, or 5 for a text, is told so,
# not silently coerced. An enumeration is published in the schema from the API's own
# table; the API refuses anything else with the valid names.
Text = Annotated[str, Strict()]
Integer = Annotated[int, Strict()]
Scope = Annotated[str, Field(strict=True, json_schema_extra={"enum": list(dependencies.SCOPES)})]
Dimension = Annotated[str, Field(strict=True, json_schema_extra={"enum": list(DIMENSIONS)})]


def refused(error: CassetteError) -> CallToolResult:
    """The SDK's tool error for a refusal: ``CODE: message`` for the model to read, and
    the code as a field of the structured content for a program to branch on."""
    return CallToolResult(
        content=[TextContent(type="text", text=str(error))],
        structured_content=error.to_dict(),
        is_error=True,
    )


def _invalid(message: str) -> CassetteError:
    return CassetteError(ErrorCode.INVALID_ARGUMENT, message)


def check_arguments(tool: str, parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """What no tool accepts, refused before it runs: an argument it does not take (a
    typo would otherwise be ignored, and a narrower question answered as a wider one),
    a text that is not UTF-8 (a lone surrogate: the SDK's JSON refuses one on stdio, but
    a server built in process is called with Python strings), an integer that no ledger
    column holds."""
    unknown = sorted(set(arguments) - set(parameters))
    if unknown:
        raise _invalid(
            f"{tool} takes no argument {', '.join(map(repr, unknown))}; "
            f"its arguments are {sorted(parameters)}"
        )
    for name, value in arguments.items():
        if isinstance(value, str):
            require_text(value, ErrorCode.INVALID_ARGUMENT, name)
        elif isinstance(value, int) and not isinstance(value, bool):
            require_int64(value, ErrorCode.INVALID_ARGUMENT, name)


def _schema_refusal(tool: str, error: ValidationError) -> CassetteError:
    """The SDK's argument validation (the published schema) as INVALID_ARGUMENT: which
    argument, and what was expected, never the value sent."""
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'arguments'}: {problem['msg']}"
        for problem in error.errors()
    ]
    return _invalid(f"{tool}: {'; '.join(problems)}")


class LedgerServer(MCPServer[Any]):
    """MCPServer whose tool calls answer a refusal with its code.

    ``call_tool`` is the SDK's documented seam: it raises ``ToolError`` for an unknown
    tool or arguments that fail the schema, and ``UnexpectedToolError`` (with the
    original as ``__cause__``) for anything else a tool raised. Both become a coded
    tool error here, so the SDK never logs a ledger's refusal as a crash; a real crash
    (any other exception) still reaches the SDK, which logs it and hides its text.
    """

    def __init__(self, name: str, tools: Mapping[str, Callable[..., dict[str, Any]]]) -> None:
        # A refusal is the agent's answer, not news for the operator: the SDK logs
        # nothing below a warning, so stderr stays empty until something is wrong.
        super().__init__(name, log_level="WARNING")
        self._parameters = {
            tool: dict(signature(function).parameters) for tool, function in tools.items()
        }
        for function in tools.values():
            self.tool()(function)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            if name not in self._parameters:
                raise _invalid(f"no tool {name!r}; the tools are {sorted(self._parameters)}")
            check_arguments(name, self._parameters[name], arguments)
            return await super().call_tool(name, arguments, context)
        except CassetteError as error:
            return refused(error)
        except ToolError as error:
            cause = error.__cause__
            if isinstance(cause, CassetteError):
                return refused(cause)
            if isinstance(cause, ValidationError) and not isinstance(error, UnexpectedToolError):
                return refused(_schema_refusal(name, cause))
            raise


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


def _tools(db: str) -> dict[str, Callable[..., dict[str, Any]]]:
    """The tools, by name, each reading ``db``."""

    def build_causal_chain(action_id: Text, max_depth: Integer | None = None) -> dict[str, Any]:
        """The cause chain of an action, root cause first (depth 0)."""
        with _reading(db) as chain:
            return chain.build_causal_chain(action_id, max_depth)

    def reconstruct_reasoning(action_id: Text) -> dict[str, Any]:
        """Why an action happened: category, rationale, direct cause and parent."""
        with _reading(db) as chain:
            return chain.reconstruct_reasoning(action_id)

    def get_causality_stats(
        plan_id: Text | None = None, session_id: Text | None = None
    ) -> dict[str, Any]:
        """Causality statistics, under the ledger's and the causality engine's definitions."""
        with _reading(db) as chain:
            return chain.causality_stats(plan_id, session_id)

    def detect_dependencies(
        action_id: Text | None = None,
        plan_id: Text | None = None,
        session_id: Text | None = None,
        intent_id: Text | None = None,
        scope: Scope = "plan",
        at: Text | None = None,
        window_ms: Integer = dependencies.DEFAULT_WINDOW_MS,
        limit: Integer = dependencies.DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """Candidate causes, newest first, each with its reason (proposals, not facts).
        ``at`` is ISO 8601 or epoch milliseconds."""
        at_ms = None
        if at is not None:
            at_ms = require_int64(parse_time(at), ErrorCode.INVALID_ARGUMENT, "at")
        with _reading(db) as chain:
            found = chain.detect_dependencies(
                action_id=action_id,
                plan_id=plan_id,
                session_id=session_id,
                intent_id=intent_id,
                scope=scope,
                at_ms=at_ms,
                window_ms=window_ms,
                limit=limit,
            )
        return {"candidates": found}

    def latest(
        plan_id: Text | None = None, session_id: Text | None = None, intent_id: Text | None = None
    ) -> dict[str, Any]:
        """The newest action of a plan, session or intent (or of the ledger)."""
        with _reading(db) as chain:
            found = chain.latest(plan_id=plan_id, session_id=session_id, intent_id=intent_id)
            return {"action": None if found is None else found.to_dict()}

    def metrics(by: Dimension) -> dict[str, Any]:
        """Count, failures, failure rate, durations and cost per plan, intent, session,
        function or capability."""
        with _reading(db) as chain:
            return {"by": by, "groups": chain.metrics(by)}

    def verify(session_id: Text | None = None) -> dict[str, Any]:
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
    return {tool.__name__: tool for tool in tools}


def build_server(db: str) -> LedgerServer:
    """A server whose tools read ``db``; ``run()`` serves it on stdio."""
    return LedgerServer(SERVER_NAME, _tools(db))


def serve(db: str) -> None:
    """Serve on stdio until the client closes the stream. Refuses a missing ledger first."""
    with _reading(db):
        pass
    build_server(db).run()
