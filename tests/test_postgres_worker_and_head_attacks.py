"""The PostgreSQL law attacked where its parts meet: worker keys (cassette_signer_context,
cassette_attest, ``sql/postgresql/schema/60_worker_keys.sql``), the append time and the
head (``10_ledger.sql``, ``50_journal.sql``). Each test
is one attempt by a raw psycopg session, as the owner (the test cluster's superuser) or
under a ledger role, and says what happened: refused with a code (nothing written), or
accepted and then what `verify` reports. Savepoints, immediate constraints, forged
settings, old snapshots, a second session holding the head, prepared transactions,
attestations planted for another worker and shadowing temporary tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.hashing import chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.verify import verify_path

from .pg_chain import journal_end

psycopg = pytest.importorskip("psycopg")

# One message of one job of one step, as cassette_post writes it (a bare message row
# would be verify's empty_message).
POST = (
    "SELECT message_id FROM cassette_post('run', 'USER', NULL, %s, ARRAY['i'], ARRAY[1],"
    " ARRAY['{}'])"
)
RAW_POST = "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES ('run', 'USER', %s)"
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


def findings(url: str, **options: Any) -> set[str]:
    return {f.kind.value for f in verify_path(url, **options).errors}


def assert_whole(url: str, conn: Any) -> None:
    """Every entry at its seq, every link its body's, verify clean."""
    journal_end(conn)
    assert findings(url) == set()


def code_of(error: BaseException) -> ErrorCode:
    assert isinstance(error, psycopg.Error), error
    return translate(error).code


# ---------------------------------------------------------------------- savepoints


def test_entries_of_a_rolled_back_savepoint_leave_no_trace(seeded: str, owner: Any) -> None:
    """Entries written in a savepoint, then ROLLBACK TO SAVEPOINT: their seqs go with
    them, and the transaction's later entries take the same seqs."""
    size, _ = journal_end(owner)
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


def test_a_worker_claims_again_after_a_rolled_back_claim(seeded: str, worker: Any) -> None:
    """cassette_signer_context() takes the head at the transaction's start; a claim in a
    savepoint rolled back and made again (with the constraints made immediate, which
    moved the head until 0017) commits one lease and one journal entry run."""
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


def test_a_worker_pointing_the_tail_at_a_real_entry_is_overwritten(
    seeded: str, worker: Any
) -> None:
    """`cassette.tail` set by the worker to a real earlier entry (its true link) before
    its first write: the journal's guard does not read it (0015) and places the post's
    entries after the journal's last, as ever (from 0009 to 0015 the post linked after
    that entry, at a seq that is taken, and was refused JOURNAL_BROKEN)."""
    size, _ = journal_end(worker)
    (chain,) = worker.execute("SELECT chain_hash FROM cassette_journal WHERE seq = 1").fetchone()
    with worker.transaction():
        worker.execute(
            "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':1:' || %s, true)",
            (bytes(chain).hex(),),
        )
        worker.execute(POST, ('{"x":1}',))
    assert journal_end(worker)[0] > size
    assert_whole(seeded, worker)


def test_a_tail_forged_between_the_last_entry_and_the_commit(seeded: str, worker: Any) -> None:
    """The worker writes, then names a later seq with its own entry's link in the
    setting before COMMIT: until 0017 the follower read it at the commit (and the head's
    guard refused the move, JOURNAL_BROKEN); now nothing reads it and the post commits."""
    size, _ = journal_end(worker)
    with worker.transaction():
        worker.execute(POST, ('{"x":1}',))
        (chain,) = worker.execute(
            "SELECT chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        worker.execute(
            "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':' || %s || ':'"
            " || %s, true)",
            (size + 40, bytes(chain).hex()),
        )
    assert journal_end(worker)[0] == size + 3
    assert_whole(seeded, worker)


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
        assert sealed.tree_size == journal_end(conn)[0] - 1
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


def test_the_ledger_id_changed_from_a_snapshot_older_than_the_first_entries(
    pg_ledger: str,
) -> None:
    """The owner's REPEATABLE READ transaction, whose snapshot saw an empty journal,
    replaces the ledger_id after another session committed the first entries. Before
    migration 0010 the meta guard counted the journal in that snapshot: accepted, and
    verify (no seal) was clean. Now the replacement locks the head first: BUSY."""
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


