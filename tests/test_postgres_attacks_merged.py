"""The merged PostgreSQL law attacked where its parts meet (issue 15, second attack pass).

Migrations 0007 (worker keys: cassette_signer_context, cassette_attest), 0008
(cassette_append_time) and 0009 (head at commit: the transaction-local `cassette.tail`,
the deferred `cassette_head_follow`) were written apart. Each test is one attempt by a
raw psycopg session, as the owner (the test cluster's superuser) or under a ledger role,
and says what happened: refused with a code (nothing written), or accepted and then what
`verify` reports. Savepoints, immediate constraints, forged settings, old snapshots, a
second session holding the head, prepared transactions, attestations planted for another
worker and shadowing temporary tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.verify import verify_path

psycopg = pytest.importorskip("psycopg")

# One message of one job of one step, as cassette_post writes it (a bare message row
# would be verify's empty_message).
POST = (
    "SELECT message_id FROM cassette_post('run', 'USER', NULL, %s, ARRAY['i'], ARRAY[1],"
    " ARRAY['{}'])"
)
SIGNATURE = "A" * 86 + "=="


@pytest.fixture
def seeded(pg_ledger: str) -> str:
    """A ledger with one message of two steps, the first leased by worker w (token 1)."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
        cassette.claim_step("run", "w", ttl_seconds=60)
    return pg_ledger


def connect(url: str, role: str | None = None) -> Any:
    conn = psycopg.connect(url, autocommit=True)
    if role is not None:
        conn.execute(f"SET ROLE {role}")
    return conn


@pytest.fixture
def owner(seeded: str) -> Iterator[Any]:
    with connect(seeded) as conn:
        yield conn


@pytest.fixture
def worker(seeded: str) -> Iterator[Any]:
    with connect(seeded, "cassette_worker") as conn:
        yield conn


def head(conn: Any) -> tuple[int, bytes]:
    next_seq, chain = conn.execute("SELECT next_seq, chain_hash FROM cassette_head").fetchone()
    return int(next_seq), bytes(chain)


def tail(conn: Any) -> tuple[int, bytes]:
    """The journal's size and last link, recomputed here from the bodies."""
    prev = ZERO_HASH
    rows = conn.execute("SELECT seq, body FROM cassette_journal ORDER BY seq").fetchall()
    for expected, (seq, body) in enumerate(rows):
        assert seq == expected
        prev = chain_hash(seq, prev, leaf_hash(body.encode("utf-8")))
    return len(rows), prev


def findings(url: str, **options: Any) -> set[str]:
    return {f.kind.value for f in verify_path(url, **options).errors}


def assert_whole(url: str, conn: Any) -> None:
    """The head names the journal's end, every link is its body's, verify is clean."""
    assert head(conn) == tail(conn)
    assert findings(url) == set()


def code_of(error: BaseException) -> ErrorCode:
    assert isinstance(error, psycopg.Error), error
    return translate(error).code


# ------------------------------------------------------------ savepoints and the follower


def test_entries_of_a_rolled_back_savepoint_leave_no_trace(seeded: str, owner: Any) -> None:
    """Entries written in a savepoint, then ROLLBACK TO SAVEPOINT: their seqs, the
    running state (cassette.tail) and the follower's pending events go with them, and
    the transaction's later entries take the same seqs."""
    size, _ = tail(owner)
    with owner.transaction():
        owner.execute(POST, ('{"kept":1}',))
        with pytest.raises(psycopg.Error), owner.transaction():
            owner.execute(POST, ('{"dropped":1}',))
            owner.execute(POST, ('{"dropped":2}',))
            raise psycopg.errors.RaiseException("roll back to the savepoint")
        owner.execute(POST, ('{"kept":2}',))
    bodies = [
        b for (b,) in owner.execute("SELECT body FROM cassette_journal WHERE seq >= %s", (size,))
    ]
    assert len(bodies) == 6  # two posts of three rows each
    assert not any("dropped" in b for b in bodies)
    assert_whole(seeded, owner)


