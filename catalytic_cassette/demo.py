"""`cassette demo`: the main job, end to end, told as a short story."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import safe_files
from .cassette import MessageCassette
from .errors import CassetteError, ErrorCode

Echo = Callable[[str], None]


def _worker(
    db_path: str,
    worker_id: str,
    runs: list[str],
    start: Any,
    results: Any,
) -> None:
    done = 0
    with MessageCassette(db_path) as cassette:
        start.wait(timeout=60)
        for run_id in runs:
            while True:
                try:
                    step = cassette.claim_step(run_id, worker_id, ttl_seconds=30)
                except CassetteError as error:
                    if error.code is ErrorCode.NO_PENDING_STEPS:
                        break
                    raise
                time.sleep(0.01)  # the work itself
                receipt = {"worker": worker_id, "result": f"did {step['payload']}"}
                cassette.complete_step(
                    run_id, step["step_id"], worker_id, step["fencing_token"], receipt, "SUCCESS"
                )
                done += 1
    results.put((worker_id, done))


def run_demo(
    db_path: str | None, *, workers: int = 3, echo: Echo = print, keep: bool = False
) -> bool:
    """The demo on ``db_path`` (a new file, kept), else on a temporary ledger of its own,
    removed afterwards unless ``keep``. It removes only the directory it created."""
    if db_path is not None:
        if safe_files.lexists(db_path) or safe_files.lexists(f"{db_path}-wal"):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, f"{db_path} exists; the demo needs a fresh file"
            )
        ok = _story(db_path, workers, echo)
        echo(f"The ledger is kept at {db_path}: cassette --db {db_path} verify")
        return ok
    scratch = tempfile.mkdtemp(prefix="cassette-demo-")
    path = str(Path(scratch) / "demo.db")
    try:
        ok = _story(path, workers, echo)
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    if keep:
        echo(f"The ledger is kept at {path}: cassette --db {path} verify")
    else:
        echo(
            f"The temporary ledger {path} is removed (--keep keeps it; --db PATH writes the"
            " demo where you say)."
        )
    return ok


def _story(path: str, workers: int, echo: Echo) -> bool:
    started = time.monotonic()
    echo(f"Ledger: {path}")
    cassette = MessageCassette(path)
    try:
        posted = 0
        for n in range(12):
            cassette.post_message({"task": f"fetch page {n}"}, "alpha", "USER", f"alpha-{n}")
            posted += 1
        cassette.post_message(
            {
                "jobs": [
                    {
                        "intent": "research",
                        "steps": [{"query": "sqlite wal"}, {"query": "fencing tokens"}],
                    },
                    {"intent": "summarise", "steps": [{"format": "markdown"}]},
                ]
            },
            "alpha",
            "PLANNER",
            "alpha-plan",
        )
        posted += 1
        for n in range(12):
            cassette.post_message({"task": f"index shard {n}"}, "beta", "SYSTEM")
            posted += 1
        again = cassette.post_message({"task": "fetch page 0"}, "alpha", "USER", "alpha-0")
        echo(
            f"1. Posted {posted} messages to runs alpha and beta; re-posting alpha-0 returned the "
            f"same ids {again} and wrote nothing."
        )

        stale = cassette.claim_step("alpha", "worker-crashed", ttl_seconds=0.5)
        echo(
            f"2. worker-crashed leased step {stale['step_id']} (token {stale['fencing_token']}, "
            "0.5 s lease) and then went silent."
        )

        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        start = context.Event()
        procs = [
            context.Process(
                target=_worker, args=(path, f"worker-{i + 1}", ["alpha", "beta"], start, results)
            )
            for i in range(workers)
        ]
        for proc in procs:
            proc.start()
        start.set()
        counts = dict(results.get(timeout=120) for _ in procs)
        for proc in procs:
            proc.join(timeout=60)
        summary = ", ".join(f"{w}: {n}" for w, n in sorted(counts.items()))
        echo(f"3. {workers} worker processes claimed and completed steps concurrently ({summary}).")

        time.sleep(max(0.0, stale["lease_expires_at"] / 1000 - time.time()) + 0.05)
        requeued = cassette.requeue("alpha")
        echo(
            f"4. The lease expired; requeue returned {[r['step_id'] for r in requeued]} to PENDING."
        )
        rescue = cassette.claim_step("alpha", "worker-rescue")
        echo(
            f"5. worker-rescue claimed step {rescue['step_id']}"
            f" with token {rescue['fencing_token']}."
        )
        try:
            cassette.complete_step(
                "alpha",
                stale["step_id"],
                "worker-crashed",
                stale["fencing_token"],
                {"late": True},
                "SUCCESS",
            )
            echo("6. UNEXPECTED: the stale worker's completion was accepted.")
            return False
        except CassetteError as error:
            echo(
                f"6. worker-crashed woke up and tried to complete with token "
                f"{stale['fencing_token']}: refused, {error.code.value}."
            )
        cassette.complete_step(
            "alpha",
            rescue["step_id"],
            "worker-rescue",
            rescue["fencing_token"],
            {"rescued": True},
            "SUCCESS",
        )
        echo(f"   worker-rescue then committed step {rescue['step_id']}.")

        raw = sqlite3.connect(path)
        refusals: Counter[str] = Counter()
        for attack in (
            "UPDATE cassette_receipts SET outcome = 'FAILURE'",
            "DELETE FROM cassette_steps",
            "UPDATE cassette_steps SET status = 'PENDING'",
            "INSERT OR REPLACE INTO cassette_messages (message_id, run_id, source, payload_json,"
            " created_at) VALUES (1, 'alpha', 'USER', '{}', 0)",
        ):
            try:
                raw.execute(attack)
                raw.commit()
            except sqlite3.DatabaseError as exc:
                refusals[str(exc).split(":")[0]] += 1
        raw.close()
        refused = sum(refusals.values())
        echo(
            f"7. A raw sqlite3 connection tried 4 edits: {refused} refused by the database "
            f"({', '.join(f'{k} x{v}' for k, v in sorted(refusals.items()))})."
        )

        alpha, beta = cassette.status("alpha"), cassette.status("beta")
        committed = alpha["steps"]["COMMITTED"] + beta["steps"]["COMMITTED"]
        report = cassette.verify_cassette()
        echo(
            f"8. {committed} steps committed, each with exactly one receipt; "
            f"{report.journal_rows} journal entries in one hash chain."
        )
        elapsed = time.monotonic() - started
        if report.ok and refused == 4:
            echo(f"PASS: All invariants verified ({elapsed:.1f} s)")
            return True
        for finding in report.findings:
            echo(f"  {finding.kind}: {finding.detail}")
        echo(f"FAIL: {len(report.errors)} issue(s) found")
        return False
    finally:
        cassette.close()