def test_the_ledger_id_changed_while_a_signer_writes(pg_ledger: str) -> None:
    """The owner replaces the ledger_id of an empty ledger (allowed) and has not yet
    committed; a signing worker takes the head, reads the id it signs under
    (cassette_signer_context) and commits its first entries; the owner commits. The
    worker's statements named an id the ledger no longer has, and verify (no seal) was
    clean. Since migration 0010 the replacement holds the head's lock to its commit: the
    signer waits (BUSY under its lock timeout), then signs under the new id."""
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


# ------------------------------------------------------------- what each role may call

ROLE_CALLS = [
    ("cassette_worker", "SELECT cassette_append_time()"),
    ("cassette_appender", "SELECT * FROM cassette_signer_context()"),
    (
        "cassette_appender",
        f"SELECT cassette_attest('claim', 'run', NULL, 2, 1, 'w', repeat('0', 16), '{SIGNATURE}')",
    ),
    ("cassette_auditor", "SELECT cassette_append_time()"),
    ("cassette_auditor", "SELECT * FROM cassette_signer_context()"),
    ("cassette_worker", "SELECT * FROM cassette_head FOR KEY SHARE"),
    ("cassette_auditor", "SELECT * FROM cassette_head FOR UPDATE"),
    ("cassette_worker", "SET session_replication_role = replica"),
    ("cassette_worker", "ALTER TABLE cassette_journal DISABLE TRIGGER cassette_journal_guard"),
]


@pytest.mark.parametrize(("role", "sql"), ROLE_CALLS, ids=[f"{r}:{s[:40]}" for r, s in ROLE_CALLS])
def test_a_role_calls_only_its_own_functions(seeded: str, role: str, sql: str) -> None:
    """Another role's definer function, a row lock on the head (it would hold every
    writer without writing), skipping triggers by replication role, or disabling the
    journal's guard: PERMISSION_DENIED, nothing written."""
    with connect(seeded, role) as conn:
        before = journal_end(conn)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        assert code_of(caught.value) is ErrorCode.PERMISSION_DENIED, caught.value
        assert journal_end(conn) == before


def test_an_appender_forging_the_tail_after_taking_the_time(seeded: str) -> None:
    """cassette_append_time() takes the head; a forged tail (an earlier real entry) set
    then is overwritten by the action's entry (0015: the guard places it after the
    journal's last; from 0009 to 0015 the entry was refused, JOURNAL_BROKEN)."""
    with connect(seeded, "cassette_appender") as appender:
        size, _ = journal_end(appender)
        (chain,) = appender.execute(
            "SELECT chain_hash FROM cassette_journal WHERE seq = 0"
        ).fetchone()
        with appender.transaction():
            appender.execute("SELECT cassette_append_time()")
            appender.execute(
                "SELECT set_config('cassette.tail', pg_current_xact_id()::text || ':0:' || %s,"
                " true)",
                (bytes(chain).hex(),),
            )
            appender.execute(
                "SELECT * FROM cassette_append_action(%s, NULL, %s, %s, 's', 'InternalStep', 'f',"
                " '[]', NULL, '{}', NULL, 1, NULL, 0, 0, '{}', NULL, NULL, NULL)",
                (str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())),
            )
        assert journal_end(appender)[0] == size + 1
        assert_whole(seeded, appender)


# ------------------------------------------------------------ attestations, temp tables


def test_a_claim_attested_under_another_workers_name(seeded: str, worker: Any) -> None:
    """A worker attests a claim of the next step under the victim's name with a key and
    signature of the right shape (SQL checks only the shape). The victim then claims the
    step unsigned and cannot complete it (SIGNATURE_REQUIRED): the planted attestation
    makes its lease a signed one. Verify without pinned keys is clean; with the workers'
    keys pinned it names the statement (the signature is verify's to check, LAW 6b)."""
    worker.execute(
        "SELECT cassette_attest('claim', 'run', NULL, 2, 1, 'victim', repeat('0', 16), %s)",
        (SIGNATURE,),
    )
    (token,) = worker.execute(
        "SELECT fencing_token FROM cassette_claim('run', 'victim', 1, 60000)"
    ).fetchone()
    with pytest.raises(psycopg.Error) as caught:
        worker.execute(
            "SELECT cassette_complete('run', 2, 'victim', %s, 'SUCCESS', '{}')", (token,)
        )
    assert code_of(caught.value) is ErrorCode.SIGNATURE_REQUIRED
    assert findings(seeded) == set()
    assert findings(seeded, worker_keys={}) == {"unknown_key"}


