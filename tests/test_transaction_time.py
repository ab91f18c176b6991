"""One time per write transaction (LAW.md section 9a): the first ``ledger_now`` of a
package write transaction fixes it, the TEMP clock guards read it through
``cassette_transaction_ms()``, and it never outlives the transaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.connection import ledger_now, read_transaction, write_transaction

pytestmark = pytest.mark.sqlite_only(
    reason=("SQLite's TEMP clock guards and cassette_transaction_ms() of one connection")
)


def _sql_now(cassette: MessageCassette) -> int:
    return int(cassette.conn.execute("SELECT cassette_transaction_ms()").fetchone()[0])


def test_the_first_ledger_now_of_a_write_transaction_holds_until_it_ends(
    cassette: MessageCassette, clock: ManualClock
) -> None:
    cassette.post_message({"n": 1}, "run", "USER")
    with write_transaction(cassette.conn) as conn:
        assert _sql_now(cassette) == clock.now_ms()  # nothing dated yet: the clock
        first = ledger_now(conn, clock)
        clock.advance(5_000)
        assert ledger_now(conn, clock) == first == _sql_now(cassette)
    assert _sql_now(cassette) == clock.now_ms() == first + 5_000


def test_a_read_transaction_or_a_refused_write_keeps_no_time(
    cassette: MessageCassette, clock: ManualClock
) -> None:
    with read_transaction(cassette.conn) as conn:
        ledger_now(conn, clock)
    clock.advance(1_000)
    assert _sql_now(cassette) == clock.now_ms()
    with pytest.raises(ZeroDivisionError), write_transaction(cassette.conn) as conn:
        ledger_now(conn, clock)
        _ = 1 / 0
    clock.advance(1_000)
    assert _sql_now(cassette) == clock.now_ms()
    assert not cassette.conn.in_transaction


def test_a_writer_whose_clock_is_behind_judges_leases_by_ledger_time(
    db_path: Path, clock: ManualClock
) -> None:
    """Another writer dated the ledger a minute ahead: the honest writer's transaction
    time is the ledger's, so a lease that ledger time has passed cannot be completed even
    though the writer's own clock says it is still live."""
    behind = ManualClock(clock.now_ms())
    with MessageCassette(db_path, clock=clock) as ahead:
        ahead.post_message({"n": 1}, "run", "USER")
        step = ahead.claim_step("run", "w", 30)  # expires 30 s after the ledger's now
        clock.advance(60_000)
        ahead.post_message({"n": 2}, "run", "USER")  # the ledger is now a minute ahead
    with MessageCassette(db_path, clock=behind) as late:
        with pytest.raises(CassetteError) as refused:
            late.complete_step("run", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
        assert refused.value.code is ErrorCode.LEASE_EXPIRED
        assert late.complete_step(
            "run", step["step_id"], "w", step["fencing_token"], {}, "ABORTED"
        )  # what an expired lease may still report
