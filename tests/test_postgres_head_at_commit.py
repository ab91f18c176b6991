"""The head written once per transaction (PostgreSQL migration head_at_commit): a
transaction links its entries to the journal's last entry, and a deferred constraint
trigger brings the head there at commit. Attacks on that: the constraint made immediate,
the follower disabled, the head moved by hand, an entry inserted past the end or without
the head, the ledger's identity changed in the transaction of its first entries, and a
REPEATABLE READ transaction whose snapshot predates the last commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate

psycopg = pytest.importorskip("psycopg")

POST = "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES ('run', 'USER', %s)"


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def head(conn: Any) -> tuple[int, bytes]:
    next_seq, chain = conn.execute("SELECT next_seq, chain_hash FROM cassette_head").fetchone()
    return int(next_seq), bytes(chain)


def tail(conn: Any) -> tuple[int, bytes]:
    """What the head must name: the journal's size and its last link, recomputed here
    from the bodies (not read from the stored hashes)."""
    prev = ZERO_HASH
    rows = conn.execute("SELECT seq, body FROM cassette_journal ORDER BY seq").fetchall()
    for expected, (seq, body) in enumerate(rows):
        assert seq == expected
        prev = chain_hash(seq, prev, leaf_hash(body.encode("utf-8")))
    return len(rows), prev


def refused(conn: Any, code: ErrorCode, sql: str, params: Any = None) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, params)
    assert translate(caught.value).code is code, caught.value


def test_a_batch_moves_the_head_once_at_commit(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    before = head(owner)
    with owner.transaction():
        for n in range(40):
            owner.execute(POST, (f'{{"n":{n}}}',))
        # inside the transaction the journal runs ahead and the head waits for the commit
        assert head(owner) == before
        assert tail(owner)[0] == before[0] + 40
    assert head(owner) == tail(owner)
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_messages(
            [({"jobs": [{"intent": "i", "steps": [{}]}]}, "r", "USER", None)] * 30
        )
    assert head(owner) == tail(owner)
    assert head(owner)[0] == before[0] + 40 + 30 * 3


@pytest.mark.parametrize("role", [None, "cassette_worker"])
def test_an_immediate_constraint_only_moves_the_head_sooner(
    pg_ledger: str, owner: Any, role: str | None
) -> None:
    """SET CONSTRAINTS is open to every session: made immediate, the follower fires after
    each statement instead of at commit, and the head ends where the journal ends."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
    with psycopg.connect(pg_ledger) as conn:
        if role:
            conn.execute(f"SET ROLE {role}")
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        if role:
            conn.execute("SELECT * FROM cassette_claim('run', 'w', 2, 60000)")
        else:
            conn.execute(POST, ('{"a":1}',))
            assert head(conn) == tail(conn)  # moved already, before the commit
            conn.execute(POST, ('{"a":2}',))
        conn.commit()
    assert head(owner) == tail(owner)


def test_a_disabled_follower_shows_in_verify(pg_ledger: str, owner: Any) -> None:
    owner.execute("ALTER TABLE cassette_journal DISABLE TRIGGER cassette_head_follow")
    owner.execute(POST, ('{"a":1}',))
    assert head(owner) != tail(owner)
    with MessageCassette(pg_ledger, read_only=True) as cassette:
        report = cassette.verify_cassette()
    assert {"trigger_disabled", "journal_head"} <= {f.kind.value for f in report.errors}


