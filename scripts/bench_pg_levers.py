"""SQL levers on the PostgreSQL worker path, measured side by side in one run.

    python scripts/bench_pg_levers.py ab --loop ours-separate --workers 4 - variant.sql
    python scripts/bench_pg_levers.py waits --loop ours-fused --workers 4
    python scripts/bench_pg_levers.py serial --loop ours-separate --steps 1000 - variant.sql

``ab`` makes one template per variant on one throwaway durable cluster (this checkout's
migrations, then the variant's SQL run as the owner; ``-`` runs none), runs the claim +
complete loop of scripts/bench_postgres.py on a fresh clone of each, interleaved (A B A B
...), checks every trial (each step done once), and prints per variant the median steps/s
with every trial's, and the CPU each step cost in the worker processes and in the server
(the cluster's processes, reaped backends included). A variant can be a lever (a function
redefined, a trigger made conditional) or its undoing: SQL that puts back what a migration
replaced measures that migration against its absence in the same run.

``serial`` measures what the server spends per step with no other process in the way:
one connection calls the ledger's claim and completion functions (``cassette_claim`` then
``cassette_complete``, or ``cassette_complete_and_claim`` for ours-fused) in a loop,
committing asynchronously with no flush (so no fsync and no lock wait is timed), on a
fresh clone of each variant's template, interleaved; it prints per variant the median
wall time and the backend's own CPU time per step (from /proc: the server's work alone,
steadier than the workers' trials on a noisy machine).

``waits`` runs one trial (of one variant, ``-`` by default) and samples every 2 ms what
the trial's backends wait for (pg_stat_activity: a lock, the WAL, the client, or nothing:
active).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_postgres as bench
import pg_cluster
import psycopg

TRIAL = "levers_trial"


def template(server: bench.Server, name: str, loop: str, steps: int, sql: str | None) -> None:
    """A template holding ``steps`` pending steps (or jobs), with ``sql`` run after."""
    server.drop(name)
    if loop == "procrastinate":
        bench.template_procrastinate(server, name, steps, 1000)
    else:
        bench.template_ours(server, name, steps, 1000)
    if sql is not None:
        with psycopg.connect(server.db_url(name), autocommit=True) as conn:
            conn.execute(f'SET ROLE "{bench.OWNER}"')  # (as the ledger's owner)
            conn.execute(sql.encode("utf-8"))
        server.settle(name)


def trial(
    server: bench.Server, cluster_dir: str, name: str, loop: str, workers: int, steps: int
) -> dict[str, Any]:
    url = server.create(TRIAL, name)
    try:
        result = bench.run_trial(loop, url, workers, cluster_dir)
        bench.check_trial(loop, url, steps, result)
    finally:
        server.drop(TRIAL)
    return result


def variant_sql(variant: str) -> str | None:
    """The SQL a variant names: a file's text, or none for ``-``."""
    return None if variant == "-" else Path(variant).read_text(encoding="utf-8")


def ab(server: bench.Server, cluster_dir: str, args: argparse.Namespace) -> None:
    names = {}
    for index, variant in enumerate(args.variants):
        names[variant] = f"tpl_lever_{index}"
        template(server, names[variant], args.loop, args.steps, variant_sql(variant))
    seen: dict[str, list[tuple[float, float, float]]] = {v: [] for v in args.variants}
    for rep in range(args.reps):
        for variant in args.variants:
            result = trial(server, cluster_dir, names[variant], args.loop, args.workers, args.steps)
            seen[variant].append(
                (
                    args.steps / result["span"],
                    result["client_cpu"] * 1000 / args.steps,
                    result["server_cpu"] * 1000 / args.steps,
                )
            )
        bench.out(f"  repetition {rep + 1}/{args.reps} done, load average {bench.load()}")
    for variant, rows in seen.items():
        rates = " ".join(f"{rate:,.0f}" for rate, _, _ in rows)
        bench.out(
            f"{variant:32s} {statistics.median(r for r, _, _ in rows):7,.0f} steps/s"
            f" [{rates}]; CPU ms per step: clients {statistics.median(c for _, c, _ in rows):.3f},"
            f" server {statistics.median(s for _, _, s in rows):.3f}"
        )


