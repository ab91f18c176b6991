"""PostgreSQL migration 0012: a call that changes no row takes no head and writes nothing;
a malformed `cassette.tail` changes nothing (0017; from 0012 it was JOURNAL_BROKEN).

A no-op (an idempotent repost, a claim with nothing PENDING, a requeue with no lease due,
a checkpoint saved again) is decided without the head in READ COMMITTED: it leaves the
head row (its version included) and the journal as they were, gets no transaction id (so
no commit record), and answers while another session holds the head in an open
transaction, where it used to wait and fail BUSY. What is not a no-op, or not known to be
one without the head (a repost of a post not committed yet, a lease due by the head's time
or the owner's offset, any call under REPEATABLE READ), still takes the head. A signing
worker's claim, requeue and reposts ask first too; a read-only ledger answers the no-ops
as a read-only SQLite file does. `cassette.tail`, a setting the journal's guard wrote and a
commit-time follower read until 0017, is set by hand as the owner and under the roles that
write through functions (worker, appender): before an entry, between two, and after the
last; nothing reads it any more, and every write lands whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.signing import generate
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import WorkerKey

from .pg_chain import journal_end

psycopg = pytest.importorskip("psycopg")

RUN = "run"
ONE_STEP = {"jobs": [{"intent": "i", "steps": [{}]}]}
BUSY_MS = 300  # the package's busy timeout here: how long a call waits for the head


def connect(url: str, role: str | None = None) -> Any:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET lock_timeout = '10s'")  # a test that waits for the head fails, never hangs
    if role is not None:
        conn.execute(f"SET ROLE {role}")
    return conn


def head_row(conn: Any) -> tuple[Any, ...]:
    """The head row with its version (xmin, ctid): a write of the same values shows."""
    row = conn.execute("SELECT xmin::text, ctid::text, * FROM cassette_head").fetchone()
    return tuple(row)


def code_of(error: BaseException) -> ErrorCode:
    assert isinstance(error, psycopg.Error), error
    return translate(error).code


@pytest.fixture
def seeded(pg_ledger: str) -> str:
    """Run `run`: message 1 (key k, two steps), step 1 leased by w for 60 s, step 2
    PENDING; a checkpoint of plan p."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, RUN, "USER", "k")
        cassette.claim_step(RUN, "w", ttl_seconds=60)
    with CausalChain(pg_ledger) as chain:
        chain.save_checkpoint("p", {"at": 1})
    return pg_ledger


@pytest.fixture
def holder(seeded: str) -> Iterator[Any]:
    """Another session holding the head in an open transaction (it took the ledger's
    time, as every write's first step does), rolled back at the end."""
    conn = connect(seeded)
    conn.execute("BEGIN")
    conn.execute("SELECT cassette_tx_ms()")
    yield conn
    conn.execute("ROLLBACK")
    conn.close()


def claim_the_pending_step(url: str) -> None:
    with MessageCassette(url) as cassette:
        assert cassette.claim_step(RUN, "w2", ttl_seconds=60) is not None


