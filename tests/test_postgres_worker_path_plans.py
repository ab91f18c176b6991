"""The worker's path without scans or checks done twice (PostgreSQL migration 0014).

- A session that planned its lookups while a table was small (statistics taken on an empty
  table: a new ledger) reads that table by key, not by scanning it, however much it grew;
  a function planned that way plans without JIT too; a transaction's first entry reads a
  bounded number of journal rows when the head has no statistics.
- The head's guard runs only when an UPDATE changes something it checks: for every UPDATE
  of a set covering each column's moves, the outcome is the one the guard gives when it
  always runs (differential, as the owner).
- The journal's guard checks every entry, from a function a client calls too (from a
  trigger: tests/test_postgres_guard_from_triggers_attacks.py). (Forged tails:
  tests/test_postgres_head.py and tests/test_postgres_worker_and_head_attacks.py.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.postgresql.connection import translate

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql

STEPS = 40


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def scans(owner: Any, session: Any) -> dict[str, int]:
    """Sequential scans of each ledger table so far, with ``session``'s own counted: its
    pending statistics are flushed when it next goes idle, before it answers."""
    session.execute("SELECT pg_stat_force_next_flush()")
    owner.execute("SELECT pg_stat_force_next_flush()")
    rows = owner.execute(
        "SELECT relname, seq_scan FROM pg_stat_user_tables WHERE relname LIKE 'cassette_%'"
    ).fetchall()
    return {name: int(count) for name, count in rows}


CLAIM = "SELECT step_id, fencing_token FROM cassette_claim('run', 'w', 1, 60000)"
COMPLETE = "SELECT cassette_complete('run', %s, 'w', %s, 'SUCCESS', '{}')"
# The same by hand, as the owner may: the tables' own triggers plan the lookups. The step
# is named by its row's address (a PENDING row stays where it is until claimed), the
# receipt's values are given.
CLAIM_BY_HAND = (
    "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'w',"
    " lease_expires_at = cassette_tx_ms() + 60000, fencing_token = fencing_token + 1"
    " WHERE ctid = %s::tid RETURNING step_id, fencing_token"
)
COMPLETE_BY_HAND = (
    "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
    " outcome, receipt_json) VALUES (%s, %s, 'run', 'w', %s, 'SUCCESS', '{}')"
)


@pytest.mark.parametrize("by_hand", [False, True], ids=["worker functions", "owner by hand"])
def test_lookups_by_key_do_not_scan_tables_analyzed_while_empty(
    pg_ledger: str, owner: Any, by_hand: bool
) -> None:
    """Statistics taken before the first receipt say the receipts table is empty. A session
    then completes step after step, through the worker's functions or by hand: once its
    plans are made (the first few calls), its lookups of a step's receipt, of the step and
    of the journal's entries go through their keys. (Before 0014 every completion read
    every receipt twice.)"""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"n": n} for n in range(STEPS)]}]},
            "run",
            "USER",
        )
    owner.execute("VACUUM ANALYZE")
    rows = owner.execute(
        "SELECT ctid::text, job_id FROM cassette_steps ORDER BY step_id"
    ).fetchall()
    with psycopg.connect(pg_ledger, autocommit=True) as worker:
        before: dict[str, int] = {}
        for n in range(STEPS):
            if n == STEPS // 2:  # plans made; the receipts table has grown since
                before = scans(owner, worker)
            with worker.transaction():
                if by_hand:
                    address, job = rows[n]
                    step, token = worker.execute(CLAIM_BY_HAND, (address,)).fetchone()
                    worker.execute(COMPLETE_BY_HAND, (step, job, token))
                else:
                    worker.execute("SET LOCAL ROLE cassette_worker")
                    step, token = worker.execute(CLAIM).fetchone()
                    worker.execute(COMPLETE, (step, token))
        after = scans(owner, worker)
    scanned = {name: after[name] - before[name] for name in after if after[name] > before[name]}
    # the one-row head has nothing to look up by key; every other table is read by key
    scanned.pop("cassette_head", None)
    if by_hand:
        # the claim by hand is the session's own statement, planned with its settings: on
        # a table this small, a scan for the row's address is as cheap as going to it
        scanned.pop("cassette_steps", None)
    assert scanned == {}
    (receipts,) = owner.execute("SELECT count(*) FROM cassette_receipts").fetchone()
    assert receipts == STEPS


def journal_rows_read(owner: Any, session: Any) -> int:
    """Journal rows fetched through its indexes so far, ``session``'s own counted."""
    session.execute("SELECT pg_stat_force_next_flush()")
    owner.execute("SELECT pg_stat_force_next_flush()")
    (count,) = owner.execute(
        "SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'cassette_journal'"
    ).fetchone()
    return int(count)


