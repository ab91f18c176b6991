"""Soak test with crashes: producers, workers and a reaper on one cassette, under SIGKILL.

    python scripts/soak.py --duration 120                # two minutes, chaos every ~1.5 s
    python scripts/soak.py --duration 25 --json          # what tests/test_soak.py runs
    python scripts/soak.py --busy-report                 # BUSY counts at 2, 4 and 8 workers

Every child is a separate process (this script with ``--child ROLE``) that opens its own
MessageCassette and writes what it believes happened to its own append-only log of JSON
lines, outside the database:

* producers post plain and multi-job messages (some with idempotency keys, re-posted with
  the same payload and with a different one) and log every acknowledged message id
  (write, flush, fsync after ``post_message(s)`` returned);
* workers claim steps with short TTLs and complete them after random delays, some on
  purpose after the lease expired; they log every claim, every completion they believe
  succeeded (fsynced) and every refusal code;
* the reaper calls ``requeue(run_id)`` (sometimes with ``max_attempts``) every ~0.2 s.

The parent kills a random producer or worker with SIGKILL at random intervals and starts a
new one under a new name. At the end it stops everything, reopens the ledger and checks the
database against the logs and against its own journal (see ``check_ledger``). Any exception
in a child that is not a CassetteError (a raw ``sqlite3.OperationalError``, for one) is a
failure of the soak. Exit status: 0 PASS, 1 FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette

T = TypeVar("T")

SOURCES = ("USER", "PLANNER", "SYSTEM", "WORKER")
MAX_BATCH = 3  # the most messages, claims or completions one call makes (chaos profile)
FAST_POST_BATCH = 20  # the busy report's producer posts this many messages per call
STALE_CODES = ("STALE_FENCING_TOKEN", "LEASE_EXPIRED", "NOT_LEASED", "WRONG_WORKER")
# A stale completion of a step that another worker has since completed is DUPLICATE_RECEIPT.
REFUSED_COMPLETION = frozenset({*STALE_CODES, "DUPLICATE_RECEIPT"})
# The refusal codes each operation may meet in a healthy soak; any other code is a failure.
EXPECTED_CODES: dict[str, frozenset[str]] = {
    "open": frozenset({"BUSY"}),
    "post": frozenset({"BUSY"}),
    "repost": frozenset({"BUSY"}),
    "conflict": frozenset({"BUSY", "IDEMPOTENCY_CONFLICT"}),
    "status": frozenset(),
    "claim": frozenset({"BUSY", "NO_PENDING_STEPS"}),
    "complete": frozenset({"BUSY"}) | REFUSED_COMPLETION,
    "complete_batch": frozenset({"BUSY"}) | REFUSED_COMPLETION,
    "duplicate": frozenset({"BUSY", "DUPLICATE_RECEIPT"}),
    "release": frozenset({"BUSY", "NOT_LEASED", "STALE_FENCING_TOKEN", "WRONG_WORKER"}),
    "requeue": frozenset({"BUSY"}),
}
STOP_GRACE_SECONDS = 10.0  # a child still running this long after the stop counts as hung
STALL_SECONDS = 15.0  # no worker wrote a log line for this long: deadlock suspected


# =============================================================================== children


class StopFlag:
    """True once the parent's stop file exists, or on SIGTERM/SIGINT, the deadline, orphaning.

    The parent stops children with a file, not a signal: a child still importing would die
    of a SIGTERM before its handler is installed.
    """

    def __init__(self, stop_file: str, deadline: float, parent_pid: int) -> None:
        self.stop_file = stop_file
        self.deadline = deadline
        self.parent_pid = parent_pid
        self.requested = False
        self.orphaned = False
        self._next_look = 0.0
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def __call__(self) -> bool:
        if self.requested or time.monotonic() < self._next_look:
            return self.requested
        self._next_look = time.monotonic() + 0.02
        if os.path.exists(self.stop_file):
            self.requested = True
        elif time.time() > self.deadline or os.getppid() != self.parent_pid:
            self.requested = self.orphaned = True
        return self.requested


def nap(stop: StopFlag, seconds: float) -> bool:
    """Sleep in short slices; False as soon as a stop is requested."""
    end = time.monotonic() + seconds
    while not stop():
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, 0.05))
    return False


def now_ms() -> int:
    """The ledger's SystemClock reading, for deciding that a lease has certainly expired."""
    return time.time_ns() // 1_000_000


class JsonLog:
    """One child's append-only log: one JSON object per line, flushed per write."""

    def __init__(self, path: Path) -> None:
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, *records: dict[str, Any], durable: bool = False) -> None:
        self._fh.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        self._fh.flush()
        if durable:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


@dataclass
class ChildContext:
    role: str
    name: str
    run_id: str
    profile: str  # "chaos" (delays, late completions) or "fast" (busy report)
    rng: random.Random
    log: JsonLog
    stop: StopFlag
    cassette: MessageCassette | None = None

    @property
    def cas(self) -> MessageCassette:
        assert self.cassette is not None
        return self.cassette

    def call(
        self,
        op: str,
        fn: Callable[..., T],
        *args: Any,
        ctx: dict[str, Any] | None = None,
        **kw: Any,
    ) -> tuple[T | None, CassetteError | None]:
        """Run one API call; a CassetteError is logged with its code and returned.

        Anything else propagates and ends the child as a failure (see ``child_main``).
        """
        started = time.monotonic()
        try:
            return fn(*args, **kw), None
        except CassetteError as err:
            cause = err.__cause__
            record: dict[str, Any] = {
                "e": "ref",
                "op": op,
                "c": err.code.value,
                "ms": round((time.monotonic() - started) * 1000, 1),
            }
            errname = getattr(cause, "sqlite_errorname", None)
            if errname:
                record["sqlite"] = errname
            if err.code is ErrorCode.BUSY:
                record["waited_ms"] = err.detail.get("waited_ms")
            if "snapshot" in str(err).lower() or "SNAPSHOT" in (errname or ""):
                record["snapshot"] = True
            if "index" in err.detail:
                record["index"] = err.detail["index"]
            if ctx:
                record.update(ctx)
            self.log.write(record)
            return None, err


def make_payload(rng: random.Random, producer: str, n: int) -> tuple[dict[str, Any], list[int]]:
    """A plain payload (one job, one step) or a multi-job one; and its steps per job."""
    if rng.random() < 0.6:
        return {"producer": producer, "n": n, "body": "x" * rng.randint(0, 200)}, [1]
    shape = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
    jobs = [
        {"intent": f"intent-{j}", "steps": [{"job": j, "step": k} for k in range(count)]}
        for j, count in enumerate(shape)
    ]
    return {"producer": producer, "n": n, "jobs": jobs}, shape


