"""PostgreSQL temporary tables that shadow the ledger's, and the one-flight writer, attacked.

The journal's guard now computes each entry from what it reads: the head's stamp (does
this transaction hold the head?) and the journal's last entry (where does the entry go,
what does it link to?). It names both tables without a schema and runs with the
session's ``search_path``, in which a session's temporary schema comes first for
tables unless the path names ``pg_temp`` itself. A temporary table is any session's to
make (TEMP is PUBLIC's) and no catalog check of another session sees it, so the owner,
doing no DDL on a ledger object, could hand the guard a head it "holds" and a journal
end of its choosing, and store an entry that forks the chain or leaves a gap, without
ever taking the head. The append names the journal the same way, and ``cassette_tx_ms()``
the head: the owner's raw INSERT into a ledger table then journaled its row into its own
temporary table and took a temporary head. Refused now: the chain's functions resolve
tables in ``public`` first, ``pg_temp`` last, as every definer function does
(``sql/postgresql/schema/10_ledger.sql``, its header).

The one-flight writer waited on its socket with ``select()``, which cannot watch a
descriptor numbered 1024 or more (FD_SETSIZE): a process holding that many files got a
raw ``ValueError`` after its write was sent (so committed, unflushed), never a code.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, verify_path
from catalytic_cassette.hashing import leaf_hash
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.verify import FindingKind

from .pg_chain import BODY, head, journal

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def shadow_head(conn: Any) -> None:
    """A temporary cassette_head stamped with this transaction: 'held' without a lock."""
    conn.execute("CREATE TEMP TABLE cassette_head AS SELECT pg_current_xact_id() AS tx")


def shadow_journal_end(conn: Any, seq: int, chain: bytes) -> None:
    """A temporary cassette_journal whose last entry is ``seq`` with ``chain``."""
    conn.execute(
        "CREATE TEMP TABLE cassette_journal AS SELECT %s::bigint AS seq, %s::bytea AS chain_hash",
        (seq, chain),
    )


@pytest.mark.parametrize("shape", ["gap", "fork"])
def test_an_entry_placed_by_temporary_tables(owner: Any, shape: str) -> None:
    """The owner never takes the head; its temporary cassette_head says it does, its
    temporary cassette_journal says the journal ends two seqs later (a gap) or at the
    true last seq with another chain hash (a fork). Then an INSERT that names neither seq
    nor hash. Before 0016 the guard placed and hashed the entry from those tables, the
    follower (its own search_path; gone since 0017) moved the real head onto it, and the
    commit stored it: only verify could tell."""
    before, at = journal(owner), head(owner)
    last_seq, _, last_chain = before[-1]
    end = (last_seq + 2, last_chain) if shape == "gap" else (last_seq, bytes(range(32)))
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        shadow_head(owner)
        shadow_journal_end(owner, *end)
        owner.execute(
            "INSERT INTO public.cassette_journal (body, tbl, row_key)"
            " VALUES (%s, 'cassette_messages', '99')",
            (BODY,),
        )
    assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert journal(owner) == before
    assert head(owner) == at


def test_a_raw_write_journaled_into_a_temporary_table(owner: Any, pg_ledger: str) -> None:
    """The owner's raw INSERT of a message (DML only, as the owner may) with a temporary
    cassette_head and cassette_journal beside it: before 0016 the row was stored, its
    entry went into the temporary journal and its 'head' was the temporary one, so the
    ledger held a message the journal does not. Now the row is journaled in the ledger's
    journal, linked to its end, and verify finds only what the raw row itself lacks."""
    before = journal(owner)
    with owner.transaction():
        owner.execute("CREATE TEMP TABLE cassette_head (LIKE public.cassette_head)")
        owner.execute("INSERT INTO cassette_head SELECT * FROM public.cassette_head")
        owner.execute(
            "CREATE TEMP TABLE cassette_journal"
            " (seq bigint, body text, leaf_hash bytea, chain_hash bytea, tbl text, row_key text)"
        )
        owner.execute(
            "INSERT INTO public.cassette_messages (run_id, source, payload_json)"
            " VALUES ('run', 'USER', '{}')"
        )
    after = journal(owner)
    assert len(after) == len(before) + 1
    assert '"table":"cassette_messages"' in after[-1][1]
    assert after[-1][0] == before[-1][0] + 1
    # the chain and the rows agree; what is left is the raw row's own content (no job)
    kinds = {finding.kind for finding in verify_path(pg_ledger).findings}
    assert kinds == {FindingKind.EMPTY_MESSAGE}


def test_the_guard_still_hashes_what_it_places(owner: Any) -> None:
    """What 0016 must not change: the owner's INSERT naming no seq or hash, after taking
    the head, gets the next seq and its body's hashes (no temporary table involved)."""
    before = journal(owner)
    with owner.transaction():
        owner.execute("SELECT cassette_tx_ms()")
        owner.execute(
            "INSERT INTO public.cassette_journal (body, tbl, row_key)"
            " VALUES (%s, 'cassette_messages', '99')",
            (BODY,),
        )
    after = journal(owner)
    assert after[:-1] == before and after[-1][0] == before[-1][0] + 1
    row = owner.execute(
        "SELECT leaf_hash FROM public.cassette_journal WHERE seq = %s", (after[-1][0],)
    ).fetchone()
    assert bytes(row[0]) == leaf_hash(BODY.encode())