CLAIM = "SELECT step_id, fencing_token FROM cassette_claim('{run}', 'w', 1, 600000)"
COMPLETE = "SELECT cassette_complete('{run}', %s, 'w', %s, 'SUCCESS', '{{}}')"
COMPLETE_AND_CLAIM = (
    "SELECT step_id, fencing_token FROM cassette_complete_and_claim('{run}', %s, 'w', %s,"
    " 'SUCCESS', '{{}}', 600000)"
)


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serial_trial(url: str, loop: str, steps: int) -> tuple[float, float]:
    """(wall ms, backend CPU ms) per step of ``steps`` claims and completions on one
    connection, each committed asynchronously and never flushed."""
    run = bench.RUN
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        cpu, start = cpu_seconds(pid), time.perf_counter()
        lease = conn.execute(CLAIM.format(run=run)).fetchone()
        for done in range(1, steps + 1):
            assert lease is not None, f"step {done}: nothing claimed"
            if loop == "ours-fused":
                lease = conn.execute(
                    COMPLETE_AND_CLAIM.format(run=run), lease, prepare=True
                ).fetchone()
                if lease is not None and lease[0] is None:
                    lease = None
            else:
                conn.execute(COMPLETE.format(run=run), lease, prepare=True)
                lease = (
                    conn.execute(CLAIM.format(run=run), prepare=True).fetchone()
                    if done < steps
                    else None
                )
        wall, used = time.perf_counter() - start, cpu_seconds(pid) - cpu
    return wall * 1000 / steps, used * 1000 / steps


def serial(server: bench.Server, args: argparse.Namespace) -> None:
    if args.loop not in ("ours-separate", "ours-fused"):
        raise SystemExit("serial measures the ledger's own loops: ours-separate or ours-fused")
    names = {}
    for index, variant in enumerate(args.variants):
        names[variant] = f"tpl_lever_{index}"
        template(server, names[variant], args.loop, args.steps + 1, variant_sql(variant))
    seen: dict[str, list[tuple[float, float]]] = {v: [] for v in args.variants}
    for rep in range(args.reps):
        for variant in args.variants:
            url = server.create(TRIAL, names[variant])
            try:
                seen[variant].append(serial_trial(url, args.loop, args.steps))
            finally:
                server.drop(TRIAL)
        bench.out(f"  repetition {rep + 1}/{args.reps} done, load average {bench.load()}")
    for variant, rows in seen.items():
        each = " ".join(f"{w:.3f}/{c:.3f}" for w, c in rows)
        bench.out(
            f"{variant:32s} wall {statistics.median(w for w, _ in rows):.3f} ms,"
            f" server CPU {statistics.median(c for _, c in rows):.3f} ms per step"
            f" [wall/CPU per trial: {each}]"
        )


def waits(server: bench.Server, cluster_dir: str, args: argparse.Namespace) -> None:
    if len(args.variants) != 1:
        raise SystemExit("waits measures one variant: a SQL file, or - for none")
    template(server, "tpl_lever_waits", args.loop, args.steps, variant_sql(args.variants[0]))
    url = server.create(TRIAL, "tpl_lever_waits")
    counts: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(server.url, autocommit=True) as conn:
            while not done.is_set():
                for (state,) in conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, state)"
                    " FROM pg_stat_activity WHERE datname = %s"
                    " AND backend_type = 'client backend'",
                    (TRIAL,),
                ):
                    counts[str(state)] += 1
                time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = bench.run_trial(args.loop, url, args.workers, cluster_dir)
        bench.check_trial(args.loop, url, args.steps, result)
    finally:
        done.set()
        sampler.join()
        server.drop(TRIAL)
    total = sum(counts.values()) or 1
    bench.out(f"{args.loop}, {args.workers} workers: {args.steps / result['span']:,.0f} steps/s")
    for state, count in counts.most_common(12):
        bench.out(f"  {state:32s} {count / total:6.1%} of the backends' samples")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("what", choices=("ab", "serial", "waits"))
    parser.add_argument("variants", nargs="*", default=["-"], help="SQL files, - for none")
    parser.add_argument("--loop", default="ours-separate", choices=bench.LOOPS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_intermixed_args(argv)  # variants after the options too
    cluster_dir = tempfile.mkdtemp(prefix="cassette-levers-pg-", dir="/tmp")
    cluster = pg_cluster.start(cluster_dir, durable=True)
    try:
        server = bench.Server(cluster.url)
        bench.out(
            f"command: {' '.join(sys.argv)}; code at {bench.git_state()};"
            f" {args.loop}, {args.workers} worker processes, {args.steps:,} steps per trial"
        )
        if args.what == "ab":
            ab(server, cluster_dir, args)
        elif args.what == "serial":
            serial(server, args)
        else:
            waits(server, cluster_dir, args)
    finally:
        pg_cluster.stop(cluster_dir, bin_dir=cluster.bin_dir)
        import shutil

        shutil.rmtree(cluster_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
