"""The write lock is waited for by the package (connection.begin_immediate), not by SQLite's
busy handler: sleeps of 1-5 ms between tries of BEGIN IMMEDIATE, up to the busy timeout,
then SQLite's BUSY. Behaviour, not timing: the lock is taken once released, the timeout still
refuses with BUSY and leaves nothing open, and every other statement keeps the busy timeout.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, connection
from catalytic_cassette.connection import begin_immediate, connect, write_transaction

RUN = "run-lock"


@pytest.fixture
def holder(db_path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection to the same ledger, which a test makes hold the write lock."""
    MessageCassette(db_path, durability="normal").close()
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


def _busy_timeout(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA busy_timeout").fetchone()[0])


def test_a_blocked_writer_takes_the_lock_once_it_is_released(
    db_path: Path, holder: sqlite3.Connection
) -> None:
    with MessageCassette(db_path, durability="normal") as cassette:
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.2, holder.execute, args=("COMMIT",))
        release.start()
        try:
            started = time.monotonic()
            cassette.post_message({"n": 1}, RUN, "USER")
            waited = time.monotonic() - started
        finally:
            release.join()
        assert waited >= 0.15  # it was blocked, and took the lock after the release
        assert not cassette.conn.in_transaction
        assert _busy_timeout(cassette.conn) == connection.DEFAULT_BUSY_TIMEOUT_MS
        assert cassette.status(RUN)["steps"]["PENDING"] == 1


def test_past_the_busy_timeout_a_write_is_refused_busy_with_nothing_open(
    db_path: Path, holder: sqlite3.Connection
) -> None:
    with MessageCassette(db_path, durability="normal", busy_timeout_ms=150) as cassette:
        cassette.post_message({"n": 0}, RUN, "USER")
        step = cassette.claim_step(RUN, "w")
        holder.execute("BEGIN IMMEDIATE")
        calls = (
            lambda: cassette.post_message({"n": 1}, RUN, "USER"),
            lambda: cassette.complete_and_claim(
                RUN, step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
            ),
        )
        for call in calls:
            started = time.monotonic()
            with pytest.raises(CassetteError) as refused:
                call()
            waited = time.monotonic() - started
            assert refused.value.code is ErrorCode.BUSY
            assert refused.value.detail["waited_ms"] == 150
            cause = refused.value.__cause__
            assert isinstance(cause, sqlite3.OperationalError)
            assert cause.sqlite_errorname == "SQLITE_BUSY"
            assert waited >= 0.1  # it waited, not refused at the first try
            assert not cassette.conn.in_transaction
        holder.execute("COMMIT")
        # the lock is free again: the refused calls wrote nothing, and now they write
        assert cassette.status(RUN)["messages"] == 1
        done = cassette.complete_and_claim(
            RUN, step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
        )
        assert done["next"] is None
        assert cassette.status(RUN)["receipts"]["SUCCESS"] == 1


def test_the_busy_timeout_is_back_after_every_write(db_path: Path) -> None:
    """SQLite's busy handler is off only while BEGIN IMMEDIATE is tried: after a write that
    committed and after one that was refused, the connection's busy timeout is in force."""
    with MessageCassette(db_path, durability="normal", busy_timeout_ms=1234) as cassette:
        assert cassette.conn.busy_timeout_ms == 1234  # type: ignore[attr-defined]
        assert _busy_timeout(cassette.conn) == 1234
        cassette.post_message({"n": 1}, RUN, "USER")
        assert _busy_timeout(cassette.conn) == 1234
        with pytest.raises(CassetteError):
            cassette.claim_step(RUN, "w", ttl_seconds=-1)
        assert _busy_timeout(cassette.conn) == 1234
        step = cassette.claim_step(RUN, "w")
        with pytest.raises(CassetteError) as refused:
            cassette.complete_step(RUN, step["step_id"], "w", 99, {}, "SUCCESS")
        assert refused.value.code is not ErrorCode.BUSY
        assert _busy_timeout(cassette.conn) == 1234
        assert not cassette.conn.in_transaction


