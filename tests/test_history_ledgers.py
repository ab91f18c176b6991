"""History judged on real ledgers of both backends: an honest busy ledger verifies clean,
and an unlawful revision that an honest write has since overwritten is still named (one
attacker per backend as a smoke test: a TEMP trigger on a package connection, a trigger
planted and dropped from a raw shell, a PostgreSQL owner switching a rule off inside one
transaction)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ErrorCode
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import WorkerKey

from .backends import Ledger, past_the_temp_check


def busy(backend: Ledger) -> None:
    """Claims, completions, releases, requeues after expiry, max-attempts ABORTED
    receipts, complete_and_claim and a signing worker."""
    with backend.open() as cassette:
        for n in range(6):
            cassette.post_message({"n": n}, "r", "USER")
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"s": 1}, {"s": 2}, {"s": 3}]}]}, "b", "PLANNER"
        )
        first = cassette.claim_step("r", "w1", 60)
        done = cassette.complete_and_claim(
            "r", first["step_id"], "w1", first["fencing_token"], {"ok": 1}, "SUCCESS", 60
        )
        nxt = done["next"]
        cassette.requeue("r", nxt["step_id"], worker_id="w1", fencing_token=nxt["fencing_token"])
        cassette.claim_step("r", "w2", 1)
        backend.advance(2_000)
        assert cassette.requeue("r")  # after expiry
        again = cassette.claim_step("r", "w3", 1)
        backend.advance(2_000)
        closed = cassette.requeue("r", max_attempts=2)  # token 2: ABORTED
        assert closed and again["step_id"] == closed[0]["step_id"]
        for _ in range(2):
            held = cassette.claim_step("b", "w4", 60)
            cassette.complete_step("b", held["step_id"], "w4", held["fencing_token"], {}, "FAILURE")
        cassette.claim_step("b", "w5", 60)  # left leased
    signer = WorkerKey("w6", Ed25519PrivateKey.generate())
    with backend.open(worker_key=signer) as cassette:
        cassette.post_message({"signed": True}, "c", "WORKER")
        cassette.post_message({"signed": 2}, "c", "WORKER")
        held = cassette.claim_step("c", "w6", 60)
        cassette.complete_step("c", held["step_id"], "w6", held["fencing_token"], {}, "SUCCESS")
        held = cassette.claim_step("c", "w6", 60)
        cassette.requeue("c", held["step_id"], worker_id="w6", fencing_token=held["fencing_token"])
        held = cassette.claim_step("c", "w6", 1)
        backend.advance(2_000)
        cassette.requeue("c")  # a signed requeue after expiry


def unlawful(report: Any) -> list[tuple[Any, Any, str]]:
    return [
        (f.table, f.key, f.detail.split(":")[0])
        for f in report.findings
        if f.kind.value == "unlawful_history"
    ]


@pytest.mark.both_backends
def test_an_honest_busy_ledger_has_a_lawful_history(backend: Ledger) -> None:
    busy(backend)
    report = verify_path(backend.target)
    assert report.ok, [f.to_dict() for f in report.errors]
    assert unlawful(report) == []
    assert unlawful(verify_path(backend.target, run_id="r")) == []


def _overwrite(backend: Ledger, step_id: int) -> None:
    """Honest writes after the lie: the row ends as the journal's last image says."""
    with backend.open() as cassette:
        backend.advance(120_000)
        cassette.requeue("r")
        held = cassette.claim_step("r", "honest", 60)
        assert held["step_id"] == step_id
        cassette.complete_step("r", step_id, "honest", held["fencing_token"], {}, "SUCCESS")


def test_a_revision_a_temp_trigger_dropped_is_named_after_an_honest_overwrite(
    tmp_path: Path,
) -> None:
    backend = Ledger("sqlite", str(tmp_path / "ledger.db"))
    with backend.open() as cassette:
        cassette.post_message({}, "r", "USER")
        held = cassette.claim_step("r", "w", 60)
        conn = cassette.conn
        conn.execute(
            "CREATE TEMP TRIGGER skip BEFORE UPDATE ON main.cassette_steps"
            " BEGIN SELECT RAISE(IGNORE); END"
        )
        past_the_temp_check(cassette.conn)
        with cassette.write() as write:  # (the package's transaction, clock and journal)
            write.execute(
                "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?",
                (held["step_id"],),
            )
        conn.execute("DROP TRIGGER temp.skip")
        past_the_temp_check(conn)
    _overwrite(backend, held["step_id"])
    report = verify_path(backend.target)
    assert not report.ok
    assert unlawful(report) == [("cassette_steps", held["step_id"], "RECEIPT_REQUIRED")]


