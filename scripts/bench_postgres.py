"""The PostgreSQL ledger against procrastinate and bare SQL: one durable cluster, one run.

    python scripts/bench_postgres.py                    # the run of record
    python scripts/bench_postgres.py --quick            # seconds; what the test suite runs
    python scripts/bench_postgres.py --json out.json    # also write every result as JSON

The script starts ONE throwaway PostgreSQL cluster (scripts/pg_cluster.py, durable: fsync,
synchronous_commit and full_page_writes at PostgreSQL's defaults), prints its settings and
the machine's, and runs every contender against it in the same run, interleaved
(A B C A B C ...), each trial in a fresh database cloned from a template made once.

Workloads (``--workloads``):
  cycle  claim + complete until no step is left, with 1, 4 and 16 worker processes
         (``--mp-counts``), each process its own connection, N steps (``--steps``) posted
         beforehand. Contenders (``--loops``):
           ours-separate  MessageCassette.claim_step then complete_step (two transactions)
           ours-fused     complete_and_claim (one transaction per step)
           ours-*-sync    the same two with every commit synchronous, under the head
                          (commits_early off: the design before committing early)
           raw-separate   the same claim and complete in plain SQL on the package's tables
                          with every trigger dropped (no law, no journal): FOR UPDATE
                          SKIP LOCKED, then INSERT receipt + UPDATE step
           raw-fused      the same, complete and next claim in one transaction
           procrastinate  procrastinate's own worker (App.run_worker_async, concurrency=1,
                          wait=False, listen_notify=False) running a no-op async task
  post   messages/s from one process, one message per transaction and in batches
         (``--batch``): ours (post_message / post_messages), raw INSERTs, procrastinate
         (defer_async / batch_defer_async)
  append actions/s from one process, single and batched: ours (append_action(s)) against
         the same rows INSERTed into the bare table
  verify seconds to verify a ledger of --posts messages, each claimed and completed: ours
         on the server against SQLite's verify of its copy (the same journal)
  hold   how long one claim+complete transaction of ours holds the chain's head row, and
         where that time goes (per statement, the commit's flush; with ``--profile``,
         pg_stat_statements with nested statements, after a restart, once the timed runs
         are done)

Timing of a cycle trial excludes start-up (processes started, connected and migrated
before a common go): ours and raw from the first claim call to the return of the last
completion (monotonic clock, across processes); procrastinate from its own event table:
the first ``started`` event to the last ``succeeded`` event (both ``now()`` of their
transactions, so the last finish's own transaction is not counted: in procrastinate's
favour by one transaction). The wall time from go to the last process's exit, with
procrastinate's worker start-up and shutdown, is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_cluster
import psycopg
from bench_common import cpu_model, filesystem, git_state, percentile, rate_line
from psycopg import sql

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, payloads
from catalytic_cassette.postgresql import connection as pg_connection
from catalytic_cassette.postgresql import one_flight

RUN = "bench"
SOURCE = "USER"
TTL_SECONDS = 600
PAYLOAD: dict[str, Any] = {
    "task": "fetch-page",
    "url": "https://example.org/articles/2024/05/sqlite-write-ahead-logging",
    "headers": {"accept": "text/html", "user-agent": "bench/1.0"},
    "retries": 3,
    "timeout_s": 30,
    "note": "summarise the page in three sentences and keep every link",
}
RECEIPT: dict[str, Any] = {"ok": True}
LOOPS = (
    "ours-separate",
    "ours-fused",
    "ours-separate-sync",
    "ours-fused-sync",
    "raw-separate",
    "raw-fused",
    "procrastinate",
)
WORKLOADS = ("cycle", "post", "hold", "append", "verify")
TASK = "noop"

Samples = dict[str, list[float]]


def out(text: str = "") -> None:
    print(text, flush=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ------------------------------------------------------------------- databases


# The role owning every database the benchmark makes: the superuser migrating a ledger
# there runs the migrations as it.
OWNER = "cassette_bench_owner"


class Server:
    """The cluster's superuser URL, and databases made and dropped on it."""

    def __init__(self, url: str, strategy: str = "FILE_COPY") -> None:
        self.url = url
        # FILE_COPY checkpoints before and after the copy, so no clone's writes are left
        # for the checkpointer to flush during a timed trial; WAL_LOG (--quick) is faster.
        self.strategy = strategy

    def db_url(self, name: str) -> str:
        head, _, query_string = self.url.partition("?")
        base = head.rsplit("/", 1)[0]
        return f"{base}/{name}" + (f"?{query_string}" if query_string else "")

    def admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.url, autocommit=True)

    def create(self, name: str, template: str = "template0") -> str:
        """A database owned by ``OWNER`` (a ledger's owner is no superuser: LAW.md 14)."""
        with self.admin() as conn:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} CREATEROLE").format(sql.Identifier(OWNER)))
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY {} OWNER {}").format(
                    sql.Identifier(name),
                    sql.Identifier(template),
                    sql.SQL(self.strategy),
                    sql.Identifier(OWNER),
                )
            )
        return self.db_url(name)

    def drop(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def settle(self, name: str, *, empty: bool = False) -> None:
        """VACUUM ANALYZE a template and CHECKPOINT, so every clone starts alike (not in
        --quick, which only shows that everything runs). An empty template is only
        checkpointed: its tables keep no statistics, as a new database's do until
        autovacuum's threshold. Statistics that say 0 rows would have each session cache
        plans made for empty tables (sequential scans) at its first call, and a batch
        would scan the whole table per lookup (docs/BENCHMARKS.md, issue 15, second
        pass)."""
        if self.strategy != "FILE_COPY":
            return
        if not empty:
            with psycopg.connect(self.db_url(name), autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
        with self.admin() as conn:
            conn.execute("CHECKPOINT")


def trial_name(kind: str) -> str:
    return f"bench_{kind.replace('-', '_')}_{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------- templates


def template_ours(server: Server, name: str, steps: int, batch: int) -> None:
    """A migrated ledger with ``steps`` pending steps: one message (one job, one step)
    each, posted by the package in batches."""
    url = server.create(name)
    with MessageCassette(url) as cassette:
        for start in range(0, steps, batch):
            size = min(batch, steps - start)
            cassette.post_messages([(PAYLOAD, RUN, SOURCE, None)] * size)
    server.settle(name)


def template_raw(server: Server, name: str, steps: int) -> None:
    """The package's migrated tables and indexes with every trigger dropped, holding the
    same rows as the ledger's template (ids, payloads), inserted without any law."""
    url = server.create(name)
    MessageCassette(url).close()  # migrate: the same tables, constraints and indexes
    payload_json = payloads.encode_object(PAYLOAD)
    created = now_ms()
    with psycopg.connect(url, autocommit=True) as conn:
        triggers = conn.execute(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE NOT t.tgisinternal AND c.relname LIKE 'cassette%%'"
        ).fetchall()
        for trigger, table in triggers:
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(trigger), sql.Identifier(table)
                )
            )
        with conn.transaction():
            ids = list(range(1, steps + 1))
            conn.execute(
                "INSERT INTO cassette_messages (message_id, run_id, source, payload_json,"
                " created_at) SELECT i, %s, %s, %s, %s FROM unnest(%s::bigint[]) i",
                (RUN, SOURCE, payload_json, created, ids),
            )
            conn.execute(
                "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal,"
                " created_at) SELECT i, i, %s, 'default', 0, %s FROM unnest(%s::bigint[]) i",
                (RUN, created, ids),
            )
            conn.execute(
                "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal,"
                " ordinal, status, fencing_token, payload_json, created_at)"
                " SELECT i, i, %s, i, 0, 0, 'PENDING', 0, %s, %s FROM unnest(%s::bigint[]) i",
                (RUN, payload_json, created, ids),
            )
    server.settle(name, empty=steps == 0)