def test_a_receipt_for_a_pending_step_through_a_temporary_steps_table(
    owner: Any, pg_ledger: str
) -> None:
    """The row rules are trigger functions too: the owner's raw INSERT of a receipt for a
    step that was never claimed, with a temporary cassette_steps beside it saying the step
    is LEASED to 'w' (the receipt's checks read it) and taking the commit (the receipt's
    trigger updates it). Before 0016 the receipt was stored and journaled while the real
    step stayed PENDING: status() counted the step twice (PENDING 1 and COMMITTED 1, as
    COMMITTED is now the run's receipts) against one step in a GROUP BY. Now refused."""
    step = owner.execute("SELECT step_id, job_id FROM public.cassette_steps").fetchone()
    before = journal(owner)
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        owner.execute("CREATE TEMP TABLE cassette_steps AS SELECT * FROM public.cassette_steps")
        owner.execute(
            "UPDATE pg_temp.cassette_steps SET status = 'LEASED', lease_owner = 'w',"
            " fencing_token = 1, lease_expires_at = 9000000000000"
        )
        owner.execute(
            "INSERT INTO public.cassette_receipts (step_id, job_id, run_id, worker_id,"
            " fencing_token, outcome, receipt_json)"
            " VALUES (%s, %s, 'run', 'w', 1, 'SUCCESS', '{}')",
            step,
        )
    assert translate(caught.value).code is not ErrorCode.DATABASE_ERROR
    assert journal(owner) == before
    with MessageCassette(pg_ledger) as cassette:
        assert cassette.status("run")["steps"] == {"PENDING": 1, "LEASED": 0, "COMMITTED": 0}


# ------------------------------------------------------------- the one-flight writer


@pytest.fixture
def many_files() -> Iterator[None]:
    """Descriptors 0..1100 taken, so the next connection's socket is numbered past
    select()'s FD_SETSIZE (1024), as in a server process holding many files."""
    opened: list[int] = []
    try:
        while not opened or opened[-1] < 1100:
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pytest.skip("this process may not open 1,100 files")
    try:
        yield
    finally:
        for fd in opened:
            os.close(fd)


def test_a_socket_numbered_past_fd_setsize(pg_ledger: str, many_files: None) -> None:
    """A write through one flight on a socket numbered over 1024. Before the fix the wait
    raised ValueError ('filedescriptor out of range in select()') after the write was
    sent: a traceback, no code, for a write that committed. Now it answers."""
    with MessageCassette(pg_ledger) as cassette:
        assert cassette.pg.pgconn.socket >= 1024
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
        lease = cassette.claim_step("run", "w", ttl_seconds=60)
        assert lease is not None
        cassette.complete_step("run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS")
    assert verify_path(pg_ledger).ok


def test_a_socket_numbered_past_fd_setsize_refusal(pg_ledger: str, many_files: None) -> None:
    """A refusal on such a socket is still its code, not a ValueError."""
    with MessageCassette(pg_ledger) as cassette:
        with pytest.raises(CassetteError) as caught:
            cassette.complete_step("run", 12345, "w", 1, {}, "SUCCESS")
        assert caught.value.code is not ErrorCode.DATABASE_ERROR


def test_prepared_names_dropped_by_discard_all(pg_ledger: str) -> None:
    """A session's prepared statements dropped under one flight's cache (DISCARD ALL, as a
    pooler resetting a server connection does, or DEALLOCATE ALL): before the fix every
    later write on the connection was DATABASE_ERROR ('prepared statement ... does not
    exist'), for good. Now the statements are prepared again and the write goes through."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
        for _ in range(2):
            lease = cassette.claim_step("run", "w", ttl_seconds=60)
            assert lease is not None
            cassette.complete_step(
                "run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS"
            )
            cassette.pg.execute("DEALLOCATE ALL")
    assert verify_path(pg_ledger).ok


def test_one_flight_prepares_only_under_the_connections_lock(pg_ledger: str) -> None:
    """Another thread is using the connection (holds psycopg's lock, as its execute does):
    a write through one flight must not touch the connection until it is free. Before the
    fix the statements were prepared outside the lock, a PQprepare interleaved with
    whatever the other thread had in flight."""
    from catalytic_cassette.postgresql import one_flight

    with MessageCassette(pg_ledger) as cassette:
        conn = cassette.pg
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
        one_flight._PREPARED.pop(conn, None)
        done: list[BaseException | None] = []

        def claim() -> None:
            try:
                assert cassette.claim_step("run", "w", ttl_seconds=60) is not None
                done.append(None)
            except BaseException as exc:  # reported below
                done.append(exc)

        with conn.lock:
            writer = threading.Thread(target=claim)
            writer.start()
            time.sleep(0.3)
            assert not one_flight._PREPARED.get(conn)  # nothing sent while the lock is held
        writer.join(10)
        assert done == [None]