def run_producer(c: ChildContext) -> None:
    fast = c.profile == "fast"
    backlog_limit = 3000 if fast else 400
    n = 0
    keyed: list[dict[str, Any]] = []  # posts with a key: what a re-post must give back
    until_check = 0
    while not c.stop():
        if until_check <= 0:
            until_check = 5 if fast else 20
            status, _ = c.call("status", c.cas.status, c.run_id)
            if status is not None and status["steps"]["PENDING"] > backlog_limit:
                nap(c.stop, 0.3)
                continue
        until_check -= 1
        roll = c.rng.random()
        if keyed and roll < 0.08:
            first = c.rng.choice(keyed)
            got, _ = c.call(
                "repost",
                c.cas.post_message,
                first["payload"],
                c.run_id,
                first["source"],
                first["key"],
                ctx={"k": first["key"]},
            )
            if got is not None:
                c.log.write({"e": "repost", "k": first["key"], "m": got[0], "j": got[1]})
                if list(got) != [first["m"], first["j"]]:
                    c.log.write(
                        {
                            "e": "violation",
                            "what": "an idempotent re-post returned other ids",
                            "k": first["key"],
                            "first": [first["m"], first["j"]],
                            "again": list(got),
                        },
                        durable=True,
                    )
        elif keyed and roll < 0.11:
            first = c.rng.choice(keyed)
            other = {**first["payload"], "conflict": c.rng.randint(0, 10**9)}
            got, _ = c.call(
                "conflict",
                c.cas.post_message,
                other,
                c.run_id,
                first["source"],
                first["key"],
                ctx={"k": first["key"]},
            )
            if got is not None:
                c.log.write(
                    {
                        "e": "violation",
                        "what": "a key re-posted with another payload was accepted",
                        "k": first["key"],
                        "m": got[0],
                    },
                    durable=True,
                )
        else:
            if fast:  # keep the workers busy: they, not the producer, set the pace
                count = c.rng.randint(FAST_POST_BATCH // 2, FAST_POST_BATCH)
            else:
                count = 1 if roll < 0.8 else c.rng.randint(2, MAX_BATCH)
            items: list[tuple[dict[str, Any], str, str, str | None]] = []
            meta: list[dict[str, Any]] = []
            for _ in range(count):
                payload, shape = make_payload(c.rng, c.name, n)
                key = f"{c.name}:k{n}" if c.rng.random() < 0.35 else None
                source = c.rng.choice(SOURCES)
                items.append((payload, c.run_id, source, key))
                meta.append(
                    {"n": n, "shape": shape, "k": key, "payload": payload, "source": source}
                )
                n += 1
            ids: list[tuple[int, int]] | None
            if count == 1:
                one, _ = c.call("post", c.cas.post_message, *items[0], ctx={"n": meta[0]["n"]})
                ids = [one] if one is not None else None
            else:
                ids, _ = c.call("post", c.cas.post_messages, items, ctx={"n": meta[0]["n"]})
            if ids is not None:
                c.log.write(
                    *[
                        {
                            "e": "ack",
                            "n": m["n"],
                            "m": mid,
                            "j": jid,
                            "shape": m["shape"],
                            "k": m["k"],
                        }
                        for m, (mid, jid) in zip(meta, ids, strict=True)
                    ],
                    durable=True,
                )
                for m, (mid, jid) in zip(meta, ids, strict=True):
                    if m["k"] is not None:
                        keyed.append({**m, "key": m["k"], "m": mid, "j": jid})
        # Fast: batches of 10-20 every ~30 ms, so that the workers make the contention.
        nap(c.stop, c.rng.uniform(0.01, 0.05) if fast else c.rng.uniform(0.05, 0.35))


def run_worker(c: ChildContext) -> None:
    fast = c.profile == "fast"
    while not c.stop():
        ttl = c.rng.uniform(5.0, 30.0) if fast else c.rng.uniform(0.2, 2.0)
        n = 1 if c.rng.random() < 0.8 else c.rng.randint(2, MAX_BATCH)
        started = time.monotonic()
        claimed: list[dict[str, Any]] = []
        if n == 1:
            one, _ = c.call("claim", c.cas.claim_step, c.run_id, c.name, ttl)
            if one is not None:
                claimed = [one]
        else:
            many, _ = c.call("claim", c.cas.claim_steps, c.run_id, c.name, n, ttl)
            claimed = many or []
            if many == []:
                c.log.write({"e": "idle"})
        if not claimed:
            nap(c.stop, c.rng.uniform(0.002, 0.01) if fast else c.rng.uniform(0.02, 0.1))
            continue
        ms = round((time.monotonic() - started) * 1000, 1)
        c.log.write(
            *[
                {
                    "e": "claim",
                    "s": s["step_id"],
                    "t": s["fencing_token"],
                    "x": s["lease_expires_at"],
                    "ms": ms,
                }
                for s in claimed
            ]
        )
        work_on(c, claimed, ttl)


def work_on(c: ChildContext, claimed: list[dict[str, Any]], ttl: float) -> None:
    """Release, complete in time, or complete on purpose after the lease expired."""
    fast = c.profile == "fast"
    fate = c.rng.random()
    if fate < (0.02 if fast else 0.05):
        if not nap(c.stop, 0.0 if fast else c.rng.uniform(0.0, 0.05)):
            return
        for s in claimed:
            done, _ = c.call(
                "release",
                c.cas.requeue,
                c.run_id,
                s["step_id"],
                worker_id=c.name,
                fencing_token=s["fencing_token"],
                ctx={"s": s["step_id"], "t": s["fencing_token"]},
            )
            if done is not None:
                c.log.write({"e": "rel", "s": s["step_id"], "t": s["fencing_token"]})
        return
    late = not fast and fate < 0.20
    if late:
        delay = ttl + c.rng.uniform(0.02, 0.5)
        outcome = "ABORTED" if c.rng.random() < 0.3 else "SUCCESS"
    else:
        delay = 0.0 if fast else c.rng.uniform(0.0, min(0.5 * ttl, 0.25))
        outcome = "FAILURE" if c.rng.random() < 0.15 else "SUCCESS"
    if delay and not nap(c.stop, delay):
        return  # stopping: abandon the lease, as a crashed worker would
    if late:
        latest = max(int(s["lease_expires_at"]) for s in claimed)
        while now_ms() <= latest:  # certainly expired by the clock the ledger reads
            time.sleep(0.002)
        c.log.write(
            *[
                {"e": "late", "s": s["step_id"], "t": s["fencing_token"], "o": outcome}
                for s in claimed
            ]
        )
    complete(c, claimed, outcome, late)


def complete(c: ChildContext, claimed: list[dict[str, Any]], outcome: str, late: bool) -> None:
    items = [
        (
            c.run_id,
            s["step_id"],
            c.name,
            s["fencing_token"],
            {"worker": c.name, "token": s["fencing_token"], "late": late},
            outcome,
        )
        for s in claimed
    ]
    if len(items) > 1 and c.rng.random() < 0.7:
        started = time.monotonic()
        steps = [[item[1], item[3]] for item in items]
        rids, _ = c.call("complete_batch", c.cas.complete_steps, items, ctx={"steps": steps})
        if rids is not None:
            ms = round((time.monotonic() - started) * 1000, 1)
            c.log.write(
                *[
                    {
                        "e": "done",
                        "s": item[1],
                        "t": item[3],
                        "o": outcome,
                        "r": rid,
                        "b": 1,
                        "ms": ms,
                    }
                    for item, rid in zip(items, rids, strict=True)
                ],
                durable=True,
            )
            return
        # A refused batch wrote nothing; each item is tried on its own below.
    for item in items:
        rid: int | None = None
        for _attempt in range(2):  # one retry after BUSY
            started = time.monotonic()
            rid, err = c.call(
                "complete",
                c.cas.complete_step,
                *item,
                ctx={"s": item[1], "t": item[3], "o": outcome, "late": late},
            )
            if rid is not None:
                ms = round((time.monotonic() - started) * 1000, 1)
                c.log.write(
                    {"e": "done", "s": item[1], "t": item[3], "o": outcome, "r": rid, "ms": ms},
                    durable=True,
                )
                break
            if err is None or err.code is not ErrorCode.BUSY:
                break
        if rid is not None and c.rng.random() < 0.03:
            again, _ = c.call(
                "duplicate", c.cas.complete_step, *item, ctx={"s": item[1], "t": item[3]}
            )
            if again is not None:
                c.log.write(
                    {
                        "e": "violation",
                        "what": "a second completion of a committed step was accepted",
                        "s": item[1],
                        "r": again,
                    },
                    durable=True,
                )


def run_reaper(c: ChildContext) -> None:
    next_status = 0.0
    while nap(c.stop, c.rng.uniform(0.15, 0.25)):
        limit = c.rng.choice((1, 2, 3)) if c.rng.random() < 0.4 else None
        done, _ = c.call("requeue", c.cas.requeue, c.run_id, max_attempts=limit)
        if done is not None:
            c.log.write(
                {
                    "e": "rq",
                    "k": limit,
                    "req": [
                        [d["step_id"], d["fencing_token"]]
                        for d in done
                        if d["action"] == "requeued"
                    ],
                    "abort": [
                        [d["step_id"], d["fencing_token"]] for d in done if d["action"] == "aborted"
                    ],
                },
                durable=True,
            )
        if time.monotonic() >= next_status:
            next_status = time.monotonic() + 2.0
            status, _ = c.call("status", c.cas.status, c.run_id)
            if status is not None:
                c.log.write({"e": "status", "steps": status["steps"]})


ROLES: dict[str, Callable[[ChildContext], None]] = {
    "producer": run_producer,
    "worker": run_worker,
    "reaper": run_reaper,
}


def child_main(args: argparse.Namespace) -> int:
    stop = StopFlag(args.stop_file, args.deadline, args.parent_pid)
    log = JsonLog(Path(args.log))
    c = ChildContext(
        role=args.child,
        name=args.name,
        run_id=args.run_id,
        profile=args.profile,
        rng=random.Random(args.seed),
        log=log,
        stop=stop,
    )
    try:
        log.write({"e": "start", "pid": os.getpid(), "name": args.name})
        while c.cassette is None and not stop():
            c.cassette, err = c.call(
                "open",
                MessageCassette,
                args.db,
                durability=args.durability,
                busy_timeout_ms=args.busy_timeout_ms,
            )
            if c.cassette is None:
                if err is not None and err.code is not ErrorCode.BUSY:
                    return 4  # logged; the parent reports the exit and the code
                nap(stop, 0.05)
        if c.cassette is not None:
            ROLES[args.child](c)
            c.cassette.close()
        log.write({"e": "stop", "orphaned": stop.orphaned}, durable=True)
    except BaseException as exc:  # c.call catches CassetteError: anything here fails the soak
        log.write(
            {
                "e": "fatal",
                "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "sqlite": isinstance(exc, sqlite3.Error),
                "message": str(exc),
                "traceback": traceback.format_exc(),
            },
            durable=True,
        )
        return 2
    finally:
        log.close()
    return 3 if stop.orphaned else 0


# ================================================================================= parent


@dataclass
class Child:
    role: str
    slot: int
    incarnation: int
    name: str
    log: Path
    out: Path
    proc: subprocess.Popen[bytes]
    killed: bool = False  # by the chaos loop, with SIGKILL
    failure: str | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Config:
    db: Path
    logs: Path
    duration: float
    producers: int
    workers: int
    durability: str
    seed: int
    kill_every: float  # mean seconds between kills; 0 = no chaos
    busy_timeout_ms: int
    profile: str


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


class Session:
    """Start the children, run the chaos loop, stop them, and collect what happened."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.run_id = f"soak-{cfg.seed}-{os.getpid()}-{time.time_ns() // 1_000_000}"
        self.children: list[Child] = []
        self.live: dict[tuple[str, int], Child] = {}
        self.kills: Counter[str] = Counter()
        self.restarts = 0
        self.failures: list[str] = []
        self.elapsed = 0.0
        self.child_deadline = 0.0

    def spawn(self, role: str, slot: int, incarnation: int) -> Child:
        name = {"producer": "p", "worker": "w", "reaper": "r"}[role] + f"{slot}.{incarnation}"
        log = self.cfg.logs / f"{name}.log"
        out = self.cfg.logs / f"{name}.out"
        seed = self.cfg.seed * 100_003 + len(self.children) * 7919 + 1
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            role,
            "--name",
            name,
            "--db",
            str(self.cfg.db),
            "--run-id",
            self.run_id,
            "--log",
            str(log),
            "--seed",
            str(seed),
            "--durability",
            self.cfg.durability,
            "--busy-timeout-ms",
            str(self.cfg.busy_timeout_ms),
            "--profile",
            self.cfg.profile,
            "--deadline",
            str(self.child_deadline),
            "--parent-pid",
            str(os.getpid()),
            "--stop-file",
            str(self.cfg.logs / f"STOP.{role}"),
        ]
        with out.open("wb") as sink:
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        child = Child(role, slot, incarnation, name, log, out, proc)
        self.children.append(child)
        self.live[(role, slot)] = child
        return child

    def run(self) -> None:
        cfg = self.cfg
        cfg.logs.mkdir(parents=True, exist_ok=True)
        with MessageCassette(cfg.db, durability=cfg.durability):
            pass  # create and migrate once, before any child opens the file
        self.child_deadline = time.time() + cfg.duration + 120
        started = time.monotonic()
        self.spawn("reaper", 0, 0)
        for slot in range(cfg.producers):
            self.spawn("producer", slot, 0)
        for slot in range(cfg.workers):
            self.spawn("worker", slot, 0)
        end = started + cfg.duration
        chaos = cfg.kill_every > 0 and cfg.producers + cfg.workers > 0
        next_kill = started + self.rng.expovariate(1 / cfg.kill_every) if chaos else float("inf")
        last_size, last_growth = -1, started
        try:
            while (now := time.monotonic()) < end:
                time.sleep(min(0.05, end - now))
                self.poll()
                now = time.monotonic()
                if now >= next_kill:
                    self.kill_one()
                    next_kill = now + self.rng.expovariate(1 / cfg.kill_every)
                size = sum(
                    c.log.stat().st_size
                    for c in self.children
                    if c.role == "worker" and c.log.exists()
                )
                if size != last_size:
                    last_size, last_growth = size, now
                elif cfg.workers and now - last_growth > STALL_SECONDS:
                    self.failures.append(
                        f"no worker wrote anything for {STALL_SECONDS:.0f} s (deadlock?)"
                    )
                    last_growth = now
        except KeyboardInterrupt:
            self.failures.append("interrupted")
        finally:
            self.elapsed = time.monotonic() - started
            self.stop_all()

    def poll(self) -> None:
        """A child that exits while it should be running is a failure (not restarted)."""
        for key, child in list(self.live.items()):
            if not child.alive:
                del self.live[key]
                child.failure = f"{child.name} exited with status {child.proc.returncode}"
                self.failures.append(child.failure + tail(child.out))

    def kill_one(self) -> None:
        candidates = [c for c in self.live.values() if c.role != "reaper"]
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        victim.killed = True
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.kills[victim.role] += 1
        self.spawn(victim.role, victim.slot, victim.incarnation + 1)
        self.restarts += 1

    def stop_all(self) -> None:
        # Producers and workers first; the reaper keeps requeueing while they wind down.
        for group in (("producer", "worker"), ("reaper",)):
            members = [c for c in self.live.values() if c.role in group]
            for role in group:
                (self.cfg.logs / f"STOP.{role}").touch()
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for child in members:
                try:
                    child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
                    child.failure = f"{child.name} did not stop within {STOP_GRACE_SECONDS:.0f} s"
                    self.failures.append(child.failure)
                    continue
                if child.proc.returncode != 0:
                    child.failure = f"{child.name} exited with status {child.proc.returncode}"
                    self.failures.append(child.failure + tail(child.out))
        self.live.clear()


def tail(path: Path, limit: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return f"\n    output: {text[-limit:]}" if text else ""


def read_log(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """A child's records. Only the last line may be torn (by SIGKILL); it is dropped."""
    if not path.exists():
        return [], []
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(lines[:-1], 1):
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            problems.append(f"{path.name}:{number} is not JSON")
    return records, problems


# ============================================================================= analysis


@dataclass
class Tally:
    """What the children say they did."""

    ops: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    refusals_by_op: Counter[tuple[str, str]] = field(default_factory=Counter)
    busy_waited: Counter[str] = field(default_factory=Counter)
    busy_elapsed_ms: list[float] = field(default_factory=list)
    write_ms: list[float] = field(default_factory=list)
    snapshot: list[dict[str, Any]] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    raw_sqlite: int = 0
    violations: list[str] = field(default_factory=list)
    unexpected: Counter[str] = field(default_factory=Counter)
    log_problems: list[str] = field(default_factory=list)

    @property
    def stale_refusals(self) -> int:
        """Completions refused as stale (the deliberate re-completions not counted)."""
        return sum(
            n
            for (op, code), n in self.refusals_by_op.items()
            if op in ("complete", "complete_batch") and code in REFUSED_COMPLETION
        )


def tally_children(children: Iterable[Child], logs: dict[str, list[dict[str, Any]]]) -> Tally:
    tally = Tally()
    for child in children:
        for rec in logs[child.name]:
            kind = rec["e"]
            if kind == "ref":
                op, code = rec["op"], rec["c"]
                tally.refusals[code] += 1
                tally.refusals_by_op[(op, code)] += 1
                if code == "BUSY":
                    tally.busy_waited[str(rec.get("waited_ms"))] += 1
                    tally.busy_elapsed_ms.append(float(rec.get("ms", 0)))
                if rec.get("snapshot"):
                    tally.snapshot.append(rec)
                if code not in EXPECTED_CODES.get(op, frozenset()):
                    tally.unexpected[f"{op}:{code}"] += 1
            elif kind == "ack":
                tally.ops["posts"] += 1
            elif kind == "repost":
                tally.ops["reposts"] += 1
            elif kind == "claim":
                tally.ops["claims"] += 1
                tally.write_ms.append(float(rec.get("ms", 0)))
            elif kind == "done":
                tally.ops["completes"] += 1
                tally.write_ms.append(float(rec.get("ms", 0)))
            elif kind == "late":
                tally.ops["late_attempts"] += 1
            elif kind == "rel":
                tally.ops["releases"] += 1
            elif kind == "rq":
                tally.ops["requeue_calls"] += 1
                tally.ops["requeued"] += len(rec["req"])
                tally.ops["aborted_max_attempts"] += len(rec["abort"])
            elif kind == "status":
                tally.ops["status_reads"] += 1
            elif kind == "violation":
                tally.violations.append(f"{child.name}: {rec['what']}: {rec}")
            elif kind == "fatal":
                tally.fatal.append(f"{child.name}: {rec['type']}: {rec['message']}")
                if rec.get("sqlite"):
                    tally.raw_sqlite += 1
    tally.ops["conflicts_refused"] = tally.refusals_by_op[("conflict", "IDEMPOTENCY_CONFLICT")]
    tally.ops["duplicates_refused"] = tally.refusals_by_op[("duplicate", "DUPLICATE_RECEIPT")]
    return tally


class Checker:
    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, name: str, problems: list[str]) -> None:
        detail = "; ".join(problems[:5]) + (
            f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        self.checks.append(Check(name, not problems, detail))


def check_ledger(
    session: Session, logs: dict[str, list[dict[str, Any]]], tally: Tally
) -> tuple[list[Check], dict[str, Any]]:
    """Reopen the ledger and compare it with the children's logs and with its journal."""
    cfg, run_id = session.cfg, session.run_id
    by_name = {c.name: c for c in session.children}
    out = Checker()
    facts: dict[str, Any] = {}
    with MessageCassette(cfg.db, durability=cfg.durability) as cas:
        conn = cas.conn
        status = cas.status(run_id)
        facts["steps"] = status["steps"]
        facts["receipts"] = status["receipts"]

        # ---------------------------------------------------------------- messages
        messages: dict[int, dict[str, Any]] = {}
        for mid, payload_json in conn.execute(
            "SELECT message_id, payload_json FROM cassette_messages WHERE run_id = ?", (run_id,)
        ):
            messages[mid] = orjson.loads(payload_json)
        jobs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # message -> (ordinal, job)
        for mid, jid, ordinal in conn.execute(
            "SELECT message_id, job_id, ordinal FROM cassette_jobs WHERE run_id = ?", (run_id,)
        ):
            jobs[mid].append((ordinal, jid))
        step_count: Counter[int] = Counter()
        for jid, count in conn.execute(
            "SELECT job_id, count(*) FROM cassette_steps WHERE run_id = ? GROUP BY job_id",
            (run_id,),
        ):
            step_count[jid] = count

        acked: dict[int, tuple[str, dict[str, Any]]] = {}
        lost, wrong, double = [], [], []
        for child in session.children:
            if child.role != "producer":
                continue
            for rec in logs[child.name]:
                if rec["e"] != "ack":
                    continue
                mid = rec["m"]
                if mid in acked:
                    double.append(
                        f"message {mid} acknowledged twice ({acked[mid][0]}, {child.name})"
                    )
                acked[mid] = (child.name, rec)
                payload = messages.get(mid)
                if payload is None:
                    lost.append(f"{child.name} n={rec['n']} message {mid}")
                    continue
                declared = [jid for _, jid in sorted(jobs[mid])]
                counts = [step_count[jid] for jid in declared]
                if (
                    payload.get("producer") != child.name
                    or payload.get("n") != rec["n"]
                    or counts != rec["shape"]
                    or not declared
                    or declared[0] != rec["j"]
                ):
                    wrong.append(
                        f"message {mid}: payload {payload.get('producer')}/{payload.get('n')},"
                        f" steps per job {counts}, expected {child.name}/{rec['n']} {rec['shape']}"
                    )
        facts["acknowledged"] = len(acked)
        facts["present"] = sum(1 for mid in acked if mid in messages)
        facts["messages_in_db"] = len(messages)
        out.add("every acknowledged message is present (nothing acknowledged is lost)", lost)
        out.add("acknowledged messages have their payload, jobs and steps", wrong + double)

        seen: Counter[tuple[str, int]] = Counter()
        unacked: dict[str, list[int]] = defaultdict(list)
        for mid, payload in messages.items():
            key = (str(payload.get("producer")), int(payload.get("n", -1)))
            seen[key] += 1
            if mid not in acked:
                unacked[key[0]].append(key[1])
        dupes = [f"{p} n={n} stored {k} times" for (p, n), k in seen.items() if k > 1]
        out.add("no message stored twice (idempotency keys and retries)", dupes)
        strays = []
        post_batch = MAX_BATCH if cfg.profile == "chaos" else FAST_POST_BATCH
        for producer, ns in unacked.items():
            poster = by_name.get(producer)
            top = max((r["n"] for r in logs.get(producer, []) if r["e"] == "ack"), default=-1)
            if poster is None or not (poster.killed or poster.failure):
                strays.append(f"{producer} n={sorted(ns)} stored but never acknowledged")
            elif len(ns) > post_batch or min(ns) <= top:
                strays.append(f"killed {producer}: unacknowledged n={sorted(ns)} (last ack {top})")
        facts["unacknowledged_present"] = sum(len(v) for v in unacked.values())
        out.add("unacknowledged messages only from the last post of a killed producer", strays)

        # ------------------------------------------------------------- step states
        bad_states = [
            f"step {sid}: {st} owner={owner!r} expires={exp!r} token={tok} receipts={n}"
            f" ({rw!r}, {rt!r})"
            for sid, st, owner, exp, tok, n, rw, rt in conn.execute(
                "SELECT s.step_id, s.status, s.lease_owner, s.lease_expires_at, s.fencing_token,"
                " count(r.receipt_id), min(r.worker_id), min(r.fencing_token)"
                " FROM cassette_steps s LEFT JOIN cassette_receipts r ON r.step_id = s.step_id"
                " WHERE s.run_id = ? GROUP BY s.step_id HAVING NOT ("
                " (s.status = 'COMMITTED' AND count(r.receipt_id) = 1"
                "  AND min(r.worker_id) IS s.lease_owner"
                "  AND min(r.fencing_token) IS s.fencing_token)"
                " OR (s.status = 'PENDING' AND count(r.receipt_id) = 0"
                "  AND s.lease_owner IS NULL AND s.lease_expires_at IS NULL)"
                " OR (s.status = 'LEASED' AND count(r.receipt_id) = 0"
                "  AND s.lease_owner IS NOT NULL AND s.lease_expires_at IS NOT NULL))",
                (run_id,),
            )
        ]
        out.add(
            "every step COMMITTED with its one matching receipt, PENDING without lease,"
            " or LEASED with both lease fields",
            bad_states,
        )

        # ----------------------------------------------------------- journal replay
        replay = replay_journal(conn, run_id)
        out.add(
            "journal: every receipt follows a LEASED revision with its worker and token,"
            " before expiry; transitions legal",
            replay.problems,
        )
        facts["claims_in_db"] = replay.claims
        facts["requeues_in_db"] = replay.requeues

        receipts: dict[tuple[int, str, int], tuple[int, str, dict[str, Any]]] = {}
        for rid, sid, worker, token, outcome, receipt_json in conn.execute(
            "SELECT receipt_id, step_id, worker_id, fencing_token, outcome, receipt_json"
            " FROM cassette_receipts WHERE run_id = ?",
            (run_id,),
        ):
            receipts[(sid, worker, token)] = (rid, outcome, orjson.loads(receipt_json))
        releases = {
            (sid, worker, token)
            for sid, worker, token in conn.execute(
                "SELECT step_id, worker_id, fencing_token FROM cassette_releases WHERE run_id = ?",
                (run_id,),
            )
        }
        started = time.monotonic()
        report = cas.verify_cassette()
        facts["verify_s"] = round(time.monotonic() - started, 2)
    facts["verify_ok"] = report.ok
    facts["journal_rows"] = report.journal_rows
    out.add(
        "verify_cassette() passes",
        [f"{f.kind} {f.table}:{f.key} {f.detail}" for f in report.errors],
    )

    # -------------------------------------------------- receipts against worker logs
    reaper_aborts = {
        tuple(pair)
        for c in session.children
        if c.role == "reaper"
        for r in logs[c.name]
        if r["e"] == "rq"
        for pair in r["abort"]
    }
    db_aborts = {
        (sid, tok)
        for (sid, _w, tok), (_r, outcome, body) in receipts.items()
        if outcome == "ABORTED" and body.get("reason") == "max_attempts"
    }
    out.add(
        "max_attempts ABORTED receipts are exactly the reaper's",
        [
            f"step {s} token {t} aborted in the ledger, not by the reaper"
            for s, t in db_aborts - reaper_aborts
        ]
        + [
            f"step {s} token {t} aborted by the reaper, not in the ledger"
            for s, t in reaper_aborts - db_aborts
        ],
    )
    facts["aborted_max_attempts"] = len(db_aborts)

    phantom: list[str] = []  # reported as completed, no such receipt
    mismatched: list[str] = []  # reported with another receipt id or outcome
    unlogged: list[str] = []  # receipts their worker never reported
    unknown: list[str] = []  # receipts in the name of no worker of the soak
    refused_but_written: list[str] = []  # refused, yet the receipt is there
    late_written: list[str] = []  # accepted after the lease expired
    claims_logged = Counter[str]()
    worker_receipts: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for (sid, worker, tok), (_rid, _outcome, body) in receipts.items():
        if body.get("reason") != "max_attempts":
            worker_receipts[worker].add((sid, tok))
            if worker not in by_name:
                unknown.append(f"receipt for step {sid} by unknown worker {worker}")
    missing_claims = []
    for child in session.children:
        if child.role != "worker":
            continue
        recs = logs[child.name]
        claimed = {(r["s"], r["t"]) for r in recs if r["e"] == "claim"}
        claims_logged[child.name] = len(claimed)
        missing_claims += [
            f"{child.name} claimed step {s} token {t}: no such LEASED revision"
            for s, t in claimed - replay.leases.get(child.name, set())
        ]
        reported = set()
        for r in recs:
            if r["e"] != "done":
                continue
            reported.add((r["s"], r["t"]))
            found = receipts.get((r["s"], child.name, r["t"]))
            if found is None:
                phantom.append(f"{child.name} completed step {r['s']} token {r['t']}: no receipt")
            elif found[0] != r["r"] or found[1] != r["o"]:
                mismatched.append(
                    f"{child.name} step {r['s']}: logged {r['r']}/{r['o']}, stored {found[:2]}"
                )
        extra = worker_receipts.get(child.name, set()) - reported
        if extra and (
            not (child.killed or child.failure) or len(extra) > MAX_BATCH or not extra <= claimed
        ):
            unlogged.append(
                f"{child.name} (killed={child.killed}): receipts never reported {sorted(extra)}"
            )
        for r in recs:
            if (
                r["e"] == "ref"
                and r["op"] == "complete"
                and r["c"] != "BUSY"
                and (r["s"], r["t"]) in worker_receipts.get(child.name, set())
            ):
                refused_but_written.append(
                    f"{child.name} step {r['s']}: refused {r['c']} but written"
                )
            if (
                r["e"] == "late"
                and r["o"] != "ABORTED"
                and (r["s"], child.name, r["t"]) in receipts
            ):
                rid, outcome, _ = receipts[(r["s"], child.name, r["t"])]
                if outcome != "ABORTED":
                    late_written.append(
                        f"{child.name} step {r['s']} token {r['t']}: receipt {rid} after expiry"
                    )
    out.add(
        "worker-reported completions are exactly the receipts in their names (no more, none lost)",
        phantom + mismatched + unlogged + unknown + refused_but_written,
    )
    out.add("every completion attempted after its lease expired was refused", late_written)
    out.add("every logged claim is a LEASED revision in the journal", missing_claims)

    unlogged_claims = []
    for owner, leases in replay.leases.items():
        holder = by_name.get(owner)
        extra_n = len(leases) - claims_logged.get(owner, 0)
        if holder is None:
            unlogged_claims.append(f"leases held by unknown worker {owner}")
        elif extra_n and (not (holder.killed or holder.failure) or extra_n > MAX_BATCH):
            unlogged_claims.append(
                f"{owner} (killed={holder.killed}): {extra_n} claims never logged"
            )
    out.add(
        "claims in the ledger are the logged ones (but a killed worker's last)", unlogged_claims
    )

    logged_releases = {
        (r["s"], c.name, r["t"])
        for c in session.children
        if c.role == "worker"
        for r in logs[c.name]
        if r["e"] == "rel"
    }
    release_problems = [f"release {x} logged, not stored" for x in logged_releases - releases]
    for sid, worker, tok in releases - logged_releases:
        releaser = by_name.get(worker)
        if releaser is None or not (releaser.killed or releaser.failure):
            release_problems.append(f"release of step {sid} token {tok} by {worker} never logged")
    reaped = tally.ops["requeued"]
    if replay.requeues != reaped:
        release_problems.append(
            f"{replay.requeues} expiry requeues in the journal, reaper logged {reaped}"
        )
    out.add("releases and requeues in the journal are the logged ones", release_problems)
    facts["releases_in_db"] = len(releases)
    return out.checks, facts


@dataclass
class Replay:
    problems: list[str] = field(default_factory=list)
    claims: int = 0
    requeues: int = 0  # LEASED -> PENDING without a release
    leases: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))