def test_the_handler_is_off_only_under_the_write_lock_and_set_back_outside(
    db_path: Path,
) -> None:
    """Inside a package write transaction (which holds the write lock) SQLite's handler
    stays off; the first statement outside one, by any way in, sets the timeout back."""
    conn = connect(db_path, durability="normal", busy_timeout_ms=4321)
    try:
        with write_transaction(conn):
            assert _busy_timeout(conn) == 0
        assert _busy_timeout(conn) == 4321
        cursor = conn.cursor()  # made before the next write, used after it
        with write_transaction(conn):
            pass
        assert cursor.execute("PRAGMA busy_timeout").fetchone()[0] == 4321
        with write_transaction(conn):
            pass
        assert conn.cursor().execute("PRAGMA busy_timeout").fetchone()[0] == 4321
        with write_transaction(conn):
            pass
        conn.executescript("SELECT 1;")
        assert _busy_timeout(conn) == 4321
        with write_transaction(conn):
            pass
        target = sqlite3.connect(":memory:")
        conn.backup(target)
        target.close()
        assert conn.busy_handler_off is False  # type: ignore[attr-defined]
        assert _busy_timeout(conn) == 4321
    finally:
        conn.close()


def test_a_worker_loop_runs_no_pragma_per_transaction(db_path: Path) -> None:
    """Write after write, the handler stays off: no PRAGMA between the transactions."""
    with MessageCassette(db_path, durability="normal") as cassette:
        cassette.post_messages([({"n": n}, RUN, "USER", None) for n in range(3)])
        step = cassette.claim_step(RUN, "w")
        statements: list[str] = []
        cassette.conn.set_trace_callback(statements.append)
        try:
            done = cassette.complete_and_claim(
                RUN, step["step_id"], "w", step["fencing_token"], {}, "SUCCESS"
            )
            nxt = done["next"]
            cassette.complete_and_claim(
                RUN, nxt["step_id"], "w", nxt["fencing_token"], {}, "SUCCESS"
            )
        finally:
            cassette.conn.set_trace_callback(None)
        top = [s for s in statements if not s.lstrip().startswith("--")]
        assert top.count("BEGIN IMMEDIATE") == 2
        assert not [s for s in top if "busy_timeout" in s], top
        assert _busy_timeout(cassette.conn) == connection.DEFAULT_BUSY_TIMEOUT_MS


def test_an_interrupted_wait_leaves_no_transaction_and_the_timeout_restored(
    db_path: Path, holder: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MessageCassette(db_path, durability="normal", busy_timeout_ms=5000) as cassette:
        holder.execute("BEGIN IMMEDIATE")

        def interrupted(seconds: float) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(connection.time, "sleep", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cassette.post_message({"n": 1}, RUN, "USER")
        monkeypatch.undo()
        holder.execute("COMMIT")
        assert not cassette.conn.in_transaction
        assert _busy_timeout(cassette.conn) == 5000
        cassette.post_message({"n": 1}, RUN, "USER")
        assert cassette.status(RUN)["messages"] == 1


def test_the_waits_between_tries_grow_to_the_cap_and_no_further(
    db_path: Path, holder: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lengths asked of time.sleep: from about LOCK_POLL_FIRST_S, never above the cap
    (times the jitter), where SQLite's handler grows to 100 ms."""
    conn = connect(db_path, durability="normal", busy_timeout_ms=100)
    asked: list[float] = []
    real_sleep = time.sleep

    def recorded(seconds: float) -> None:
        asked.append(seconds)
        real_sleep(seconds)

    try:
        holder.execute("BEGIN IMMEDIATE")
        monkeypatch.setattr(connection.time, "sleep", recorded)
        with pytest.raises(sqlite3.OperationalError):
            begin_immediate(conn)
        monkeypatch.undo()
        assert not conn.in_transaction
        assert _busy_timeout(conn) == 100
    finally:
        conn.close()
    assert len(asked) >= 2
    assert asked[0] <= connection.LOCK_POLL_FIRST_S * 1.5
    assert max(asked) <= connection.LOCK_POLL_CAP_S * 1.5
    assert all(seconds > 0 for seconds in asked)


def test_a_connection_not_opened_by_connect_leaves_the_wait_to_sqlite(
    db_path: Path, holder: sqlite3.Connection
) -> None:
    MessageCassette(db_path).close()
    plain = sqlite3.connect(db_path, isolation_level=None, timeout=0.05)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as refused:
            begin_immediate(plain)
        assert refused.value.sqlite_errorname == "SQLITE_BUSY"
        assert not plain.in_transaction
        holder.execute("COMMIT")
        begin_immediate(plain)
        assert plain.in_transaction
        plain.execute("ROLLBACK")
    finally:
        plain.close()