def template_procrastinate(server: Server, name: str, steps: int, batch: int) -> None:
    """procrastinate's schema applied, and ``steps`` no-op jobs deferred in batches."""
    url = server.create(name)

    async def fill() -> None:
        app = make_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            task = app.tasks[TASK]
            for start in range(0, steps, batch):
                size = min(batch, steps - start)
                await task.batch_defer_async(*([PAYLOAD] * size))

    asyncio.run(fill())
    server.settle(name)


def template_empty_ours(server: Server, name: str) -> None:
    MessageCassette(server.create(name)).close()
    server.settle(name, empty=True)


def template_empty_procrastinate(server: Server, name: str) -> None:
    url = server.create(name)

    async def apply() -> None:
        app = make_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())
    server.settle(name, empty=True)


# ------------------------------------------------------------------ procrastinate


async def noop(**_: Any) -> None:
    """The task procrastinate runs: nothing, as the other contenders do nothing."""


def make_app(url: str) -> Any:
    import procrastinate

    # procrastinate warns when its App is made in __main__ (a worker finds tasks by import
    # path); here every process registers the task by name itself, so it is not needed.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)

    # One connection per process: concurrency 1 and no LISTEN need no more.
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=1)
    app = procrastinate.App(connector=connector)
    app.task(name=TASK)(noop)
    return app


def procrastinate_version() -> str:
    try:
        from importlib.metadata import version

        return version("procrastinate")
    except Exception:
        return "not installed"


# -------------------------------------------------------------------- raw SQL

RAW_CLAIM = """
UPDATE cassette_steps s
   SET status = 'LEASED', lease_owner = %(worker)s, lease_expires_at = %(expires)s,
       fencing_token = s.fencing_token + 1
 WHERE s.step_id = (SELECT step_id FROM cassette_steps
                     WHERE run_id = %(run)s AND status = 'PENDING'
                     ORDER BY message_id, job_ordinal, ordinal
                     LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING s.step_id, s.job_id, s.fencing_token, s.payload_json
"""
RAW_RECEIPT = (
    "INSERT INTO cassette_receipts (receipt_id, step_id, job_id, run_id, worker_id,"
    " fencing_token, outcome, receipt_json, created_at)"
    " VALUES (%(step)s, %(step)s, %(job)s, %(run)s, %(worker)s, %(token)s, 'SUCCESS',"
    " %(receipt)s, %(now)s)"
)
RAW_COMMIT_STEP = "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = %(step)s"


def raw_claim(conn: psycopg.Connection[Any], worker: str) -> tuple[Any, ...] | None:
    return conn.execute(
        RAW_CLAIM, {"worker": worker, "expires": now_ms() + TTL_SECONDS * 1000, "run": RUN}
    ).fetchone()


def raw_complete(conn: psycopg.Connection[Any], worker: str, row: tuple[Any, ...]) -> None:
    step, job, token, _payload = row
    receipt = payloads.encode_object(RECEIPT)
    params = {"step": step, "job": job, "run": RUN, "worker": worker, "token": token}
    conn.execute(RAW_RECEIPT, {**params, "receipt": receipt, "now": now_ms()})
    conn.execute(RAW_COMMIT_STEP, params)


# ------------------------------------------------------------------ worker loops


def loop_ours_separate(cassette: MessageCassette, worker: str) -> tuple[int, float, float]:
    done, first = 0, time.monotonic()
    last = first
    while True:
        try:
            lease = cassette.claim_step(RUN, worker, ttl_seconds=TTL_SECONDS)
        except CassetteError as error:
            if error.code is not ErrorCode.NO_PENDING_STEPS:
                raise
            return done, first, last
        cassette.complete_step(
            RUN, lease["step_id"], worker, lease["fencing_token"], RECEIPT, "SUCCESS"
        )
        last = time.monotonic()
        done += 1