def test_an_immediate_follower_in_a_rolled_back_savepoint_fires_again(
    seeded: str, owner: Any
) -> None:
    """SET CONSTRAINTS ALL IMMEDIATE inside a savepoint fires the follower for entries
    written before it; rolling the savepoint back undoes that head move, and the server
    marks those events pending again, so the commit still moves the head."""
    before = head(owner)
    with owner.transaction():
        owner.execute(POST, ('{"a":1}',))
        with pytest.raises(psycopg.Error), owner.transaction():
            owner.execute("SET CONSTRAINTS ALL IMMEDIATE")
            assert head(owner)[0] == before[0] + 3  # moved inside the savepoint
            raise psycopg.errors.RaiseException("roll back to the savepoint")
        assert head(owner) == before  # the move rolled back with it
    assert head(owner)[0] == before[0] + 3
    assert_whole(seeded, owner)


def test_a_worker_claims_again_after_a_rolled_back_claim(seeded: str, worker: Any) -> None:
    """cassette_signer_context() takes the head at the transaction's start; a claim in a
    savepoint rolled back and made again, with the constraint immediate, commits one
    lease and one journal entry run."""
    with worker.transaction():
        worker.execute("SELECT * FROM cassette_signer_context()")
        worker.execute("SET CONSTRAINTS ALL IMMEDIATE")
        with pytest.raises(psycopg.Error), worker.transaction():
            worker.execute("SELECT * FROM cassette_claim('run', 'x', 1, 60000)")
            raise psycopg.errors.RaiseException("roll back to the savepoint")
        (token,) = worker.execute(
            "SELECT fencing_token FROM cassette_claim('run', 'x', 1, 60000)"
        ).fetchone()
    assert token == 1
    assert_whole(seeded, worker)


def test_a_worker_pointing_the_tail_at_a_real_entry_is_refused(seeded: str, worker: Any) -> None:
    """`cassette.tail` set by the worker to a real earlier entry (its true link) before
    its first write: the post would link after that entry, at a seq that is taken."""
    size, last = tail(worker)
    (chain,) = worker.execute("SELECT chain_hash FROM cassette_journal WHERE seq = 1").fetchone()
    with pytest.raises(psycopg.Error) as caught, worker.transaction():
        worker.execute(
            "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':1:' || %s, true)",
            (bytes(chain).hex(),),
        )
        worker.execute(POST, ('{"x":1}',))
    assert code_of(caught.value) is ErrorCode.JOURNAL_BROKEN
    assert tail(worker) == (size, last) == head(worker)


def test_a_tail_forged_between_the_last_entry_and_the_commit(seeded: str, worker: Any) -> None:
    """The worker writes, then names a later seq with its own entry's link in the
    setting before COMMIT: the follower's move is checked by the head's guard."""
    size, last = tail(worker)
    with pytest.raises(psycopg.Error) as caught, worker.transaction():
        worker.execute(POST, ('{"x":1}',))
        (chain,) = worker.execute(
            "SELECT chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        worker.execute(
            "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':' || %s || ':'"
            " || %s, true)",
            (size + 40, bytes(chain).hex()),
        )
    assert code_of(caught.value) is ErrorCode.JOURNAL_BROKEN
    assert tail(worker) == (size, last) == head(worker)


# ------------------------------------------------------------------- other sessions


def test_an_append_time_from_an_old_snapshot_is_busy(seeded: str) -> None:
    """The appender's REPEATABLE READ transaction whose snapshot predates a commit
    cannot take the head (cassette_append_time): BUSY, and it writes nothing."""
    with connect(seeded, "cassette_appender") as appender, connect(seeded) as other:
        appender.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        appender.execute("SELECT 1 FROM cassette_journal LIMIT 1")  # the snapshot
        other.execute(POST, ('{"later":1}',))
        with pytest.raises(psycopg.Error) as caught:
            appender.execute("SELECT cassette_append_time()")
        appender.execute("ROLLBACK")
        assert code_of(caught.value) is ErrorCode.BUSY
        assert_whole(seeded, other)


def test_a_seal_waits_for_the_session_holding_the_head(seeded: str) -> None:
    """A worker holds the head (signer context, then a post not yet committed); the
    owner's seal waits for it (BUSY under a lock timeout) instead of sealing a root the
    worker's commit would leave behind; after the commit the seal covers its entries."""
    with connect(seeded, "cassette_worker") as holder, connect(seeded) as sealer:
        holder.execute("BEGIN")
        holder.execute("SELECT * FROM cassette_signer_context()")
        holder.execute(POST, ('{"held":1}',))
        sealer.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.Error) as caught:
            sealer.execute(
                "INSERT INTO cassette_seals (tree_size, root_hex, key_id, origin, note)"
                " VALUES (1, repeat('0', 64), '00000000', 'o', E'o\\n1\\n')"
            )
        assert code_of(caught.value) is ErrorCode.BUSY
        holder.execute("COMMIT")
    with MessageCassette(seeded) as cassette:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        sealed = cassette.seal(Ed25519PrivateKey.generate())
    with connect(seeded) as conn:
        assert sealed.tree_size == tail(conn)[0] - 1
        assert_whole(seeded, conn)


