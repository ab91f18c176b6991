"""`cassette mcp` through the MCP SDK's own stdio client, one real server process per
backend: a valid and an invalid call for every tool the server lists. A refusal is the
SDK's tool error whose text starts with the ledger's code (also a structured field), the
server writes no traceback, and no call changes the ledger. Without the extra, the
command says how to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CausalChain, ManualClock
from catalytic_cassette.copying import copy_ledger
from catalytic_cassette.errors import ErrorCode

from .backends import Ledger, dump
from .conftest import file_digest

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CASSETTE_")}


def _cassette(db: Path | str, *args: str) -> list[str]:
    return [sys.executable, "-m", "catalytic_cassette", "--db", str(db), *args]


def _structured(result: Any) -> Any:
    """A tool's structured answer (its JSON text when a client gives none)."""
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


# ------------------------------------------------------------------ the calls

# Placeholders for the ids the ledger is given when it is written.
CAUSE, EFFECT = "<cause>", "<effect>"


def _ledger(path: Path) -> dict[str, str]:
    """A failed search that causes a decision (session s, plan p), and an action of
    another session; returns the placeholders' ids."""
    with CausalChain(path, clock=ManualClock()) as chain:
        act = {"plan_id": "p", "intent_id": "i", "session_id": "s"}
        cause = chain.append_action(
            {
                **act,
                "action_type": "CapabilityCall",
                "function_name": "search",
                "duration_ms": 40,
                "success": False,
            }
        )
        effect = chain.append_action(
            {
                **act,
                "action_type": "InternalStep",
                "function_name": "decide",
                "caused_by": cause.action_id,
                "rationale": "the search failed",
                "category": "decision",
            }
        )
        chain.append_action(
            {**act, "session_id": "t", "action_type": "CapabilityCall", "function_name": "f"}
        )
    return {CAUSE: cause.action_id, EFFECT: effect.action_id}


@dataclass(frozen=True)
class Call:
    """One tool call and what it must answer: ``check`` on the structured answer of a
    valid call, or the refusal's ``code`` (and words its message must hold)."""

    tool: str
    arguments: dict[str, Any]
    check: Callable[[Any, dict[str, str]], bool] | None = None
    code: str | None = None
    says: tuple[str, ...] = ()


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["action_id"] for entry in entries]