def loop_ours_fused(cassette: MessageCassette, worker: str) -> tuple[int, float, float]:
    first = time.monotonic()
    last = first
    try:
        lease: dict[str, Any] | None = cassette.claim_step(RUN, worker, ttl_seconds=TTL_SECONDS)
    except CassetteError as error:
        if error.code is not ErrorCode.NO_PENDING_STEPS:
            raise
        return 0, first, last
    done = 0
    while lease is not None:
        result = cassette.complete_and_claim(
            RUN,
            lease["step_id"],
            worker,
            lease["fencing_token"],
            RECEIPT,
            "SUCCESS",
            ttl_seconds=TTL_SECONDS,
        )
        last = time.monotonic()
        done += 1
        lease = result["next"]
    return done, first, last


def loop_raw(conn: psycopg.Connection[Any], worker: str, fused: bool) -> tuple[int, float, float]:
    done, first = 0, time.monotonic()
    last = first
    with conn.transaction():
        row = raw_claim(conn, worker)
    while row is not None:
        if fused:
            with conn.transaction():
                raw_complete(conn, worker, row)
                row = raw_claim(conn, worker)
        else:
            with conn.transaction():
                raw_complete(conn, worker, row)
        last = time.monotonic()
        done += 1
        if not fused:
            with conn.transaction():
                row = raw_claim(conn, worker)
    return done, first, last


def cpu_seconds() -> float:
    """This process's CPU time, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_main(kind: str, url: str, worker: str, go: Any, results: Any) -> None:
    """One worker process: connect, say ready, wait for go, run until no step is left.
    Its "done" carries (steps, first, last, CPU seconds spent from go to the end)."""
    try:
        if kind.startswith("ours"):
            with MessageCassette(url) as cassette:
                if kind.endswith("-sync"):
                    cast(Any, cassette).commits_early = False
                results.put(("ready", worker, None))
                go.wait(timeout=300)
                cpu = cpu_seconds()
                loop = loop_ours_fused if kind.startswith("ours-fused") else loop_ours_separate
                done = loop(cassette, worker)
                results.put(("done", worker, (*done, cpu_seconds() - cpu)))
        elif kind.startswith("raw"):
            with psycopg.connect(url, autocommit=True) as conn:
                results.put(("ready", worker, None))
                go.wait(timeout=300)
                cpu = cpu_seconds()
                done = loop_raw(conn, worker, kind == "raw-fused")
                results.put(("done", worker, (*done, cpu_seconds() - cpu)))
        else:
            asyncio.run(procrastinate_worker(url, worker, go, results))
    except BaseException:
        results.put(("error", worker, traceback.format_exc()))


async def procrastinate_worker(url: str, worker: str, go: Any, results: Any) -> None:
    app = make_app(url)
    async with app.open_async():
        results.put(("ready", worker, None))
        go.wait(timeout=300)  # nothing else runs on this loop yet
        cpu = cpu_seconds()
        await app.run_worker_async(
            name=worker,
            concurrency=1,
            wait=False,  # stop once the queue is empty
            listen_notify=False,  # no LISTEN connection: with wait=False there is no waiting
            install_signal_handlers=False,
            delete_jobs="never",  # the default: jobs stay, as ours stay in the ledger
        )
    results.put(("done", worker, (0, 0.0, 0.0, cpu_seconds() - cpu)))


def server_cpu_seconds(cluster_dir: str) -> float:
    """CPU time of the cluster's processes, user and system: the postmaster's own and its
    reaped children's (backends that exited), and every live child's (Linux /proc)."""
    try:
        postmaster = int(
            Path(cluster_dir, pg_cluster.DATA, "postmaster.pid").read_text().split()[0]
        )
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        pid, parent = int(entry.name), int(fields[1])
        if pid == postmaster:
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        elif parent == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def reaped_server_cpu(cluster_dir: str) -> float:
    """The server's CPU time once the backends of exited clients are gone (a backend exits
    a moment after its client closes; until the postmaster reaps it, its time is live)."""
    time.sleep(0.5)
    return server_cpu_seconds(cluster_dir)


def run_trial(kind: str, url: str, workers: int, cluster_dir: str) -> dict[str, Any]:
    """Run ``workers`` processes of ``kind`` on the database at ``url``."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    results = context.Queue()
    names = [f"worker-{n + 1}" for n in range(workers)]
    processes = [
        context.Process(target=worker_main, args=(kind, url, name, go, results)) for name in names
    ]
    for process in processes:
        process.start()
    finished: dict[str, tuple[int, float, float, float]] = {}
    try:
        for _ in names:
            state, worker, detail = results.get(timeout=300)
            if state != "ready":
                raise RuntimeError(f"{kind} {worker} failed to start:\n{detail}")
        server_cpu = server_cpu_seconds(cluster_dir)
        go_at = time.monotonic()
        go.set()
        for _ in names:
            state, worker, detail = results.get(timeout=3600)
            if state != "done":
                raise RuntimeError(f"{kind} {worker} failed:\n{detail}")
            finished[worker] = detail
        wall = time.monotonic() - go_at
    finally:
        for process in processes:
            process.join(timeout=60)
    trial: dict[str, Any] = {
        "wall": wall,
        "split": [finished[n][0] for n in names],
        "client_cpu": sum(finished[n][3] for n in names),
        # after every process exited and their backends were reaped; nothing else ran
        "server_cpu": reaped_server_cpu(cluster_dir) - server_cpu,
    }
    if kind != "procrastinate":
        ran = [v for v in finished.values() if v[0]]
        trial["span"] = max(v[2] for v in ran) - min(v[1] for v in ran)
    return trial