def test_a_planted_then_dropped_trigger_is_named(tmp_path: Path) -> None:
    """From a raw shell: a trigger in the file that drops a claim's row change after the
    package journaled it; an honest worker claims, the trigger is dropped, another worker
    claims the same step and gets the same token."""
    backend = Ledger("sqlite", str(tmp_path / "ledger.db"))
    with backend.open() as cassette:
        cassette.post_message({}, "r", "USER")
    shell = sqlite3.connect(backend.target, isolation_level=None)
    shell.execute(
        "CREATE TRIGGER planted BEFORE UPDATE ON cassette_steps"
        " WHEN NEW.status = 'LEASED' BEGIN SELECT RAISE(IGNORE); END"
    )
    with backend.open() as cassette, contextlib.suppress(CassetteError):
        cassette.claim_step("r", "w", 60)  # journaled; the row never took it
    shell.execute("DROP TRIGGER planted")
    shell.close()
    with backend.open() as cassette:
        again = cassette.claim_step("r", "w2", 60)
        assert again["fencing_token"] == 1
        cassette.complete_step("r", again["step_id"], "w2", 1, {}, "SUCCESS")
    report = verify_path(backend.target)
    assert not report.ok
    assert unlawful(report) == [("cassette_steps", again["step_id"], "LEASE_FIELDS_LOCKED")]


def test_an_owner_switching_a_rule_off_inside_a_transaction_is_named(pg_ledger: str) -> None:
    import psycopg

    backend = Ledger("postgresql", pg_ledger)
    with backend.open() as cassette:
        cassette.post_message({}, "r", "USER")
        held = cassette.claim_step("r", "w", 3_600)  # (an hour: beyond the clock skew allowed)
    with psycopg.connect(backend.target) as owner:
        owner.execute("SELECT cassette_tx_ms()")  # (takes the head, as every write does)
        owner.execute("ALTER TABLE cassette_steps DISABLE TRIGGER cassette_steps_update")
        owner.execute(
            "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
            " lease_expires_at = NULL WHERE step_id = %s",
            (held["step_id"],),
        )
        owner.execute("ALTER TABLE cassette_steps ENABLE TRIGGER cassette_steps_update")
    with backend.open() as cassette:
        again = cassette.claim_step("r", "w2", 60)
        cassette.complete_step("r", again["step_id"], "w2", again["fencing_token"], {}, "SUCCESS")
    report = verify_path(backend.target)
    assert not report.ok
    assert unlawful(report) == [("cassette_steps", held["step_id"], "LEASE_NOT_EXPIRED")]


def _commit_without_receipt_sqlite(backend: Ledger) -> int:
    """A TEMP trigger drops a COMMITTED revision after the journal took it; returns the
    step, which honest writes then overwrite."""
    with backend.open() as cassette:
        cassette.post_message({}, "r", "USER")
        held = cassette.claim_step("r", "w", 60)
        cassette.conn.execute(
            "CREATE TEMP TRIGGER skip BEFORE UPDATE ON main.cassette_steps"
            " BEGIN SELECT RAISE(IGNORE); END"
        )
        past_the_temp_check(cassette.conn)
        with cassette.write() as write:
            write.execute(
                "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?",
                (held["step_id"],),
            )
        cassette.conn.execute("DROP TRIGGER temp.skip")
        past_the_temp_check(cassette.conn)
    _overwrite(backend, held["step_id"])
    return int(held["step_id"])


def _requeue_early_postgresql(backend: Ledger) -> int:
    import psycopg

    with backend.open() as cassette:
        cassette.post_message({}, "r", "USER")
        held = cassette.claim_step("r", "w", 3_600)
    with psycopg.connect(backend.target) as owner:
        owner.execute("SELECT cassette_tx_ms()")
        owner.execute("ALTER TABLE cassette_steps DISABLE TRIGGER cassette_steps_update")
        owner.execute(
            "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
            " lease_expires_at = NULL WHERE step_id = %s",
            (held["step_id"],),
        )
        owner.execute("ALTER TABLE cassette_steps ENABLE TRIGGER cassette_steps_update")
    with backend.open() as cassette:
        again = cassette.claim_step("r", "w2", 60)
        cassette.complete_step("r", again["step_id"], "w2", again["fencing_token"], {}, "SUCCESS")
    return int(held["step_id"])


