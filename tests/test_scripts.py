"""The benchmark and example scripts still run (tiny sizes), so they cannot rot unseen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_chain_quick_run_reports_every_workload() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_chain.py"), "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for expected in (
        "append one per transaction, ours",
        "append one per transaction, raw+chain",
        "append batches of 100, raw",
        "ratio ours/raw",
        "rows/s; peak RSS",
        "load_session of 100 actions",
        "durability full",
    ):
        assert expected in out, out