def check_trial(kind: str, url: str, steps: int, trial: dict[str, Any]) -> None:
    """Every step done exactly once; procrastinate's span from its own events."""
    with psycopg.connect(url, autocommit=True) as conn:
        if kind == "procrastinate":
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
                " count(DISTINCT job_id) FILTER (WHERE type = 'started'),"
                " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
                "                    - min(at) FILTER (WHERE type = 'started'))"
                " FROM procrastinate_events"
            ).fetchone()
            assert row is not None
            succeeded, started, span = row
            jobs = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*)"
                " FROM procrastinate_jobs"
            ).fetchone()
            if not (succeeded == started == steps and jobs == (steps, steps)):
                raise AssertionError(f"procrastinate: {row}, jobs {jobs}, expected {steps}")
            trial["span"] = float(span)
            return
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'COMMITTED'), max(fencing_token),"
            " (SELECT count(DISTINCT step_id) FROM cassette_receipts),"
            " (SELECT count(*) FROM cassette_receipts)"
            " FROM cassette_steps"
        ).fetchone()
        if row != (steps, steps, 1, steps, steps):
            raise AssertionError(f"{kind}: steps/committed/max token/receipts {row}")
        if sum(trial["split"]) != steps:
            raise AssertionError(f"{kind}: workers report {trial['split']} for {steps} steps")
        if kind.startswith("ours"):  # the server's own record: first lease to last receipt
            server = conn.execute(
                "SELECT (SELECT max(created_at) FROM cassette_receipts)"
                " - (SELECT min(lease_expires_at) FROM cassette_steps) + %s",
                (TTL_SECONDS * 1000,),
            ).fetchone()
            trial["server_span"] = server[0] / 1000 if server else None


# ---------------------------------------------------------------- 1. cycles


