"""Each journal entry computed once, and the indexes a step writes (PostgreSQL migration 0015).

- The journal's guard computes an entry's seq and hashes (the append only builds the body):
  an INSERT that names none gets them, one that names them must name exactly these, and
  one whose transaction does not hold the head is refused whatever it names.
- The status counts without an index by run and status: COMMITTED steps counted as the
  run's receipts give the counts a GROUP BY of the steps gives, through claims, commits,
  requeues and several runs.
(Forged tails: tests/test_postgres_noop.py, tests/test_postgres_head.py,
tests/test_postgres_worker_and_head_attacks.py.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.verify import verify_path

from .pg_chain import BODY

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"x": 1}, "run", "USER")  # entries 0-2
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def last(conn: Any) -> tuple[int, bytes]:
    """The journal's last seq and chain hash, recomputed from the bodies."""
    prev, seq = ZERO_HASH, -1
    for seq, body in conn.execute("SELECT seq, body FROM cassette_journal ORDER BY seq"):
        prev = chain_hash(seq, prev, leaf_hash(body.encode("utf-8")))
    return seq, prev


def test_an_entry_naming_no_seq_or_hash_gets_the_next_and_its_bodys(
    pg_ledger: str, owner: Any
) -> None:
    """The owner takes the head and inserts a body alone: the guard places it right after
    the journal's last with its body's hashes, the follower moves the head to it, and
    verify compares it with the rows (no message 99: row_missing)."""
    seq, prev = last(owner)
    with owner.transaction():
        (now,) = owner.execute("SELECT cassette_tx_ms()").fetchone()
        body = BODY.replace('"created_at":1', f'"created_at":{now}')
        stored = owner.execute(
            "INSERT INTO cassette_journal (body, tbl, row_key)"
            " VALUES (%s, 'cassette_messages', '99') RETURNING seq, leaf_hash, chain_hash",
            (body,),
        ).fetchone()
    leaf = leaf_hash(body.encode("utf-8"))
    assert (stored[0], bytes(stored[1]), bytes(stored[2])) == (
        seq + 1,
        leaf,
        chain_hash(seq + 1, prev, leaf),
    )
    assert owner.execute("SELECT max(seq) FROM cassette_journal").fetchone() == (seq + 1,)
    assert {f.kind.value for f in verify_path(pg_ledger).errors} == {"row_missing"}


def wrong(seq: int, prev: bytes) -> dict[str, tuple[Any, ...]]:
    """Entries that name one value other than the guard's: each is refused."""
    leaf = leaf_hash(BODY.encode("utf-8"))
    right = chain_hash(seq + 1, prev, leaf)
    return {
        "the seq after next": (seq + 2, leaf, chain_hash(seq + 2, prev, leaf)),
        "the last seq": (seq, leaf, right),
        "a leaf not the body's": (seq + 1, leaf_hash(b"{}"), right),
        "a chain not linked to the last": (seq + 1, leaf, chain_hash(seq + 1, ZERO_HASH, leaf)),
        "a seq and no hash": (seq + 2, None, None),
        "a chain alone, wrong": (None, None, chain_hash(seq, prev, leaf)),
    }


@pytest.mark.parametrize("case", [*wrong(0, ZERO_HASH), "right, without the head", "right"])
def test_an_entry_naming_a_seq_or_hash_must_name_the_guards(
    pg_ledger: str, owner: Any, case: str
) -> None:
    seq, prev = last(owner)
    leaf = leaf_hash(BODY.encode("utf-8"))
    values = wrong(seq, prev).get(case, (seq + 1, leaf, chain_hash(seq + 1, prev, leaf)))
    insert = (
        "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)"
        " VALUES (%s, %s, %s, %s, 'cassette_messages', '99')"
    )
    if case == "right":
        with owner.transaction():
            owner.execute("SELECT cassette_tx_ms()")
            owner.execute(insert, (values[0], BODY, *values[1:]))
        assert last(owner) == (seq + 1, values[2])
        return
    with pytest.raises(psycopg.Error) as caught, owner.transaction():
        if case != "right, without the head":
            owner.execute("SELECT cassette_tx_ms()")
        owner.execute(insert, (values[0], BODY, *values[1:]))
    assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN, caught.value
    assert last(owner) == (seq, prev)
    assert verify_path(pg_ledger).ok


def test_status_counts_match_the_steps_through_every_transition(pg_ledger: str) -> None:
    """Random claims, completions (each outcome), releases and requeues over two runs:
    after each round, status() (PENDING and LEASED through their indexes, COMMITTED as
    the run's receipts) gives what a GROUP BY of the steps gives."""
    rng = random.Random(15)
    with MessageCassette(pg_ledger) as cassette:
        for run in ("a", "b"):
            for _ in range(6):
                steps = [{"n": n} for n in range(rng.randint(1, 3))]
                cassette.post_message({"jobs": [{"intent": "i", "steps": steps}]}, run, "USER")
        leases: list[dict[str, Any]] = []
        with psycopg.connect(pg_ledger, autocommit=True) as owner:
            for _ in range(40):
                run = rng.choice(("a", "b"))
                move = rng.choice(("claim", "claim", "complete", "release", "expire"))
                if move == "claim":
                    try:
                        leases.append({**cassette.claim_step(run, "w", ttl_seconds=60), "run": run})
                    except CassetteError as error:
                        assert error.code is ErrorCode.NO_PENDING_STEPS
                elif leases and move == "complete":
                    lease = leases.pop(rng.randrange(len(leases)))
                    outcome = rng.choice(("SUCCESS", "FAILURE", "ABORTED"))
                    cassette.complete_step(
                        lease["run"], lease["step_id"], "w", lease["fencing_token"], {}, outcome
                    )
                elif leases and move == "release":
                    lease = leases.pop(rng.randrange(len(leases)))
                    cassette.requeue(
                        lease["run"],
                        lease["step_id"],
                        worker_id="w",
                        fencing_token=lease["fencing_token"],
                    )
                elif leases and move == "expire":
                    owner.execute("SELECT cassette_advance_clock(61000)")
                    for name in ("a", "b"):
                        cassette.requeue(name)
                    leases.clear()
                for name in ("a", "b"):
                    counted = dict.fromkeys(("PENDING", "LEASED", "COMMITTED"), 0)
                    counted.update(
                        owner.execute(
                            "SELECT status, count(*) FROM cassette_steps WHERE run_id = %s"
                            " GROUP BY status",
                            (name,),
                        ).fetchall()
                    )
                    assert cassette.status(name)["steps"] == counted
    assert verify_path(pg_ledger).ok
