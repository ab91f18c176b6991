"""Committing early on PostgreSQL (durability full): a write's transaction ends once its
commit record is in the WAL buffer (the chain's head is free for the next writer), and the
call returns only after the WAL is flushed past it; every read that hands out evidence
waits for the flush past what its snapshot sees (``connection.wait_durable``).

What a test can observe without a disk to pull: the flush after each write, the
fallback of a role that cannot flush, refusals that leave nothing open, and readers that
do not answer before the WAL is flushed as far as their snapshot.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import CausalChain, ErrorCode, MessageCassette, verify_path
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.postgresql import connection, one_flight
from catalytic_cassette.postgresql.sqlfiles import query

psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.postgresql, pytest.mark.slow]


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def wal(conn: Any) -> tuple[int, int]:
    """(inserted, flushed) WAL positions as integers."""
    inserted, flushed = conn.execute(
        "SELECT pg_current_wal_insert_lsn() - '0/0', pg_current_wal_flush_lsn() - '0/0'"
    ).fetchone()
    return int(inserted), int(flushed)


def lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


class Flushes:
    """Records each flush: ``connection.flush`` with the WAL as the writer's commit left
    it, and each one-statement write sent with its flush in one flight
    (``one_flight.write_and_flush``) with the WAL as the call left it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, observer: Any) -> None:
        self.calls: list[tuple[int, int]] = []
        real = connection.flush
        real_flight = one_flight.write_and_flush

        def recording(conn: Any) -> None:
            self.calls.append(wal(observer))
            real(conn)

        def recording_flight(*args: Any) -> Any:
            answer = real_flight(*args)
            self.calls.append(wal(observer))
            return answer

        monkeypatch.setattr(connection, "flush", recording)
        monkeypatch.setattr(one_flight, "write_and_flush", recording_flight)