def test_a_first_entry_reads_one_journal_row_when_the_head_has_no_statistics(
    pg_ledger: str, owner: Any
) -> None:
    """On a ledger never analyzed, the head's size is estimated from its page (hundreds of
    rows): a check of the journal correlated with the head's row was planned as a hash of
    every seq in the journal, read at each transaction's first entry (single posts 15%
    slower). Each post now reads a bounded number of journal rows."""
    owner.execute("SELECT pg_stat_reset()")
    with MessageCassette(pg_ledger) as cassette:
        for n in range(40):  # plans made; the journal has grown
            cassette.post_message({"n": n}, "run", "USER")
        before = journal_rows_read(owner, cassette.pg)  # type: ignore[attr-defined]
        for n in range(40):
            cassette.post_message({"n": n}, "run", "USER")
        read = journal_rows_read(owner, cassette.pg) - before  # type: ignore[attr-defined]
    assert read <= 40 * 3 * 2, read  # per entry: at most the link and the free seq


# ------------------------------------------------------------------- the head's guard

CHANGES = {
    "tx": ["tx", "pg_current_xact_id()", "NULL", "'12345'::xid8"],
    "time_ms": ["time_ms", "time_ms + 1", "time_ms - 1", "NULL"],
    "clock_offset_ms": ["clock_offset_ms", "clock_offset_ms + 1", "clock_offset_ms - 1"],
    "one": ["one", "NOT one"],
}
UPDATES = [
    "UPDATE cassette_head SET "
    + ", ".join(f"{column} = {value}" for column, value in zip(CHANGES, values, strict=True))
    for values in itertools.product(*CHANGES.values())
]

ALWAYS = (
    "DROP TRIGGER cassette_head_guard_update ON cassette_head;"
    " CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON cassette_head"
    " FOR EACH ROW EXECUTE FUNCTION cassette_head_guard()"
)


def outcomes(conn: Any, *, always: bool) -> list[str]:
    """Whether each UPDATE of the head is admitted or the code it is refused with, with and
    without the head taken first, each rolled back; the whole in one transaction rolled
    back (with the guard's trigger made unconditional if ``always``). (Not the rows: the
    two transactions have their own ids and times.)"""
    seen = []
    conn.execute("BEGIN")
    try:
        if always:
            conn.execute(ALWAYS)
        for update in UPDATES:
            for taken in (False, True):
                conn.execute("SAVEPOINT one")
                try:
                    if taken:
                        conn.execute("SELECT cassette_tx_ms()")
                    conn.execute(update)
                    seen.append(f"{update} (taken {taken}): admitted")
                except psycopg.Error as exc:
                    seen.append(f"{update} (taken {taken}): {translate(exc).code.value}")
                conn.execute("ROLLBACK TO SAVEPOINT one")
    finally:
        conn.execute("ROLLBACK")
    return seen


def test_the_head_guard_runs_whenever_an_update_needs_it(pg_ledger: str, owner: Any) -> None:
    """Every UPDATE of the head from a set that moves each column forward, back, to NULL
    or nowhere, with and without the head taken first: the guard behind its WHEN condition
    refuses or admits exactly what the guard run on every UPDATE does."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")
    gated = outcomes(owner, always=False)
    every = outcomes(owner, always=True)
    assert len(gated) == 2 * len(UPDATES) == 2 * 4 * 4 * 3 * 2
    assert [a for a, b in zip(gated, every, strict=True) if a != b] == []
    # the set reaches both sides: admitted changes and each of the guard's refusals
    assert {line.rsplit(": ", 1)[1] for line in every} >= {
        "admitted",
        "JOURNAL_BROKEN",
        "TIME_BACKWARDS",
    }


# ----------------------------------------------------------------- the journal's guard


def test_an_entry_inserted_by_a_function_a_client_calls_is_checked(owner: Any) -> None:
    """pg_trigger_depth() is 0 in a DO block or a function a client calls, as at the top:
    an entry with hashes that are not its body's is refused there too."""
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        owner.execute("SELECT cassette_tx_ms()")
        owner.execute(
            "DO $$ BEGIN INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl,"
            " row_key) VALUES (0, '{}', sha256('\\x00'::bytea), sha256('\\x01'::bytea),"
            " 'cassette_messages', '1'); END $$"
        )
    assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert owner.execute("SELECT count(*) FROM cassette_journal").fetchone() == (0,)


def test_no_law_function_plans_for_jit(owner: Any) -> None:
    """A function that plans with sequential scans penalized also plans without JIT: the
    penalty puts any scan it cannot avoid (the one-row head) past JIT's cost threshold,
    and JIT compiled such a statement at every call. Called functions inherit both."""
    rows = owner.execute(
        "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}')"
        " FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
        " AND p.proname LIKE 'cassette%'"
    ).fetchall()
    penalized = {name: set(config) for name, config in rows if "enable_seqscan=off" in config}
    assert "cassette_receipts_insert()" in penalized
    assert {name for name, config in penalized.items() if "jit=off" not in config} == set()
