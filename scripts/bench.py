"""Ledger benchmarks against plain sqlite3 and huey: one command, one run, ratios.

Every comparison runs in this process tree, interleaved (A B A B ...), and reports the
median and range of N repetitions plus the ratio of medians, for synchronous=FULL and
NORMAL (journal mode WAL). The setup is printed first and a table of targets last.

    python scripts/bench.py                          # the full run (1M pending steps)
    python scripts/bench.py --quick                  # seconds; what the test suite runs
    python scripts/bench.py --json results.json      # also write every result as JSON

Workloads: 1 post_message; 2 claim + complete, 1 worker, vs raw sqlite3 and huey, as
separate calls and as the fused worker loop (complete_and_claim); 3 both loops with 1, 2
and 4 worker processes; 4 claim latency with 1k, 100k and 1M pending
steps; 5 append_action (the code of scripts/bench_chain.py); 6 verify rows/s and peak
RSS; 7 the `cassette claim` command as a process; 8 bytes on disk per record.

The PostgreSQL ledger's run (issue 15: against procrastinate and bare SQL on one durable
cluster it starts; claim + complete at 1, 4 and 16 worker processes, post, append, verify)
is the mode `postgres`, whose arguments are scripts/bench_postgres.py's (its module):

    python scripts/bench.py postgres --reps 3        # the run of record
    python scripts/bench.py postgres --quick         # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_raw
from bench_common import cpu_model, filesystem, git_state, percentile, rate_line

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, payloads
from catalytic_cassette import cassette as cassette_module

ROOT = Path(__file__).resolve().parents[1]

RUN = "bench"
SOURCE = "USER"
WORKER = "worker-1"
TTL_SECONDS = 600
LONG_TTL_SECONDS = 86_400  # leases of the latency ledger stay valid until it is verified
PAYLOAD: dict[str, Any] = {
    "task": "fetch-page",
    "url": "https://example.org/articles/2024/05/sqlite-write-ahead-logging",
    "headers": {"accept": "text/html", "user-agent": "bench/1.0"},
    "retries": 3,
    "timeout_s": 30,
    "note": "summarise the page in three sentences and keep every link",
}
RECEIPT: dict[str, Any] = {"ok": True, "result": "summary stored", "tokens": 412}
SYNC = bench_raw.SYNC
# The tables each raw baseline writes; the setup prints their indexes.
RAW_TABLES = (
    "cassette_messages",
    "cassette_jobs",
    "cassette_steps",
    "cassette_receipts",
    "cassette_actions",
)

Samples = dict[str, list[float]]


# ----------------------------------------------------------------------- reporting


class Report:
    """What was printed, as JSON, plus the target table."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"setup": {}, "workloads": {}, "targets": []}

    def put(self, workload: str, durability: str, key: str, value: Any) -> None:
        slot = self.data["workloads"].setdefault(workload, {}).setdefault(durability, {})
        slot[key] = value

    def target(self, name: str, value: float, op: str, limit: float, fmt: str = ".2f") -> str:
        met = value >= limit if op == ">=" else value <= limit
        self.data["targets"].append(
            {"target": name, "value": value, "op": op, "limit": limit, "met": met, "fmt": fmt}
        )
        return f"(target {op} {limit:{fmt}}: {'met' if met else 'MISSED'})"

    def check(self, name: str, ok: bool, detail: str) -> str:
        self.data["targets"].append({"target": name, "value": detail, "met": ok})
        return "met" if ok else "MISSED"


def out(text: str = "") -> None:
    print(text, flush=True)


def ms_line(samples: list[float]) -> str:
    return (
        f"{statistics.median(samples) * 1e3:,.1f} ms "
        f"(range {min(samples) * 1e3:,.1f}-{max(samples) * 1e3:,.1f})"
    )


def ratio(samples: Samples, a: str, b: str) -> float:
    return statistics.median(samples[a]) / statistics.median(samples[b])


def interleave(contenders: dict[str, Callable[[], float]], reps: int) -> Samples:
    """Run every contender once per repetition, in turn (A B A B ...)."""
    results: Samples = {name: [] for name in contenders}
    for _ in range(reps):
        for name, run in contenders.items():
            results[name].append(run())
    return results


# ------------------------------------------------------------------ raw sqlite3


RAW_POST = (
    (
        "INSERT INTO cassette_messages (run_id, source, idempotency_key, payload_json, created_at)"
        " VALUES (?, ?, NULL, ?, ?) RETURNING message_id"
    ),
    (
        "INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal, created_at)"
        " VALUES (?, ?, 'default', 0, ?) RETURNING job_id"
    ),
    (
        "INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal, status,"
        " fencing_token, payload_json, created_at) VALUES (?, ?, ?, 0, 0, 'PENDING', 0, ?, ?)"
    ),
)
RAW_CLAIM = """
UPDATE cassette_steps
   SET status = 'LEASED', lease_owner = ?, lease_expires_at = ?,
       fencing_token = fencing_token + 1
 WHERE step_id = (SELECT step_id FROM cassette_steps
                   WHERE run_id = ? AND status = 'PENDING'
                   ORDER BY message_id, job_ordinal, ordinal LIMIT 1)
RETURNING step_id, job_id, fencing_token, payload_json
"""
RAW_RECEIPT = (
    "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token, outcome,"
    " receipt_json, created_at) VALUES (?, ?, ?, ?, ?, 'SUCCESS', ?, ?)"
)
RAW_COMMIT_STEP = "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def raw_connect(path: Path, durability: str) -> sqlite3.Connection:
    return bench_raw.connect_raw(path, durability)


def raw_create(path: Path) -> None:
    """The package's own tables and indexes, without triggers (scripts/bench_raw.py)."""
    bench_raw.create(path)


def raw_post(conn: sqlite3.Connection, payload_json: str, created: int) -> None:
    message_id = conn.execute(RAW_POST[0], (RUN, SOURCE, payload_json, created)).fetchone()[0]
    job_id = conn.execute(RAW_POST[1], (message_id, RUN, created)).fetchone()[0]
    conn.execute(RAW_POST[2], (job_id, RUN, message_id, payload_json, created))


def raw_claim(conn: sqlite3.Connection, worker: str) -> tuple[int, int, int, Any] | None:
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute(RAW_CLAIM, (worker, now_ms() + TTL_SECONDS * 1000, RUN)).fetchone()
    conn.execute("COMMIT")
    if row is None:
        return None
    return row[0], row[1], row[2], json.loads(row[3])