def replay_journal(conn: sqlite3.Connection, run_id: str) -> Replay:
    """Walk the journal in seq order and re-run the state machine of every step of the run.

    For each receipt the step's latest revision before it must be LEASED by the receipt's
    worker with the receipt's token (so no worker whose lease was requeued completed), and a
    SUCCESS/FAILURE receipt must be older than that lease's expiry.
    """
    out = Replay()
    state: dict[int, list[Any]] = {}  # step -> [status, owner, token, expires]
    last_receipt: dict[int, tuple[str, int]] = {}
    last_release: set[tuple[int, int]] = set()
    problems = out.problems
    for seq, body in conn.execute(
        "SELECT seq, body FROM cassette_journal"
        " WHERE tbl IN ('cassette_steps', 'cassette_receipts', 'cassette_releases') ORDER BY seq"
    ):
        entry = orjson.loads(body)
        row = entry["row"]
        if row["run_id"] != run_id:
            continue
        table, op = entry["table"], entry["op"]
        sid = row["step_id"]
        if table == "cassette_steps" and op == "INSERT":
            state[sid] = ["PENDING", None, 0, None]
            continue
        prev = state.get(sid)
        if prev is None:
            problems.append(f"seq {seq}: {table} {op} of step {sid} before its insert")
            continue
        status, owner, token, expires = prev
        if table == "cassette_receipts":
            if status != "LEASED" or owner != row["worker_id"] or token != row["fencing_token"]:
                problems.append(
                    f"seq {seq}: receipt of step {sid} by {row['worker_id']}/{row['fencing_token']}"
                    f" while the step was {status} {owner}/{token}"
                )
            elif row["outcome"] != "ABORTED" and row["created_at"] >= expires:
                problems.append(f"seq {seq}: {row['outcome']} receipt of step {sid} after expiry")
            if sid in last_receipt:
                problems.append(f"seq {seq}: second receipt for step {sid}")
            last_receipt[sid] = (row["worker_id"], row["fencing_token"])
        elif table == "cassette_releases":
            if status != "LEASED" or owner != row["worker_id"] or token != row["fencing_token"]:
                problems.append(f"seq {seq}: release of step {sid} not by its holder")
            last_release.add((sid, row["fencing_token"]))
        else:
            new = (row["status"], row["lease_owner"], row["fencing_token"], row["lease_expires_at"])
            if status == "PENDING" and new[0] == "LEASED":
                if new[2] != token + 1 or new[1] is None or new[3] is None:
                    problems.append(f"seq {seq}: bad claim of step {sid}: {new}")
                out.claims += 1
                out.leases[new[1]].add((sid, new[2]))
            elif status == "LEASED" and new[0] == "PENDING":
                if new[1] is not None or new[3] is not None or new[2] != token:
                    problems.append(f"seq {seq}: bad requeue of step {sid}: {new}")
                if (sid, token) not in last_release:
                    out.requeues += 1
            elif status == "LEASED" and new[0] == "COMMITTED":
                if last_receipt.get(sid) != (owner, token) or new[1:] != (owner, token, expires):
                    problems.append(f"seq {seq}: step {sid} committed without its holder's receipt")
            else:
                problems.append(f"seq {seq}: step {sid} went {status} -> {new[0]}")
            state[sid] = list(new)
    return out


