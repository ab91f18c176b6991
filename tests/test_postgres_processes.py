"""Several worker processes on one PostgreSQL ledger, as hosts of a fleet would share it:
every step leased once per token and committed once, and one unbroken chain."""

from __future__ import annotations

import multiprocessing

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.hashing import ZERO_HASH, chain_hash, leaf_hash

from .backends import Ledger

pytestmark = pytest.mark.slow

STEPS = 60
WORKERS = 4


def _work(url: str, name: str) -> list[int]:
    done = []
    with MessageCassette(url) as cassette:
        while True:
            try:
                lease = cassette.claim_step("run", name)
            except CassetteError as error:
                assert error.code is ErrorCode.NO_PENDING_STEPS
                return done
            token = lease["fencing_token"]
            cassette.complete_step("run", lease["step_id"], name, token, {}, "SUCCESS")
            done.append(lease["step_id"])


def test_worker_processes_share_one_chain(pg_ledger: str) -> None:
    with MessageCassette(pg_ledger) as cassette:
        steps = [{"n": n} for n in range(STEPS)]
        cassette.post_message({"jobs": [{"intent": "i", "steps": steps}]}, "run", "USER")
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS) as pool:
        results = pool.starmap(_work, [(pg_ledger, f"w{n}") for n in range(WORKERS)])
    completed = sorted(step for done in results for step in done)
    assert completed == list(range(1, STEPS + 1))
    entries = Ledger("postgresql", pg_ledger).journal()
    # the message and its job; per step its insert, lease, receipt and commit
    assert [seq for seq, *_ in entries] == list(range(2 + STEPS * 4))
    previous = ZERO_HASH
    for seq, body, leaf, chain in entries:
        assert leaf == leaf_hash(body.encode("utf-8")) and chain == chain_hash(seq, previous, leaf)
        previous = chain
    with MessageCassette(pg_ledger) as cassette:
        assert cassette.status("run")["receipts"]["SUCCESS"] == STEPS