CALLS: dict[str, Call] = {
    # build_causal_chain
    "chain": Call(
        "build_causal_chain",
        {"action_id": EFFECT},
        lambda a, ids: _ids(a["chain"]) == [ids[CAUSE], ids[EFFECT]],
    ),
    "chain_depth_0": Call(
        "build_causal_chain",
        {"action_id": EFFECT, "max_depth": 0},
        lambda a, ids: _ids(a["chain"]) == [ids[EFFECT]],
    ),
    "chain_of_nothing": Call("build_causal_chain", {"action_id": "nope"}, code="NOT_FOUND"),
    "chain_without_id": Call(
        "build_causal_chain", {}, code="INVALID_ARGUMENT", says=("action_id",)
    ),
    "chain_negative_depth": Call(
        "build_causal_chain", {"action_id": EFFECT, "max_depth": -1}, code="INVALID_ARGUMENT"
    ),
    "chain_depth_beyond_64_bits": Call(
        "build_causal_chain",
        {"action_id": EFFECT, "max_depth": 2**64},
        code="INVALID_ARGUMENT",
        says=("64-bit",),
    ),
    "chain_depth_as_text": Call(
        "build_causal_chain",
        {"action_id": EFFECT, "max_depth": "1"},
        code="INVALID_ARGUMENT",
        says=("max_depth",),
    ),
    "chain_depth_as_boolean": Call(
        "build_causal_chain", {"action_id": EFFECT, "max_depth": True}, code="INVALID_ARGUMENT"
    ),
    # reconstruct_reasoning
    "why": Call(
        "reconstruct_reasoning",
        {"action_id": EFFECT},
        lambda a, ids: a["cause"]["action_id"] == ids[CAUSE],
    ),
    "why_nothing": Call("reconstruct_reasoning", {"action_id": "nope"}, code="NOT_FOUND"),
    "why_a_number": Call("reconstruct_reasoning", {"action_id": 5}, code="INVALID_ARGUMENT"),
    # get_causality_stats
    "stats": Call(
        "get_causality_stats", {"plan_id": "p"}, lambda a, ids: a["max_chain_nodes"] == 2
    ),
    "stats_misspelled": Call(
        "get_causality_stats",
        {"plan": "p"},
        code="INVALID_ARGUMENT",
        says=("'plan'", "plan_id", "session_id"),
    ),
    "stats_of_a_list": Call("get_causality_stats", {"plan_id": ["p"]}, code="INVALID_ARGUMENT"),
    # detect_dependencies
    "deps": Call(
        "detect_dependencies",
        {"action_id": EFFECT},
        lambda a, ids: _ids(a["candidates"]) == [ids[CAUSE]],
    ),
    "deps_of_a_plan_at_a_time": Call(
        "detect_dependencies",
        {"plan_id": "p", "at": "2100-01-01T00:00:00Z", "window_ms": 2**62},
        lambda a, ids: set(_ids(a["candidates"])) >= {ids[CAUSE], ids[EFFECT]},
    ),
    "deps_unknown_scope": Call(
        "detect_dependencies",
        {"action_id": EFFECT, "scope": "typo"},
        code="INVALID_ARGUMENT",
        says=("intent", "plan", "session"),
    ),
    "deps_action_and_plan": Call(
        "detect_dependencies", {"action_id": EFFECT, "plan_id": "p"}, code="INVALID_ARGUMENT"
    ),
    "deps_no_scope": Call("detect_dependencies", {}, code="INVALID_ARGUMENT"),
    "deps_bad_time": Call(
        "detect_dependencies", {"plan_id": "p", "at": "yesterday"}, code="INVALID_ARGUMENT"
    ),
    "deps_time_beyond_64_bits": Call(
        "detect_dependencies",
        {"plan_id": "p", "at": "1" + "0" * 20},
        code="INVALID_ARGUMENT",
        says=("64-bit",),
    ),
    "deps_zero_limit": Call(
        "detect_dependencies", {"action_id": EFFECT, "limit": 0}, code="INVALID_ARGUMENT"
    ),
    "deps_window_beyond_64_bits": Call(
        "detect_dependencies",
        {"action_id": EFFECT, "window_ms": -(2**63) - 1},
        code="INVALID_ARGUMENT",
    ),
    # latest
    "latest_of_a_session": Call(
        "latest", {"session_id": "s"}, lambda a, ids: a["action"]["action_id"] == ids[EFFECT]
    ),
    "latest_of_the_ledger": Call("latest", {}, lambda a, ids: a["action"]["session_id"] == "t"),
    "latest_of_nothing": Call("latest", {"plan_id": "none"}, lambda a, ids: a["action"] is None),
    "latest_misspelled": Call(
        "latest", {"sesion_id": "s"}, code="INVALID_ARGUMENT", says=("'sesion_id'", "session_id")
    ),
    # metrics
    "metrics": Call(
        "metrics",
        {"by": "capability"},
        lambda a, ids: (
            [(g["capability"], g["failures"]) for g in a["groups"]] == [("f", 0), ("search", 1)]
        ),
    ),
    "metrics_unknown_dimension": Call(
        "metrics",
        {"by": "typo"},
        code="INVALID_ARGUMENT",
        says=("capability", "function", "intent", "plan", "session"),
    ),
    "metrics_without_dimension": Call("metrics", {}, code="INVALID_ARGUMENT", says=("by",)),
    # verify
    "verify": Call("verify", {}, lambda a, ids: a["ok"] is True and a["journal_rows"] == 3),
    "verify_a_session": Call(
        "verify", {"session_id": "s"}, lambda a, ids: a["ok"] is True and a["actions"] == 2
    ),
    "verify_a_session_number": Call("verify", {"session_id": 7}, code="INVALID_ARGUMENT"),
    "verify_no_session": Call("verify", {"session_id": "nope"}, code="NOT_FOUND"),
    # a tool the server does not have
    "unknown_tool": Call("drop_table", {}, code="INVALID_ARGUMENT", says=("verify", "latest")),
}