# ============================================================================= reporting


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def evaluate(session: Session) -> dict[str, Any]:
    logs: dict[str, list[dict[str, Any]]] = {}
    problems: list[str] = []
    for child in session.children:
        logs[child.name], bad = read_log(child.log)
        problems += bad
    tally = tally_children(session.children, logs)
    checks: list[Check] = []
    facts: dict[str, Any] = {}
    try:
        checks, facts = check_ledger(session, logs, tally)
    except Exception as exc:  # a raw error while reopening or reading is a failure too
        checks.append(Check("reopen and read the ledger", False, f"{type(exc).__name__}: {exc}"))
    checks[:0] = [
        Check(
            "no raw error (non-CassetteError) in any child",
            not tally.fatal,
            "; ".join(tally.fatal[:3]),
        ),
        Check(
            "no snapshot conflict (BEGIN IMMEDIATE everywhere)",
            not tally.snapshot,
            "; ".join(str(s) for s in tally.snapshot[:3]),
        ),
        Check(
            "only expected refusal codes",
            not tally.unexpected,
            ", ".join(f"{k}={v}" for k, v in tally.unexpected.items()),
        ),
        Check(
            "no violation seen by a child", not tally.violations, "; ".join(tally.violations[:3])
        ),
        Check(
            "every child ran, stopped when told, and left a readable log",
            not session.failures and not problems,
            "; ".join((session.failures + problems)[:3]),
        ),
    ]
    if tally.ops["late_attempts"]:
        checks.append(
            Check(
                "stale completions were refused and counted",
                tally.stale_refusals > 0,
                f"{tally.stale_refusals} refused",
            )
        )
    passed = all(c.ok for c in checks)
    cfg = session.cfg
    return {
        "result": "PASS" if passed else "FAIL",
        "duration_s": round(session.elapsed, 1),
        "db": str(cfg.db),
        "logs": str(cfg.logs),
        "seed": cfg.seed,
        "run_id": session.run_id,
        "producers": cfg.producers,
        "workers": cfg.workers,
        "durability": cfg.durability,
        "busy_timeout_ms": cfg.busy_timeout_ms,
        "kill_every": cfg.kill_every,
        "ops": dict(sorted(tally.ops.items())),
        "refusals": dict(sorted(tally.refusals.items())),
        "refusals_by_op": {
            f"{op}:{code}": n for (op, code), n in sorted(tally.refusals_by_op.items())
        },
        "stale_refusals": tally.stale_refusals,
        "busy": tally.refusals["BUSY"],
        "busy_waited_ms": dict(tally.busy_waited),
        "busy_max_elapsed_ms": max(tally.busy_elapsed_ms, default=0.0),
        "write_ms_p50": percentile(tally.write_ms, 0.5),
        "write_ms_p99": percentile(tally.write_ms, 0.99),
        "write_ms_max": max(tally.write_ms, default=0.0),
        "snapshot_errors": len(tally.snapshot),
        "raw_errors": len(tally.fatal),
        "raw_sqlite_errors": tally.raw_sqlite,
        "kills": sum(session.kills.values()),
        "kills_by_role": dict(session.kills),
        "restarts": session.restarts,
        "steps": facts.get("steps", {}),
        "acknowledged": facts.get("acknowledged", 0),
        "present": facts.get("present", 0),
        "facts": facts,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
    }


