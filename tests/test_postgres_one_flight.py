"""A one-statement write and its flush in one round trip (``postgresql.one_flight``).

What changes against sending them apart: only the round trips. The write still commits
before its flush begins (a flush refused after it leaves the write standing:
test_postgres_commit_early.py), refusals are the same codes with nothing written and the
connection idle, out of pipeline mode, values come back as psycopg's ``execute`` gives
them, a payload larger than the socket's buffers goes through, and a connection lost
mid-flight is CANNOT_OPEN, closed, never a traceback or a connection left mid-protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, verify_path
from catalytic_cassette.postgresql import connection, one_flight

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def idle(cassette: MessageCassette) -> bool:
    return bool(
        cassette.pg.info.transaction_status.name == "IDLE"
        and cassette.pg.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    )


def test_writes_go_in_one_flight_and_answer_as_execute_does(
    pg_ledger: str, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every one-statement write of the worker's loop goes through one flight (counted),
    and its answer is the one the two-round-trip path gives for the same call on a twin
    ledger: the same ids, tokens, payloads, types."""
    assert one_flight.supported()
    flights: list[str] = []
    real = one_flight.write_and_flush

    def counting(conn: Any, sql: str, *rest: Any) -> Any:
        flights.append(sql)
        return real(conn, sql, *rest)

    def calls(cassette: MessageCassette) -> list[Any]:
        answers: list[Any] = [cassette.post_message({"n": 1, "s": "é"}, "run", "USER", "k")]
        answers.append(cassette.post_message({"n": 1, "s": "é"}, "run", "USER", "k"))
        lease = cassette.claim_step("run", "w", ttl_seconds=60)
        answers.append({k: v for k, v in lease.items() if k != "lease_expires_at"})
        answers.append(
            cassette.complete_step(
                "run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS"
            )
        )
        return answers

    monkeypatch.setattr(one_flight, "write_and_flush", counting)
    with MessageCassette(pg_ledger) as cassette:
        flown = calls(cassette)
    assert len(flights) == 2  # the claim, the completion (a post runs in its batch's
    # transaction, connection.early_transaction)
    monkeypatch.setattr(one_flight, "supported", lambda: False)
    with MessageCassette(pg_database) as cassette:  # a twin ledger, migrated here
        apart = calls(cassette)
    assert len(flights) == 2
    assert flown == apart
    assert [type(v) for v in flown[2].values()] == [type(v) for v in apart[2].values()]


def test_refusals_and_bad_values_leave_nothing_and_an_idle_connection(
    pg_ledger: str, owner: Any
) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
        journal = owner.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
        for run, code in (
            ("a\x00b", ErrorCode.INVALID_ARGUMENT),
            ("\udc80", ErrorCode.INVALID_RUN_ID),
        ):
            with pytest.raises(CassetteError) as caught:
                cassette.claim_step(run, "w")
            assert caught.value.code is code
            assert idle(cassette)
        lease = cassette.claim_step("run", "w")
        for _ in range(3):
            with pytest.raises(CassetteError) as caught:
                cassette.complete_step("run", lease["step_id"], "w", 99, {}, "SUCCESS")
            assert caught.value.code is ErrorCode.STALE_FENCING_TOKEN
            assert idle(cassette)
        assert owner.execute("SELECT count(*) FROM cassette_journal").fetchone()[0] == journal + 1
        cassette.complete_step("run", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS")
        assert idle(cassette)
    assert verify_path(pg_ledger).ok


def test_a_payload_larger_than_the_sockets_buffers(pg_ledger: str) -> None:
    """Several MB out (a post, a receipt) and back (the claim's payload): the flight waits
    for the socket to take it, and for the answer, without spinning or blocking in libpq."""
    blob = "x" * 6_000_000
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"blob": blob}, "run", "USER")
        lease = cassette.claim_step("run", "w")
        assert lease["payload"] == {"blob": blob}
        cassette.complete_step(
            "run", lease["step_id"], "w", lease["fencing_token"], {"blob": blob}, "SUCCESS"
        )
        assert cassette.status("run")["receipts"]["SUCCESS"] == 1


def test_a_connection_lost_mid_flight_is_cannot_open_and_closed(pg_ledger: str, owner: Any) -> None:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
        owner.execute("SELECT pg_terminate_backend(%s)", (cassette.pg.info.backend_pid,))
        with pytest.raises(CassetteError) as caught:
            cassette.claim_step("run", "w")
        assert caught.value.code is ErrorCode.CANNOT_OPEN
        assert cassette.pg.closed
        with pytest.raises(CassetteError) as again:
            cassette.claim_step("run", "w")
        assert again.value.code is ErrorCode.CANNOT_OPEN
    # the claim never ran: the step is still there to claim
    with MessageCassette(pg_ledger) as cassette:
        assert cassette.claim_step("run", "w")["step_id"] == 1


def test_without_pipeline_mode_the_write_and_its_flush_go_apart(
    pg_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libpq before 14 has no pipeline mode: the two statements, one after the other."""
    monkeypatch.setattr(one_flight, "supported", lambda: False)
    flushed: list[Any] = []
    real = connection.flush
    monkeypatch.setattr(connection, "flush", lambda conn: (flushed.append(conn), real(conn)))
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
        cassette.claim_step("run", "w")
        assert len(flushed) == 2


def test_statements_deallocated_behind_its_back_are_prepared_again(
    pg_ledger: str, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg deallocates every prepared statement of the connection (DEALLOCATE ALL)
    when it drops its own after a failed transaction (a refused post did it: found by
    the backends' differential test). A write whose statement is gone never ran: it is
    prepared again and sent again; a flush whose statement is gone after its write ran
    flushes once more, apart. Each step is claimed and completed exactly once."""
    flushed: list[Any] = []
    real = connection.flush
    monkeypatch.setattr(connection, "flush", lambda conn: (flushed.append(conn), real(conn)))
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, "run", "USER")
        flushed.clear()  # (a post flushes its transaction apart)
        first = cassette.claim_step("run", "w")
        cassette.pg.execute("DEALLOCATE ALL")
        second = cassette.claim_step("run", "w")  # the claim's statement and the flush's: gone
        assert (first["step_id"], second["step_id"]) == (1, 2)
        assert flushed == []
        cassette.pg.execute("DEALLOCATE ALL")
        # a statement not prepared before goes out with the flush's, which is gone
        cassette.complete_step("run", 1, "w", first["fencing_token"], {}, "SUCCESS")
        assert len(flushed) == 1
        # forgotten here, the statements prepared since are still on the server: new
        # names never clash with them
        cassette.complete_step("run", 2, "w", second["fencing_token"], {}, "SUCCESS")
        third = cassette.claim_step("run", "w")
        cassette.complete_step("run", 3, "w", third["fencing_token"], {}, "SUCCESS")
        assert len(flushed) == 1
        assert idle(cassette)
    assert owner.execute(
        "SELECT count(*), count(DISTINCT step_id) FROM cassette_receipts"
    ).fetchone() == (3, 3)
    assert verify_path(pg_ledger).ok
