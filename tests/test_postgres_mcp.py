"""`cassette mcp` on either backend (issue 15): the same tools answer the same JSON for
the same ledger, a SQLite file or the PostgreSQL database it was copied into, through
the MCP SDK's own client over stdio (a real server process each), and write nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from catalytic_cassette import CausalChain, ManualClock
from catalytic_cassette.cli import cli
from catalytic_cassette.copying import copy_ledger

from .backends import Ledger
from .test_mcp import _env, _structured

pytestmark = pytest.mark.slow

pytest.importorskip("mcp")
psycopg = pytest.importorskip("psycopg")


def _ledger(path: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """A plan whose failed search causes a decision, a second session, and the calls
    that read them (by the ids they were given)."""
    with CausalChain(path, clock=ManualClock()) as chain:
        act = {"plan_id": "p", "intent_id": "i", "session_id": "s"}
        cause = chain.append_action(
            {
                **act,
                "action_type": "CapabilityCall",
                "function_name": "search",
                "duration_ms": 40,
                "cost": 0.25,
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
                "result": {"chosen": "retry"},
            }
        )
        chain.append_action(
            {**act, "session_id": "t", "action_type": "CapabilityCall", "function_name": "f"}
        )
    return {
        "chain": ("build_causal_chain", {"action_id": effect.action_id}),
        "shallow": ("build_causal_chain", {"action_id": effect.action_id, "max_depth": 0}),
        "why": ("reconstruct_reasoning", {"action_id": effect.action_id}),
        "stats": ("get_causality_stats", {"plan_id": "p"}),
        "session_stats": ("get_causality_stats", {"session_id": "s"}),
        "deps": ("detect_dependencies", {"action_id": effect.action_id}),
        "deps_by_session": (
            "detect_dependencies",
            {"action_id": effect.action_id, "scope": "session"},
        ),
        "latest": ("latest", {"session_id": "s"}),
        "latest_of_ledger": ("latest", {}),
        "nothing": ("latest", {"plan_id": "none"}),
        "metrics": ("metrics", {"by": "capability"}),
        "by_session": ("metrics", {"by": "session"}),
        "verify": ("verify", {}),
    }


ERROR = {"error": True}


def _answer(result: Any) -> Any:
    """A tool's structured answer, or ERROR when the call was refused."""
    if result.is_error:
        return ERROR
    return _structured(result)


