"""`cassette copy` between the backends: the journal byte for byte, every row through the
destination's law, seals of the source still holding on the copy (issue 15, item 3)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.cli import cli
from catalytic_cassette.copying import copy_ledger
from catalytic_cassette.merkle import root_from_leaves
from catalytic_cassette.note import open_note
from catalytic_cassette.seals import record_seal
from catalytic_cassette.verify import verify_path

from .backends import Ledger
from .conftest import unguarded

KEY = Ed25519PrivateKey.generate()


def busy_history(path: Path) -> ManualClock:
    """A SQLite ledger with every kind of message-cassette write: posts (one idempotent),
    claims, a completion, an expired lease requeued, a release, an abort at max attempts,
    and a seal. Its clock starts a minute ago, so a PostgreSQL copy can go on writing."""
    clock = ManualClock(time.time_ns() // 1_000_000 - 60_000)
    with MessageCassette(path, clock=clock) as cassette:
        steps = [{"n": n, "text": "é\u2028\x01"} for n in range(4)]
        cassette.post_message({"jobs": [{"intent": "i", "steps": steps}]}, "run", "USER", "k")
        cassette.post_message({"jobs": [{"intent": "i", "steps": steps}]}, "run", "USER", "k")
        first = cassette.claim_step("run", "w", ttl_seconds=5)
        cassette.complete_step("run", first["step_id"], "w", 1, {"ok": True}, "SUCCESS")
        cassette.claim_step("run", "w", ttl_seconds=5)
        clock.advance(6_000)
        cassette.requeue("run")
        held = cassette.claim_step("run", "v", ttl_seconds=5)
        cassette.requeue("run", held["step_id"], worker_id="v", fencing_token=2)
        cassette.claim_step("run", "v", ttl_seconds=1)
        clock.advance(1_000)
        cassette.requeue("run", max_attempts=3)
        record_seal(cassette.conn, KEY, now_ms=clock.now_ms(), origin=None)
        cassette.claim_step("run", "u", ttl_seconds=600)
    return clock


def test_sqlite_to_postgres_and_back_is_the_same_journal(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    copied = copy_ledger(str(source), pg_ledger)
    entries = Ledger("sqlite", str(source)).journal()
    assert copied["copied"] == copied["size"] == len(entries) > 15
    assert Ledger("postgresql", pg_ledger).journal() == entries
    # the copy is a live ledger: it goes on under the server's law, then comes back
    with MessageCassette(pg_ledger) as cassette:
        lease = cassette.claim_step("run", "pg")
        cassette.complete_step("run", lease["step_id"], "pg", lease["fencing_token"], {}, "SUCCESS")
    back = tmp_path / "back.db"
    assert copy_ledger(pg_ledger, str(back))["size"] == len(entries) + 3
    assert Ledger("sqlite", str(back)).journal() == Ledger("postgresql", pg_ledger).journal()
    report = verify_path(str(back))
    assert report.ok, report.findings


def test_the_source_seal_holds_on_the_copy(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    copy_ledger(str(source), pg_ledger)
    with MessageCassette(str(source)) as cassette:
        (size, root_hex, origin, note) = cassette.conn.execute(
            "SELECT tree_size, root_hex, origin, note FROM cassette_seals"
        ).fetchone()
    body = open_note(note.encode(), origin, KEY.public_key())
    assert body.decode().splitlines()[1:2] == [str(size)]
    leaves = [leaf for _, _, leaf, _ in Ledger("postgresql", pg_ledger).journal()[:size]]
    assert root_from_leaves(leaves).hex() == root_hex
    # and the server itself refuses a seal whose root is not the journal's
    import psycopg

    with psycopg.connect(pg_ledger, autocommit=True) as conn, pytest.raises(psycopg.Error) as e:
        conn.execute(
            "INSERT INTO cassette_seals (tree_size, root_hex, origin, key_id, note)"
            " VALUES (%s, %s, %s, 'abcdef01', %s)",
            (size, "0" * 64, origin, f"{origin}\n{size}\nx\n"),
        )
    assert "SEAL_MISMATCH" in str(e.value)


def test_a_copy_is_the_same_ledger_by_name(tmp_path: Path, pg_ledger: str) -> None:
    """The copy takes its source's ledger_id (the name its seals sign): an empty
    PostgreSQL ledger and a new file take it; a file that is another ledger is refused."""
    source = tmp_path / "source.db"
    busy_history(source)
    copy_ledger(str(source), pg_ledger)
    copy_ledger(pg_ledger, str(tmp_path / "back.db"))
    names = {ledger_id_of(str(path)) for path in (source, tmp_path / "back.db")}
    import psycopg

    with psycopg.connect(pg_ledger) as conn:
        (pg_name,) = conn.execute(
            "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
        ).fetchone()
    assert names == {pg_name}
    other = tmp_path / "other.db"
    MessageCassette(other).close()
    before = Ledger("sqlite", str(other)).journal()
    refused(ErrorCode.INVALID_ARGUMENT, copy_ledger, str(source), str(other))
    assert Ledger("sqlite", str(other)).journal() == before == []


def ledger_id_of(path: str) -> str:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return str(
            conn.execute("SELECT value FROM cassette_meta WHERE key = 'ledger_id'").fetchone()[0]
        )
    finally:
        conn.close()


def test_a_second_copy_adds_only_the_rest(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    clock = busy_history(source)
    first = copy_ledger(str(source), pg_ledger)
    assert copy_ledger(str(source), pg_ledger)["copied"] == 0
    with MessageCassette(source, clock=clock) as cassette:
        cassette.post_message({"more": 1}, "run", "USER")
    again = copy_ledger(str(source), pg_ledger)
    assert (again["copied"], again["size"]) == (3, first["size"] + 3)
    assert Ledger("postgresql", pg_ledger).journal() == Ledger("sqlite", str(source)).journal()


def test_a_destination_that_went_its_own_way_is_refused_unchanged(
    tmp_path: Path, pg_ledger: str
) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    copy_ledger(str(source), pg_ledger)
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"pg only": 1}, "run", "USER")
    with MessageCassette(source) as cassette:
        cassette.post_message({"sqlite only": 1}, "run", "USER")
    before = Ledger("postgresql", pg_ledger).journal()
    refused(ErrorCode.JOURNAL_BROKEN, copy_ledger, str(source), pg_ledger)
    assert Ledger("postgresql", pg_ledger).journal() == before


def test_a_destination_ahead_of_its_source_is_refused(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    copy_ledger(str(source), pg_ledger)
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"pg only": 1}, "run", "USER")
    short = tmp_path / "short.db"
    copy_ledger(str(source), str(short))
    before = Ledger("postgresql", pg_ledger).journal()
    # the file is a prefix of the database: copying it there adds nothing and says so
    error = refused(ErrorCode.JOURNAL_BROKEN, copy_ledger, str(short), pg_ledger)
    assert "more than the source" in error.message
    assert Ledger("postgresql", pg_ledger).journal() == before


def test_a_source_whose_chain_is_broken_is_not_copied(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    with unguarded(source) as conn:
        forged = conn.execute(
            "UPDATE cassette_journal SET body = replace(body, ?, ?) WHERE instr(body, ?)",
            ('\\"ok\\":true', '\\"ok\\":false', '\\"ok\\":true'),
        )
        assert forged.rowcount == 1
    refused(ErrorCode.JOURNAL_BROKEN, copy_ledger, str(source), pg_ledger)
    assert Ledger("postgresql", pg_ledger).journal() == []
    dest = tmp_path / "new.db"
    refused(ErrorCode.JOURNAL_BROKEN, copy_ledger, str(source), str(dest))
    assert not dest.exists()  # the file this copy made is gone with it


def test_what_the_destination_cannot_hold_is_refused_before_anything_is_written(
    tmp_path: Path, pg_ledger: str
) -> None:
    from catalytic_cassette.worker_keys import WorkerKey

    source = tmp_path / "signed.db"
    key = WorkerKey("w", Ed25519PrivateKey.generate())
    with MessageCassette(source, worker_key=key) as cassette:
        cassette.post_message({"a": 1}, "run", "WORKER")
    import psycopg

    # every table is ported now: a destination whose schema does not journal one (its
    # owner dropped the trigger) stands for a backend that cannot hold it
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("DROP TRIGGER cassette_attestations_journal ON cassette_attestations")
    error = refused(ErrorCode.BACKEND_UNSUPPORTED, copy_ledger, str(source), pg_ledger)
    assert "cassette_attestations" in error.message
    assert Ledger("postgresql", pg_ledger).journal() == []


def test_copy_on_the_command_line(tmp_path: Path, pg_ledger: str) -> None:
    source = tmp_path / "source.db"
    busy_history(source)
    result = CliRunner().invoke(cli, ["copy", str(source), pg_ledger])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["dest"] == pg_ledger and shown["copied"] == shown["size"]
    onto_itself = CliRunner().invoke(cli, ["copy", str(source), str(source)])
    assert onto_itself.exit_code == 1
    assert onto_itself.stderr.startswith("error: INVALID_ARGUMENT: ")


def refused(code: ErrorCode, call: Any, *args: Any) -> CassetteError:
    with pytest.raises(CassetteError) as caught:
        call(*args)
    assert caught.value.code is code, caught.value
    return caught.value
