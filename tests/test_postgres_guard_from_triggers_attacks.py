"""The PostgreSQL journal guard attacked from triggers (``sql/postgresql/schema/50_journal.sql``).

The journal's guard repeats checks whose values the append has just computed, and a form
that never landed ran it only at ``WHEN (pg_trigger_depth() = 0)``: an entry
inserted from a trigger was taken to be cassette_journal_append's, "since only the owner
makes triggers, and the owner's DDL is what verify's catalog check reports". But a
temporary table, its trigger and the trigger's function in ``pg_temp`` are any session's
to make (TEMP is PUBLIC's), they are in no catalog verify reads (another session's
temporary objects, gone when it ends), and a trigger on them runs the owner's INSERT at
depth 1. Each test is the owner's session doing DML only (no DDL on a ledger object): what
the guard refuses at depth 0 it must refuse from a trigger too. And two keyed lookups the
first form left planning from statistics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate

from .pg_chain import BODY, head, journal

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql

INSERT_ENTRY = (
    "INSERT INTO public.cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)"
    " VALUES (%s, %s, %s, %s, 'cassette_messages', '99')"
)


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def from_a_temporary_trigger(conn: Any, statement: str) -> None:
    """Run ``statement`` (no parameters) from a row trigger on a temporary table: the
    session's own objects, in pg_temp, that no catalog check of another session sees."""
    conn.execute("CREATE TEMP TABLE poke (x int)")
    conn.execute(
        "CREATE FUNCTION pg_temp.poked() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
        + statement
        + "; RETURN NULL; END $f$"
    )
    conn.execute(
        "CREATE TRIGGER poked AFTER INSERT ON pg_temp.poke"
        " FOR EACH ROW EXECUTE FUNCTION pg_temp.poked()"
    )


def literal(conn: Any, seq: int, leaf: bytes, chain: bytes) -> str:
    """The entry INSERT with its values spelled out (a trigger body takes no parameters)."""
    return str(
        psycopg.sql.SQL(INSERT_ENTRY.replace("%s", "{}"))
        .format(
            psycopg.sql.Literal(seq),
            psycopg.sql.Literal(BODY),
            psycopg.sql.Literal(leaf),
            psycopg.sql.Literal(chain),
        )
        .as_string(conn)
    )


def refused(conn: Any, statement: str, *, from_trigger: bool, take_head: bool) -> ErrorCode:
    """Run ``statement`` in one transaction, after taking the head (as the owner may) if
    ``take_head``, directly or from a temporary trigger; the code it was refused with."""
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        if take_head:
            conn.execute("SELECT cassette_tx_ms()")
        if from_trigger:
            from_a_temporary_trigger(conn, statement)
            conn.execute("INSERT INTO poke VALUES (1)")
        else:
            conn.execute(statement)
    return translate(caught.value).code


@pytest.mark.parametrize("from_trigger", [False, True], ids=["directly", "from a temp trigger"])
def test_an_entry_whose_hashes_are_not_its_bodys(owner: Any, from_trigger: bool) -> None:
    """The owner holds the head (its own stamp) and appends an entry at the next seq whose
    leaf and chain hashes are not computed from its body. Before the fix the guard did not
    run for it from a trigger: it was stored and the follower moved the head onto a chain
    hash nothing computes (only verify would tell)."""
    before, at = journal(owner), head(owner)
    seq = len(before)
    forged = bytes(range(32))
    statement = literal(owner, seq, forged, forged)
    code = refused(owner, statement, from_trigger=from_trigger, take_head=True)
    assert code is ErrorCode.JOURNAL_BROKEN
    assert journal(owner) == before
    assert head(owner) == at


@pytest.mark.parametrize("from_trigger", [False, True], ids=["directly", "from a temp trigger"])
def test_an_entry_without_the_head(owner: Any, from_trigger: bool) -> None:
    """A true entry at the next seq, from a transaction that did not take the head (another
    transaction may hold it and be appending at the same seq): refused."""
    before, at = journal(owner), head(owner)
    seq = len(before)
    prev = before[-1][2] if before else ZERO_HASH
    leaf = leaf_hash(BODY.encode())
    statement = literal(owner, seq, leaf, chain_hash(seq, prev, leaf))
    code = refused(owner, statement, from_trigger=from_trigger, take_head=False)
    assert code is ErrorCode.JOURNAL_BROKEN
    assert journal(owner) == before
    assert head(owner) == at


