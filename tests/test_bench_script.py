"""scripts/bench.py still runs (tiny sizes) and reports every workload, so it cannot rot unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_quick_run_reports_every_workload(tmp_path: Path) -> None:
    results = tmp_path / "bench.json"
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--json", str(results)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    ).stdout
    for expected in (
        "python 3.",
        "durability full (synchronous=FULL) and normal (synchronous=NORMAL)",
        "message payload",
        "post_message one per transaction, ours",
        "post_message one per transaction, raw",
        "claim+complete cycles, 1 worker, ours",
        "claim+complete cycles, 1 worker, raw",
        "claim+complete cycles, 1 worker, ours fused",
        "claim+complete cycles, 1 worker, raw fused",
        "ratio ours fused/raw fused",
        "us/cycle",
        "claim+complete, fused loop, 2 worker process(es)",
        "claim+complete, fused loop, 4 worker process(es)",
        "claim+complete, separate loop, 4 worker process(es)",
        "no step claimed twice, in every trial",
        "SEARCH cassette_steps USING INDEX cassette_steps_claimable",
        "claim_step latency at 1,000 pending: p50",
        "append_action one per transaction, ours",
        "append_actions batches of 100, raw",
        "journal rows",
        "rows/s",
        "peak RSS of the verifying process",
        "wall time, python -m catalytic_cassette claim",
        'wall time, python -c "import sqlite3"',
        "bytes per message+job+step+receipt",
        "bytes per action",
        "ratio ours/raw",
        "== targets",
        "[full]",
        "[normal]",
    ):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    # huey is an optional baseline: measured when installed, otherwise named as skipped.
    assert "claim+complete cycles, 1 worker, huey" in out or "huey: not installed" in out, out
    if "1 worker, huey" in out:  # the fused loop is reported against huey, as the separate calls
        assert "ratio ours fused/huey" in out and "ratio ours/huey" in out, out
    data = json.loads(results.read_text())
    assert {"1_post", "2_cycle", "3_workers", "4_latency", "5_append", "6_verify"} <= set(
        data["workloads"]
    )
    assert {"7_cli", "8_bytes"} <= set(data["workloads"])
    assert data["workloads"]["6_verify"]["any"]["result"]["ok"] is True