REPOST = ({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, RUN, "USER", "k")


def _repost(url: str) -> Any:
    with MessageCassette(url, busy_timeout_ms=BUSY_MS) as cassette:
        return cassette.post_message(*REPOST)


def _claim(url: str) -> Any:
    with MessageCassette(url, busy_timeout_ms=BUSY_MS) as cassette:
        return cassette.claim_steps(RUN, "w3", 5, 60)


def _claim_other_run(url: str) -> Any:
    with MessageCassette(url, busy_timeout_ms=BUSY_MS) as cassette:
        return cassette.claim_steps("idle", "w3", 1, 60)


def _requeue(url: str) -> Any:
    with MessageCassette(url, busy_timeout_ms=BUSY_MS) as cassette:
        return cassette.requeue(RUN)


def _checkpoint(url: str) -> Any:
    with CausalChain(url, busy_timeout_ms=BUSY_MS) as chain:
        return chain.save_checkpoint("p", {"at": 1})


# Each no-op through the package, and its answer (the checkpoint's: the stored id).
NOOPS: dict[str, tuple[Callable[[str], Any], Any]] = {
    "repost": (_repost, (1, 1)),
    "claim": (_claim, []),
    "claim_other_run": (_claim_other_run, []),
    "requeue": (_requeue, []),
    "checkpoint": (_checkpoint, None),
}


@pytest.mark.parametrize("name", sorted(NOOPS))
def test_a_noop_writes_nothing_and_answers_while_the_head_is_held(
    seeded: str, holder: Any, name: str
) -> None:
    """With the head held by an open transaction, each no-op answers (before 0012: BUSY
    after the busy timeout), and leaves the head row, its version and the journal as
    they were."""
    if name == "claim":
        holder.execute("ROLLBACK")
        claim_the_pending_step(seeded)  # nothing PENDING in the run now
        holder.execute("BEGIN")
        holder.execute("SELECT cassette_tx_ms()")
    with connect(seeded) as owner:
        before = (head_row(owner), journal_end(owner))
        call, expected = NOOPS[name]
        answer = call(seeded)
        assert (head_row(owner), journal_end(owner)) == before
        if name == "checkpoint":
            (expected,) = owner.execute("SELECT checkpoint_id FROM cassette_checkpoints").fetchone()
        assert answer == expected


# The same no-ops as raw calls of the functions, under the role that may call them.
RAW_NOOPS = {
    "repost": (
        "cassette_worker",
        "SELECT message_id, job_id, existing FROM cassette_post('run', 'USER', 'k', %s,"
        " ARRAY['i'], ARRAY[2], ARRAY['{}', '{}'])",
    ),
    "claim": ("cassette_worker", "SELECT * FROM cassette_claim('idle', 'w3', 5, 60000)"),
    "requeue": ("cassette_worker", "SELECT * FROM cassette_requeue('run', NULL, NULL)"),
    "requeue_max_attempts": ("cassette_worker", "SELECT * FROM cassette_requeue('run', NULL, 1)"),
    "checkpoint": (
        "cassette_appender",
        "SELECT cassette_save_checkpoint(checkpoint_id, plan_id, context_json)"
        " FROM cassette_checkpoints",
    ),
}


def _payload(url: str) -> str:
    with connect(url) as owner:
        (text,) = owner.execute(
            "SELECT payload_json FROM cassette_messages WHERE message_id = 1"
        ).fetchone()
    return str(text)


@pytest.mark.parametrize("name", sorted(RAW_NOOPS))
def test_a_raw_noop_gets_no_transaction_id(seeded: str, name: str) -> None:
    """Called in an explicit transaction by a role's raw session, the no-op leaves the
    transaction without an id: it wrote nothing, not even a row lock, and its commit
    writes no commit record."""
    role, sql = RAW_NOOPS[name]
    payload = _payload(seeded)
    with connect(seeded, role) as conn:
        conn.execute("BEGIN")
        conn.execute(sql, (payload,) if "%s" in sql else None).fetchall()
        (xid,) = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
        conn.execute("COMMIT")
    assert xid is None


@pytest.mark.parametrize("act", ["claim", "requeue", "repost"])
def test_a_signed_noop_takes_no_head(seeded: str, holder: Any, tmp_path: Path, act: str) -> None:
    """A signing worker's claim with nothing PENDING, its requeue of the run with no lease
    due, or its batch of reposts asks first in statements of its own: no head taken,
    nothing signed or written (before 0012 its transaction took the head first: BUSY
    here)."""
    key_path, _ = generate(str(tmp_path / "w3"))
    key = WorkerKey.load("w3", key_path)
    with connect(seeded) as owner:
        before = (head_row(owner), journal_end(owner))
        with MessageCassette(seeded, busy_timeout_ms=BUSY_MS, worker_key=key) as cassette:
            if act == "claim":
                assert cassette.claim_steps("idle", "w3", 2, 60) == []
            elif act == "requeue":
                assert cassette.requeue(RUN) == []
            else:
                assert cassette.post_messages([REPOST, REPOST]) == [(1, 1), (1, 1)]
        assert (head_row(owner), journal_end(owner)) == before


def test_a_read_only_ledger_answers_noops_as_sqlite_does(seeded: str, tmp_path: Path) -> None:
    """Opened read-only (the server's default_transaction_read_only), the no-ops answer as
    on a read-only SQLite file holding the same rows (before 0012 each was a refused
    UPDATE of the head: DATABASE_ERROR), and a write is refused alike on both."""
    path = tmp_path / "ledger.db"
    with MessageCassette(path) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, RUN, "USER", "k")
        cassette.claim_step(RUN, "w", ttl_seconds=60)
    with CausalChain(path) as chain:
        chain.save_checkpoint("p", {"at": 1})

    def answers(target: str) -> list[Any]:
        got: list[Any] = []
        with MessageCassette(target, read_only=True) as cassette:
            got.append(cassette.post_message(*REPOST))
            got.append(cassette.claim_steps("idle", "w", 1, 60))
            got.append(cassette.requeue(RUN))
            with pytest.raises(CassetteError) as caught:
                cassette.post_message(ONE_STEP, RUN, "USER")
            got.append(caught.value.code)
        with CausalChain(target, read_only=True) as chain:
            got.append(chain.save_checkpoint("p", {"at": 1}))
        return got

    assert answers(str(path)) == answers(seeded)
    assert answers(seeded)[3] is ErrorCode.DATABASE_ERROR