def workload_cycle(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    out("\n== 1. claim + complete, worker processes (steps/s) ==")
    templates = {}
    started = time.monotonic()
    for kind in args.loops:
        family = kind.split("-")[0]
        if family in templates:
            continue
        name = f"tpl_cycle_{family}"
        server.drop(name)
        if family == "ours":
            template_ours(server, name, args.steps, args.batch)
        elif family == "raw":
            template_raw(server, name, args.steps)
        else:
            template_procrastinate(server, name, args.steps, args.batch)
        templates[family] = name
    out(
        f"templates ({', '.join(templates)}) with {args.steps:,} pending steps/jobs made in"
        f" {time.monotonic() - started:.1f} s"
    )
    rates: dict[str, Samples] = {k: {str(n): [] for n in args.mp_counts} for k in args.loops}
    walls: dict[str, Samples] = {k: {str(n): [] for n in args.mp_counts} for k in args.loops}
    splits: dict[str, dict[str, list[int]]] = {k: {} for k in args.loops}
    server_spans: dict[str, Samples] = {k: {str(n): [] for n in args.mp_counts} for k in args.loops}
    cpu: dict[str, dict[str, list[tuple[float, float]]]] = {
        k: {str(n): [] for n in args.mp_counts} for k in args.loops
    }
    for rep in range(args.reps):
        for workers in args.mp_counts:
            for kind in args.loops:
                name = trial_name(kind)
                url = server.create(name, templates[kind.split("-")[0]])
                try:
                    trial = run_trial(kind, url, workers, args.cluster_dir)
                    check_trial(kind, url, args.steps, trial)
                finally:
                    server.drop(name)
                rates[kind][str(workers)].append(args.steps / trial["span"])
                walls[kind][str(workers)].append(args.steps / trial["wall"])
                splits[kind][str(workers)] = trial["split"]
                cpu[kind][str(workers)].append(
                    (
                        trial["client_cpu"] * 1000 / args.steps,
                        trial["server_cpu"] * 1000 / args.steps,
                    )
                )
                if trial.get("server_span"):
                    server_spans[kind][str(workers)].append(args.steps / trial["server_span"])
        out(f"  repetition {rep + 1}/{args.reps} done, load average {load()}")
    for workers in args.mp_counts:
        key = str(workers)
        for kind in args.loops:
            extra = ""
            if server_spans[kind][key]:
                recorded = statistics.median(server_spans[kind][key])
                extra = f"; server-recorded span {recorded:,.0f}/s"
            client_ms = statistics.median(c for c, _ in cpu[kind][key])
            server_ms = statistics.median(s for _, s in cpu[kind][key])
            out(
                f"{kind:14s} {workers:2d} worker(s): {rate_line(rates[kind][key])};"
                f" with start-up and exit {statistics.median(walls[kind][key]):,.0f}/s{extra};"
                f" CPU ms per step: clients {client_ms:.2f}, server {server_ms:.2f};"
                f" last split {'/'.join(map(str, splits[kind][key]))}"
            )
    table = []
    for workers in args.mp_counts:
        key = str(workers)
        row: dict[str, Any] = {"workers": workers}
        for kind in args.loops:
            row[kind] = statistics.median(rates[kind][key])
        if "procrastinate" in rates:
            for kind in args.loops:
                if kind != "procrastinate":
                    row[f"{kind}/procrastinate"] = row[kind] / row["procrastinate"]
        for kind in ("ours-separate", "ours-fused"):
            if kind in rates and f"{kind}-sync" in rates:
                row[f"{kind}/{kind}-sync"] = row[kind] / row[f"{kind}-sync"]
            if kind in rates and "raw-fused" in rates:
                row[f"{kind}/raw-fused"] = row[kind] / row["raw-fused"]
            if kind in rates and "raw-separate" in rates:
                row[f"{kind}/raw-separate"] = row[kind] / row["raw-separate"]
        table.append(row)
    out("\nmedians, steps/s, and ratios of medians:")
    for row in table:
        out(
            "  "
            + ", ".join(
                f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
    base = str(args.mp_counts[0])
    for kind in args.loops:
        one = statistics.median(rates[kind][base])
        scale = ", ".join(
            f"{n}/{base} = {statistics.median(rates[kind][str(n)]) / one:.2f}"
            for n in args.mp_counts[1:]
        )
        if scale:
            out(f"  scaling {kind}: {scale}")
    targets = report.setdefault("targets", [])
    if "procrastinate" in rates:
        for kind in ("ours-separate", "ours-fused"):
            if kind not in rates:
                continue
            for row in table:
                value = row[f"{kind}/procrastinate"]
                met = value >= 1.0
                targets.append(
                    {
                        "target": f"{kind}/procrastinate, {row['workers']} workers",
                        "value": value,
                        "met": met,
                    }
                )
    if "1" in rates.get("ours-fused", {}) and "4" in rates.get("ours-fused", {}):
        for kind in ("ours-separate", "ours-fused"):
            if kind in rates:
                value = statistics.median(rates[kind]["4"]) / statistics.median(rates[kind]["1"])
                targets.append(
                    {"target": f"{kind} 4/1 workers", "value": value, "met": value > 1.0}
                )
    out(
        "every trial checked: each step/job done exactly once (one receipt per step, all"
        " COMMITTED, every token 1; procrastinate: every job started once and succeeded)"
    )
    report["cycle"] = {
        "rates": rates,
        "walls": walls,
        "server_spans": server_spans,
        "splits": splits,
        "cpu_ms_per_step": cpu,
        "table": table,
    }


# ------------------------------------------------------------------- 2. posts


def workload_post(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    out("\n== 2. post (messages/s, one process) ==")
    server.drop("tpl_post_ours")
    template_empty_ours(server, "tpl_post_ours")
    server.drop("tpl_post_raw")
    template_raw(server, "tpl_post_raw", 0)
    server.drop("tpl_post_procrastinate")
    template_empty_procrastinate(server, "tpl_post_procrastinate")
    count, batch = args.posts, args.batch
    payload_json = payloads.encode_object(PAYLOAD)

    def ours(batched: bool) -> Callable[[str], float]:
        def run(url: str) -> float:
            with MessageCassette(url) as cassette:
                started = time.perf_counter()
                if batched:
                    for start in range(0, count, batch):
                        size = min(batch, count - start)
                        cassette.post_messages([(PAYLOAD, RUN, SOURCE, None)] * size)
                else:
                    for _ in range(count):
                        cassette.post_message(PAYLOAD, RUN, SOURCE)
                return count / (time.perf_counter() - started)

        return run

    def ours_sql(pipelined: bool) -> Callable[[str], float]:
        """Batches of the post query in plain SQL (what post_messages sends), pipelined or
        a round trip per item: the two levers, each alone, in the same run."""
        from catalytic_cassette.postgresql import connection
        from catalytic_cassette.postgresql.sqlfiles import query

        plans = payloads.plan_jobs(PAYLOAD, payload_json)
        params = {
            "run_id": RUN,
            "source": SOURCE,
            "idempotency_key": None,
            "payload_json": payload_json,
            "intents": [plan.intent for plan in plans],
            "step_counts": [len(plan.steps) for plan in plans],
            "step_payloads": [step for plan in plans for step in plan.steps],
        }

        def run(url: str) -> float:
            with psycopg.connect(url, autocommit=True) as conn:
                started = time.perf_counter()
                for start in range(0, count, batch):
                    size = min(batch, count - start)
                    with conn.transaction():
                        if pipelined:
                            connection.batch(conn, query("post"), [params] * size)
                        else:
                            for _ in range(size):
                                conn.execute(query("post"), params).fetchone()
                return count / (time.perf_counter() - started)

        return run

    def raw(batched: bool) -> Callable[[str], float]:
        def one(conn: psycopg.Connection[Any], ident: int) -> None:
            created = now_ms()
            conn.execute(
                "INSERT INTO cassette_messages (message_id, run_id, source, payload_json,"
                " created_at) VALUES (%s, %s, %s, %s, %s)",
                (ident, RUN, SOURCE, payload_json, created),
            )
            conn.execute(
                "INSERT INTO cassette_jobs (job_id, message_id, run_id, intent, ordinal,"
                " created_at) VALUES (%s, %s, %s, 'default', 0, %s)",
                (ident, ident, RUN, created),
            )
            conn.execute(
                "INSERT INTO cassette_steps (step_id, job_id, run_id, message_id, job_ordinal,"
                " ordinal, status, fencing_token, payload_json, created_at)"
                " VALUES (%s, %s, %s, %s, 0, 0, 'PENDING', 0, %s, %s)",
                (ident, ident, RUN, ident, payload_json, created),
            )

        def run(url: str) -> float:
            with psycopg.connect(url, autocommit=True) as conn:
                started = time.perf_counter()
                size = batch if batched else 1
                for start in range(0, count, size):
                    with conn.transaction():
                        for ident in range(start + 1, min(count, start + size) + 1):
                            one(conn, ident)
                return count / (time.perf_counter() - started)

        return run

    def proc(batched: bool) -> Callable[[str], float]:
        def run(url: str) -> float:
            async def go() -> float:
                app = make_app(url)
                async with app.open_async():
                    task = app.tasks[TASK]
                    started = time.perf_counter()
                    if batched:
                        for start in range(0, count, batch):
                            size = min(batch, count - start)
                            await task.batch_defer_async(*([PAYLOAD] * size))
                    else:
                        for _ in range(count):
                            await task.defer_async(**PAYLOAD)
                    return count / (time.perf_counter() - started)

            return asyncio.run(go())

        return run

    contenders = {
        "ours single": ("tpl_post_ours", ours(False)),
        "raw single": ("tpl_post_raw", raw(False)),
        "procrastinate single": ("tpl_post_procrastinate", proc(False)),
        f"ours batch {batch}": ("tpl_post_ours", ours(True)),
        f"raw batch {batch}": ("tpl_post_raw", raw(True)),
        f"procrastinate batch {batch}": ("tpl_post_procrastinate", proc(True)),
    }
    # The batch levers, one at a time (the post query in SQL, no package on top):
    # pipelined or not.
    levers = {
        "sql, pipelined": ("tpl_post_ours", ours_sql(True)),
        "sql, round trip per item": ("tpl_post_ours", ours_sql(False)),
    }
    contenders.update({f"ours batch {batch} ({k})": v for k, v in levers.items()})
    samples: Samples = {name: [] for name in contenders}
    for _ in range(args.reps):
        for label, (template, run) in contenders.items():
            name = trial_name("post")
            url = server.create(name, template)
            try:
                samples[label].append(run(url))
            finally:
                server.drop(name)
    for label in contenders:
        out(f"post {label:28s} {rate_line(samples[label])}")
    for lever in levers:
        mine = statistics.median(samples[f"ours batch {batch} ({lever})"])
        base = statistics.median(samples[f"raw batch {batch}"])
        out(f"  lever, batch {batch}, {lever}: ours/raw = {mine / base:.2f}")
    med = {label: statistics.median(v) for label, v in samples.items()}
    for mode in ("single", f"batch {batch}"):
        mine = med[f"ours {mode}"]
        out(
            f"  {mode}: ours/procrastinate = {mine / med[f'procrastinate {mode}']:.2f},"
            f" ours/raw = {mine / med[f'raw {mode}']:.2f}"
        )
    report["post"] = {"samples": samples, "count": count, "batch": batch}


def workload_append(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """append_action(s) of ours against the same rows INSERTed into the bare table."""
    from catalytic_cassette.chain import CausalChain

    out("\n== 4. append (actions/s, one process) ==")
    server.drop("tpl_append_ours")
    template_empty_ours(server, "tpl_append_ours")
    server.drop("tpl_append_raw")
    template_raw(server, "tpl_append_raw", 0)
    count, batch = args.posts, args.batch
    action = {
        "plan_id": "plan",
        "intent_id": "intent",
        "action_type": "InternalStep",
        "function_name": "work",
        "arguments": [1],
        "result": {"ok": True},
        "duration_ms": 3,
    }

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signer = Ed25519PrivateKey.generate()

    def ours(
        batched: bool, *, signed: bool = False, suggest: bool = False
    ) -> Callable[[str], float]:
        def run(url: str) -> float:
            with CausalChain(url, signing_key=signer if signed else None) as chain:
                started = time.perf_counter()
                if batched:
                    for start in range(0, count, batch):
                        chain.append_actions(
                            [action] * min(batch, count - start), suggest_causes=suggest
                        )
                else:
                    for _ in range(count):
                        chain.append_action(action, suggest_causes=suggest)
                return count / (time.perf_counter() - started)

        return run

    def raw(batched: bool) -> Callable[[str], float]:
        def run(url: str) -> float:
            with psycopg.connect(url, autocommit=True) as conn:
                started = time.perf_counter()
                size = batch if batched else 1
                for start in range(0, count, size):
                    with conn.transaction():
                        for seq in range(start + 1, min(count, start + size) + 1):
                            conn.execute(
                                "INSERT INTO cassette_actions (action_seq, action_id, plan_id,"
                                " intent_id, action_type, function_name, arguments_json,"
                                ' result_json, success, cost_micros, duration_ms, "timestamp",'
                                " metadata_json) VALUES (%s, %s, 'plan', 'intent',"
                                " 'InternalStep', 'work', '[1]', '{\"ok\":true}', 1, 0,"
                                " 3, %s, '{}')",
                                (seq, f"a-{seq}", now_ms()),
                            )
                return count / (time.perf_counter() - started)

        return run

    contenders = {
        "ours single": ("tpl_append_ours", ours(False)),
        "raw single": ("tpl_append_raw", raw(False)),
        f"ours batch {batch}": ("tpl_append_ours", ours(True)),
        f"raw batch {batch}": ("tpl_append_raw", raw(True)),
        # the chain's extras: the head taken first, then one call per row (0008)
        "ours signed single": ("tpl_append_ours", ours(False, signed=True)),
        "ours suggest single": ("tpl_append_ours", ours(False, suggest=True)),
        f"ours signed batch {batch}": ("tpl_append_ours", ours(True, signed=True)),
    }
    samples: Samples = {name: [] for name in contenders}
    for _ in range(args.reps):
        for label, (template, run) in contenders.items():
            name = trial_name("append")
            url = server.create(name, template)
            try:
                samples[label].append(run(url))
            finally:
                server.drop(name)
    for label in contenders:
        out(f"append {label:26s} {rate_line(samples[label])}")
    med = {label: statistics.median(v) for label, v in samples.items()}
    for mode in ("single", f"batch {batch}"):
        out(f"  {mode}: ours/raw = {med[f'ours {mode}'] / med[f'raw {mode}']:.2f}")
    for extra, mode in (("signed", "single"), ("suggest", "single"), ("signed", f"batch {batch}")):
        ratio = med[f"ours {extra} {mode}"] / med[f"ours {mode}"]
        out(f"  {mode}: ours {extra}/ours = {ratio:.2f}")
    report["append"] = {"samples": samples, "count": count, "batch": batch}


def workload_verify(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """verify of a PostgreSQL ledger against verify of its copy in a SQLite file: the same
    journal, the same checks, in the same run."""
    import tempfile

    from catalytic_cassette.copying import copy_ledger
    from catalytic_cassette.verify import verify_path

    out("\n== 5. verify (seconds, one ledger of --posts messages, claimed and completed) ==")
    name = trial_name("verify")
    url = server.create(name)
    samples: Samples = {"postgresql": [], "sqlite copy": []}
    try:
        with MessageCassette(url) as cassette:
            for start in range(0, args.posts, 100):
                cassette.post_messages(
                    [(PAYLOAD, RUN, SOURCE, None)] * min(100, args.posts - start)
                )
            lease = cassette.claim_step(RUN, "w")
            while lease is not None:
                lease = cassette.complete_and_claim(
                    RUN, lease["step_id"], "w", lease["fencing_token"], {"ok": True}, "SUCCESS"
                )["next"]
        with tempfile.TemporaryDirectory() as scratch:
            copied = f"{scratch}/copy.db"
            copy_ledger(url, copied)
            for _ in range(args.reps):
                for label, target in (("postgresql", url), ("sqlite copy", copied)):
                    started = time.perf_counter()
                    verified = verify_path(target)
                    samples[label].append(time.perf_counter() - started)
                    if not verified.ok:
                        raise SystemExit(f"verify of {label} failed: {verified.findings[:3]}")
        entries = verified.journal_rows
    finally:
        server.drop(name)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    for label, values in samples.items():
        spread = f"range {min(values):.2f}-{max(values):.2f}"
        out(f"verify {label:12s} {medians[label]:.2f} s ({spread}) for {entries:,} entries")
    out(f"  postgresql/sqlite = {medians['postgresql'] / medians['sqlite copy']:.2f}")
    report["verify"] = {"samples": samples, "entries": entries}


# ------------------------------------------------------ 3. the head's hold time


def timed_cycles(url: str, cycles: int) -> dict[str, list[float]]:
    """What one worker's calls cost, one process, alternating the fused and the separate
    path (ms per call, client-side: the server's work, its WAL flush at commit and one
    round trip), and the commit of a one-row insert into a table without triggers."""
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "complete_and_claim",
            "claim_step",
            "complete_step",
            "commit of a one-row insert, no trigger",
        )
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_floor (n bigint)")
        for n in range(cycles):
            started = time.perf_counter()
            conn.execute("INSERT INTO bench_floor VALUES (%s)", (n,))
            times["commit of a one-row insert, no trigger"].append(
                (time.perf_counter() - started) * 1e3
            )
    # A write that commits early (durability full) holds the head until its COMMIT, then
    # flushes outside it: the flush's share of each call is timed apart, so here the write
    # and its flush go one after the other (one_flight, which sends them together, is off).
    flushed: list[float] = []
    real_flush = pg_connection.flush
    real_supported = one_flight.supported

    def timed_flush(conn: psycopg.Connection[Any]) -> None:
        started = time.perf_counter()
        real_flush(conn)
        flushed.append((time.perf_counter() - started) * 1e3)

    pg_connection.flush = timed_flush
    one_flight.supported = lambda: False
    try:
        _timed_worker_calls(url, cycles, times, flushed)
    finally:
        pg_connection.flush = real_flush
        one_flight.supported = real_supported
    return times


def _timed_worker_calls(
    url: str, cycles: int, times: dict[str, list[float]], flushed: list[float]
) -> None:
    for label in ("complete_and_claim", "claim_step", "complete_step"):
        times[f"{label}: under the head"] = []
    with MessageCassette(url) as cassette:
        lease: dict[str, Any] | None = cassette.claim_step(RUN, "w", ttl_seconds=TTL_SECONDS)
        for n in range(cycles):
            assert lease is not None
            step, token = lease["step_id"], lease["fencing_token"]
            t0 = time.perf_counter()
            flushed.clear()
            if n % 2:
                lease = cassette.complete_and_claim(
                    RUN, step, "w", token, RECEIPT, "SUCCESS", ttl_seconds=TTL_SECONDS
                )["next"]
                record(times, "complete_and_claim", (time.perf_counter() - t0) * 1e3, flushed)
            else:
                cassette.complete_step(RUN, step, "w", token, RECEIPT, "SUCCESS")
                t1 = time.perf_counter()
                record(times, "complete_step", (t1 - t0) * 1e3, flushed)
                flushed.clear()
                lease = cassette.claim_step(RUN, "w", ttl_seconds=TTL_SECONDS)
                t2 = time.perf_counter()
                record(times, "claim_step", (t2 - t1) * 1e3, flushed)


def record(times: dict[str, list[float]], label: str, ms: float, flushed: list[float]) -> None:
    """A call's time, and the part of it before its flush (an upper bound of how long it
    held the head: from its first write to its COMMIT, plus a round trip)."""
    times[label].append(ms)
    times[f"{label}: under the head"].append(ms - sum(flushed))


def workload_hold(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    out("\n== 3. ours: how long a worker's call holds the head row (1 process, ms) ==")
    steps = args.hold_cycles + 2
    server.drop("tpl_hold")
    template_ours(server, "tpl_hold", steps, args.batch)
    name = trial_name("hold")
    url = server.create(name, "tpl_hold")
    try:
        times = timed_cycles(url, args.hold_cycles)
    finally:
        server.drop(name)
    for label, values in times.items():
        out(
            f"{label:40s} p50 {statistics.median(values):6.2f}  p90 {percentile(values, 90):6.2f}"
            f"  p99 {percentile(values, 99):6.2f}"
        )
    fused = statistics.median(times["complete_and_claim: under the head"])
    out(
        "the head row is locked from a transaction's first write to the end of its COMMIT"
        " (with a synchronous commit, the WAL flush included; committing early, not), so"
        " 'under the head' bounds a call's hold from above (it adds one round trip and the"
        f" client's own work): at ~{fused:.2f} ms per complete_and_claim the chain admits"
        f" about {1000 / fused:,.0f} steps/s at most, whatever the number of workers"
    )
    report["hold"] = {k: statistics.median(v) for k, v in times.items()}


def profile(server: Server, cluster: Any, args: argparse.Namespace) -> None:
    """pg_stat_statements over one single-worker trial of ``--profile-loop``: where the time
    goes inside the functions and triggers (restarts the cluster with the module loaded)."""
    out(f"\n== 4. ours: pg_stat_statements, nested statements, 1 {args.profile_loop} worker ==")
    with server.admin() as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    cluster.stop()
    pg_cluster.start(cluster.directory, durable=True, bin_dir=cluster.bin_dir)
    with server.admin() as conn:  # known only once the module is loaded
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        conn.execute("ALTER SYSTEM SET track_functions = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    server.drop("tpl_profile")
    template_ours(server, "tpl_profile", args.steps, args.batch)
    name = trial_name("profile")
    url = server.create(name, "tpl_profile")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_reset()")
        trial = run_trial(args.profile_loop, url, 1, args.cluster_dir)
        total = trial["span"] * 1e3
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT calls, total_exec_time, mean_exec_time, toplevel,"
                " regexp_replace(query, '\\s+', ' ', 'g')"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                "  WHERE datname = current_database())"
                " ORDER BY total_exec_time DESC LIMIT 24"
            ).fetchall()
            functions = conn.execute(
                "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
                " ORDER BY self_time DESC LIMIT 20"
            ).fetchall()
    finally:
        server.drop(name)
    out(f"{args.steps:,} steps in {total:,.0f} ms of client time; statements by total time:")
    for calls, total_ms, mean_ms, top, text in rows:
        out(
            f"  {calls:7,d} x {mean_ms:7.4f} ms = {total_ms:8.1f} ms {'top ' if top else 'nest'}"
            f" {text[:110]}"
        )
    out("functions by self time (ms):")
    for fname, calls, total_ms, self_ms in functions:
        out(f"  {fname:32s} {calls:7,d} calls, total {total_ms:8.1f}, self {self_ms:8.1f}")


# -------------------------------------------------------------------- setup


def load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def print_setup(server: Server, args: argparse.Namespace, report: dict[str, Any]) -> None:
    with server.admin() as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN"
                " ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers',"
                " 'wal_sync_method', 'max_connections', 'wal_level', 'commit_delay',"
                " 'checkpoint_timeout', 'max_wal_size')"
            ).fetchall()
        )
        version = conn.execute("SHOW server_version").fetchone()
    setup = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "procrastinate": procrastinate_version(),
        "server": version[0] if version else "?",
        "settings": settings,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()}, {cpu_model()}, {platform.system()} {platform.release()}",
        "cluster": f"{args.cluster_dir} ({filesystem(Path(args.cluster_dir))})",
        "code": git_state(),
        "load_start": load(),
    }
    report["setup"] = setup
    out(f"command: {setup['command']}")
    out(
        f"python {setup['python']}, psycopg {setup['psycopg']}, procrastinate"
        f" {setup['procrastinate']}; code at {setup['code']}"
    )
    out(f"machine: {setup['cpus']} CPUs, {setup['machine']}; load average {setup['load_start']}")
    out(f"PostgreSQL {setup['server']}, one durable cluster in {setup['cluster']}, unix socket:")
    out("  " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
    out(
        f"sizes: {args.steps:,} steps per cycle trial, worker processes {args.mp_counts},"
        f" loops {', '.join(args.loops)}; {args.posts:,} posts, batch {args.batch:,};"
        f" {args.reps} interleaved repetition(s), every trial in a fresh database cloned from"
        f" a template (VACUUM ANALYZE, unless empty, and CHECKPOINT once; CREATE DATABASE"
        f" ... STRATEGY {server.strategy})"
    )
    out(
        f"payload {len(payloads.encode_object(PAYLOAD))} bytes of JSON per message / job;"
        f" receipt {payloads.encode_object(RECEIPT)}; ours at durability full"
        f" (synchronous_commit on, as the server's default the others use)"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 rep: seconds")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000, help="steps per cycle trial")
    parser.add_argument("--mp-counts", default="1,4,16", help="worker processes, e.g. 1,4,16")
    parser.add_argument("--loops", default=",".join(LOOPS), help=f"subset of {','.join(LOOPS)}")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="cycle,post,hold,append,verify"
    )
    parser.add_argument("--posts", type=int, default=2000, help="posts per repetition")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--hold-cycles", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="pg_stat_statements at the end")
    parser.add_argument("--profile-loop", default="ours-fused", choices=LOOPS[:4])
    parser.add_argument("--cluster-dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--keep-cluster", action="store_true", help="do not stop or remove it")
    parser.add_argument("--json", type=Path, default=None, help="also write every result here")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.posts, args.batch, args.hold_cycles = 1, 40, 20, 10, 20
        if args.mp_counts == "1,4,16":
            args.mp_counts = "2"
    args.mp_counts = [int(n) for n in args.mp_counts.split(",") if n]
    args.loops = [k for k in args.loops.split(",") if k]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for kind in args.loops:
        if kind not in LOOPS:
            parser.error(f"unknown loop {kind!r}")
    for workload in args.workloads:
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    made_dir = args.cluster_dir is None
    if made_dir:
        # Not under a private tmp: the server runs as the postgres user under root, and
        # the socket path must stay short.
        args.cluster_dir = tempfile.mkdtemp(prefix="cassette-bench-pg-", dir="/tmp")
    cluster = pg_cluster.start(args.cluster_dir, durable=True)
    server = Server(cluster.url, "WAL_LOG" if args.quick else "FILE_COPY")
    report: dict[str, Any] = {}
    try:
        print_setup(server, args, report)
        if "cycle" in args.workloads:
            workload_cycle(server, args, report)
        if "post" in args.workloads:
            workload_post(server, args, report)
        if "hold" in args.workloads:
            workload_hold(server, args, report)
        if "append" in args.workloads:
            workload_append(server, args, report)
        if "verify" in args.workloads:
            workload_verify(server, args, report)
        if args.profile:
            profile(server, cluster, args)
        out("\n== targets ==")
        for target in report.get("targets", []):
            out(
                f"  {target['target']}: {target['value']:.2f}"
                f" {'met' if target['met'] else 'MISSED'}"
            )
        report["setup"]["load_end"] = load()
        out(f"load average at the end {report['setup']['load_end']}")
    finally:
        if not args.keep_cluster:
            try:
                pg_cluster.stop(args.cluster_dir, bin_dir=cluster.bin_dir)
            finally:
                if made_dir:
                    import shutil

                    shutil.rmtree(args.cluster_dir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