def raw_complete(conn: sqlite3.Connection, step: int, job: int, worker: str, token: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(RAW_RECEIPT, (step, job, RUN, worker, token, canonical(RECEIPT), now_ms()))
    conn.execute(RAW_COMMIT_STEP, (step,))
    conn.execute("COMMIT")


# ----------------------------------------------------------------------- ledgers


class Templates:
    """Files built once and copied for every repetition, so each starts from the same state."""

    def __init__(self, scratch: Path, batch: int) -> None:
        self.dir = scratch / "templates"
        self.dir.mkdir()
        self.batch = batch
        self.cache: dict[tuple[str, int], Path] = {}

    def ours(self, pending: int) -> Path:
        key = ("ours", pending)
        if key not in self.cache:
            path = self.dir / f"ours-{pending}.db"
            with MessageCassette(path, durability="normal") as cassette:
                post_batches(cassette, pending, self.batch)
            checkpoint(path)
            self.cache[key] = path
        return self.cache[key]

    def raw(self, pending: int) -> Path:
        key = ("raw", pending)
        if key not in self.cache:
            path = self.dir / f"raw-{pending}.db"
            raw_create(path)
            conn = raw_connect(path, "normal")
            payload_json = canonical(PAYLOAD)
            for first in range(0, pending, self.batch):
                conn.execute("BEGIN IMMEDIATE")
                for _ in range(min(self.batch, pending - first)):
                    raw_post(conn, payload_json, now_ms())
                conn.execute("COMMIT")
            conn.close()
            checkpoint(path)
            self.cache[key] = path
        return self.cache[key]


def fresh_copy(template: Path, target: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(template, target)
    return target


def post_batches(cassette: MessageCassette, count: int, batch: int, run: str = RUN) -> None:
    for first in range(0, count, batch):
        cassette.post_messages([(PAYLOAD, run, SOURCE, None)] * min(batch, count - first))


def checkpoint(path: Path) -> None:
    """After every writer closed: fold the WAL into the file and truncate it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    if busy:
        raise RuntimeError(f"checkpoint of {path} was blocked")


def file_bytes(path: Path) -> int:
    return sum(
        Path(f"{path}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{path}{suffix}").exists()
    )


# ------------------------------------------------------------- 1. post_message


def workload_post(
    report: Report, scratch: Path, templates: Templates, durability: str, args: argparse.Namespace
) -> None:
    count = args.posts
    trial = [0]

    def ours() -> float:
        trial[0] += 1
        path = fresh_copy(templates.ours(0), scratch / f"post-ours-{trial[0]}.db")
        with MessageCassette(path, durability=durability) as cassette:
            start = time.perf_counter()
            for _ in range(count):
                cassette.post_message(PAYLOAD, RUN, SOURCE)
            return float(count / (time.perf_counter() - start))

    def raw(floor: bool = False) -> float:
        path = fresh_copy(templates.raw(0), scratch / f"post-raw-{trial[0]}-{floor}.db")
        conn = raw_connect(path, durability)
        if floor:
            bench_raw.add_floor_journal(conn, bench_raw.POST_WRITES)
        try:
            start = time.perf_counter()
            for _ in range(count):
                conn.execute("BEGIN IMMEDIATE")
                raw_post(conn, canonical(PAYLOAD), now_ms())  # serialised per post, as ours
                conn.execute("COMMIT")
            return float(count / (time.perf_counter() - start))
        finally:
            conn.close()

    results = interleave({"ours": ours, "raw": raw, "floor": lambda: raw(floor=True)}, args.reps)
    tag = f"[{durability}]"
    for name, samples in results.items():
        out(f"{tag:8s} post_message one per transaction, {name:5s}: {rate_line(samples)}")
    value = ratio(results, "ours", "raw")
    verdict = report.target(f"1. post_message ours/raw [{durability}]", value, ">=", 0.6)
    out(f"{tag:8s}   ratio ours/raw = {value:.2f} {verdict}")
    floor = ratio(results, "floor", "raw")
    out(f"{tag:8s}   ratio floor/raw = {floor:.2f} (the most any journaling design reaches)")
    report.put("1_post", durability, "ratio_floor_raw", floor)
    report.put("1_post", durability, "samples_per_s", results)
    report.put("1_post", durability, "ratio_ours_raw", value)


# -------------------------------------------------------- 2. claim + complete


def huey_module() -> ModuleType | None:
    try:
        return importlib.import_module("huey")
    except ImportError:
        return None


def make_huey(path: Path, durability: str) -> tuple[Any, Any]:
    """A SqliteHuey whose connections use this durability; returns (huey, task)."""
    from huey import SqliteHuey  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from huey.storage import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        SqliteStorage,
    )

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._create_connection()
            conn.execute(f"PRAGMA synchronous = {SYNC[durability]}")
            return conn

    queue = SqliteHuey("bench", filename=str(path), storage_class=Storage, journal_mode="wal")

    def work(payload: dict[str, Any]) -> dict[str, Any]:
        return RECEIPT

    task = queue.task(name="work")(work)
    level = queue.storage.conn.execute("PRAGMA synchronous").fetchone()[0]
    mode = queue.storage.conn.execute("PRAGMA journal_mode").fetchone()[0]
    expected = {"full": 2, "normal": 1}[durability]
    if level != expected or mode != "wal":
        raise RuntimeError(f"huey connection has synchronous={level}, journal_mode={mode}")
    return queue, task


CYCLE_EXPLAINED = """\
  per cycle, each side does:
    ours : claim_step = 1 transaction (BEGIN IMMEDIATE): SELECT the next step through the
           partial index cassette_steps_claimable, UPDATE it by id: the step guards, 1
           hash-chained journal row (JSON body built in SQL, SHA-256 in Python); then
           complete_step = 1 transaction: INSERT the receipt (guards, 1 journal row), whose
           trigger UPDATEs the step to COMMITTED (guards, 1 journal row). 2 commits, 3
           journal rows, every row kept.
    ours fused: the worker loop: one claim_step, then complete_and_claim until no step is
           left: 1 transaction per cycle holding the same statements (the receipt INSERT
           with its step UPDATE, then the next step's SELECT and UPDATE) and the same 3
           journal rows. 1 commit per cycle.
    raw  : the same two transactions on the same tables and indexes without triggers or
           journal: UPDATE ... WHERE step_id = (SELECT ... LIMIT 1) RETURNING; then INSERT
           receipt + UPDATE step. 2 commits. The physical limit of SQLite here.
    raw fused: the same three statements as raw in one transaction per cycle (receipt
           INSERT, step UPDATE, then the next claim's UPDATE ... RETURNING). 1 commit.
    huey : what its worker loop does per task: dequeue = BEGIN EXCLUSIVE, SELECT + DELETE of
           the task row, COMMIT; execute = unpickle, run the no-op task, pop the revoke flag
           (a BEGIN EXCLUSIVE transaction that writes nothing), INSERT OR REPLACE the pickled
           result, COMMIT. 2 writing commits; no lease, no token, the task row is deleted.
  each line gives cycles/s of wall time and the CPU time of this process per cycle."""


def separate_loop(cassette: MessageCassette, worker: str) -> list[int]:
    """claim_step and complete_step until the run has no pending step; the steps done."""
    done: list[int] = []
    while True:
        try:
            step = cassette.claim_step(RUN, worker, TTL_SECONDS)
        except CassetteError as error:
            if error.code is ErrorCode.NO_PENDING_STEPS:
                return done
            raise
        cassette.complete_step(
            RUN, step["step_id"], worker, step["fencing_token"], RECEIPT, "SUCCESS"
        )
        done.append(step["step_id"])


def fused_loop(cassette: MessageCassette, worker: str) -> list[int]:
    """The worker loop: one claim, then complete_and_claim until no step is left."""
    done: list[int] = []
    leased = cassette.claim_steps(RUN, worker, 1, TTL_SECONDS)
    step = leased[0] if leased else None
    while step is not None:
        step_id = step["step_id"]
        step = cassette.complete_and_claim(
            RUN, step_id, worker, step["fencing_token"], RECEIPT, "SUCCESS", TTL_SECONDS
        )["next"]
        done.append(step_id)
    return done


def fused_yield_loop(cassette: MessageCassette, worker: str) -> list[int]:
    """The fused loop, yielding the CPU (``os.sched_yield``) after each commit: a lever of
    the fifth pass, kept here to be measured (``--loops fused-yield``)."""
    done: list[int] = []
    leased = cassette.claim_steps(RUN, worker, 1, TTL_SECONDS)
    step = leased[0] if leased else None
    while step is not None:
        step_id = step["step_id"]
        step = cassette.complete_and_claim(
            RUN, step_id, worker, step["fencing_token"], RECEIPT, "SUCCESS", TTL_SECONDS
        )["next"]
        done.append(step_id)
        os.sched_yield()
    return done


PREFETCH = 4


def prefetch_loop(cassette: MessageCassette, worker: str) -> list[int]:
    """A worker that leases PREFETCH steps per transaction (``claim_steps``), each with its
    own lease and token, and completes them one by one (``complete_step``)."""
    done: list[int] = []
    while leased := cassette.claim_steps(RUN, worker, PREFETCH, TTL_SECONDS):
        for step in leased:
            cassette.complete_step(
                RUN, step["step_id"], worker, step["fencing_token"], RECEIPT, "SUCCESS"
            )
            done.append(step["step_id"])
    return done


LOOPS: dict[str, Callable[[MessageCassette, str], list[int]]] = {
    "fused": fused_loop,
    "separate": separate_loop,
    "fused-yield": fused_yield_loop,
    "prefetch": prefetch_loop,
}


def raw_separate_loop(conn: sqlite3.Connection, worker: str) -> int:
    """The raw side of the separate calls: claim, then complete, two transactions."""
    done = 0
    while (claimed := raw_claim(conn, worker)) is not None:
        raw_complete(conn, claimed[0], claimed[1], worker, claimed[2])
        done += 1
    return done


def raw_fused_loop(conn: sqlite3.Connection, worker: str) -> int:
    """The raw side of the fused loop: the receipt, the step's commit and the next claim
    in one transaction. Returns the number of cycles."""
    claimed = raw_claim(conn, worker)
    done = 0
    while claimed is not None:
        step, job, token = claimed[0], claimed[1], claimed[2]
        conn.execute("BEGIN IMMEDIATE")
        now = now_ms()
        conn.execute(RAW_RECEIPT, (step, job, RUN, worker, token, canonical(RECEIPT), now))
        conn.execute(RAW_COMMIT_STEP, (step,))
        row = conn.execute(RAW_CLAIM, (worker, now + TTL_SECONDS * 1000, RUN)).fetchone()
        conn.execute("COMMIT")
        claimed = None if row is None else (row[0], row[1], row[2], json.loads(row[3]))
        done += 1
    return done


class Stopwatch:
    """Wall and CPU time (of this process) of the code inside ``with``."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Stopwatch:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def workload_cycle(
    report: Report, scratch: Path, templates: Templates, durability: str, args: argparse.Namespace
) -> None:
    count = args.cycles
    trial = [0]
    cpu: dict[str, list[float]] = {}

    def contender(name: str, run: Callable[[Stopwatch], int]) -> Callable[[], float]:
        """cycles/s of wall time; the CPU time per cycle goes to ``cpu[name]``. ``run``
        times only the cycles (not the copy of the file or the enqueueing)."""

        def measured() -> float:
            watch = Stopwatch()
            done = run(watch)
            assert done == count, (name, done)
            cpu.setdefault(name, []).append(watch.cpu / done * 1e6)
            return done / watch.wall

        return measured

    def ours(loop: Callable[[MessageCassette, str], list[int]]) -> Callable[[Stopwatch], int]:
        def run(watch: Stopwatch) -> int:
            trial[0] += 1
            path = fresh_copy(templates.ours(count), scratch / f"cycle-ours-{trial[0]}.db")
            with MessageCassette(path, durability=durability) as cassette, watch:
                return len(loop(cassette, WORKER))

        return run

    def raw(
        loop: Callable[[sqlite3.Connection, str], int], floor: bool = False
    ) -> Callable[[Stopwatch], int]:
        def run(watch: Stopwatch) -> int:
            trial[0] += 1
            path = fresh_copy(templates.raw(count), scratch / f"cycle-raw-{trial[0]}.db")
            conn = raw_connect(path, durability)
            if floor:
                bench_raw.add_floor_journal(conn, bench_raw.CYCLE_WRITES)
            try:
                with watch:
                    return loop(conn, WORKER)
            finally:
                conn.close()

        return run

    def huey(watch: Stopwatch) -> int:
        trial[0] += 1
        queue, task = make_huey(scratch / f"cycle-huey-{durability}-{trial[0]}.db", durability)
        for _ in range(count):
            task(PAYLOAD)
        with watch:
            for _ in range(count):
                item = queue.dequeue()
                assert item is not None
                queue.execute(item)
        stored = queue.storage.conn.execute("SELECT count(*) FROM kv").fetchone()[0]
        assert stored == count, stored
        queue.storage.close()
        return count

    contenders = {
        "ours": contender("ours", ours(separate_loop)),
        "ours fused": contender("ours fused", ours(fused_loop)),
        "raw": contender("raw", raw(raw_separate_loop)),
        "raw fused": contender("raw fused", raw(raw_fused_loop)),
        "floor fused": contender("floor fused", raw(raw_fused_loop, floor=True)),
    }
    if args.huey:
        contenders["huey"] = contender("huey", huey)
    results = interleave(contenders, args.reps)
    tag = f"[{durability}]"
    for name, samples in results.items():
        out(
            f"{tag:8s} claim+complete cycles, 1 worker, {name:10s}: {rate_line(samples)},"
            f" cpu {statistics.median(cpu[name]):,.0f} us/cycle"
        )
    report.put("2_cycle", durability, "samples_per_s", results)
    report.put("2_cycle", durability, "cpu_us_per_cycle", cpu)
    for mine, theirs, label in (
        ("ours", "raw", "claim+complete ours/raw"),
        ("ours fused", "raw fused", "fused worker loop ours/raw fused"),
    ):
        value = ratio(results, mine, theirs)
        verdict = report.target(f"2. {label} [{durability}]", value, ">=", 0.5)
        out(f"{tag:8s}   ratio {mine}/{theirs} = {value:.2f} {verdict}")
        report.put("2_cycle", durability, f"ratio_{mine}_{theirs}".replace(" ", "_"), value)
    value = ratio(results, "ours fused", "ours")
    out(f"{tag:8s}   ratio ours fused/ours (separate calls) = {value:.2f}")
    report.put("2_cycle", durability, "ratio_fused_separate", value)
    value = ratio(results, "ours fused", "floor fused")
    out(f"{tag:8s}   ratio ours fused/floor fused (the cheapest per-row journal) = {value:.2f}")
    report.put("2_cycle", durability, "ratio_fused_floor", value)
    if "huey" in results:
        value = ratio(results, "floor fused", "huey")
        out(f"{tag:8s}   ratio floor fused/huey = {value:.2f} (the most a per-row journal reaches)")
        report.put("2_cycle", durability, "ratio_floor_fused_huey", value)
        for mine, label in (("ours", "claim+complete"), ("ours fused", "fused worker loop")):
            value = ratio(results, mine, "huey")
            verdict = report.target(f"2. {label} ours/huey [{durability}]", value, ">=", 1.0)
            cpu_ratio = statistics.median(cpu["huey"]) / statistics.median(cpu[mine])
            out(
                f"{tag:8s}   ratio {mine}/huey = {value:.2f} {verdict};"
                f" CPU per cycle huey/{mine} = {cpu_ratio:.2f}"
            )
            report.put("2_cycle", durability, f"ratio_{mine}_huey".replace(" ", "_"), value)
    else:
        out(f"{tag:8s}   huey: {args.huey_status}")


# ---------------------------------------------------- 3. several worker processes


def cycle_worker(db: str, durability: str, worker: str, loop: str, go: Any, results: Any) -> None:
    """A worker process: run ``LOOPS[loop]`` until the run has no pending step."""
    try:
        with MessageCassette(db, durability=durability) as cassette:
            results.put(("ready", worker, None, 0.0))
            go.wait(timeout=120)
            done = LOOPS[loop](cassette, worker)
            results.put(("done", worker, done, time.monotonic()))
    except BaseException:
        results.put(("error", worker, traceback.format_exc(), 0.0))


def run_workers(
    path: Path, durability: str, workers: int, loop: str
) -> tuple[float, list[int], float]:
    """Start the processes, release them together; return (steps/s, steps per worker, the
    seconds from the first worker's end to the last's: how long the last took to notice
    that no step was left, asleep in the busy handler or finishing its last step)."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    results = context.Queue()
    names = [f"worker-{n + 1}" for n in range(workers)]
    processes = [
        context.Process(target=cycle_worker, args=(str(path), durability, name, loop, go, results))
        for name in names
    ]
    for process in processes:
        process.start()
    try:
        for _ in names:
            kind, worker, detail, _ = results.get(timeout=120)
            if kind != "ready":
                raise RuntimeError(f"{worker} failed to start:\n{detail}")
        started = time.monotonic()
        go.set()
        finished: dict[str, tuple[list[int], float]] = {}
        for _ in names:
            kind, worker, detail, ended = results.get(timeout=1800)
            if kind != "done":
                raise RuntimeError(f"{worker} failed:\n{detail}")
            finished[worker] = (detail, ended)
    finally:
        for process in processes:
            process.join(timeout=60)
    claimed = [step for done, _ in finished.values() for step in done]
    if len(claimed) != len(set(claimed)):
        raise AssertionError("a step was claimed and completed by two workers")
    ends = [ended for _, ended in finished.values()]
    elapsed = max(ends) - started
    return len(claimed) / elapsed, [len(finished[name][0]) for name in names], max(ends) - min(ends)


def check_exactly_once(path: Path, expected: int) -> str:
    """One receipt per step, every step COMMITTED, every token 1 (claimed exactly once)."""
    conn = sqlite3.connect(path)
    try:
        steps, committed, max_token = conn.execute(
            "SELECT count(*), sum(status = 'COMMITTED'), max(fencing_token) FROM cassette_steps"
        ).fetchone()
        receipts, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT step_id) FROM cassette_receipts"
        ).fetchone()
    finally:
        conn.close()
    if not (steps == committed == receipts == distinct == expected and max_token == 1):
        raise AssertionError(
            f"steps {steps}, committed {committed}, receipts {receipts} for {distinct} steps,"
            f" max fencing token {max_token}; expected {expected} of each and token 1"
        )
    return f"{steps} steps, {receipts} receipts (one per step), all COMMITTED, every token 1"


def workload_workers(
    report: Report, scratch: Path, templates: Templates, durability: str, args: argparse.Namespace
) -> None:
    """Each loop (by default the fused worker loop and the separate calls) with 1, 2 and 4
    processes, interleaved; every trial is checked: no step claimed twice, one receipt per
    step."""
    count = args.mp_steps
    counts = args.mp_counts
    results: dict[str, Samples] = {v: {str(n): [] for n in counts} for v in args.loops}
    balance: dict[str, dict[str, list[int]]] = {v: {} for v in args.loops}
    tails: dict[str, dict[str, list[float]]] = {v: {str(n): [] for n in counts} for v in args.loops}
    checked = ""
    for rep in range(args.reps):
        for workers in counts:
            for n, loop in enumerate(args.loops):
                path = fresh_copy(templates.ours(count), scratch / f"mp-{n}-{workers}-{rep}.db")
                rate, per_worker, tail = run_workers(path, durability, workers, loop)
                tails[loop][str(workers)].append(tail * 1000)
                checked = check_exactly_once(path, count)
                results[loop][str(workers)].append(rate)
                balance[loop][str(workers)] = per_worker
    tag = f"[{durability}]"
    most = str(max(counts))
    for loop in args.loops:
        base = statistics.median(results[loop][str(counts[0])])
        for workers in counts:
            samples = results[loop][str(workers)]
            split = "/".join(str(n) for n in balance[loop][str(workers)])
            out(
                f"{tag:8s} claim+complete, {loop} loop, {workers} worker process(es):"
                f" {rate_line(samples)}  x{statistics.median(samples) / base:.2f} of"
                f" {counts[0]} worker; last split {split}; last worker's end after the first's"
                f" {statistics.median(tails[loop][str(workers)]):.1f} ms (median)"
            )
        if counts[0] != 1 or most == "1":
            continue
        value = statistics.median(results[loop][most]) / base
        verdict = report.target(
            f"3. {most} worker processes / 1 worker, {loop} loop [{durability}]",
            value,
            ">=",
            1.0,
        )
        out(f"{tag:8s}   {loop} loop: {most} processes / 1 = {value:.2f} {verdict}")
    if "fused" in results and "separate" in results and "1" in results["fused"]:
        value = statistics.median(results["fused"]["1"]) / statistics.median(
            results["separate"]["1"]
        )
        out(f"{tag:8s}   1 process, fused loop / separate calls = {value:.2f}")
    out(f"{tag:8s}   no step claimed twice, in every trial: {checked}")
    report.check(f"3. no step claimed twice [{durability}]", True, checked)
    report.put("3_workers", durability, "samples_per_s", results)
    report.put("3_workers", durability, "last_split", balance)
    report.put("3_workers", durability, "tail_ms", tails)


# ------------------------------------------------------------- 4. claim latency


def claim_plan(conn: sqlite3.Connection) -> list[str]:
    statement = getattr(cassette_module, "_NEXT_PENDING", None)
    if statement is None:  # an older package: its UPDATE ... RETURNING
        rows = conn.execute(f"EXPLAIN QUERY PLAN {RAW_CLAIM}", ("w", 1, RUN)).fetchall()
    elif "?" in statement:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {statement}", (RUN,)).fetchall()
    else:  # named parameters (before issue 12's third pass)
        params = {"worker": "w", "expires": 1, "run": RUN}
        rows = conn.execute(f"EXPLAIN QUERY PLAN {statement}", params).fetchall()
    return [str(row[-1]) for row in rows]


class LatencyLedger:
    """One ledger grown in stages; claims alternate between a FULL and a NORMAL connection."""

    def __init__(self, path: Path, durabilities: list[str], args: argparse.Namespace) -> None:
        self.path = path
        self.args = args
        self.builder = MessageCassette(path, durability="normal")
        self.claimers = {d: MessageCassette(path, durability=d) for d in durabilities}
        self.posted = 0
        self.claimed = 0
        self.build_seconds = 0.0

    def close(self) -> None:
        for cassette in self.claimers.values():
            cassette.close()
        self.builder.close()
        checkpoint(self.path)

    def grow(self, pending: int) -> None:
        need = pending - (self.posted - self.claimed)
        if need <= 0:
            return
        self._post(need)

    def _post(self, need: int) -> None:
        batch = self.args.batch
        start = last_print = chunk_start = time.perf_counter()
        chunk_done = done = 0
        while done < need:
            size = min(batch, need - done)
            self.builder.post_messages([(PAYLOAD, RUN, SOURCE, None)] * size)
            done += size
            chunk_done += size
            now = time.perf_counter()
            if now - last_print >= 15 or done == need:
                out(
                    f"  build: {self.posted + done:,} messages posted"
                    f" ({done:,}/{need:,} of this stage), {chunk_done / (now - chunk_start):,.0f}"
                    f" messages/s lately, {now - start:,.0f} s in this stage,"
                    f" about {(need - done) * (now - start) / done:,.0f} s to go"
                )
                last_print = chunk_start = now
                chunk_done = 0
        self.posted += need
        self.build_seconds += time.perf_counter() - start

    def post_latency(self, count: int) -> dict[str, list[float]]:
        """post_message one per transaction, now, at this ledger size."""
        samples: dict[str, list[float]] = {d: [] for d in self.claimers}
        for _ in range(count):
            for durability, cassette in self.claimers.items():
                start = time.perf_counter()
                cassette.post_message(PAYLOAD, RUN, SOURCE)
                samples[durability].append(time.perf_counter() - start)
                self.posted += 1
        return samples

    def claim_latency(self, count: int) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {d: [] for d in self.claimers}
        order = list(self.claimers.items())
        for index in range(count):
            for durability, cassette in order if index % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                cassette.claim_step(RUN, f"lat-{durability}", LONG_TTL_SECONDS)
                samples[durability].append(time.perf_counter() - start)
                self.claimed += 1
        return samples


def workload_latency(
    report: Report, scratch: Path, durabilities: list[str], args: argparse.Namespace
) -> Path:
    sizes = [size for size in (1_000, 100_000, 1_000_000) if size <= args.max_pending]
    if args.max_pending not in sizes:
        sizes.append(args.max_pending)
    claims = args.claims
    path = scratch / "latency-ledger.db"
    ledger = LatencyLedger(path, durabilities, args)
    out(
        f"  {claims:,} claim_step calls per durability at each size, alternating the"
        f" connections; build: post_messages batches of {args.batch:,}, one transaction each"
    )
    try:
        plan = claim_plan(ledger.builder.conn)
        search = [line for line in plan if "cassette_steps_claimable" in line]
        ok = bool(search) and all(line.startswith("SEARCH") for line in search)
        ok = ok and not any(line.startswith("SCAN cassette_steps") for line in plan)
        out("  EXPLAIN QUERY PLAN of the claim's read (MessageCassette._NEXT_PENDING):")
        for line in plan:
            out(f"    {line}")
        verdict = report.check(
            "4. claim is a SEARCH on cassette_steps_claimable", ok, "; ".join(plan)
        )
        out(f"  claim plan uses SEARCH ... cassette_steps_claimable, no SCAN: {verdict}")
        report.put("4_latency", "any", "claim_plan", plan)
        for size in sizes:
            post_count = args.post_probes
            ledger.grow(size + claims * len(durabilities))
            posts = ledger.post_latency(post_count)
            before = ledger.posted - ledger.claimed
            samples = ledger.claim_latency(claims)
            after = ledger.posted - ledger.claimed
            out(f"  pending {before:,} -> {after:,} (size {size:,}):")
            for durability in durabilities:
                values = samples[durability]
                p50, p99 = percentile(values, 50), percentile(values, 99)
                tag = f"[{durability}]"
                out(
                    f"{tag:8s} claim_step latency at {size:,} pending: p50 {p50 * 1e3:.2f} ms,"
                    f" p99 {p99 * 1e3:.2f} ms, max {max(values) * 1e3:.2f} ms"
                    f"; post_message at this size: median"
                    f" {statistics.median(posts[durability]) * 1e3:.1f} ms"
                    f" ({post_count} calls)"
                )
                report.put(
                    "4_latency",
                    durability,
                    str(size),
                    {
                        "pending_before": before,
                        "p50_s": p50,
                        "p99_s": p99,
                        "max_s": max(values),
                        "post_message_s": posts[durability],
                    },
                )
        out(
            f"  build total: {ledger.posted:,} messages in {ledger.build_seconds:,.1f} s"
            f" ({ledger.posted / max(ledger.build_seconds, 1e-9):,.0f} messages/s)"
        )
        report.put("4_latency", "any", "build_seconds", ledger.build_seconds)
    finally:
        ledger.close()
    return path


# ----------------------------------------------------------- 5. append_action


def bench_chain() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_chain as module

    return module


def workload_append(
    report: Report, scratch: Path, durability: str, args: argparse.Namespace
) -> None:
    chain = bench_chain()
    folder = scratch / f"append-{durability}"
    folder.mkdir()
    single = chain.Single(folder, durability)
    batched = chain.Batched(folder, durability, args.batch)
    tag = f"[{durability}]"
    results = interleave(
        {
            "ours": lambda: single.run_ours(args.appends),
            "raw": lambda: single.run_raw(args.appends),
            "floor": lambda: single.run_floor(args.appends),
        },
        args.reps,
    )
    for name, samples in results.items():
        out(f"{tag:8s} append_action one per transaction, {name:5s}: {rate_line(samples)}")
    value = ratio(results, "ours", "raw")
    verdict = report.target(f"5. append_action ours/raw [{durability}]", value, ">=", 0.5)
    out(f"{tag:8s}   ratio ours/raw = {value:.2f} {verdict}")
    out(f"{tag:8s}   ratio floor/raw = {ratio(results, 'floor', 'raw'):.2f}")
    report.put("5_append", durability, "single_samples_per_s", results)
    results = interleave(
        {
            "ours": lambda: batched.run_ours(args.appends_batched),
            "raw": lambda: batched.run_raw(args.appends_batched),
            "floor": lambda: batched.run_floor(args.appends_batched),
        },
        args.reps,
    )
    for name, samples in results.items():
        out(f"{tag:8s} append_actions batches of {args.batch:,}, {name:5s}: {rate_line(samples)}")
    value = ratio(results, "ours", "raw")
    verdict = report.target(f"5. append_actions batched ours/raw [{durability}]", value, ">=", 0.3)
    out(f"{tag:8s}   ratio ours/raw = {value:.2f} {verdict}")
    out(
        f"{tag:8s}   ratio floor/raw = {ratio(results, 'floor', 'raw'):.2f},"
        f" floor {statistics.median(results['floor']):,.0f} actions/s"
    )
    if durability == "normal":  # issue 12: 25,000 actions/s in batches of 1,000
        rate = statistics.median(results["ours"])
        verdict = report.target(
            "5. append_actions batched, actions/s [normal]", rate, ">=", 25_000, ",.0f"
        )
        out(f"{tag:8s}   ours {rate:,.0f} actions/s {verdict}")
    report.put("5_append", durability, "batched_samples_per_s", results)
    for conn in (single.ours, single.raw, single.floor, batched.ours, batched.raw, batched.floor):
        conn.close()


# ------------------------------------------------------------------- 6. verify

CHILD_VERIFY = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from catalytic_cassette.verify import verify_path
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
report = verify_path({path!r})
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rows": report.journal_rows, "seconds": elapsed, "ok": report.ok,
                  "findings": [f.kind + ": " + f.detail for f in report.errors][:3],
                  "rss_before_kib": before, "rss_peak_kib": peak}}))
"""


def workload_verify(report: Report, ledger: Path) -> None:
    code = CHILD_VERIFY.format(root=str(ROOT), path=str(ledger))
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    result = json.loads(done.strip().splitlines()[-1])
    rate = result["rows"] / result["seconds"]
    verdict = report.target("6. verify journal rows/s", rate, ">=", 300_000, ",.0f")
    out(
        f"verify {result['rows']:,} journal rows ({file_bytes(ledger) / 2**20:,.0f} MiB file):"
        f" {result['seconds']:.2f} s = {rate:,.0f} rows/s {verdict}"
    )
    out(
        f"  peak RSS of the verifying process {result['rss_peak_kib'] / 1024:.1f} MiB"
        f" (interpreter and imports {result['rss_before_kib'] / 1024:.1f} MiB);"
        f" report ok: {result['ok']}"
        + ("" if result["ok"] else f"; first findings: {result['findings']}")
    )
    report.put("6_verify", "any", "result", {**result, "rows_per_s": rate})


# ---------------------------------------------------------------------- 7. CLI


def workload_cli(
    report: Report, scratch: Path, templates: Templates, durability: str, args: argparse.Namespace
) -> None:
    runs = args.cli_runs
    path = fresh_copy(templates.ours(3 * runs), scratch / f"cli-{durability}.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    claim = ["--db", str(path), "--durability", durability, "claim", "--run-id", RUN]
    commands = {
        "python -m catalytic_cassette claim": [sys.executable, "-m", "catalytic_cassette", *claim],
        'python -c "import sqlite3"': [sys.executable, "-c", "import sqlite3"],
    }
    script = Path(sys.executable).with_name("cassette")
    if script.exists():
        commands["cassette claim (venv script)"] = [str(script), *claim]

    def timed(command: list[str]) -> Callable[[], float]:
        def run() -> float:
            worker = ["--worker", "cli"] if "claim" in command else []
            start = time.perf_counter()
            done = subprocess.run([*command, *worker], capture_output=True, env=env)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:  # say why: the command's own coded line
                raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr!r}")
            return elapsed

        return run

    results = interleave({name: timed(command) for name, command in commands.items()}, runs)
    tag = f"[{durability}]"
    for name, samples in results.items():
        out(f"{tag:8s} wall time, {name}: {ms_line(samples)}")
    value = ratio(results, "python -m catalytic_cassette claim", 'python -c "import sqlite3"')
    verdict = report.target(f"7. CLI claim / python startup [{durability}]", value, "<=", 3.0)
    out(f"{tag:8s}   ratio cassette claim / import sqlite3 = {value:.2f} {verdict}")
    report.put("7_cli", durability, "samples_s", results)
    report.put("7_cli", durability, "ratio", value)


# --------------------------------------------------------------------- 8. bytes


def workload_bytes(
    report: Report, scratch: Path, templates: Templates, durability: str, args: argparse.Namespace
) -> None:
    count, batch = args.bytes_records, 100
    empty = templates.ours(0).stat().st_size
    path = fresh_copy(templates.ours(0), scratch / f"bytes-ours-{durability}.db")
    with MessageCassette(path, durability=durability) as cassette:
        post_batches(cassette, count, batch)
        while claimed := cassette.claim_steps(RUN, WORKER, batch, TTL_SECONDS):
            cassette.complete_steps(
                [
                    (RUN, s["step_id"], WORKER, s["fencing_token"], RECEIPT, "SUCCESS")
                    for s in claimed
                ]
            )
    checkpoint(path)
    ours = file_bytes(path)
    raw_path = fresh_copy(templates.raw(0), scratch / f"bytes-raw-{durability}.db")
    conn = raw_connect(raw_path, durability)
    payload_json = canonical(PAYLOAD)
    for first in range(0, count, batch):
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(min(batch, count - first)):
            raw_post(conn, payload_json, now_ms())
        conn.execute("COMMIT")
    while (claimed_raw := raw_claim(conn, WORKER)) is not None:
        raw_complete(conn, claimed_raw[0], claimed_raw[1], WORKER, claimed_raw[2])
    conn.close()
    checkpoint(raw_path)
    raw = file_bytes(raw_path)
    tag = f"[{durability}]"
    out(
        f"{tag:8s} bytes per message+job+step+receipt after {count:,} cycles, checkpointed:"
        f" ours {ours / count:,.0f}, raw {raw / count:,.0f} (ours/raw {ours / raw:.2f};"
        f" an empty ledger is {empty:,} bytes)"
    )
    chain = bench_chain()
    actions = [chain.action() for _ in range(batch)]
    from catalytic_cassette.chain import CausalChain

    path = fresh_copy(templates.ours(0), scratch / f"bytes-actions-{durability}.db")
    with CausalChain(path, durability=durability) as ledger:
        for _ in range(count // batch):
            ledger.append_actions(actions)
    checkpoint(path)
    ours_actions = file_bytes(path)
    folder = scratch / f"bytes-raw-actions-{durability}"
    folder.mkdir()
    raw_conn = chain.raw_connection(folder / "raw.db", durability)
    args_json, result_json = canonical(chain.ARGUMENTS), canonical(chain.RESULT)
    for _ in range(count // batch):
        raw_conn.execute("BEGIN IMMEDIATE")
        raw_conn.executemany(
            chain.RAW_INSERT,
            [(str(uuid.uuid4()), args_json, result_json, now_ms()) for _ in range(batch)],
        )
        raw_conn.execute("COMMIT")
    raw_conn.close()
    checkpoint(folder / "raw.db")
    raw_actions = file_bytes(folder / "raw.db")
    appended = count // batch * batch
    out(
        f"{tag:8s} bytes per action after {appended:,} appends, checkpointed:"
        f" ours {ours_actions / appended:,.0f}, raw {raw_actions / appended:,.0f}"
        f" (ours/raw {ours_actions / raw_actions:.2f})"
    )
    report.put(
        "8_bytes",
        durability,
        "bytes",
        {
            "cycle_ours": ours / count,
            "cycle_raw": raw / count,
            "action_ours": ours_actions / appended,
            "action_raw": raw_actions / appended,
            "empty_ledger": empty,
        },
    )


# --------------------------------------------------------------------- setup


def print_setup(report: Report, args: argparse.Namespace, scratch: Path, huey_version: str) -> None:
    payload_bytes = len(payloads.dumps(PAYLOAD).encode())
    receipt_bytes = len(payloads.dumps(RECEIPT).encode())
    setup = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "durability": args.durabilities,
        "journal_mode": "WAL",
        "payload_bytes": payload_bytes,
        "receipt_bytes": receipt_bytes,
        "batch": args.batch,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()}, {cpu_model()}, {platform.system()} {platform.release()}",
        "scratch": f"{scratch} ({filesystem(scratch)})",
        "huey": huey_version,
        "code": git_state(),
        "max_pending": args.max_pending,
    }
    report.data["setup"] = setup
    out(f"command: {setup['command']}")
    out(
        f"python {setup['python']}, sqlite {setup['sqlite']}, {setup['cpus']} CPUs,"
        f" {setup['machine']}"
    )
    modes = " and ".join(f"{d} (synchronous={SYNC[d]})" for d in args.durabilities)
    out(f"durability {modes}, journal mode WAL for every contender")
    out(
        f"message payload {payload_bytes} bytes of canonical JSON (one job, one step carrying"
        f" the same payload); receipt {receipt_bytes} bytes; batch size {args.batch:,};"
        f" {args.reps} interleaved repetition(s), each from a fresh copy of the same file"
    )
    out(f"scratch files in {setup['scratch']}; code at {setup['code']}")
    raw_file = scratch / "raw-schema.db"
    raw_create(raw_file)
    setup["raw"] = bench_raw.describe(raw_file, RAW_TABLES)
    out(
        "raw sqlite3 baseline: the package's migrated schema with every trigger dropped"
        " (scripts/bench_raw.py), the same WAL, synchronous and wal_autocheckpoint:"
    )
    for line in setup["raw"]:
        out(f"  {line}")
    out(
        f"huey: {huey_version}"
        + (", SqliteHuey, synchronous forced per durability" if args.huey else "")
    )
    out(
        f"sizes: {args.posts:,} posts, {args.cycles:,} cycles, {args.mp_steps:,} steps for the"
        f" multi-process runs, {args.claims:,} claims per size, {args.appends:,} single and"
        f" {args.appends_batched:,} batched appends, {args.cli_runs} CLI runs,"
        f" {args.bytes_records:,} records for bytes; max pending {args.max_pending:,}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 rep: seconds")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--durability", choices=["full", "normal", "both"], default="both")
    parser.add_argument("--max-pending", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--posts", type=int, default=1000, help="posts per repetition")
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per repetition")
    parser.add_argument("--mp-steps", type=int, default=1000, help="steps per multi-process run")
    parser.add_argument("--claims", type=int, default=2000, help="claims per size and durability")
    parser.add_argument("--post-probes", type=int, default=5)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--appends-batched", type=int, default=20000)
    parser.add_argument("--cli-runs", type=int, default=20)
    parser.add_argument("--bytes-records", type=int, default=5000)
    parser.add_argument("--no-huey", action="store_true", help="skip the huey baseline")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where scratch files go")
    parser.add_argument(
        "--loops",
        default="fused,separate",
        help=f"worker loops of workload 3, of {', '.join(LOOPS)} (default fused,separate)",
    )
    parser.add_argument(
        "--mp-counts", default="1,2,4", help="workload 3: numbers of worker processes"
    )
    parser.add_argument(
        "--workloads",
        default="1,2,3,4,5,6,7,8",
        help="which workloads to run, by number (default all): --workloads 3 for the workers",
    )
    args = parser.parse_args()
    if args.quick:
        args.reps, args.batch, args.max_pending = 1, 100, min(args.max_pending, 1000)
        args.posts, args.cycles, args.mp_steps, args.claims = 100, 100, 100, 100
        args.post_probes, args.appends, args.appends_batched = 2, 50, 200
        args.cli_runs, args.bytes_records = 2, 200
    args.durabilities = ["full", "normal"] if args.durability == "both" else [args.durability]
    args.loops = args.loops.split(",")
    if not set(args.loops) <= set(LOOPS):
        parser.error(f"--loops takes {', '.join(LOOPS)}: {args.loops!r}")
    try:
        args.mp_counts = tuple(int(part) for part in args.mp_counts.split(","))
    except ValueError:
        parser.error(f"--mp-counts takes numbers separated by commas: {args.mp_counts!r}")
    try:
        args.workloads = {int(part) for part in args.workloads.split(",")}
    except ValueError:
        parser.error(f"--workloads takes numbers 1-8 separated by commas: {args.workloads!r}")
    if not args.workloads or not args.workloads <= set(range(1, 9)):
        parser.error(f"--workloads takes numbers 1-8 separated by commas: {args.workloads!r}")
    return args


def main() -> None:
    if sys.argv[1:2] == ["postgres"]:
        # a server, cloned databases and other peers: its own module, imported only here
        # (it imports this one's helpers)
        import bench_postgres

        sys.exit(bench_postgres.main(sys.argv[2:]))
    args = parse_args()
    report = Report()
    module = None if args.no_huey else huey_module()
    args.huey = module is not None
    if args.no_huey:
        huey_version = "skipped (--no-huey)"
    elif module is None:
        huey_version = "not installed (pip install huey)"
    else:
        huey_version = str(getattr(module, "__version__", "?"))
    args.huey_status = huey_version
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-", dir=args.tmpdir) as tmp:
        scratch = Path(tmp)
        print_setup(report, args, scratch, huey_version)
        templates = Templates(scratch, args.batch)
        sections: list[tuple[str, Callable[[str], None]]] = [
            (
                f"1. post_message, one message+job+step per transaction ({args.posts:,} per rep)",
                lambda d: workload_post(report, scratch, templates, d, args),
            ),
            (
                f"2. claim + complete cycle, 1 worker, separate calls and the fused worker loop"
                f" ({args.cycles:,} per rep)",
                lambda d: workload_cycle(report, scratch, templates, d, args),
            ),
            (
                f"3. claim + complete with 1, 2 and 4 worker processes, fused and separate (spawn;"
                f" {args.mp_steps:,} steps per run, total throughput)",
                lambda d: workload_workers(report, scratch, templates, d, args),
            ),
        ]
        for title, run in sections:
            if int(title[0]) not in args.workloads:
                continue
            out(f"\n== {title}")
            if title.startswith("2."):
                out(CYCLE_EXPLAINED)
            for durability in args.durabilities:
                run(durability)
        ledger = None
        if 4 in args.workloads or 6 in args.workloads:
            out("\n== 4. claim latency by pending steps (p50, p99 of claim_step)")
            ledger = workload_latency(report, scratch, args.durabilities, args)
        if 5 in args.workloads:
            out(
                f"\n== 5. append_action, one per transaction ({args.appends:,} per rep) and"
                f" batches of {args.batch:,} ({args.appends_batched:,} per rep)"
                " (the code of scripts/bench_chain.py)"
            )
            for durability in args.durabilities:
                workload_append(report, scratch, durability, args)
        if ledger is not None and 6 in args.workloads:
            out("\n== 6. verify (the ledger of workload 4, in a child process)")
            workload_verify(report, ledger)
        if 7 in args.workloads:
            out(f"\n== 7. CLI claim as a process, median of {args.cli_runs} interleaved runs")
            for durability in args.durabilities:
                workload_cli(report, scratch, templates, durability, args)
        if 8 in args.workloads:
            out("\n== 8. bytes on disk (file + WAL after a TRUNCATE checkpoint) / records")
            for durability in args.durabilities:
                workload_bytes(report, scratch, templates, durability, args)
    elapsed = time.perf_counter() - started
    out("\n== targets")
    for row in report.data["targets"]:
        status = "met   " if row["met"] else "MISSED"
        if "op" in row:
            value = f"{row['value']:{row['fmt']}} (target {row['op']} {row['limit']:{row['fmt']}})"
        else:
            value = "yes" if row["met"] else f"no: {row['value']}"
        out(f"{status} {row['target']}: {value}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out(f"\nbenchmark process peak RSS {peak / 1024:.0f} MiB; total {elapsed:,.0f} s")
    report.data["elapsed_s"] = elapsed
    if args.json is not None:
        args.json.write_text(json.dumps(report.data, indent=2) + "\n")
        out(f"results written to {args.json}")


if __name__ == "__main__":
    main()
