"""The head of a PostgreSQL ledger: the chain's lock and the ledger's clock (migration
0017; from 0009 to 0016 it also kept a copy of the journal's end, moved at every commit).

A transaction takes the head at its first journaled write and holds it to its commit;
the journal's guard places each entry after the journal's last. Attacks: an entry without
the head or in the wrong place, the head's stamp and clock moved by hand, a setting any
session can set, the ledger's identity changed in the transaction of its first entries, a
REPEATABLE READ snapshot older than the last commit, and a journal cut short with its
rows by an owner who turned the triggers off and on again (verify cannot see that cut
without a seal made before it; with one, it is ``truncated``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate

from .pg_chain import journal_end

psycopg = pytest.importorskip("psycopg")

POST = "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES ('run', 'USER', %s)"


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def refused(conn: Any, code: ErrorCode, sql: str, params: Any = None) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, params)
    assert translate(caught.value).code is code, caught.value


def verified(url: str, **options: Any) -> set[str]:
    """The kinds of verify's errors (with ``options``: seal files, key and origin)."""
    from catalytic_cassette.verify import verify_path

    report = verify_path(url, **options)
    return {f.kind.value for f in report.errors}


def test_a_batch_is_one_whole_chain(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    size, _ = journal_end(owner)
    with owner.transaction():
        for n in range(40):
            owner.execute(POST, (f'{{"n":{n}}}',))
        assert journal_end(owner)[0] == size + 40  # the transaction sees its own entries
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_messages(
            [({"jobs": [{"intent": "i", "steps": [{}]}]}, "r", "USER", None)] * 30
        )
    assert journal_end(owner)[0] == size + 40 + 30 * 3
    assert verified(pg_ledger) == {"empty_message"}  # (the raw posts have no job)


def test_an_entry_needs_the_head_and_the_entry_before_it(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    size, last = journal_end(owner)
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
    assert journal_end(owner) == (size, last)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("tx = '1'::xid8", ErrorCode.JOURNAL_BROKEN),  # stamped for another transaction
        ("time_ms = time_ms - 1", ErrorCode.TIME_BACKWARDS),
        ("clock_offset_ms = clock_offset_ms - 1", ErrorCode.TIME_BACKWARDS),
    ],
)
def test_the_heads_stamp_and_clock_by_hand(
    pg_ledger: str, owner: Any, change: str, code: ErrorCode
) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    owner.execute("SELECT cassette_advance_clock(5)")  # an offset to move back
    before = owner.execute("SELECT time_ms, tx, clock_offset_ms FROM cassette_head").fetchone()
    refused(owner, code, f"UPDATE cassette_head SET {change}")
    assert (
        owner.execute("SELECT time_ms, tx, clock_offset_ms FROM cassette_head").fetchone() == before
    )


def test_the_head_is_one_row(pg_ledger: str, owner: Any) -> None:
    refused(owner, ErrorCode.JOURNAL_BROKEN, "DELETE FROM cassette_head")
    refused(
        owner,
        ErrorCode.JOURNAL_BROKEN,
        "INSERT INTO cassette_head (one, time_ms) VALUES (true, 0)",
    )
    assert owner.execute("SELECT count(*) FROM cassette_head").fetchone() == (1,)


def test_the_identity_is_fixed_by_entries_not_yet_committed(pg_ledger: str, owner: Any) -> None:
    """The ledger's identity is fixed once the journal has an entry, committed or the
    transaction's own: the meta guard asks the journal."""
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        owner.execute(POST, ('{"a":1}',))
        owner.execute("UPDATE cassette_meta SET value = repeat('b', 32) WHERE key = 'ledger_id'")
    assert translate(caught.value).code is ErrorCode.APPEND_ONLY
    assert journal_end(owner) == (0, ZERO_HASH)
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
        assert journal_end(first)[0] == 2


@pytest.mark.parametrize("when", ["before", "between", "after"])
def test_the_old_running_state_setting_is_read_by_nothing(
    pg_ledger: str, owner: Any, when: str
) -> None:
    """cassette.tail, any session's to set, named a transaction's last entry until 0017.
    Set to a forged value (an earlier entry's true link) before, between or after a
    transaction's entries, it changes nothing: the chain stays whole and verify clean."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")  # entries 0-2
    size, _ = journal_end(owner)
    (first,) = owner.execute("SELECT chain_hash FROM cassette_journal WHERE seq = 0").fetchone()
    forge = "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':0:' || %s, true)"
    with owner.transaction():
        if when == "before":
            owner.execute(forge, (bytes(first).hex(),))
        owner.execute(POST, ('{"a":1}',))
        if when == "between":
            owner.execute(forge, (bytes(first).hex(),))
        owner.execute(POST, ('{"a":2}',))
        if when == "after":
            owner.execute(forge, (bytes(first).hex(),))
    assert journal_end(owner)[0] == size + 2
    assert verified(pg_ledger) == {"empty_message"}  # (the raw posts have no job)


def test_a_tail_cut_with_its_rows_is_caught_by_a_seal_only(
    pg_ledger: str, owner: Any, tmp_path: Path
) -> None:
    """The owner turns the append-only triggers off, removes the last message with its
    journal entries and the seal row that covered them, and turns the triggers on, in one
    transaction (the catalog keeps no trace). What is left is a shorter ledger consistent
    in itself: verify alone says nothing (nor did the head before 0017 for an owner who
    moved it back too). A seal file kept outside the ledger says the journal was cut."""
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.seals import ORIGIN_PREFIX, AutoSeal

    key = Ed25519PrivateKey.generate()
    seals = tmp_path / "seals"
    seals.mkdir()
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    with MessageCassette(pg_ledger, auto_seal=AutoSeal(key, seals, every=1000)) as cassette:
        cassette.post_message({"x": 2}, "run", "USER")  # entries 3-5, sealed at close
    (message_id,) = owner.execute("SELECT max(message_id) FROM cassette_messages").fetchone()
    tables = ["cassette_journal", "cassette_seals", "cassette_steps", "cassette_jobs"]
    tables.append("cassette_messages")
    with owner.transaction():
        for table in tables:
            owner.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        owner.execute("DELETE FROM cassette_journal WHERE seq >= 3")
        owner.execute("DELETE FROM cassette_seals")
        for table in tables[2:]:  # the message's step, job and row
            owner.execute(f"DELETE FROM {table} WHERE message_id = %s", (message_id,))
        for table in tables:
            owner.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
    assert journal_end(owner)[0] == 3
    assert verified(pg_ledger) == set()
    (ledger_id,) = owner.execute(
        "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
    ).fetchone()
    anchored = verified(
        pg_ledger,
        anchors=load_anchors(seals),
        seal_key=key.public_key(),
        origin=ORIGIN_PREFIX + ledger_id,
    )
    assert "truncated" in anchored