def print_summary(s: dict[str, Any]) -> None:
    ops, f = s["ops"], s["facts"]
    print(f"duration     {s['duration_s']} s  (seed {s['seed']}, run {s['run_id']})")
    print(
        f"operations   posts={ops.get('posts', 0)} reposts={ops.get('reposts', 0)}"
        f" claims={ops.get('claims', 0)} completes={ops.get('completes', 0)}"
        f" releases={ops.get('releases', 0)} requeue_calls={ops.get('requeue_calls', 0)}"
        f" requeued={ops.get('requeued', 0)} aborted={ops.get('aborted_max_attempts', 0)}"
        f" late_attempts={ops.get('late_attempts', 0)} status_reads={ops.get('status_reads', 0)}"
    )
    print(
        f"in ledger    claims={f.get('claims_in_db')} requeues={f.get('requeues_in_db')}"
        f" releases={f.get('releases_in_db')} receipts={f.get('receipts')}"
    )
    print("refusals     " + (" ".join(f"{k}={v}" for k, v in s["refusals"].items()) or "none"))
    print("  by op      " + " ".join(f"{k}={v}" for k, v in s["refusals_by_op"].items()))
    print(f"stale        {s['stale_refusals']} stale completions refused")
    print(
        f"busy         {s['busy']} (waited_ms {s['busy_waited_ms'] or '-'}),"
        f" snapshot errors {s['snapshot_errors']}, raw errors {s['raw_errors']}"
    )
    print(
        f"writes       p50 {s['write_ms_p50']} ms, p99 {s['write_ms_p99']} ms,"
        f" max {s['write_ms_max']} ms"
    )
    print(f"chaos        kills={s['kills']} {s['kills_by_role']} restarts={s['restarts']}")
    print("steps        " + " ".join(f"{k}={v}" for k, v in s["steps"].items()))
    print(
        f"messages     acknowledged={s['acknowledged']} present={s['present']}"
        f" in_db={f.get('messages_in_db')}"
        f" (unacknowledged, from killed producers: {f.get('unacknowledged_present')})"
    )
    print(
        f"verify       ok={f.get('verify_ok')} journal_rows={f.get('journal_rows')}"
        f" in {f.get('verify_s')} s"
    )
    for c in s["checks"]:
        print(
            f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}"
            + (f": {c['detail']}" if not c["ok"] else "")
        )
    print(f"result       {s['result']}")


