"""A short crash soak: producers and workers killed with SIGKILL lose nothing acknowledged.

scripts/soak.py runs the processes and checks the ledger against their logs and its own
journal; this test runs it for CASSETTE_SOAK_SECONDS (default 25) and reads its JSON summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.sqlite_only(reason="a crash soak of processes on one SQLite file"),
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[1]
SOAK_SECONDS = float(os.environ.get("CASSETTE_SOAK_SECONDS", "25"))
STALE_CODES = ("STALE_FENCING_TOKEN", "LEASE_EXPIRED", "NOT_LEASED")


@pytest.mark.slow
def test_soak_with_sigkill_chaos_loses_nothing_and_refuses_stale_completions(
    tmp_path: Path,
) -> None:
    command = [
        sys.executable,
        str(ROOT / "scripts" / "soak.py"),
        "--duration",
        str(SOAK_SECONDS),
        "--producers",
        "2",
        "--workers",
        "3",
        "--kill-every",
        "1.5",
        "--db",
        str(tmp_path / "soak.db"),
        "--keep",
        "--json",
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=SOAK_SECONDS + 120, check=False
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, output
    summary = json.loads(lines[-1])

    assert proc.returncode == 0, output
    assert summary["result"] == "PASS", output
    assert all(check["ok"] for check in summary["checks"]), output
    assert summary["kills"] > 0, output
    assert summary["restarts"] == summary["kills"], output
    assert sum(summary["refusals"].get(code, 0) for code in STALE_CODES) > 0, output
    assert summary["acknowledged"] > 0, output
    assert summary["acknowledged"] == summary["present"], output
    assert summary["raw_errors"] == 0, output
    assert summary["raw_sqlite_errors"] == 0, output
    assert summary["snapshot_errors"] == 0, output
    assert summary["facts"]["verify_ok"] is True, output