def test_the_head_moves_only_to_the_journals_last_entry(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
    size, last = tail(owner)
    (earlier,) = owner.execute("SELECT chain_hash FROM cassette_journal WHERE seq = 1").fetchone()
    # back to an earlier entry, with its own link
    refused(
        owner,
        ErrorCode.JOURNAL_BROKEN,
        "UPDATE cassette_head SET next_seq = 2, chain_hash = %s",
        (earlier,),
    )
    # past the end, or the right size with another link
    refused(owner, ErrorCode.JOURNAL_BROKEN, "UPDATE cassette_head SET next_seq = next_seq + 1")
    refused(
        owner,
        ErrorCode.JOURNAL_BROKEN,
        "UPDATE cassette_head SET chain_hash = %s",
        (sha := bytes(32),),
    )
    assert sha != last
    assert head(owner) == (size, last)
    owner.execute("UPDATE cassette_head SET next_seq = %s, chain_hash = %s", (size, last))
    assert head(owner) == (size, last)  # where it is: nothing to refuse


def test_an_entry_needs_the_head_and_the_entry_before_it(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    size, last = tail(owner)
    body = '{"table":"cassette_messages","op":"INSERT","key":9,"row":{}}'
    leaf = leaf_hash(body.encode())
    insert = (
        "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)"
        " VALUES (%s, %s, %s, %s, 'cassette_messages', '9')"
    )
    # right hashes, right place, but the head is not this transaction's
    refused(
        owner, ErrorCode.JOURNAL_BROKEN, insert, (size, body, leaf, chain_hash(size, last, leaf))
    )
    # holding the head: one past the end (linked to nothing the journal has), or at the
    # end linked to the wrong entry
    for seq in (size + 1, size):
        with pytest.raises(psycopg.Error) as caught, owner.transaction():
            owner.execute("SELECT cassette_tx_ms()")
            owner.execute(insert, (seq, body, leaf, chain_hash(seq, ZERO_HASH, leaf)))
        assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert tail(owner) == (size, last) == head(owner)


def test_the_identity_is_fixed_by_entries_not_yet_committed(pg_ledger: str, owner: Any) -> None:
    """The meta guard asked the head whether the ledger was empty; inside the transaction
    of its first entries the head still says 0, so it asks the journal."""
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        owner.execute(POST, ('{"a":1}',))
        owner.execute("UPDATE cassette_meta SET value = repeat('b', 32) WHERE key = 'ledger_id'")
    assert translate(caught.value).code is ErrorCode.APPEND_ONLY
    assert tail(owner) == (0, ZERO_HASH) == head(owner)
    owner.execute("UPDATE cassette_meta SET value = repeat('b', 32) WHERE key = 'ledger_id'")


def test_a_snapshot_older_than_the_last_commit_cannot_append(pg_ledger: str) -> None:
    """REPEATABLE READ keeps the snapshot of a transaction's first statement: one taken
    before another writer's commit would see an older journal's end. Taking the head
    then fails (the head row changed after the snapshot), so it never links to it."""
    with (
        psycopg.connect(pg_ledger) as first,
        psycopg.connect(pg_ledger) as second,
    ):
        first.execute(POST, ('{"a":1}',))  # holds the head
        second.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert second.execute("SELECT count(*) FROM cassette_journal").fetchone()[0] == 0
        first.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            second.execute(POST, ('{"a":2}',))
        second.rollback()
        second.execute(POST, ('{"a":3}',))
        second.commit()
        assert head(first) == tail(first)
        assert tail(first)[0] == 2


@pytest.mark.parametrize("forged_seq", [-1, 0, 5])
def test_a_forged_running_state_between_entries_is_overwritten(
    pg_ledger: str, owner: Any, forged_seq: int
) -> None:
    """A transaction's last entry is named in a transaction-local setting any session can
    set (cassette.tail). Pointing it at an earlier entry (its true chain hash), at none,
    or past the end between two entries changes nothing: the journal's guard places the
    next entry after the journal's last and sets the value anew (0015; before, the next
    entry was refused). It never links anywhere but the end."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")  # entries 0-2
    size, _ = tail(owner)
    with owner.transaction():
        owner.execute(POST, ('{"a":1}',))
        (me,) = owner.execute("SELECT pg_current_xact_id()::text").fetchone()
        if 0 <= forged_seq < size:
            (chain,) = owner.execute(
                "SELECT chain_hash FROM cassette_journal WHERE seq = %s", (forged_seq,)
            ).fetchone()
        else:
            chain = bytes(32)
        owner.execute(
            "SELECT set_config('cassette.tail', %s, true)",
            (f"{me}:{forged_seq}:{bytes(chain).hex()}",),
        )
        owner.execute(POST, ('{"a":2}',))
    assert tail(owner)[0] == size + 2
    assert tail(owner) == head(owner)


def test_a_forged_state_does_not_move_the_head_back(pg_ledger: str, owner: Any) -> None:
    """Set after the transaction's last entry, a forged state naming an earlier entry is
    not followed (the follower takes the later of it and the entry it fires for), and the
    head's guard would refuse it anyway: the head ends at the journal's end."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    (first,) = owner.execute("SELECT chain_hash FROM cassette_journal WHERE seq = 0").fetchone()
    with owner.transaction():
        owner.execute(POST, ('{"a":1}',))
        owner.execute(
            "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':0:' || %s, true)",
            (bytes(first).hex(),),
        )
    assert head(owner) == tail(owner)
    assert head(owner)[0] == 4