def make_config(args: argparse.Namespace, workdir: Path | None, **overrides: Any) -> Config:
    db = Path(args.db) if args.db or workdir is None else workdir / "soak.db"
    values: dict[str, Any] = {
        "db": db,
        "logs": Path(str(db) + ".soak-logs"),
        "duration": args.duration,
        "producers": args.producers,
        "workers": args.workers,
        "durability": args.durability,
        "seed": args.seed,
        "kill_every": args.kill_every,
        "busy_timeout_ms": args.busy_timeout_ms,
        "profile": "chaos",
    }
    values.update(overrides)
    return Config(**values)


def soak(args: argparse.Namespace) -> int:
    workdir = None if args.db else Path(tempfile.mkdtemp(prefix="cassette-soak-"))
    cfg = make_config(args, workdir)
    if args.db and cfg.logs.exists():
        shutil.rmtree(cfg.logs)
    print(
        f"soak: db={cfg.db} duration={cfg.duration}s producers={cfg.producers}"
        f" workers={cfg.workers} durability={cfg.durability} kill_every={cfg.kill_every}s"
        f" seed={cfg.seed}",
        flush=True,
    )
    session = Session(cfg)
    session.run()
    summary = evaluate(session)
    print_summary(summary)
    if summary["result"] == "PASS" and not args.keep:
        # A temporary ledger goes with its directory; a named one stays, its logs go.
        shutil.rmtree(workdir if workdir is not None else cfg.logs, ignore_errors=True)
    else:
        print(f"kept         {cfg.db} and {cfg.logs}")
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    return 0 if summary["result"] == "PASS" else 1


