"""Issue 14 with real processes: `cassette tail --follow` beside a writer process,
killed and restarted from the last seq it printed; the MCP server through the SDK's
own stdio client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO, Any

import pytest

from catalytic_cassette.chain import CausalChain

from .backends import Ledger
from .conftest import file_digest

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

WRITER = textwrap.dedent(
    """
    import sys, time
    from catalytic_cassette.chain import CausalChain
    path, total = sys.argv[1], int(sys.argv[2])
    with CausalChain(path) as chain:
        for n in range(total):
            chain.append_action({"plan_id": "p", "intent_id": "i", "action_type": "InternalStep",
                                 "function_name": f"n{n}"})
            if n % 10 == 0:
                time.sleep(0.005)
    """
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CASSETTE_")}


def _cassette(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "catalytic_cassette", "--db", str(db), *args]


def _lines(stream: IO[str], count: int, deadline: float) -> list[str]:
    got = []
    while len(got) < count and time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        got.append(line)
    return got


def test_tail_follows_a_writer_across_a_restart_with_no_gap_and_no_duplicate(
    db_path: Path, backend: Ledger
) -> None:
    total = 400
    CausalChain(db_path, clock=backend.clock).close()  # the ledger exists before both start
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db_path), str(total)], env=_env())
    follow = ("tail", "--follow", "--interval", "0.01", "--timeout", "60")
    first = subprocess.Popen(
        _cassette(db_path, *follow), stdout=subprocess.PIPE, text=True, env=_env()
    )
    assert first.stdout is not None
    printed = _lines(first.stdout, 60, time.monotonic() + 60)
    assert len(printed) == 60
    first.send_signal(signal.SIGKILL)  # mid-stream, while the writer keeps writing
    first.wait()
    rest = first.stdout.read()
    printed += [line + "\n" for line in rest.split("\n")[:-1]]  # complete lines only
    first.stdout.close()
    last = json.loads(printed[-1])["seq"]
    second = subprocess.Popen(
        _cassette(
            db_path, *follow, "--since-seq", str(last), "--max-entries", str(total - 1 - last)
        ),
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    resumed, _ = second.communicate(timeout=120)
    assert writer.wait(timeout=120) == 0
    assert second.returncode == 0
    entries = [json.loads(line) for line in printed + resumed.splitlines(keepends=True)]
    assert [e["seq"] for e in entries] == list(range(total))  # no gap, no duplicate, in order
    assert [e["row"]["function_name"] for e in entries] == [f"n{n}" for n in range(total)]
    stored = [chain_hash.hex() for _, _, _, chain_hash in backend.journal()]
    assert [e["chain_hash"] for e in entries] == stored


# ------------------------------------------------------------------------- MCP


def _structured(result: Any) -> Any:
    value = getattr(result, "structured_content", None)
    if value is None:
        value = getattr(result, "structuredContent", None)
    if value is None:
        value = json.loads(result.content[0].text)
    return value


def test_the_mcp_server_answers_the_sdk_client_and_writes_nothing(
    db_path: Path, backend: Ledger
) -> None:
    pytest.importorskip("mcp")  # the optional extra; the test extra installs it
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    with CausalChain(db_path, clock=backend.clock) as chain:
        cause = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "CapabilityCall",
                "function_name": "search",
                "session_id": "s",
                "duration_ms": 40,
                "success": False,
            }
        )
        effect = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "InternalStep",
                "function_name": "decide",
                "session_id": "s",
                "caused_by": cause.action_id,
                "rationale": "the search failed",
                "category": "decision",
            }
        )
    before = file_digest(db_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "catalytic_cassette", "--db", str(db_path), "mcp"],
        env=_env(),
    )

    async def session() -> dict[str, Any]:
        answers: dict[str, Any] = {}
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            listed = await client.list_tools()
            answers["tools"] = sorted(t.name for t in listed.tools)
            calls = {
                "chain": ("build_causal_chain", {"action_id": effect.action_id}),
                "why": ("reconstruct_reasoning", {"action_id": effect.action_id}),
                "stats": ("get_causality_stats", {"plan_id": "p"}),
                "deps": ("detect_dependencies", {"action_id": effect.action_id}),
                "latest": ("latest", {"session_id": "s"}),
                "metrics": ("metrics", {"by": "capability"}),
                "verify": ("verify", {}),
                "verify_session": ("verify", {"session_id": "s"}),
            }
            for key, (name, arguments) in calls.items():
                answers[key] = _structured(await client.call_tool(name, arguments))
            missing = await client.call_tool("reconstruct_reasoning", {"action_id": "nope"})
            answers["missing_is_error"] = bool(
                getattr(missing, "is_error", None) or getattr(missing, "isError", None)
            )
        return answers

    answers = anyio.run(session)
    assert answers["tools"] == sorted(
        [
            "build_causal_chain",
            "reconstruct_reasoning",
            "get_causality_stats",
            "detect_dependencies",
            "latest",
            "metrics",
            "verify",
        ]
    )
    assert [e["action_id"] for e in answers["chain"]["chain"]] == [
        cause.action_id,
        effect.action_id,
    ]
    assert answers["why"]["cause"]["action_id"] == cause.action_id
    assert answers["stats"]["root_causes_including_isolated"] == 0
    assert answers["stats"]["max_chain_nodes"] == 2
    assert [c["action_id"] for c in answers["deps"]["candidates"]] == [cause.action_id]
    assert answers["latest"]["action"]["action_id"] == effect.action_id
    assert answers["metrics"]["groups"][0]["failures"] == 1
    assert answers["verify"]["ok"] is True
    assert answers["verify_session"]["ok"] is True and answers["verify_session"]["actions"] == 2
    assert answers["missing_is_error"]
    assert file_digest(db_path) == before  # read-only


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