def test_temporary_tables_do_not_shadow_the_workers_functions(seeded: str, worker: Any) -> None:
    """The worker (TEMP is PUBLIC's) makes a temporary cassette_head and cassette_journal
    and puts pg_temp first: its definer functions pin `public, pg_temp`, so the post goes
    to the ledger's journal and takes the ledger's head."""
    size, _ = journal_end(worker)
    worker.execute("CREATE TEMP TABLE cassette_journal (LIKE public.cassette_journal)")
    worker.execute("CREATE TEMP TABLE cassette_head AS SELECT * FROM public.cassette_head")
    worker.execute("SET search_path = pg_temp, public")
    worker.execute(POST, ('{"x":1}',))
    assert worker.execute("SELECT count(*) FROM pg_temp.cassette_journal").fetchone() == (0,)
    worker.execute("DROP TABLE pg_temp.cassette_journal, pg_temp.cassette_head")
    worker.execute("SET search_path = public")
    assert journal_end(worker)[0] == size + 3
    assert_whole(seeded, worker)


def test_an_owners_temporary_journal_no_longer_swallows_entries(seeded: str, owner: Any) -> None:
    """The owner's own writes run the trigger functions (not definers) under the owner's
    search_path: with a temporary cassette_journal first, a raw row's entry went to the
    temporary table and the ledger's rows outran its journal (verify: unjournaled_row).
    Since migration 0016 every such function pins search_path = public, pg_temp: the
    entry goes to the ledger's journal whatever the session's path
    (tests/test_postgres_temporary_shadow_attacks.py has the guard's and the row rules' forms)."""
    size, _ = journal_end(owner)
    owner.execute(
        "CREATE TEMP TABLE cassette_journal AS SELECT * FROM public.cassette_journal WITH NO DATA"
    )
    owner.execute("SET search_path = pg_temp, public")
    owner.execute(RAW_POST, ('{"x":1}',))
    assert owner.execute("SELECT count(*) FROM pg_temp.cassette_journal").fetchone() == (0,)
    owner.execute("DROP TABLE pg_temp.cassette_journal")
    owner.execute("SET search_path = public")
    assert journal_end(owner)[0] == size + 1  # the ledger's journal got it, whole
    assert "unjournaled_row" not in findings(seeded)


def test_an_owners_entry_without_a_row(seeded: str, owner: Any) -> None:
    """The owner stamps the head with its own transaction and inserts an entry with
    true hashes whose body names a message no table holds: the journal's guard accepts
    it (it checks links, not rows); verify compares the rows with the journal."""
    size, last = journal_end(owner)
    body = (
        '{"table":"cassette_messages","op":"INSERT","key":99,"row":{"message_id":99,'
        '"run_id":"run","source":"USER","idempotency_key":null,"payload_json":"{}",'
        '"created_at":1}}'
    )
    leaf = leaf_hash(body.encode())
    with owner.transaction():
        owner.execute("UPDATE cassette_head SET tx = pg_current_xact_id()")
        owner.execute(
            "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)"
            " VALUES (%s, %s, %s, %s, 'cassette_messages', '99')",
            (size, body, leaf, chain_hash(size, last, leaf)),
        )
    assert journal_end(owner)[0] == size + 1
    assert "row_missing" in findings(seeded)


def test_a_seal_from_an_old_snapshot_is_busy(seeded: str) -> None:
    """The owner's REPEATABLE READ transaction whose snapshot predates a commit inserts
    a seal of the journal it saw: the seal's trigger takes the head first and cannot (a
    serialization error): BUSY, nothing written. (anchors.py seals in READ COMMITTED.)"""
    with connect(seeded) as sealer, connect(seeded, "cassette_worker") as other:
        sealer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        (size,) = sealer.execute("SELECT count(*) FROM cassette_journal").fetchone()
        other.execute(POST, ('{"later":1}',))
        with pytest.raises(psycopg.Error) as caught:
            sealer.execute(
                "INSERT INTO cassette_seals (tree_size, root_hex, key_id, origin, note)"
                " VALUES (%s, repeat('0', 64), '00000000', 'o', 'o' || E'\\n' || %s || E'\\n')",
                (size, size),
            )
        sealer.execute("ROLLBACK")
        assert code_of(caught.value) is ErrorCode.BUSY
        assert sealer.execute("SELECT count(*) FROM cassette_seals").fetchone() == (0,)
        assert_whole(seeded, other)