def test_every_write_flushes_before_it_returns(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = Flushes(monkeypatch, owner)
    with MessageCassette(pg_ledger) as cassette:
        assert cassette.commits_early
        cassette.post_message({"n": 1}, "run", "USER")
        cassette.post_message({"n": 2}, "run", "USER")
        assert len(flushes.calls) == 2
        lease = cassette.claim_step("run", "w")
        result = cassette.complete_and_claim(
            "run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS"
        )
        assert result["next"] is not None
        cassette.post_messages([({"n": n}, "run", "USER", None) for n in range(3)])
        assert len(flushes.calls) == 5  # post, post, claim, complete_and_claim, the batch
        # when the call has returned, the WAL is flushed past everything its commit wrote
        # (asked as wait_durable asks: at a WAL page's start the insert position is past
        # the page's header, which no flush reaches until the next record)
        inserted_at_return, flushed = wal(owner)
        past = owner.execute(query("wal_flushed_past"), {"lsn": lsn_text(inserted_at_return)})
        assert past.fetchone()[0], (inserted_at_return, flushed)
    with CausalChain(pg_ledger) as chain:
        chain.append_action(
            {
                "plan_id": "p1",
                "intent_id": "i",
                "session_id": "s1",
                "action_type": "PlanStarted",
                "function_name": "f",
            }
        )
    assert len(flushes.calls) == 6
    # The commits were asynchronous: when the writer came to flush, the WAL was inserted
    # past what was flushed (after a synchronous commit on this otherwise idle database,
    # the two would be equal).
    assert any(inserted > flushed for inserted, flushed in flushes.calls)


def test_durability_normal_commits_asynchronously_and_never_flushes(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = Flushes(monkeypatch, owner)
    with MessageCassette(pg_ledger, durability="normal") as cassette:
        assert not cassette.commits_early
        cassette.post_message({"n": 1}, "run", "USER")
    assert flushes.calls == []


def test_a_database_where_the_role_cannot_flush_commits_under_the_head(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DBA who revoked pg_logical_emit_message (privileges are per database) gets
    synchronous commits, as before: slower, never less durable."""
    owner.execute(
        "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC"
    )
    name = "runner_noflush"
    owner.execute(f"CREATE ROLE {name} LOGIN IN ROLE cassette_worker")
    try:
        flushes = Flushes(monkeypatch, owner)
        url = pg_ledger.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
        with MessageCassette(url) as cassette:
            assert not cassette.commits_early
            cassette.post_message({"n": 1}, "run", "USER")
            lease = cassette.claim_step("run", name)
            cassette.complete_step("run", lease["step_id"], name, 1, {}, "SUCCESS")
            assert cassette.status("run")["receipts"]["SUCCESS"] == 1
        assert flushes.calls == []
    finally:
        owner.execute(f"DROP OWNED BY {name}")
        owner.execute(f"DROP ROLE {name}")
        owner.execute(
            "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO PUBLIC"
        )


def test_refusals_roll_back_and_leave_the_connection_usable(pg_ledger: str, owner: Any) -> None:
    """Refused early commits, more of them than psycopg's threshold for preparing a
    statement (a prepared statement lost with an aborted pipeline once broke the next
    call), then writes that succeed; nothing of a refusal was written, no transaction is
    left open."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
        lease = cassette.claim_step("run", "w")
        journal = owner.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
        for _ in range(12):
            with pytest.raises(CassetteError) as caught:
                cassette.complete_step("run", lease["step_id"], "w", 99, {}, "SUCCESS")
            assert caught.value.code is ErrorCode.STALE_FENCING_TOKEN
            assert cassette.pg.info.transaction_status.name == "IDLE"
        assert owner.execute("SELECT count(*) FROM cassette_journal").fetchone()[0] == journal
        cassette.complete_step("run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS")
        assert cassette.status("run")["receipts"]["SUCCESS"] == 1


def test_a_writer_does_not_wait_for_another_writers_flush(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one writer waits for its flush, its transaction is over: another writer
    takes the head and commits (with a synchronous commit it would wait for the first
    one's fsync under the head; here the first one's flush is held back by hand)."""
    with MessageCassette(pg_ledger) as first, MessageCassette(pg_ledger) as second:
        first.post_message({"n": 0}, "run", "USER")
        holding, release = threading.Event(), threading.Event()
        real = connection.flush

        def held(conn: Any) -> None:
            if conn is first.pg:
                holding.set()
                assert release.wait(10)
            real(conn)

        monkeypatch.setattr(connection, "flush", held)
        worker = threading.Thread(target=first.post_message, args=({"n": 1}, "run", "USER"))
        worker.start()
        try:
            assert holding.wait(10)
            second.post_message({"n": 2}, "run", "USER")  # would be BUSY behind a held head
            payloads = [
                row[0]
                for row in owner.execute(
                    "SELECT payload_json FROM cassette_messages ORDER BY message_id"
                )
            ]
            assert payloads == ['{"n":0}', '{"n":1}', '{"n":2}']
        finally:
            release.set()
            worker.join(10)


def test_wait_durable_returns_only_once_the_wal_is_flushed_that_far(
    pg_ledger: str, owner: Any
) -> None:
    """A position past the WAL's end: the wait looks until a later write (flushed by its
    writer) carries the flush past it. The position is 1 MiB ahead, not one byte: the
    server's own processes (autovacuum, the checkpointer) write WAL at any moment, and a
    few bytes of theirs must not end the wait; the write carries 2 MiB of incompressible
    payload past it."""
    inserted, _ = wal(owner)
    target = lsn_text(inserted + (1 << 20))
    done: list[float] = []
    with psycopg.connect(pg_ledger, autocommit=True) as reader:

        def wait() -> None:
            connection.wait_durable(reader, target)
            done.append(time.monotonic())

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        assert done == [], "returned before any WAL reached the position"
        wrote = time.monotonic()
        with MessageCassette(pg_ledger) as cassette:
            cassette.post_message({"n": 1, "pad": os.urandom(1 << 20).hex()}, "run", "USER")
        thread.join(10)
    assert done and done[0] >= wrote


def test_evidence_reads_wait_for_an_asynchronous_commit_to_be_flushed(
    pg_ledger: str, owner: Any, tmp_path: Any
) -> None:
    """A client that commits asynchronously (its right: synchronous_commit is a user
    setting) and never flushes: a snapshot, a follow poll, verify and a copy that see its
    entry return only once the WAL is flushed past it (each read makes it so: the WAL
    writer, left alone, takes up to its delay). Then an idle server whose WAL ends in a
    record no commit follows (a page pruned by a read, say): the reads flush it, they do
    not wait for a flush nobody makes."""
    from catalytic_cassette.copying import copy_ledger
    from catalytic_cassette.follow import follow_reader
    from catalytic_cassette.postgresql.anchors import journal_reader

    def async_commit() -> int:
        owner.execute("SET synchronous_commit = off")
        owner.execute(
            "SELECT cassette_post('run', 'USER', NULL, '{}', ARRAY['i'], ARRAY[1], ARRAY['{}'])"
        )
        owner.execute("RESET synchronous_commit")
        return wal(owner)[0]

    def snapshot() -> None:
        with MessageCassette(pg_ledger) as cassette, cassette.read_snapshot():
            pass

    def follow() -> None:
        with psycopg.connect(pg_ledger, autocommit=True) as reader:
            assert list(follow_reader(journal_reader(reader), keep_following=False))

    def verify() -> None:
        assert verify_path(pg_ledger).ok

    def copy() -> None:
        copy_ledger(pg_ledger, str(tmp_path / f"copy-{time.monotonic_ns()}.db"))

    for read in (snapshot, follow, verify, copy):
        committed = async_commit()
        read()
        assert wal(owner)[1] >= committed, read.__name__
    # a WAL record no commit follows: no one would flush it, the read does
    owner.execute("SELECT pg_logical_emit_message(false, 'test', 'no commit follows')")
    inserted, flushed = wal(owner)
    assert flushed < inserted
    started = time.monotonic()
    assert verify_path(pg_ledger).ok
    assert time.monotonic() - started < 5


def test_a_write_that_returned_survives_the_servers_crash() -> None:
    """An immediate stop (every server process quits; WAL still in shared memory is gone)
    right after a write returned: after recovery, every write that returned is there. A
    commit left asynchronous without its flush is lost this way whenever the WAL writer
    has not come round yet. Its own cluster, since it is crashed."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from . import postgres

    if os.environ.get(postgres.SERVER_VARIABLE):
        pytest.skip("the server is given by a URL: this test crashes a cluster of its own")
    pg_cluster = postgres._pg_cluster()
    directory = Path(tempfile.mkdtemp(prefix="cassette-pg-crash-"))
    try:
        cluster = pg_cluster.start(directory, durable=False)
        url = postgres.create_database(cluster.url)  # (its owner no superuser: LAW.md 14)
        returned = 0
        for _ in range(3):
            with MessageCassette(url) as cassette:
                for n in range(30):
                    cassette.post_message({"n": n}, "run", "USER")
                    returned += 1
                pg_cluster.stop(directory, mode="immediate")
            pg_cluster.start(directory, durable=False)
            with MessageCassette(url) as cassette:
                assert cassette.status("run")["messages"] == returned
        assert verify_path(url).ok
        pg_cluster.stop(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_signed_repost_answered_early_returns_only_once_the_post_is_flushed(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A signing worker's batch of reposts is answered from the committed posts without a
    write of its own (0012's early path in the package). The post it repeats may be
    committed early by another writer whose flush has not come yet: the answer (the
    message's ids, \"it is posted\") must wait for the WAL flush past that commit, as the
    unsigned repost's does (its statement flushes): else a crash takes back a post the
    repeating caller was told exists. The first writer's flush is held back by hand; a
    few keys, since the server's WAL writer may flush one by luck."""
    from catalytic_cassette.signing import generate
    from catalytic_cassette.worker_keys import WorkerKey

    key_path, _ = generate(str(tmp_path / "w3"))
    key = WorkerKey.load("w3", key_path)
    post = {"jobs": [{"intent": "i", "steps": [{}]}]}
    unflushed: list[tuple[str, int, int]] = []
    with (
        MessageCassette(pg_ledger) as first,
        MessageCassette(pg_ledger, worker_key=key) as signed,
    ):
        assert first.commits_early and signed.commits_early
        real = connection.flush
        holding, release = threading.Event(), threading.Event()
        committed: list[int] = []

        def held(conn: Any) -> None:
            if conn is first.pg:
                committed.append(wal(owner)[0])  # past the first writer's commit
                holding.set()
                assert release.wait(10)
            real(conn)

        monkeypatch.setattr(connection, "flush", held)
        for attempt in range(5):
            holding.clear()
            release.clear()
            item = (post, "run", "USER", f"k{attempt}")
            writer = threading.Thread(target=first.post_messages, args=([item],))
            writer.start()
            try:
                assert holding.wait(10)
                answer = signed.post_messages([item])
                _, flushed = wal(owner)
            finally:
                release.set()
                writer.join(10)
            assert answer[0][0] > 0
            if flushed < committed[-1]:
                unflushed.append((f"k{attempt}", committed[-1], flushed))
    assert unflushed == [], "a repost was answered before the post it repeats was flushed"


def test_a_write_waits_for_a_synchronous_standby_as_a_synchronous_commit_does() -> None:
    """With a synchronous standby named (synchronous_standby_names), a synchronous commit
    returns once the standby has its commit: the server's own configuration of durability
    full (LAW 14). An early commit does not wait for the standby, and the flush that
    follows skips its message when the local WAL is flushed already (the WAL writer's,
    or another writer's fsync): the write returned without the standby's word, and a
    failover could take it back. Here the standby never answers, so a write that waits
    for it does not return; the local flush is let through first by hand. Both a ledger
    opened with the standby named and one opened before it was named must wait. Its own
    cluster, since the server's settings change."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from . import postgres

    if os.environ.get(postgres.SERVER_VARIABLE):
        pytest.skip("the server is given by a URL: this test changes a cluster of its own")
    pg_cluster = postgres._pg_cluster()
    directory = Path(tempfile.mkdtemp(prefix="cassette-pg-syncrep-"))
    monkeypatch = pytest.MonkeyPatch()
    try:
        cluster = pg_cluster.start(directory, durable=False)
        url = postgres.with_database(cluster.url, "postgres")
        with psycopg.connect(url, autocommit=True) as admin:
            early = MessageCassette(url)  # opened before the standby is named
            assert early.commits_early
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'absent_standby'")
            admin.execute("SELECT pg_reload_conf()")
            time.sleep(0.5)
            named = MessageCassette(url)  # opened with the standby named
            real = connection.flush

            def locally_flushed_first(conn: Any) -> None:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    inserted, flushed = wal(admin)
                    if flushed >= inserted:
                        break
                    time.sleep(0.01)
                real(conn)

            monkeypatch.setattr(connection, "flush", locally_flushed_first)
            returned: dict[str, bool] = {}

            def write(name: str, cassette: MessageCassette) -> None:
                try:
                    cassette.post_message({"n": name}, "run", "USER")
                finally:
                    returned[name] = True

            writers = [
                threading.Thread(target=write, args=(name, cassette), daemon=True)
                for name, cassette in (("early", early), ("named", named))
            ]
            try:
                for writer in writers:
                    writer.start()
                time.sleep(2.0)
                premature = sorted(returned)
            finally:
                admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
                admin.execute("SELECT pg_reload_conf()")
                for writer in writers:
                    writer.join(10)
                early.close()
                named.close()
        assert premature == [], "returned before the synchronous standby had the commit"
    finally:
        monkeypatch.undo()
        try:
            pg_cluster.stop(directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _insert_at_a_page_start(owner: Any) -> None:
    """Pad the WAL with transactional messages (synchronously committed: flushed) until
    the insert position is at a page's start: the last commit ended at the page's end."""
    owner.execute("SET synchronous_commit = on")
    page = int(owner.execute("SELECT current_setting('wal_block_size')").fetchone()[0])

    def emit(size: int) -> tuple[int, int]:
        before, _ = wal(owner)
        with owner.transaction():
            owner.execute("SELECT pg_logical_emit_message(true, 'pad', repeat('x', %s))", (size,))
        after, _ = wal(owner)
        return before, after

    for _ in range(50):
        before, after = emit(400)
        overhead = after - before - 400  # (the record's headers and its commit record)
        need = page - after % page - overhead
        if need >= 300:
            emit(need)
            if wal(owner)[0] % page == 24:
                return
    raise AssertionError("could not bring the WAL's insert position to a page's start")


def test_an_evidence_read_on_an_idle_server_at_a_page_start_does_not_wait(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a WAL page's start the insert position names the byte after the page's header
    (24 bytes; 40 on a segment's first page), which no flush reaches until another record
    is written: after a WAL switch (archive_timeout's, on an idle archived server, every
    time) or a record that ended at a page's end, every evidence read waited for WAL that
    an idle server never writes and failed BUSY after 30 s (here 3 s)."""
    monkeypatch.setattr(connection, "_FLUSH_WAIT_SECONDS", 3.0)
    segment = int(
        owner.execute("SELECT pg_size_bytes(current_setting('wal_segment_size'))").fetchone()[0]
    )
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
    owner.execute("SELECT pg_switch_wal()")
    inserted, flushed = wal(owner)
    assert inserted % segment == 40 and flushed == inserted - 40  # (the case tested)
    connection.wait_durable(owner, connection.wal_inserted(owner))
    assert verify_path(pg_ledger).ok  # its snapshot waits the same way
    _insert_at_a_page_start(owner)
    inserted, flushed = wal(owner)
    assert flushed == inserted - 24  # (the case tested)
    connection.wait_durable(owner, connection.wal_inserted(owner))


def test_a_flush_refused_after_the_commit_does_not_report_a_committed_write_refused(
    pg_ledger: str, owner: Any
) -> None:
    """pg_logical_emit_message revoked after the ledger was opened (can_flush is read at
    open): the write has committed when its flush is refused. Reported as the flush's
    PERMISSION_DENIED, a refusal, the caller was told nothing was written and retried a
    post that is there (a duplicate). The commit stands: the call waits for the WAL
    writer's flush past it (as a reader does) and returns the write's answer."""
    name = "runner_revoked"
    owner.execute(f"CREATE ROLE {name} LOGIN IN ROLE cassette_worker")
    try:
        url = pg_ledger.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
        with MessageCassette(url) as cassette:
            assert cassette.commits_early
            owner.execute(
                "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text)"
                " FROM PUBLIC"
            )
            message_id, _ = cassette.post_message({"n": 1}, "run", "USER")
            lease = cassette.claim_step("run", name)
            assert lease is not None and lease["message_id"] == message_id
        count = owner.execute("SELECT count(*) FROM cassette_messages").fetchone()[0]
        assert count == 1
    finally:
        owner.execute(f"DROP OWNED BY {name}")
        owner.execute(f"DROP ROLE {name}")
        owner.execute(
            "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO PUBLIC"
        )