def test_a_prepared_transaction_cannot_keep_the_head(seeded: str, worker: Any) -> None:
    """PREPARE TRANSACTION would keep the head's lock past the session's end; the
    server refuses it (max_prepared_transactions is 0) and the transaction rolls back."""
    worker.execute("BEGIN")
    worker.execute(POST, ('{"x":1}',))
    with pytest.raises(psycopg.Error) as caught:
        worker.execute("PREPARE TRANSACTION 'keep-the-head'")
    assert "prepared transactions are disabled" in str(caught.value)
    worker.execute("ROLLBACK")
    assert not worker.execute("SELECT 1 FROM pg_prepared_xacts").fetchall()
    assert_whole(seeded, worker)


# ------------------------------------------------------------------ the ledger's id


def ledger_id(conn: Any) -> str:
    (value,) = conn.execute("SELECT value FROM cassette_meta WHERE key = 'ledger_id'").fetchone()
    return str(value)


@pytest.mark.xfail(
    strict=True,
    reason="the meta guard counts the journal in the caller's snapshot and does not take "
    "the head: the id changes after the first entries, and verify (no seal) is clean",
)
def test_the_ledger_id_changed_from_a_snapshot_older_than_the_first_entries(
    pg_ledger: str,
) -> None:
    """The owner's REPEATABLE READ transaction, whose snapshot saw an empty journal,
    replaces the ledger_id after another session committed the first entries."""
    with connect(pg_ledger) as attacker, connect(pg_ledger) as other:
        before = ledger_id(other)
        attacker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        attacker.execute("SELECT count(*) FROM cassette_journal")  # empty, in the snapshot
        other.execute(POST, ('{"first":1}',))
        try:
            attacker.execute(
                "UPDATE cassette_meta SET value = repeat('b', 32) WHERE key = 'ledger_id'"
            )
            attacker.execute("COMMIT")
        except psycopg.Error as error:
            attacker.execute("ROLLBACK")
            assert code_of(error) in {ErrorCode.BUSY, ErrorCode.APPEND_ONLY}
        assert ledger_id(other) == before, "the ledger's id changed after its first entry"
        assert_whole(pg_ledger, other)


@pytest.mark.xfail(
    strict=True,
    reason="the meta guard counts the journal in the caller's snapshot and does not take "
    "the head: the id changes after the first entries, and verify (no seal) is clean",
)
def test_the_ledger_id_changed_while_a_signer_writes(pg_ledger: str) -> None:
    """The owner replaces the ledger_id of an empty ledger (allowed) and has not yet
    committed; a signing worker takes the head, reads the id it signs under
    (cassette_signer_context) and commits its first entries; the owner commits. The
    worker's statements name an id the ledger no longer has."""
    with connect(pg_ledger) as attacker, connect(pg_ledger, "cassette_worker") as signer:
        attacker.execute("BEGIN")
        attacker.execute("UPDATE cassette_meta SET value = repeat('b', 32) WHERE key = 'ledger_id'")
        signer.execute("SET lock_timeout = '300ms'")
        signed_under = None
        try:
            with signer.transaction():
                (_, signed_under) = signer.execute(
                    "SELECT * FROM cassette_signer_context()"
                ).fetchone()
                signer.execute(POST, ('{"first":1}',))
        except psycopg.Error as error:
            assert code_of(error) is ErrorCode.BUSY  # it waited for the owner's head
            signed_under = None
        attacker.execute("COMMIT")
        if signed_under is None:  # refused while the id was moving: sign again now
            with signer.transaction():
                (_, signed_under) = signer.execute(
                    "SELECT * FROM cassette_signer_context()"
                ).fetchone()
                signer.execute(POST, ('{"first":1}',))
        assert signed_under == ledger_id(attacker), "signed under an id the ledger no longer has"
        assert_whole(pg_ledger, attacker)