def test_a_signed_batch_with_one_new_post_or_a_conflict_takes_the_signed_path(
    seeded: str, tmp_path: Path
) -> None:
    """A batch of reposts with one new post, or one conflicting repost, is not answered
    early: the new post is attested and written (with the repeats' ids), the conflict is
    IDEMPOTENCY_CONFLICT naming its item and message, with nothing written."""
    key_path, _ = generate(str(tmp_path / "w3"))
    key = WorkerKey.load("w3", key_path)
    conflicting = ({"other": 1}, RUN, "USER", "k")
    fresh = ({"jobs": [{"intent": "i", "steps": [{}]}]}, RUN, "USER", "new")
    with connect(seeded) as owner, MessageCassette(seeded, worker_key=key) as cassette:
        before = (head_row(owner), journal_end(owner))
        with pytest.raises(CassetteError) as caught:
            cassette.post_messages([REPOST, conflicting])
        assert caught.value.code is ErrorCode.IDEMPOTENCY_CONFLICT
        assert caught.value.detail == {"message_id": 1, "index": 1}
        assert (head_row(owner), journal_end(owner)) == before
        assert cassette.post_messages([REPOST, fresh]) == [(1, 1), (2, 2)]
        acts = owner.execute("SELECT act, message_id FROM cassette_attestations").fetchall()
        assert acts == [("post", 2)]
    assert verify_path(seeded).ok


def test_a_repost_of_a_post_not_committed_waits_for_it(seeded: str, holder: Any) -> None:
    """The first post under a key is in flight (its session holds the head): a repeat
    cannot know the answer without the head, so it waits (BUSY here); once the first
    commits, the repeat is answered from it without the head."""
    payload = ({"n": 1}, RUN, "USER", "fresh")
    holder.execute(
        "SELECT cassette_post('run', 'USER', 'fresh', '{\"n\":1}', ARRAY['default'], ARRAY[1],"
        " ARRAY['{}'])"
    )
    with MessageCassette(seeded, busy_timeout_ms=BUSY_MS) as cassette:
        with pytest.raises(CassetteError) as caught:
            cassette.post_message(*payload)
        assert caught.value.code is ErrorCode.BUSY
        holder.execute("COMMIT")
        holder.execute("BEGIN")
        holder.execute("SELECT cassette_tx_ms()")  # held again
        assert cassette.post_message(*payload) == (2, 2)


def test_a_conflicting_repost_is_refused_without_the_head(seeded: str, holder: Any) -> None:
    """Another payload under a committed key: IDEMPOTENCY_CONFLICT naming the message, as
    under the head, without waiting for it; nothing written."""
    with connect(seeded) as owner:
        before = (head_row(owner), journal_end(owner))
        with (
            MessageCassette(seeded, busy_timeout_ms=BUSY_MS) as cassette,
            pytest.raises(CassetteError) as caught,
        ):
            cassette.post_message({"other": 1}, RUN, "USER", "k")
        assert caught.value.code is ErrorCode.IDEMPOTENCY_CONFLICT
        assert caught.value.detail["message_id"] == 1
        assert (head_row(owner), journal_end(owner)) == before


def test_a_claim_with_a_pending_step_takes_the_head(seeded: str, holder: Any) -> None:
    with MessageCassette(seeded, busy_timeout_ms=BUSY_MS) as cassette:
        with pytest.raises(CassetteError) as caught:
            cassette.claim_steps(RUN, "w3", 1, 60)
        assert caught.value.code is ErrorCode.BUSY
        holder.execute("ROLLBACK")
        holder.execute("BEGIN")  # (the fixture rolls back again)
        (leased,) = cassette.claim_steps(RUN, "w3", 1, 60)
        assert leased["step_id"] == 2