def test_an_entry_past_the_next_seq(owner: Any) -> None:
    """A gap: the owner holds the head and appends a true entry two seqs past the next one.
    Before the fix, from a trigger, it was stored and the follower moved the head to it
    (the head's guard accepts any move forward onto the journal's last entry)."""
    before, at = journal(owner), head(owner)
    seq = len(before) + 2
    leaf = leaf_hash(BODY.encode())
    statement = literal(owner, seq, leaf, chain_hash(seq, before[-1][2], leaf))
    for from_trigger in (False, True):
        code = refused(owner, statement, from_trigger=from_trigger, take_head=True)
        assert code is ErrorCode.JOURNAL_BROKEN
    assert journal(owner) == before
    assert head(owner) == at


def test_a_tail_forged_for_an_entry_from_a_trigger(owner: Any) -> None:
    """The owner names its own forged entry in cassette.tail with a chain hash of its
    choosing: until 0017 the follower would have moved the head onto that hash. Refused
    (the entry's hashes are not its body's; the setting is read by nothing since 0017)."""
    before = journal(owner)
    seq = len(before)
    forged = bytes(range(32))
    statement = (
        "PERFORM set_config('cassette.tail', pg_current_xact_id()::text || ':"
        + str(seq)
        + ":' || repeat('ab', 32), true); "
        + literal(owner, seq, forged, forged)
    )
    code = refused(owner, statement, from_trigger=True, take_head=True)
    assert code is ErrorCode.JOURNAL_BROKEN
    assert journal(owner) == before


def test_the_append_from_a_temporary_trigger_still_journals(owner: Any) -> None:
    """What the fix must not refuse: the owner's journaled write from a temporary trigger
    (depth 2 for the append) is journaled as from a client, after the journal's last entry."""
    before = journal(owner)
    with owner.transaction():
        from_a_temporary_trigger(
            owner,
            "INSERT INTO public.cassette_messages (run_id, source, payload_json)"
            " VALUES ('run', 'USER', '{}')",
        )
        owner.execute("INSERT INTO poke VALUES (1)")
    after = journal(owner)
    assert len(after) == len(before) + 1
    seq, body, chain = after[-1]
    assert (seq, chain) == (
        before[-1][0] + 1,
        chain_hash(seq, before[-1][2], leaf_hash(body.encode())),
    )


# ------------------------------------------------- plans that statistics cannot steer


def seq_scans(owner: Any, session: Any, table: str) -> int:
    """Sequential scans of ``table`` so far, ``session``'s own flushed first."""
    session.execute("SELECT pg_stat_force_next_flush()")
    owner.execute("SELECT pg_stat_force_next_flush()")
    row = owner.execute(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = %s", (table,)
    ).fetchone()
    return int(row[0])


@pytest.fixture
def analyzed(pg_ledger: str) -> Iterator[Any]:
    """The owner's session on a ledger of 40 PENDING steps, analyzed while small."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"n": n} for n in range(40)]}]}, "run", "USER"
        )
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        yield conn


def test_the_lease_due_check_a_worker_calls_reads_steps_by_key(
    pg_ledger: str, analyzed: Any
) -> None:
    """cassette_run_has_lease_due, granted to the worker and called by the package before
    a requeue, is a SQL function with its own search_path (so planned at every call, from
    the statistics), like the PENDING check 0014 fixed: it scanned every step of every run.
    It plans like the law's other functions, over (run_id, status)."""
    with psycopg.connect(pg_ledger, autocommit=True) as worker:
        worker.execute("SET ROLE cassette_worker")
        worker.execute("SELECT step_id FROM cassette_claim('run', 'w', 5, 60000)")
        before = seq_scans(analyzed, worker, "cassette_steps")
        for _ in range(10):
            (due,) = worker.execute("SELECT cassette_run_has_lease_due('run')").fetchone()
            assert due is False
        assert seq_scans(analyzed, worker, "cassette_steps") == before


def test_a_release_by_hand_reads_attestations_by_key(analyzed: Any) -> None:
    """The owner's release by hand runs the releases' signature trigger, the one trigger
    function with a keyed lookup (its lease's claim attestation) that 0014's first form left
    planning from the statistics (its receipts twin is set): it scanned the attestations."""
    before = seq_scans(analyzed, analyzed, "cassette_attestations")
    for _ in range(10):
        step, token = analyzed.execute(
            "SELECT step_id, fencing_token FROM cassette_claim('run', 'w', 1, 60000)"
        ).fetchone()
        analyzed.execute(
            "INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token)"
            " VALUES (%s, 'run', 'w', %s)",
            (step, token),
        )
    assert seq_scans(analyzed, analyzed, "cassette_attestations") == before