@pytest.mark.both_backends
def test_a_seal_signs_only_a_lawful_history(backend: Ledger) -> None:
    key = Ed25519PrivateKey.generate()
    with backend.open() as cassette:
        cassette.post_message({"first": 1}, "s", "USER")
        first = cassette.seal(key)  # lawful so far
    if backend.postgresql:
        _requeue_early_postgresql(backend)
    else:
        _commit_without_receipt_sqlite(backend)
    before = backend.dump()
    with backend.open() as cassette, pytest.raises(CassetteError) as refused:
        cassette.seal(key)
    assert refused.value.code is ErrorCode.UNLAWFUL_HISTORY
    assert "cassette_steps" in str(refused.value.detail["findings"])
    assert backend.dump() == before  # nothing recorded
    with backend.open() as cassette:
        latest = cassette.latest_seal()
        assert latest is not None and latest.seal_id == first.seal_id
        # a new key has no checkpoint: it judges the whole history, and refuses too
        with pytest.raises(CassetteError) as other:
            cassette.seal(Ed25519PrivateKey.generate())
        assert other.value.code is ErrorCode.UNLAWFUL_HISTORY


@pytest.mark.both_backends
def test_a_seal_after_a_busy_lawful_history_is_signed(backend: Ledger) -> None:
    key = Ed25519PrivateKey.generate()
    busy(backend)
    with backend.open() as cassette:
        sealed = cassette.seal(key)
        cassette.post_message({"after": 1}, "r", "USER")
        held = cassette.claim_step("r", "w9", 60)
        cassette.complete_step("r", held["step_id"], "w9", held["fencing_token"], {}, "SUCCESS")
        again = cassette.seal(key)  # judged from the first seal on
    assert again.tree_size > sealed.tree_size


def test_a_seal_judges_a_step_of_before_its_checkpoint_from_its_last_entry(
    tmp_path: Path,
) -> None:
    """A lease taken before the key's last seal and closed after it: its commit is judged
    against the claim read from below the checkpoint, lawful or not."""
    key = Ed25519PrivateKey.generate()
    for attack in (False, True):
        backend = Ledger("sqlite", str(tmp_path / f"ledger-{attack}.db"))
        with backend.open() as cassette:
            cassette.post_message({}, "r", "USER")
            cassette.post_message({}, "r", "USER")
            held = cassette.claim_step("r", "w", 60)
            cassette.seal(key)
            if attack:  # COMMITTED with no receipt, the row change dropped
                cassette.conn.execute(
                    "CREATE TEMP TRIGGER skip BEFORE UPDATE ON main.cassette_steps"
                    " BEGIN SELECT RAISE(IGNORE); END"
                )
                past_the_temp_check(cassette.conn)
                with cassette.write() as write:
                    write.execute(
                        "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = ?",
                        (held["step_id"],),
                    )
                cassette.conn.execute("DROP TRIGGER temp.skip")
                past_the_temp_check(cassette.conn)
            cassette.complete_step("r", held["step_id"], "w", 1, {}, "SUCCESS")
            nxt = cassette.claim_step("r", "w", 60)
            cassette.complete_step("r", nxt["step_id"], "w", 1, {}, "SUCCESS")
            if not attack:
                assert cassette.seal(key).tree_size == cassette.journal_size() - 1
                continue
            with pytest.raises(CassetteError) as refused:
                cassette.seal(key)
            assert refused.value.code is ErrorCode.UNLAWFUL_HISTORY
            found = refused.value.detail["findings"]
            assert [(f["table"], f["key"]) for f in found] == [
                ("cassette_steps", held["step_id"]),
                ("cassette_receipts", 1),
            ]


def test_a_long_history_is_judged_before_the_seal_takes_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond ``AHEAD_MIN_ENTRIES`` the history is judged in a read snapshot first, and
    only what follows under the write lock: lawful or refused, as when judged at once."""
    from catalytic_cassette import seals

    monkeypatch.setattr(seals, "AHEAD_MIN_ENTRIES", 2)
    lawful = Ledger("sqlite", str(tmp_path / "lawful.db"))
    busy(lawful)
    with lawful.open() as cassette:
        assert cassette.seal(Ed25519PrivateKey.generate()).tree_size > 2
    unlawful_ledger = Ledger("sqlite", str(tmp_path / "unlawful.db"))
    step_id = _commit_without_receipt_sqlite(unlawful_ledger)
    with unlawful_ledger.open() as cassette, pytest.raises(CassetteError) as refused:
        cassette.seal(Ed25519PrivateKey.generate())
    assert refused.value.code is ErrorCode.UNLAWFUL_HISTORY
    assert refused.value.detail["findings"][0]["key"] == step_id