@pytest.mark.parametrize("how", ["offset", "head_time"])
def test_a_lease_due_by_the_ledgers_time_is_requeued(seeded: str, how: str) -> None:
    """The check without the head reads the time a writer would get: the owner's offset
    (cassette_advance_clock) and the head's own time, which a copy moves past the
    server's clock. A check by the server's clock alone would answer [] here."""
    with connect(seeded) as owner:
        if how == "offset":
            owner.execute("SELECT cassette_advance_clock(120000)")
        else:  # the owner dates the ledger forward, as a copy does
            owner.execute("UPDATE cassette_head SET time_ms = time_ms + 120000")
        before = head_row(owner)
        with MessageCassette(seeded) as cassette:
            assert cassette.requeue(RUN) == [
                {"step_id": 1, "action": "requeued", "fencing_token": 1}
            ]
        assert head_row(owner) != before
        journal_end(owner)  # asserts the chain whole


def test_a_due_lease_waits_for_the_head(seeded: str, holder: Any) -> None:
    holder.execute("ROLLBACK")
    with connect(seeded) as owner:
        owner.execute("SELECT cassette_advance_clock(120000)")
    holder.execute("BEGIN")
    holder.execute("SELECT cassette_tx_ms()")
    with MessageCassette(seeded, busy_timeout_ms=BUSY_MS) as cassette:
        with pytest.raises(CassetteError) as caught:
            cassette.requeue(RUN)
        assert caught.value.code is ErrorCode.BUSY


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_other_isolation_levels_take_the_head(seeded: str, holder: Any, isolation: str) -> None:
    """A snapshot that may be older than the last commit answers nothing without the
    head: the no-op claim waits for it as before (BUSY here)."""
    with connect(seeded, "cassette_worker") as worker:
        worker.execute(f"SET lock_timeout = '{BUSY_MS}ms'")
        worker.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        with pytest.raises(psycopg.Error) as caught:
            worker.execute("SELECT * FROM cassette_claim('idle', 'w', 1, 60000)")
        worker.execute("ROLLBACK")
    assert code_of(caught.value) is ErrorCode.BUSY


def test_a_noop_inside_a_transaction_holding_the_head(seeded: str) -> None:
    """A transaction that wrote first holds the head: its no-ops run the locked path and
    stamp nothing more; the transaction's entries are whole."""
    with connect(seeded, "cassette_worker") as worker:
        worker.execute("BEGIN")
        worker.execute(
            "SELECT cassette_post('run', 'USER', 'k2', '{}', ARRAY['i'], ARRAY[1], ARRAY['{}'])"
        )
        stamped = head_row(worker)
        assert (
            worker.execute("SELECT * FROM cassette_claim('idle', 'w', 1, 60000)").fetchall() == []
        )
        assert worker.execute("SELECT * FROM cassette_requeue('run', NULL, NULL)").fetchall() == []
        (again,) = worker.execute(
            "SELECT existing FROM cassette_post('run', 'USER', 'k2', '{}', ARRAY['i'], ARRAY[1],"
            " ARRAY['{}'])"
        ).fetchone()
        assert again is True
        assert head_row(worker) == stamped
        worker.execute("COMMIT")
        journal_end(worker)  # asserts the chain whole


def test_idle_pollers_beside_a_poster_claim_each_step_once(seeded: str) -> None:
    """Three sessions poll a run with claim (mostly no-ops) while a fourth posts 60
    one-step messages into it: every step is leased exactly once, and verify is clean."""
    posted = 60
    done = threading.Event()
    leased: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def poll(worker: str) -> None:
        try:
            with MessageCassette(seeded) as cassette:
                while True:
                    finished = done.is_set()
                    got = cassette.claim_steps("busy", worker, 2, 60)
                    with lock:
                        leased.extend(s["step_id"] for s in got)
                    if finished and not got:
                        return
        except BaseException as exc:  # reported below
            errors.append(exc)

    pollers = [threading.Thread(target=poll, args=(f"p{n}",)) for n in range(3)]
    for thread in pollers:
        thread.start()
    with MessageCassette(seeded) as poster:
        for n in range(posted):
            poster.post_message({"jobs": [{"intent": "i", "steps": [{"n": n}]}]}, "busy", "USER")
    done.set()
    for thread in pollers:
        thread.join()
    assert errors == []
    assert len(leased) == len(set(leased)) == posted
    assert verify_path(seeded).ok


