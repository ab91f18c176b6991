"""Waiting for the write lock (LAW.md section 9): a writer blocked by another connection takes
the lock once it is released, and past the busy timeout it is refused with BUSY, leaving no
transaction open. Behaviour, not timing. (Issue 12's fifth pass measured a package-side wait
in short sleeps instead of SQLite's busy handler and dropped it: docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, connection

pytestmark = [
    pytest.mark.sqlite_only(reason=("SQLite's write lock and busy timeout between connections")),
    pytest.mark.slow,
]

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


def test_refused_writes_leave_the_busy_timeout_and_no_transaction(db_path: Path) -> None:
    with MessageCassette(db_path, durability="normal", busy_timeout_ms=1234) as cassette:
        assert _busy_timeout(cassette.conn) == 1234
        cassette.post_message({"n": 1}, RUN, "USER")
        with pytest.raises(CassetteError):
            cassette.claim_step(RUN, "w", ttl_seconds=-1)
        step = cassette.claim_step(RUN, "w")
        with pytest.raises(CassetteError) as refused:
            cassette.complete_step(RUN, step["step_id"], "w", 99, {}, "SUCCESS")
        assert refused.value.code is not ErrorCode.BUSY
        assert _busy_timeout(cassette.conn) == 1234
        assert not cassette.conn.in_transaction
