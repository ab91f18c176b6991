"""`scripts/bench.py postgres` (the code of scripts/bench_postgres.py) still runs end to
end (tiny sizes, its own cluster) and reports every contender and workload, so the
PostgreSQL benchmark of record cannot rot unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import postgres

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_postgres_quick_run(tmp_path: Path) -> None:
    pytest.importorskip("procrastinate", reason="the peer baseline: pip install -e '.[bench]'")
    try:
        postgres._pg_cluster().find_bin_dir()
    except Exception as error:  # no PostgreSQL: fails unless CASSETTE_SKIP_POSTGRES=1
        postgres.unavailable(str(error))
    results = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench.py"),
            "postgres",
            "--quick",
            "--json",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    text = run.stdout
    for expected in (
        "PostgreSQL 1",
        "fsync=on",
        "synchronous_commit=on",
        "shared_buffers=",
        "load average",
        "ours-separate   2 worker(s)",
        "ours-fused      2 worker(s)",
        "raw-separate    2 worker(s)",
        "raw-fused       2 worker(s)",
        "procrastinate   2 worker(s)",
        "ours-fused/procrastinate",
        "every trial checked",
        "post ours single",
        "post procrastinate batch",
        "post raw batch",
        "(sql, round trip per item)",
        "(sql, pipelined, head per entry)",
        "lever, batch",
        "complete_and_claim",
        "commit of a one-row insert",
        "append ours single",
        "append raw batch",
        "verify postgresql",
        "verify sqlite copy",
        "postgresql/sqlite = ",
    ):
        assert expected in text, f"{expected!r} missing from:\n{text}"
    data = json.loads(results.read_text())
    assert {"setup", "cycle", "post", "hold", "append", "verify"} <= set(data)
    assert data["setup"]["settings"]["fsync"] == "on"