def _ask(db: str, calls: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Every call's structured answer from `cassette --db DB mcp`, and whether asking
    about a missing action is an error."""
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "catalytic_cassette", "--db", db, "mcp"], env=_env()
    )

    async def session() -> dict[str, Any]:
        answers: dict[str, Any] = {}
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            answers["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
            for key, (name, arguments) in calls.items():
                answers[key] = _answer(await client.call_tool(name, arguments))
            missing = await client.call_tool("reconstruct_reasoning", {"action_id": "nope"})
            answers["missing_is_error"] = _answer(missing) == ERROR
        return answers

    return anyio.run(session)


def test_the_same_answers_from_a_sqlite_ledger_and_its_postgresql_copy(
    tmp_path: Path, pg_database: str
) -> None:
    path = tmp_path / "ledger.db"
    calls = _ledger(path)
    copy_ledger(str(path), pg_database)
    before = Ledger("postgresql", pg_database).journal()
    assert before == Ledger("sqlite", str(path)).journal()
    on_sqlite = _ask(str(path), calls)
    on_postgres = _ask(pg_database, calls)
    for key in on_sqlite:
        assert on_postgres[key] == on_sqlite[key], key
    # and the answers are about the ledger (not two equal refusals)
    effect = calls["why"][1]["action_id"]
    assert [e["action_id"] for e in on_postgres["chain"]["chain"]][-1] == effect
    assert len(on_postgres["chain"]["chain"]) == 2 and len(on_postgres["shallow"]["chain"]) == 1
    assert on_postgres["why"]["cause"]["action_id"] == on_postgres["chain"]["chain"][0]["action_id"]
    assert on_postgres["latest"]["action"]["action_id"] == effect
    assert on_postgres["latest"]["action"]["result"] == {"chosen": "retry"}
    assert on_postgres["latest_of_ledger"]["action"]["session_id"] == "t"
    assert on_postgres["nothing"] == {"action": None}
    assert [(g["capability"], g["failures"]) for g in on_postgres["metrics"]["groups"]] == [
        ("f", 0),
        ("search", 1),
    ]
    assert on_postgres["stats"]["max_chain_nodes"] == 2
    assert [c["action_id"] for c in on_postgres["deps"]["candidates"]] == [
        on_postgres["chain"]["chain"][0]["action_id"]
    ]
    assert on_postgres["verify"]["ok"] is True and on_postgres["verify"]["journal_rows"] == 3
    assert on_postgres["missing_is_error"]
    assert Ledger("postgresql", pg_database).journal() == before  # read-only


def test_a_session_verify_over_mcp_on_postgresql_answers_like_the_cli(
    tmp_path: Path, pg_database: str
) -> None:
    """`verify` with a session id goes where `cassette verify --session` goes: whatever
    the CLI answers on this backend, the tool answers (an error when it is refused)."""
    path = tmp_path / "ledger.db"
    _ledger(path)
    copy_ledger(str(path), pg_database)
    runner = CliRunner()
    by_cli = runner.invoke(cli, ["--db", pg_database, "verify", "--session", "s", "--json"])
    answers = _ask(pg_database, {"session": ("verify", {"session_id": "s"})})
    if by_cli.exit_code == 0:
        assert answers["session"]["ok"] is True and answers["session"]["actions"] == 2
    else:
        assert "BACKEND_UNSUPPORTED" in by_cli.output
        assert answers["session"] == ERROR


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_mcp_refuses_what_is_not_a_ledger_before_serving(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A missing file, or a database holding no ledger: refused with its code, nothing
    created, no server started."""
    target = (
        str(tmp_path / "missing.db")
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_database"))
    )
    result = CliRunner().invoke(cli, ["--db", target, "mcp"])
    assert result.exit_code != 0
    assert ("CANNOT_OPEN" if backend == "sqlite" else "NOT_A_CASSETTE") in result.output
    assert "Traceback" not in result.output
    if backend == "sqlite":
        assert not (tmp_path / "missing.db").exists()
    else:
        with psycopg.connect(target) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()
        assert tables == (0,)


def test_an_auditor_login_gets_the_owners_answers(tmp_path: Path, pg_database: str) -> None:
    """What to hand an agent: a login in cassette_auditor (reads only). Every tool
    answers it as it answers the owner."""
    import uuid

    from psycopg import sql

    path = tmp_path / "ledger.db"
    calls = _ledger(path)
    copy_ledger(str(path), pg_database)
    name = "agent_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_database, autocommit=True) as owner:
        owner.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE cassette_auditor").format(sql.Identifier(name))
        )
    try:
        url = pg_database.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
        assert url != pg_database
        answers = _ask(url, calls)
        assert ERROR not in answers.values() and answers["verify"]["ok"] is True
        assert answers == _ask(pg_database, calls)
    finally:
        with psycopg.connect(pg_database, autocommit=True) as owner:
            owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_latest_reads_an_artifact_where_the_ledger_keeps_them(tmp_path: Path) -> None:
    """A value stored as an artifact file beside a SQLite ledger comes back whole."""
    path = tmp_path / "ledger.db"
    big = {"text": "x" * 5000}
    with CausalChain(path, artifact_threshold=100) as chain:
        stored = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "CapabilityCall",
                "function_name": "f",
                "result": big,
            }
        )
    assert any((tmp_path / "ledger.db.artifacts").iterdir())  # (it is a file there)
    answers = _ask(str(path), {"latest": ("latest", {"plan_id": "p"})})
    assert answers["latest"]["action"]["action_id"] == stored.action_id
    assert answers["latest"]["action"]["result"] == big