# ------------------------------------------------------------------- cassette.tail

MALFORMED = [
    "{me}:x:{hex}",  # the seq does not parse
    "{me}:1:zz",  # the hash does not parse
    "{me}:1:{short}",  # 63 digits
    "{me}:1:{upper}",  # not as written (upper case)
    "{me}:99999999999999999999:{hex}",  # beyond bigint
    "{me}:-1:{hex}",
    "{me}:01:{hex}",  # not as written (a leading zero)
    "{me}:1:{hex}:x",
    "{me}",
    "{me}:1",
    "garbage",  # names no transaction: refused all the same
    ":::",
]


def _forged(template: str, me: str, chain: bytes) -> str:
    return template.format(
        me=me, hex=chain.hex(), short=chain.hex()[:63], upper=chain.hex().upper()
    )


def _last_chain(conn: Any) -> bytes:
    (chain,) = conn.execute(
        "SELECT chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    return bytes(chain)


WRITES = {
    "cassette_worker": (
        "SELECT cassette_post('run', 'USER', NULL, '{}', ARRAY['i'], ARRAY[1], ARRAY['{}'])"
    ),
    "cassette_appender": (
        "SELECT cassette_save_checkpoint('cp-' || encode(sha256(convert_to(c, 'UTF8')), 'hex'),"
        ' \'p\', c) FROM (SELECT \'{"plan_id":"p","n":\' || floor(random() * 1e12)::bigint'
        " || '}' AS c) t"
    ),
    None: (
        "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES ('run', 'USER', '{}')"
    ),
}


@pytest.mark.parametrize("role", list(WRITES), ids=["worker", "appender", "owner"])
@pytest.mark.parametrize("when", ["before", "between", "after"])
def test_a_malformed_tail_changes_nothing(seeded: str, role: str | None, when: str) -> None:
    """Set before the transaction's first entry, between two, or after the last: nothing
    reads it (0017; the guard stopped reading it in 0015, and the commit-time follower
    that did is gone), so each write lands at the journal's end, whole. (From 0012 to 0015
    a value set before or between was JOURNAL_BROKEN, and until 0017 one set after.)"""
    write = WRITES[role]
    with connect(seeded, role) as conn:
        for template in MALFORMED:
            size, _ = journal_end(conn)
            with conn.transaction():
                (me,) = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
                if when != "before":
                    conn.execute(write)
                forged = _forged(template, me, _last_chain(conn))
                conn.execute("SELECT set_config('cassette.tail', %s, true)", (forged,))
                if when != "after":
                    conn.execute(write)
            assert journal_end(conn)[0] > size, template
    # (the owner's raw messages have no job: verify names that, and nothing of the chain)
    assert {f.kind.value for f in verify_path(seeded).errors} <= {"empty_message"}


def test_a_malformed_tail_for_the_whole_session_is_overwritten_by_each_write(
    seeded: str,
) -> None:
    """Set for the session (not the transaction) on a package connection: each write's
    entries set it for their transaction, so each write lands whole (from 0012 to 0015
    each was refused JOURNAL_BROKEN); reads and no-ops answer as ever."""
    with MessageCassette(seeded) as cassette:
        cassette.pg.execute("SET cassette.tail = 'garbage'")
        cassette.post_message(ONE_STEP, RUN, "USER")
        assert cassette.claim_steps("idle", "w", 1, 60) == []
        assert cassette.status(RUN)["messages"] == 2
        assert cassette.pg.execute("SHOW cassette.tail").fetchone() == ("garbage",)
    with connect(seeded) as owner:
        journal_end(owner)  # asserts the chain whole
    assert verify_path(seeded).ok


def test_a_well_formed_tail_of_another_transaction_is_ignored(seeded: str) -> None:
    """A tail naming another transaction, set for the session: the write's entries go
    after the journal's last, as always."""
    with connect(seeded) as owner:
        chain = _last_chain(owner)
    with connect(seeded, "cassette_worker") as worker:
        worker.execute("SELECT set_config('cassette.tail', %s, false)", (f"1:7:{chain.hex()}",))
        worker.execute(WRITES["cassette_worker"])
        journal_end(worker)  # asserts the chain whole
    assert verify_path(seeded).ok