def busy_report(args: argparse.Namespace) -> int:
    """Short bursts without chaos at several worker counts: how often does BUSY happen?"""
    levels = [int(x) for x in args.levels.split(",")]
    root = Path(tempfile.mkdtemp(prefix="cassette-busy-"))
    rows = []
    ok = True
    print(
        f"busy report: {args.burst}s bursts, 1 producer, 1 reaper, durability={args.durability},"
        f" busy_timeout={args.busy_timeout_ms} ms, no chaos",
        flush=True,
    )
    for workers in levels:
        workdir = root / f"w{workers}"
        workdir.mkdir()
        db = workdir / "busy.db"
        cfg = make_config(
            args,
            workdir,
            db=db,
            logs=workdir / "logs",
            duration=args.burst,
            producers=1,
            workers=workers,
            kill_every=0.0,
            profile="fast",
        )
        session = Session(cfg)
        session.run()
        s = evaluate(session)
        ops = s["ops"]
        row = {
            "workers": workers,
            "claims": ops.get("claims", 0),
            "completes": ops.get("completes", 0),
            "posts": ops.get("posts", 0),
            "busy": s["busy"],
            "busy_by_op": {
                key.split(":")[0]: n
                for key, n in s["refusals_by_op"].items()
                if key.endswith(":BUSY")
            },
            "busy_waited_ms": s["busy_waited_ms"],
            "write_ms_p50": s["write_ms_p50"],
            "write_ms_p99": s["write_ms_p99"],
            "write_ms_max": s["write_ms_max"],
            "raw_errors": s["raw_errors"],
            "raw_sqlite_errors": s["raw_sqlite_errors"],
            "snapshot_errors": s["snapshot_errors"],
            "result": s["result"],
        }
        rows.append(row)
        print(
            f"  workers={workers}: claims={row['claims']} completes={row['completes']}"
            f" posts={row['posts']} BUSY={row['busy']} {row['busy_by_op'] or ''}"
            f" waited_ms={row['busy_waited_ms'] or '-'}"
            f" write ms p50/p99/max={row['write_ms_p50']}/{row['write_ms_p99']}"
            f"/{row['write_ms_max']} raw_errors={row['raw_errors']}"
            f" snapshot={row['snapshot_errors']} checks={s['result']}",
            flush=True,
        )
        if s["result"] != "PASS":
            ok = False
            for c in s["checks"]:
                if not c["ok"]:
                    print(f"    [FAIL] {c['name']}: {c['detail']}")
    # The contract: BUSY reaches a caller only as CassetteError(BUSY), never as sqlite3's error.
    raw = sum(r["raw_sqlite_errors"] + r["raw_errors"] for r in rows)
    print(f"raw sqlite3 errors that reached a caller: {raw}")
    print(f"result: {'PASS' if ok and raw == 0 else 'FAIL'}")
    if ok and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    if args.json:
        print(json.dumps({"result": "PASS" if ok and raw == 0 else "FAIL", "levels": rows}))
    return 0 if ok and raw == 0 else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--db", help="ledger file (default: a new temporary file)")
    parser.add_argument("--durability", choices=("full", "normal"), default="normal")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--kill-every",
        type=float,
        default=1.5,
        help="mean seconds between SIGKILLs of a random producer or worker (0: no chaos)",
    )
    parser.add_argument(
        "--busy-timeout-ms",
        type=int,
        default=10_000,
        help="busy_timeout of every child's connection (default: the package's 10000)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON last")
    parser.add_argument("--keep", action="store_true", help="keep the ledger and logs on PASS")
    parser.add_argument(
        "--busy-report",
        action="store_true",
        help="instead of the soak: bursts without chaos at --levels worker counts",
    )
    parser.add_argument("--burst", type=float, default=10.0, help="seconds per busy-report level")
    parser.add_argument("--levels", default="2,4,8", help="busy-report worker counts")
    # Internal: how the parent starts a child.
    hidden = argparse.SUPPRESS
    parser.add_argument("--child", choices=sorted(ROLES), help=hidden)
    parser.add_argument("--name", help=hidden)
    parser.add_argument("--run-id", help=hidden)
    parser.add_argument("--log", help=hidden)
    parser.add_argument("--profile", default="chaos", help=hidden)
    parser.add_argument("--deadline", type=float, default=0.0, help=hidden)
    parser.add_argument("--parent-pid", type=int, default=0, help=hidden)
    parser.add_argument("--stop-file", default="", help=hidden)
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    try:
        return busy_report(args) if args.busy_report else soak(args)
    except CassetteError as err:  # the ledger could not even be created
        print(f"result       FAIL: {err}")
        if args.json:
            print(json.dumps({"result": "FAIL", "error": str(err), "code": err.code.value}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
