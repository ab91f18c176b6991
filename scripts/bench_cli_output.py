"""CLI listing benchmark: time to the first row, and memory, of `cassette actions`.

Builds (or reuses) a ledger of N actions, then runs the installed CLI as a real process
and reads its stdout like `| head -1` does (first line, then close the pipe), and like
`> /dev/null` does (everything). Reports the median and range of R runs, wall time and
the child's peak RSS. Results and this command go to docs/BENCHMARKS.md.

    python scripts/bench_cli_output.py                  # 200,000 actions, recorded
    python scripts/bench_cli_output.py --quick          # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalytic_cassette import ManualClock
from catalytic_cassette.chain import CausalChain

BATCH = 2_000


def build(path: Path, count: int) -> None:
    with CausalChain(path, clock=ManualClock(), durability="normal") as chain:
        plan = chain.append_action(
            {
                "plan_id": "bench",
                "intent_id": "i",
                "action_type": "PlanStarted",
                "function_name": "plan",
            }
        )
        made = 1
        while made < count:
            size = min(BATCH, count - made)
            chain.append_actions(
                [
                    {
                        "plan_id": "bench",
                        "intent_id": "i",
                        "action_type": "CapabilityCall",
                        "function_name": f"tool.{n % 17}",
                        "parent_action_id": plan.action_id,
                        "arguments": [{"n": n, "query": "disk usage on /var"}],
                        "result": {"ok": True, "bytes": n * 4096},
                        "cost": 0.001,
                    }
                    for n in range(made, made + size)
                ]
            )
            made += size


def run_once(db: Path, args: list[str], first_line_only: bool) -> tuple[float, int]:
    """Seconds until the first line (or until exit when reading all) and peak RSS in KiB."""
    command = [sys.executable, "-m", "catalytic_cassette", "--db", str(db), "actions", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    if first_line_only:
        proc.stdout.readline()
        elapsed = time.perf_counter() - start
        proc.stdout.close()  # what `head -1` does after its line
    else:
        while proc.stdout.read(1 << 16):
            pass
        elapsed = time.perf_counter() - start
        proc.stdout.close()
    _, _, usage = os.wait4(proc.pid, 0)
    return elapsed, usage.ru_maxrss


def report(label: str, runs: list[tuple[float, int]]) -> str:
    seconds = [s for s, _ in runs]
    rss = max(r for _, r in runs)
    return (
        f"{label}: median {statistics.median(seconds):.3f} s"
        f" (range {min(seconds):.3f}-{max(seconds):.3f}, {len(runs)} runs);"
        f" peak RSS {rss / 1024:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actions", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None, help="reuse (or build) this ledger")
    parser.add_argument("--quick", action="store_true", help="2,000 actions, 2 runs")
    options = parser.parse_args()
    count, reps = (2_000, 2) if options.quick else (options.actions, options.reps)
    with tempfile.TemporaryDirectory() as tmp:
        db = options.db or Path(tmp) / "bench.db"
        if not db.exists():
            started = time.perf_counter()
            build(db, count)
            print(f"built {count:,} actions in {time.perf_counter() - started:.1f} s")
        workloads = [
            ("actions --nl | head -1", ["--nl"], True),
            ("actions -t | head -1", ["-t"], True),
            ("actions | head -1 (JSON array)", [], True),
            ("actions --nl > /dev/null (all rows)", ["--nl"], False),
        ]
        for label, args, first in workloads:
            print(report(label, [run_once(db, args, first) for _ in range(reps)]), flush=True)


if __name__ == "__main__":
    main()