def _filled(value: Any, ids: dict[str, str]) -> Any:
    return ids.get(value, value) if isinstance(value, str) else value


@dataclass
class Served:
    """What one server process answered: the tools it lists, every call's result, the
    calls after which the ledger differed, and the server's stderr."""

    ids: dict[str, str]
    tools: list[str]
    answers: dict[str, Any]
    changed: list[str]
    stderr: str


def _serve_all(db: str, ids: dict[str, str], errlog: Path) -> Served:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=_cassette(db, "mcp")[1:], env=_env()
    )

    def state() -> Any:
        return (dump(db), None if "://" in db else file_digest(Path(db)))

    async def session() -> Served:
        answers: dict[str, Any] = {}
        changed = []
        with errlog.open("w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                for key, call in CALLS.items():
                    before = state()
                    arguments = {k: _filled(v, ids) for k, v in call.arguments.items()}
                    answers[key] = await client.call_tool(call.tool, arguments)
                    if state() != before:
                        changed.append(key)
        return Served(ids, tools, answers, changed, errlog.read_text())

    return anyio.run(session)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server per backend for the whole table: the SQLite ledger, or its copy in a
    fresh PostgreSQL database."""
    pytest.importorskip("mcp")
    folder = tmp_path_factory.mktemp("mcp")
    path = folder / "ledger.db"
    ids = _ledger(path)
    if request.param == "sqlite":
        yield _serve_all(str(path), ids, folder / "stderr")
        return
    from . import postgres

    url = postgres.create_database(request.getfixturevalue("pg_server"))
    try:
        copy_ledger(str(path), url)
        yield _serve_all(url, ids, folder / "stderr")
    finally:
        postgres.drop_database(request.getfixturevalue("pg_server"), url)


def test_every_tool_has_a_valid_and_an_invalid_call(served: Served) -> None:
    """A tool added to the server without its calls here fails this test."""
    valid = {c.tool for c in CALLS.values() if c.code is None}
    invalid = {c.tool for c in CALLS.values() if c.code is not None}
    assert served.tools == sorted(valid)
    assert set(served.tools) <= invalid


@pytest.mark.parametrize("key", list(CALLS))
def test_each_call_answers_or_refuses_with_its_code(served: Served, key: str) -> None:
    call, result = CALLS[key], served.answers[key]
    if call.code is None:
        assert not result.is_error, result.content
        assert call.check is not None and call.check(_structured(result), served.ids)
        return
    assert result.is_error
    text = result.content[0].text
    assert text.startswith(f"{call.code}: "), text
    assert result.structured_content["code"] == call.code
    assert f"{call.code}: {result.structured_content['message']}" == text
    for word in call.says:
        assert word in text, (word, text)


def test_no_call_changes_the_ledger_or_writes_a_traceback(served: Served) -> None:
    assert served.changed == []
    assert served.stderr == ""  # no traceback, nor a log line per refusal


def test_a_text_that_is_not_utf8_is_refused_in_process(tmp_path: Path) -> None:
    """A lone surrogate cannot cross stdio (the SDK's JSON refuses it on both sides), but
    a server built in process (``build_server``) is called with Python strings."""
    import anyio

    from catalytic_cassette.mcp_server import build_server

    path = tmp_path / "ledger.db"
    _ledger(path)
    server = build_server(str(path))
    result = anyio.run(server.call_tool, "reconstruct_reasoning", {"action_id": "\udcff"})
    assert result.is_error and result.structured_content["code"] == "INVALID_ARGUMENT"
    assert result.content[0].text == "INVALID_ARGUMENT: action_id is not valid UTF-8 text"


# ----------------------------------------------------------- before serving


def test_mcp_refuses_a_missing_ledger_before_serving(tmp_path: Path) -> None:
    ran = subprocess.run(
        _cassette(tmp_path / "missing.db", "mcp"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert ran.returncode == 1
    assert ran.stderr.startswith("error: CANNOT_OPEN: ") and "Traceback" not in ran.stderr
    assert not (tmp_path / "missing.db").exists()


# Imports of ``blocked`` (and below it) fail as they do when it is not installed.
WITHOUT = textwrap.dedent(
    """
    import sys

    blocked = sys.argv.pop(1)

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name == blocked or name.startswith(blocked + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from catalytic_cassette.cli import main

    main()
    """
)


@pytest.mark.parametrize(
    "blocked",
    ["mcp", "mcp.server.mcpserver"],  # the quickstart's install; an mcp 1.x
)
def test_mcp_without_the_extra_says_how_to_install_it(tmp_path: Path, blocked: str) -> None:
    path = tmp_path / "ledger.db"
    _ledger(path)
    before = file_digest(path)
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT, blocked, "--db", str(path), "mcp"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr == (
        "error: MISSING_EXTRA: the MCP server needs the mcp extra: "
        "pip install 'catalytic-cassette[mcp]'\n"
    )
    assert file_digest(path) == before


# ------------------------------------------------------------- any arguments

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)  # NUL, surrogates too


def _argument_value(kind: str, ids: dict[str, str]) -> st.SearchStrategy[Any]:
    """A value an agent might send for an argument of the schema's ``kind``: mostly a
    plausible one (the ledger's ids and names, enumerations' words, times, small
    numbers), else a wrong type, a number beyond 64 bits, any text."""
    words = [*ids.values(), "p", "s", "t", "i", "plan", "session", "capability", "nope"]
    plausible = (
        st.integers(min_value=-1, max_value=3)
        if kind == "integer"
        else st.sampled_from([*words, "2026-01-01", "2100-01-01T00:00:00Z", "0"])
    )
    wild = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(),
        ANY_TEXT,
        st.lists(st.sampled_from(words), max_size=2),
    )
    return st.one_of(plausible, plausible, plausible, wild)


def _kind(schema: dict[str, Any]) -> str:
    types = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
    return "integer" if "integer" in types else "string"


@dataclass
class InProcess:
    """A server built in process on the table's ledger, and each tool's argument names."""

    server: Any
    ids: dict[str, str]
    parameters: dict[str, dict[str, str]]  # tool -> argument -> "string" or "integer"


@pytest.fixture
def in_process(backend: Ledger, tmp_path: Path) -> InProcess:
    """The table's ledger on the backend under test (on PostgreSQL, copied there)."""
    import anyio

    from catalytic_cassette.mcp_server import build_server

    path = tmp_path / "source.db"
    ids = _ledger(path)
    target = str(path)
    if backend.postgresql:
        copy_ledger(str(path), backend.target)
        target = backend.target
    server = build_server(target)
    listed = anyio.run(server.list_tools)
    parameters = {
        t.name: {name: _kind(schema) for name, schema in t.input_schema["properties"].items()}
        for t in listed
    }
    return InProcess(server, ids, parameters)


@pytest.mark.both_backends
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_arguments_get_an_answer_or_a_coded_refusal(
    in_process: InProcess, data: st.DataObject
) -> None:
    """As the SDK's stdio server calls it: ``call_tool`` re-raises only a crash (which
    the SDK would log with its traceback), so none may escape."""
    import anyio

    tool = data.draw(st.sampled_from([*in_process.parameters, "typo"]), label="tool")
    arguments = {
        name: data.draw(_argument_value(kind, in_process.ids), label=name)
        for name, kind in in_process.parameters.get(tool, {}).items()
        if data.draw(st.booleans(), label=f"give {name}")
    }
    if data.draw(st.integers(0, 9), label="misspell") == 0:
        arguments["typo"] = "x"
    result = anyio.run(in_process.server.call_tool, tool, arguments)
    if result.is_error:
        text = result.content[0].text
        code = result.structured_content["code"]
        assert code in {c.value for c in ErrorCode} and text.startswith(f"{code}: "), text
        event(code)
    else:
        event("answered")


def test_the_readme_shows_what_a_refusal_looks_like_on_the_wire(tmp_path: Path) -> None:
    import anyio

    from catalytic_cassette.mcp_server import build_server

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Tools for agents (MCP).**") :]
    shown = json.loads(section[section.index("```text\n") + 8 : section.index("\n```\n")])
    path = tmp_path / "ledger.db"
    _ledger(path)
    result = anyio.run(build_server(str(path)).call_tool, "metrics", {"by": "typo"})
    on_the_wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert {key: on_the_wire[key] for key in shown} == shown  # (also "resultType")
