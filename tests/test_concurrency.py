"""Real processes on one ledger file: claim races, completion races, concurrent posts, kill -9.

Workers are module-level functions run in the ``spawn`` context, so nothing is inherited
but their arguments; each opens its own MessageCassette with the package's default busy
timeout and reports back through a queue or pipe. A CassetteError a worker did not expect
is reported with its code and fails the test.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import random
import signal
import sqlite3
import time
from collections import Counter, defaultdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette

pytestmark = [
    pytest.mark.slow,  # multi-process; still part of the default run
    pytest.mark.sqlite_only(
        reason="processes racing on one SQLite file, killed mid-write (PostgreSQL's worker"
        " processes: test_postgres_processes.py)"
    ),
]

CTX = mp.get_context("spawn")
RUN = "run-concurrency"
TIMEOUT = 120  # seconds any single wait on a child may take before the test fails
# The work of one step in the fused tests. Without it a loop holds the write lock all but a
# few microseconds, and SQLite's busy handler (sleeps and retries, no queue) may leave one
# process every step: correct, but then there is no race to test.
WORK_SECONDS = 0.0002


def _failure(error: BaseException) -> str:
    if isinstance(error, CassetteError):
        return f"CassetteError {error.code.value}: {error.message}"
    return f"{type(error).__module__}.{type(error).__name__}: {error}"


def _collect(queue: Any, count: int) -> list[Any]:
    return [queue.get(timeout=TIMEOUT) for _ in range(count)]


def _join(processes: list[Any]) -> None:
    for process in processes:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
            process.join()
            pytest.fail(f"worker {process.name} did not exit")
        assert process.exitcode == 0, (process.name, process.exitcode)


def _step_revisions(conn: sqlite3.Connection) -> dict[int, list[tuple[str, int, Any]]]:
    """Every journaled revision of every step, in journal order: (status, token, owner)."""
    revisions: dict[int, list[tuple[str, int, Any]]] = defaultdict(list)
    for key, status, token, owner in conn.execute(
        "SELECT row_key, json_extract(body, '$.row.status'),"
        " json_extract(body, '$.row.fencing_token'), json_extract(body, '$.row.lease_owner')"
        " FROM cassette_journal WHERE tbl = 'cassette_steps' ORDER BY seq"
    ):
        revisions[key].append((status, token, owner))
    return revisions


# ------------------------------------------------------------------------ workers


def claim_complete_worker(
    path: str, worker_id: str, start: Any, out: Any, work_s: float = 0.0
) -> None:
    """Claim and complete until the run has no pending step (each step taking ``work_s``
    seconds of work between the two); report what was done."""
    claimed: list[tuple[int, int]] = []
    completed: list[tuple[int, int, int]] = []
    error = None
    try:
        with MessageCassette(path) as cassette:
            start.wait(TIMEOUT)
            while True:
                try:
                    step = cassette.claim_step(RUN, worker_id, 300)
                except CassetteError as refusal:
                    if refusal.code is ErrorCode.NO_PENDING_STEPS:
                        break
                    raise
                step_id, token = step["step_id"], step["fencing_token"]
                claimed.append((step_id, token))
                if work_s:
                    time.sleep(work_s)
                receipt_id = cassette.complete_step(
                    RUN, step_id, worker_id, token, {"by": worker_id}, "SUCCESS"
                )
                completed.append((step_id, token, receipt_id))
    except BaseException as caught:
        error = _failure(caught)
    out.put({"worker": worker_id, "claimed": claimed, "completed": completed, "error": error})


def fused_worker(
    path: str, worker_id: str, start: Any, out: Any, work_s: float = WORK_SECONDS
) -> None:
    """The fused worker loop: claim once, then complete_and_claim until nothing is left."""
    claimed: list[tuple[int, int]] = []
    completed: list[tuple[int, int, int]] = []
    error = None
    try:
        with MessageCassette(path) as cassette:
            start.wait(TIMEOUT)
            leased = cassette.claim_steps(RUN, worker_id, 1, 300)
            step = leased[0] if leased else None
            while step is not None:
                step_id, token = step["step_id"], step["fencing_token"]
                claimed.append((step_id, token))
                time.sleep(work_s)  # the work, outside any transaction
                result = cassette.complete_and_claim(
                    RUN, step_id, worker_id, token, {"by": worker_id}, "SUCCESS", 300
                )
                assert result["step_id"] == step_id
                completed.append((step_id, token, result["receipt_id"]))
                step = result["next"]
    except BaseException as caught:
        error = _failure(caught)
    out.put({"worker": worker_id, "claimed": claimed, "completed": completed, "error": error})


def racing_completer(path: str, name: str, start: Any, inbox: Any, out: Any) -> None:
    """For each (step_id, holder, token) received: wait for the other racer, then complete."""
    try:
        cassette = MessageCassette(path)
    except BaseException as caught:
        out.put((name, "open", _failure(caught)))
        return
    with cassette:
        while (job := inbox.get(timeout=TIMEOUT)) is not None:
            step_id, holder, token = job
            start.wait(TIMEOUT)
            try:
                receipt_id = cassette.complete_step(
                    RUN, step_id, holder, token, {"racer": name}, "SUCCESS"
                )
            except CassetteError as refusal:
                out.put((name, "refused", refusal.code.value))
            except BaseException as caught:  # a raw sqlite3 error must never escape
                out.put((name, "raised", _failure(caught)))
            else:
                out.put((name, "committed", receipt_id))


def keyless_poster(path: str, name: str, count: int, start: Any, out: Any) -> None:
    posted: list[tuple[int, int]] = []
    error = None
    try:
        with MessageCassette(path) as cassette:
            start.wait(TIMEOUT)
            for i in range(count):
                posted.append(cassette.post_message({"from": name, "i": i}, RUN, "WORKER"))
    except BaseException as caught:
        error = _failure(caught)
    out.put({"poster": name, "posted": posted, "error": error})


def first_opener(path: str, name: str, start: Any, out: Any) -> None:
    """Open a file that does not exist yet, at the same moment as the others, and use it."""
    try:
        start.wait(TIMEOUT)
        with MessageCassette(path) as cassette:
            cassette.post_message({"by": name}, RUN, "SYSTEM")
            step = cassette.claim_step(RUN, name, 300)
            cassette.complete_step(RUN, step["step_id"], name, step["fencing_token"], {}, "FAILURE")
        out.put((name, None))
    except BaseException as caught:
        out.put((name, _failure(caught)))


def _kill_payload(i: int) -> dict[str, Any]:
    return {
        "jobs": [
            {"intent": "fetch", "steps": [{"i": i, "k": k} for k in range(3)]},
            {"intent": "store", "steps": [{"i": i, "k": 3}]},
        ],
        "pad": "x" * (i % 7) * 100,
    }


def endless_writer(path: str, acks: Connection) -> None:
    """Post keyed multi-job messages forever, acknowledging each one after it returned."""
    with MessageCassette(path) as cassette:
        i = 0
        while True:
            message_id, job_id = cassette.post_message(
                _kill_payload(i), RUN, "PLANNER", f"kill-{i}"
            )
            acks.send((i, message_id, job_id))
            i += 1


def endless_fused_worker(path: str, acks: Connection) -> None:
    """The fused loop over a long run, acknowledging each step once its call returned."""
    with MessageCassette(path, durability="normal") as cassette:
        step = cassette.claim_step(RUN, "fused", 300)
        while step is not None:
            result = cassette.complete_and_claim(
                RUN, step["step_id"], "fused", step["fencing_token"], {"k": 1}, "SUCCESS", 300
            )
            acks.send(step["step_id"])
            step = result["next"]


# -------------------------------------------------------------------------- tests


def _post_steps(path: str, messages: int) -> None:
    """``messages`` messages of one job with two steps each, in batches of 100."""
    with MessageCassette(path) as cassette:
        for start_at in range(0, messages, 100):
            cassette.post_messages(
                [
                    (
                        {
                            "jobs": [
                                {"intent": "work", "steps": [{"i": i, "p": 0}, {"i": i, "p": 1}]}
                            ]
                        },
                        RUN,
                        "USER",
                        None,
                    )
                    for i in range(start_at, min(start_at + 100, messages))
                ]
            )
        assert cassette.status(RUN)["steps"]["PENDING"] == 2 * messages


def _run_workers(path: str, loops: list[Any]) -> list[dict[str, Any]]:
    """One process per loop function, started together; their reports, none failed."""
    start, out = CTX.Barrier(len(loops)), CTX.Queue()
    workers = [
        CTX.Process(target=loop, args=(path, f"w{n}", start, out), name=f"w{n}")
        for n, loop in enumerate(loops)
    ]
    for worker in workers:
        worker.start()
    reports = _collect(out, len(workers))
    _join(workers)
    for report in reports:
        assert report["error"] is None, f"{report['worker']}: {report['error']}"
    return reports


def _check_exactly_once(path: str, reports: list[dict[str, Any]], total: int) -> None:
    """No (step, token) handed to two workers, nothing lost; each receipt by the worker
    that held the lease; the journal shows one claim per step; verify passes."""
    claims = [(s, t) for r in reports for s, t in r["claimed"]]
    assert len(claims) == len(set(claims)) == total
    completions = [c for r in reports for c in r["completed"]]
    assert len(completions) == total
    assert len({step_id for step_id, _, _ in completions}) == total
    assert len({receipt_id for _, _, receipt_id in completions}) == total
    assert sum(1 for r in reports if r["completed"]) >= 2, "the workers never overlapped"

    by_worker = {(s, t): r["worker"] for r in reports for s, t, _ in r["completed"]}
    with MessageCassette(path) as cassette:
        conn = cassette.conn
        assert conn.execute("SELECT count(*) FROM cassette_steps").fetchone()[0] == total
        assert (
            conn.execute(
                "SELECT count(*) FROM cassette_steps WHERE status IS NOT 'COMMITTED'"
            ).fetchone()[0]
            == 0
        )
        receipts = conn.execute(
            "SELECT r.step_id, r.worker_id, r.fencing_token, s.lease_owner, s.fencing_token"
            " FROM cassette_receipts r JOIN cassette_steps s USING (step_id)"
        ).fetchall()
        assert len(receipts) == total
        assert Counter(row[0] for row in receipts).most_common(1)[0][1] == 1
        for step_id, worker, token, owner, step_token in receipts:
            assert (worker, token) == (owner, step_token), step_id
            assert by_worker[(step_id, token)] == worker, step_id

        # The journal: tokens only grow, every claim is a new token, no claim is lost.
        revisions = _step_revisions(conn)
        assert len(revisions) == total
        for step_id, history in revisions.items():
            tokens = [token for _, token, _ in history]
            assert tokens == sorted(tokens), (step_id, history)
            claim_tokens = [token for status, token, _ in history if status == "LEASED"]
            assert claim_tokens == sorted(set(claim_tokens)), (step_id, history)
            assert [status for status, _, _ in history] == ["PENDING", "LEASED", "COMMITTED"]

        assert cassette.status(RUN)["receipts"]["SUCCESS"] == total
        report = cassette.verify_cassette()
        assert report.ok, report.errors


def test_four_workers_complete_two_thousand_steps_exactly_once(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.db")
    _post_steps(path, 1000)
    # (the same work per step as the fused workers below: without it, one worker that
    # begins again right after its COMMIT can take every step before the others start)
    reports = _run_workers(
        path, [functools.partial(claim_complete_worker, work_s=WORK_SECONDS)] * 4
    )
    _check_exactly_once(path, reports, 2000)


@pytest.mark.parametrize(
    "loops",
    [
        [fused_worker] * 4,
        [fused_worker, functools.partial(claim_complete_worker, work_s=WORK_SECONDS)] * 2,
    ],
    ids=["four fused", "two fused, two separate"],
)
def test_fused_workers_never_claim_a_step_twice(tmp_path: Path, loops: list[Any]) -> None:
    """Workers leasing their next step in the transaction that completes the last (alone,
    or beside workers making separate calls): every step claimed and completed once."""
    path = str(tmp_path / "ledger.db")
    _post_steps(path, 500)
    reports = _run_workers(path, loops)
    _check_exactly_once(path, reports, 1000)


def test_two_processes_racing_to_complete_one_step_write_one_receipt(tmp_path: Path) -> None:
    rounds = 20
    path = str(tmp_path / "ledger.db")
    with MessageCassette(path) as cassette:
        start, out = CTX.Barrier(2), CTX.Queue()
        inboxes = [CTX.Queue(), CTX.Queue()]
        racers = [
            CTX.Process(
                target=racing_completer, args=(path, f"r{n}", start, inboxes[n], out), name=f"r{n}"
            )
            for n in range(2)
        ]
        for racer in racers:
            racer.start()
        try:
            for round_no in range(rounds):
                cassette.post_message({"round": round_no}, RUN, "SYSTEM")
                holder = f"holder-{round_no}"
                held = cassette.claim_step(RUN, holder, 300)
                for inbox in inboxes:
                    inbox.put((held["step_id"], holder, held["fencing_token"]))
                results = sorted(_collect(out, 2), key=lambda result: result[1])
                outcomes = [outcome for _, outcome, _ in results]
                assert outcomes == ["committed", "refused"], (round_no, results)
                loser_code = results[1][2]
                assert loser_code in ("DUPLICATE_RECEIPT", "NOT_LEASED"), (round_no, results)
                stored = cassette.conn.execute(
                    "SELECT receipt_id, worker_id FROM cassette_receipts WHERE step_id = ?",
                    (held["step_id"],),
                ).fetchall()
                assert stored == [(results[0][2], holder)], (round_no, stored, results)
        finally:
            for inbox in inboxes:
                inbox.put(None)
            _join(racers)
        assert cassette.status(RUN)["steps"] == {"PENDING": 0, "LEASED": 0, "COMMITTED": rounds}
        report = cassette.verify_cassette()
        assert report.ok, report.errors


def test_two_processes_posting_keyless_messages_never_collide(tmp_path: Path) -> None:
    per_poster = 200
    path = str(tmp_path / "ledger.db")
    MessageCassette(path).close()  # create and migrate once, before the race
    start, out = CTX.Barrier(2), CTX.Queue()
    posters = [
        CTX.Process(target=keyless_poster, args=(path, name, per_poster, start, out), name=name)
        for name in ("p0", "p1")
    ]
    for poster in posters:
        poster.start()
    reports = {report["poster"]: report for report in _collect(out, len(posters))}
    _join(posters)

    for name, report in reports.items():
        assert report["error"] is None, f"{name}: {report['error']}"
        assert len(report["posted"]) == per_poster
        ids = [message_id for message_id, _ in report["posted"]]
        assert ids == sorted(ids), f"{name}'s messages are not in its posting order"
    all_ids = [mid for report in reports.values() for mid, _ in report["posted"]]
    assert len(set(all_ids)) == 2 * per_poster

    with MessageCassette(path) as cassette:
        rows = cassette.conn.execute(
            "SELECT message_id, idempotency_key, json_extract(payload_json, '$.from'),"
            " json_extract(payload_json, '$.i') FROM cassette_messages WHERE run_id = ?"
            " ORDER BY message_id",
            (RUN,),
        ).fetchall()
        assert sorted(all_ids) == [row[0] for row in rows]
        assert all(row[1] is None for row in rows)
        for name in ("p0", "p1"):
            assert [i for _, _, sender, i in rows if sender == name] == list(range(per_poster))
        assert cassette.status(RUN)["steps"]["PENDING"] == 2 * per_poster
        report = cassette.verify_cassette()
        assert report.ok, report.errors


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("kill_after", [1, 37, 150])
def test_writer_killed_mid_loop_loses_no_acknowledged_post(tmp_path: Path, kill_after: int) -> None:
    path = str(tmp_path / "ledger.db")
    MessageCassette(path).close()
    receive, send = CTX.Pipe(duplex=False)
    writer = CTX.Process(target=endless_writer, args=(path, send), name="writer")
    writer.start()
    send.close()  # the child holds the only writing end: EOF once it is dead
    acked: list[tuple[int, int, int]] = []
    try:
        while len(acked) < kill_after:
            assert receive.poll(TIMEOUT), "the writer stopped acknowledging"
            acked.append(receive.recv())
        time.sleep(random.uniform(0, 0.02))  # land the kill somewhere inside a later post
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(TIMEOUT)
    assert writer.exitcode == -signal.SIGKILL
    while True:  # acknowledgements already in the pipe when the writer died
        try:
            acked.append(receive.recv())
        except EOFError:
            break
    receive.close()

    with MessageCassette(path) as cassette:
        conn = cassette.conn
        for i, message_id, job_id in acked:
            row = conn.execute(
                "SELECT m.idempotency_key, m.payload_json,"
                " (SELECT min(job_id) FROM cassette_jobs j WHERE j.message_id = m.message_id)"
                " FROM cassette_messages m WHERE m.message_id = ?",
                (message_id,),
            ).fetchone()
            assert row is not None, f"acknowledged post {i} (message {message_id}) was lost"
            assert row[0] == f"kill-{i}" and row[2] == job_id
            assert cassette.post_message(_kill_payload(i), RUN, "PLANNER", f"kill-{i}") == (
                message_id,
                job_id,
            )
        # No partial message: every message has both jobs, with three and one steps.
        shapes = conn.execute(
            "SELECT m.message_id, m.idempotency_key,"
            " (SELECT group_concat(n, ',') FROM (SELECT count(s.step_id) AS n"
            "   FROM cassette_jobs j LEFT JOIN cassette_steps s ON s.job_id = j.job_id"
            "   WHERE j.message_id = m.message_id GROUP BY j.job_id ORDER BY j.ordinal))"
            " FROM cassette_messages m ORDER BY m.message_id"
        ).fetchall()
        assert shapes, "nothing was written"
        for message_id, key, shape in shapes:
            assert shape == "3,1", (message_id, key, shape)
        # Posts are committed in order, so what survived is a prefix of the loop:
        # every acknowledged post, plus at most the one in flight when the kill landed.
        keys = [key for _, key, _ in shapes]
        assert keys == [f"kill-{i}" for i in range(len(keys))]
        assert len(acked) <= len(keys) <= len(acked) + 1
        assert not conn.in_transaction
        report = cassette.verify_cassette()
        assert report.ok, report.errors


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("kill_after", [1, 60, 400])
def test_a_fused_worker_killed_mid_loop_holds_exactly_one_lease(
    tmp_path: Path, kill_after: int
) -> None:
    """Each fused transaction commits one step and leases the next, so whenever the worker
    dies it holds exactly one lease: a receipt never commits without the next claim (a
    kill between two separate transactions would leave none). Acknowledged steps survive."""
    path = str(tmp_path / "ledger.db")
    _post_steps(path, 2500)  # 5,000 steps: seconds of work, so the kill lands mid-run
    receive, send = CTX.Pipe(duplex=False)
    worker = CTX.Process(target=endless_fused_worker, args=(path, send), name="fused")
    worker.start()
    send.close()
    acked: list[int] = []
    try:
        while len(acked) < kill_after:
            assert receive.poll(TIMEOUT), "the worker stopped acknowledging"
            acked.append(receive.recv())
        time.sleep(random.uniform(0, 0.01))  # land the kill somewhere inside a later call
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(TIMEOUT)
    assert worker.exitcode == -signal.SIGKILL
    while True:
        try:
            acked.append(receive.recv())
        except EOFError:
            break
    receive.close()

    with MessageCassette(path) as cassette:
        conn = cassette.conn
        leased = conn.execute(
            "SELECT step_id, lease_owner FROM cassette_steps WHERE status = 'LEASED'"
        ).fetchall()
        committed = [
            row[0]
            for row in conn.execute(
                "SELECT step_id FROM cassette_steps WHERE status = 'COMMITTED' ORDER BY step_id"
            )
        ]
        assert len(leased) == 1 and leased[0][1] == "fused", leased
        # Claim order is step order here: what committed is a prefix, then the one lease.
        assert committed == list(range(1, len(committed) + 1))
        assert leased[0][0] == len(committed) + 1
        assert set(acked) <= set(committed)
        assert len(acked) <= len(committed) <= len(acked) + 1
        report = cassette.verify_cassette()
        assert report.ok, report.errors


def test_processes_creating_the_same_new_file_at_once_all_get_one_ledger(tmp_path: Path) -> None:
    """The first open migrates under BEGIN IMMEDIATE; the others wait and find it current."""
    path = str(tmp_path / "fresh.db")
    start, out = CTX.Barrier(4), CTX.Queue()
    openers = [
        CTX.Process(target=first_opener, args=(path, f"o{n}", start, out), name=f"o{n}")
        for n in range(4)
    ]
    for opener in openers:
        opener.start()
    results = dict(_collect(out, len(openers)))
    _join(openers)
    assert results == dict.fromkeys(results, None), results
    with MessageCassette(path) as cassette:
        assert cassette.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert (
            cassette.conn.execute("SELECT count(*) FROM cassette_migrations").fetchone()[0]
            == (cassette.conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()[0])
        )
        assert cassette.status(RUN)["receipts"]["FAILURE"] == 4
        report = cassette.verify_cassette()
        assert report.ok, report.errors


def test_switching_to_wal_waits_for_a_writer_instead_of_failing_busy(tmp_path: Path) -> None:
    """While another connection holds the write lock of a file still in rollback mode
    (as when several processes open a new ledger at once), SQLite answers the switch to
    WAL with BUSY at once, without calling the busy handler. Opening must wait instead."""
    import threading

    path = tmp_path / "rollback.db"
    MessageCassette(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")  # RESERVED, as a process migrating the file holds
    release = threading.Timer(0.3, writer.execute, args=("COMMIT",))
    release.start()
    try:
        started = time.monotonic()
        with MessageCassette(path) as cassette:
            assert cassette.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert time.monotonic() - started >= 0.2  # it waited for the writer
    finally:
        release.join()
        writer.close()
