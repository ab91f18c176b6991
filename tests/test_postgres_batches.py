"""Batches sent pipelined on PostgreSQL (every item before the first answer): a refusal
the server makes in the middle of a long batch names that item, as SQLite's loop does,
and nothing of the batch stays; the connection serves the next call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode

from .backends import BACKENDS, Ledger

SIZE, BAD = 80, 37


@pytest.fixture(params=BACKENDS)
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "sqlite":
        return Ledger("sqlite", str(tmp_path / "ledger.db"))
    return Ledger("postgresql", request.getfixturevalue("pg_ledger"))


def refused(code: ErrorCode, call: Any, *args: Any) -> CassetteError:
    with pytest.raises(CassetteError) as caught:
        call(*args)
    assert caught.value.code is code, caught.value
    return caught.value


def test_a_post_the_server_refuses_names_its_item(either: Ledger) -> None:
    with either.open() as cassette:
        cassette.post_message({"a": 0}, "run", "USER", "taken")
        before = either.journal()
        items = [({"n": n}, "run", "USER", f"k{n}") for n in range(SIZE)]
        items[BAD] = ({"other": 1}, "run", "USER", "taken")  # the key of another payload
        error = refused(ErrorCode.IDEMPOTENCY_CONFLICT, cassette.post_messages, items)
        assert error.detail["index"] == BAD
        assert either.journal() == before
        items[BAD] = ({"a": 0}, "run", "USER", "taken")  # the same post again: its ids
        answers = cassette.post_messages(items)
        assert answers[BAD] == (1, 1)
        assert [m for m, _ in answers[:BAD]] == list(range(2, BAD + 2))


def test_a_completion_the_server_refuses_names_its_item(either: Ledger) -> None:
    with either.open() as cassette:
        cassette.post_messages([({"n": n}, "run", "USER", None) for n in range(SIZE)])
        leased = cassette.claim_steps("run", "w", SIZE)
        items = [("run", s["step_id"], "w", s["fencing_token"], {}, "SUCCESS") for s in leased]
        items[BAD] = ("run", leased[BAD]["step_id"], "w", 7, {}, "SUCCESS")  # a stale token
        before = either.journal()
        error = refused(ErrorCode.STALE_FENCING_TOKEN, cassette.complete_steps, items)
        assert error.detail["index"] == BAD
        assert either.journal() == before
        items[BAD] = ("run", leased[BAD]["step_id"], "w", 1, {}, "SUCCESS")
        assert len(cassette.complete_steps(items)) == SIZE
        assert cassette.status("run")["steps"]["COMMITTED"] == SIZE
