"""Issue 14 with real processes: `cassette tail --follow` beside a writer process,
killed and restarted from the last seq it printed (the MCP server's processes:
test_mcp.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO

import pytest

from catalytic_cassette.chain import CausalChain

from .backends import Ledger

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
