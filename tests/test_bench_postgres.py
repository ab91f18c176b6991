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
        "CPU ms per step: clients",
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
        "(sql, pipelined)",
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


@pytest.mark.slow
def test_bench_pg_levers_runs_both_ways(tmp_path: Path) -> None:
    """`scripts/bench_pg_levers.py`: an A/B of a variant against none, the serial
    measure of the server's CPU per step, and the wait sampler, end to end at tiny sizes
    on their own cluster."""
    try:
        postgres._pg_cluster().find_bin_dir()
    except Exception as error:  # no PostgreSQL: fails unless CASSETTE_SKIP_POSTGRES=1
        postgres.unavailable(str(error))
    variant = tmp_path / "fillfactor.sql"
    variant.write_text("ALTER TABLE cassette_head SET (fillfactor = 100);\n", encoding="utf-8")
    sizes = ["--steps", "30", "--workers", "2", "--loop", "ours-fused"]

    def levers(*args: str) -> str:
        """What the script prints, run to a zero exit."""
        run = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench_pg_levers.py"), *args],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    out = levers("ab", *sizes, "--reps", "1", "-", str(variant))
    lines = [line for line in out.splitlines() if "steps/s [" in line]
    assert [line.split()[0] for line in lines] == ["-", str(variant)]
    assert all("CPU ms per step: clients" in line for line in lines)
    for loop in ("ours-fused", "ours-separate"):
        out = levers("serial", *sizes[:2], "--loop", loop, "--reps", "1", "-", str(variant))
        lines = [line for line in out.splitlines() if "ms per step [" in line]
        assert [line.split()[0] for line in lines] == ["-", str(variant)]
        for line in lines:  # a wall time per step, and the backend's CPU (ticks: may be 0)
            assert float(line.split("wall ")[1].split()[0]) > 0
            assert float(line.split("server CPU ")[1].split()[0]) >= 0
    waits = levers("waits", *sizes)
    assert "of the backends' samples" in waits
