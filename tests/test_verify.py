"""verify catches tampering by someone who owns the storage, and names the row: on SQLite
who writes the file (triggers dropped, bytes flipped), on PostgreSQL the superuser with
ordinary triggers off (``conftest.tampering``)."""

from __future__ import annotations

import random
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ManualClock, MessageCassette
from catalytic_cassette.artifacts import default_root
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.clock import SystemClock
from catalytic_cassette.connection import connect_readonly, read_transaction
from catalytic_cassette.verify import (
    LEDGER_TABLES,
    VerifyOptions,
    VerifyReport,
    _same_snapshot,
    verify_connection,
    verify_path,
)
from catalytic_cassette.worker_keys import WorkerKey

from . import backends
from .backends import BACKENDS
from .conftest import dump, tampering, unguarded, write_journal

SQLITE_VERIFIER = pytest.mark.sqlite_only(
    reason="the SQLite verifier's own machinery (its state thread, snapshots, the quick"
    " level split between processes); PostgreSQL's verify replays the rows it mirrors"
)


def _build(path: Path | str) -> None:
    clock: dict[str, Any] = {} if backends.is_postgresql(path) else {"clock": ManualClock()}
    with MessageCassette(path, **clock) as cassette:
        for n in range(4):
            cassette.post_message({"n": n}, "run-a", "USER", f"k{n}")
        cassette.post_message(
            {"jobs": [{"intent": "i", "steps": [{"s": 1}, {"s": 2}]}]}, "run-b", "PLANNER"
        )
        for worker in ("w1", "w2", "w3"):
            step = cassette.claim_step("run-a", worker, 60)
            cassette.complete_step(
                "run-a", step["step_id"], worker, step["fencing_token"], {"w": worker}, "SUCCESS"
            )
        for _ in range(2):
            held = cassette.claim_step("run-a", "w4", 60)
            token = held["fencing_token"]
            cassette.requeue("run-a", held["step_id"], worker_id="w4", fencing_token=token)
        cassette.claim_step("run-b", "w5", 60)
    signer = WorkerKey("w6", Ed25519PrivateKey.generate())
    with MessageCassette(path, worker_key=signer, **clock) as cassette:
        cassette.post_message({"signed": True}, "run-c", "WORKER")
        step = cassette.claim_step("run-c", "w6", 60)
        cassette.complete_step(
            "run-c", step["step_id"], "w6", step["fencing_token"], {"w": "w6"}, "SUCCESS"
        )
    with CausalChain(path, **clock) as chain:
        root = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "PlanStarted",
                "function_name": "plan",
            }
        )
        for n in range(3):
            chain.append_action(
                {
                    "plan_id": "p",
                    "intent_id": "i",
                    "action_type": "CapabilityCall",
                    "function_name": f"tool{n}",
                    "parent_action_id": root.action_id,
                    "session_id": "s",
                    "arguments": [n],
                }
            )
        chain.save_checkpoint("p", {"cursor": 1})
        key = Ed25519PrivateKey.generate()
        chain.seal(key)
        chain.save_checkpoint("p", {"cursor": 2})
        chain.seal(key)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("healthy") / "ledger.db"
    _build(path)
    return path


@pytest.fixture
def ledger(healthy: Path, tmp_path: Path) -> Path:
    """A copy of the healthy SQLite ledger, the test's to damage."""
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(healthy)
    target = sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    return copy


@pytest.fixture(scope="module", params=BACKENDS)
def healthy_either(request: pytest.FixtureRequest) -> Iterator[str]:
    """The healthy ledger of each backend: a file, or the name of a database to copy."""
    if request.param == "sqlite":
        yield str(request.getfixturevalue("healthy"))
        return
    from . import postgres

    server = request.getfixturevalue("pg_server")
    url = postgres.clone_database(server, request.getfixturevalue("pg_template"))
    try:
        _build(url)
        yield postgres.database_name(url)
    finally:
        postgres.drop_database(server, url)


@pytest.fixture
def either(healthy_either: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A copy of the healthy ledger of each backend (a path, or a URL), the test's."""
    if healthy_either.endswith(".db"):
        copy = tmp_path / "copy.db"
        shutil.copyfile(healthy_either, copy)
        yield copy
        return
    from . import postgres

    server = request.getfixturevalue("pg_server")
    url = postgres.clone_database(server, healthy_either)
    try:
        yield url
    finally:
        postgres.drop_database(server, url)


def _verify(path: Path | str) -> VerifyReport:
    return verify_path(str(path))


def _named(report: VerifyReport, table: str, key: object) -> bool:
    return any(f.table == table and f.key == key for f in report.errors)


def test_a_healthy_ledger_passes(either: Path) -> None:
    report = _verify(either)
    assert report.ok, report.findings
    assert report.journal_rows > 20
    assert any("anchor" in note for note in report.notes)


TABLES = sorted(LEDGER_TABLES)


def _some_key(conn: Any, table: str, offset: int = 0) -> object:
    key = LEDGER_TABLES[table][0]
    row = conn.execute(
        f"SELECT {key} FROM {table} ORDER BY {key} LIMIT 1 OFFSET ?", (offset,)
    ).fetchone()
    return row[0]


def _time_column(table: str) -> str:
    return "timestamp" if table == "cassette_actions" else "created_at"


def _edit_column(conn: Any, table: str) -> object:
    key_col, _columns = LEDGER_TABLES[table]
    key = _some_key(conn, table)
    column = _time_column(table)
    conn.execute(f"UPDATE {table} SET {column} = {column} + 1 WHERE {key_col} = ?", (key,))
    return key


def _delete_row(conn: Any, table: str) -> object:
    key_col = LEDGER_TABLES[table][0]
    key = _some_key(conn, table)
    conn.execute(f"DELETE FROM {table} WHERE {key_col} = ?", (key,))
    return key


_FORGERIES = {
    # a copy of an existing row under a new key, with its UNIQUE columns moved aside
    "cassette_messages": "idempotency_key = NULL",
    "cassette_jobs": "ordinal = ordinal + 100",
    "cassette_steps": "ordinal = ordinal + 100",
    "cassette_receipts": "step_id = step_id + 1000",
    "cassette_releases": "fencing_token = fencing_token + 100",
    "cassette_actions": "action_seq = action_seq + 1000",
    "cassette_checkpoints": "checkpoint_seq = checkpoint_seq + 1000",
    "cassette_seals": "created_at = created_at + 1",
    "cassette_attestations": "fencing_token = fencing_token + 100",
}
_FORGED_TEXT_KEYS = {
    "cassette_actions": "00000000-0000-4000-8000-000000000000",
    "cassette_checkpoints": "cp-" + "0" * 64,
}


def _insert_forged(conn: Any, table: str) -> object:
    key_col = LEDGER_TABLES[table][0]
    key = _some_key(conn, table)
    if table in _FORGED_TEXT_KEYS:
        new_key: object = _FORGED_TEXT_KEYS[table]
    else:
        new_key = conn.execute(f"SELECT max({key_col}) + 100 FROM {table}").fetchone()[0]
    conn.execute(
        "CREATE TEMP TABLE forged AS SELECT * FROM " + table + f" WHERE {key_col} = ?", (key,)
    )
    conn.execute(f"UPDATE forged SET {key_col} = ?, {_FORGERIES[table]}", (new_key,))
    conn.execute(f"INSERT INTO {table} SELECT * FROM forged")
    conn.execute("DROP TABLE forged")
    return new_key


def _swap_rows(conn: Any, table: str) -> object:
    """Exchange the positions (integer primary keys) of two rows."""
    position = {"cassette_actions": "action_seq", "cassette_checkpoints": "checkpoint_seq"}.get(
        table, LEDGER_TABLES[table][0]
    )
    key_col = LEDGER_TABLES[table][0]
    first, second = (
        row[0]
        for row in conn.execute(f"SELECT {position} FROM {table} ORDER BY {position} LIMIT 2")
    )
    parked = 10**9  # a free position while the two rows trade places
    conn.execute(f"UPDATE {table} SET {position} = ? WHERE {position} = ?", (parked, first))
    conn.execute(f"UPDATE {table} SET {position} = ? WHERE {position} = ?", (first, second))
    conn.execute(f"UPDATE {table} SET {position} = ? WHERE {position} = ?", (second, parked))
    return conn.execute(
        f"SELECT {key_col} FROM {table} WHERE {position} = ?", (second,)
    ).fetchone()[0]


TAMPERS: dict[str, Callable[[Any, str], object]] = {
    "edit": _edit_column,
    "delete": _delete_row,
    "forge": _insert_forged,
    "swap": _swap_rows,
}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_tampering_with_triggers_dropped_is_named(either: Path, table: str, tamper: str) -> None:
    with tampering(either) as conn:
        key = TAMPERS[tamper](conn, table)
    report = _verify(either)
    assert not any(f.kind.startswith("schema") for f in report.findings)
    assert not report.ok
    assert _named(report, table, key), report.findings


def test_an_edited_journal_body_is_named_by_seq(either: Path) -> None:
    with tampering(either) as conn:
        conn.execute(
            "UPDATE cassette_journal SET body = replace(body, 'run-a', 'run-z') WHERE seq = 1"
        )
    report = _verify(either)
    assert not report.ok
    assert any(f.kind == "leaf_hash" and f.seq == 1 for f in report.errors)


def test_a_deleted_journal_entry_is_a_gap(either: Path) -> None:
    with tampering(either) as conn:
        conn.execute("DELETE FROM cassette_journal WHERE seq = 5")
    report = _verify(either)
    assert any(f.kind == "journal_gap" and f.seq == 6 for f in report.errors)


# The rule that keeps receipts unchanged: one trigger per event on SQLite, one on PostgreSQL.
RECEIPTS_UNCHANGED = {
    "sqlite": "DROP TRIGGER cassette_receipts_no_update",
    "postgresql": "DROP TRIGGER cassette_receipts_no_change ON cassette_receipts",
}


def test_a_dropped_trigger_is_a_finding(either: Path) -> None:
    """Dropped by the file's writer, or by the database owner (who owns the triggers)."""
    backend = "postgresql" if backends.is_postgresql(either) else "sqlite"
    drop = RECEIPTS_UNCHANGED[backend]
    assert backends.raw_script(either, drop)
    report = _verify(either)
    name = drop.split()[2]
    assert [(f.kind, f.table) for f in report.errors] == [("schema_missing", "cassette_receipts")]
    assert name in report.errors[0].detail


@pytest.mark.sqlite_only(reason="a trigger dropped and re-written in the SQLite file's schema")
def test_an_edited_trigger_is_a_finding(ledger: Path) -> None:
    conn = sqlite3.connect(ledger)
    conn.execute("DROP TRIGGER cassette_messages_no_delete")
    conn.execute(
        "CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages"
        " WHEN 0 BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: x'); END"
    )
    conn.commit()
    conn.close()
    report = _verify(ledger)
    assert any(f.kind == "schema_changed" for f in report.errors)


def test_an_expired_lease_is_a_warning_not_a_failure(either: Path) -> None:
    far_future = 10**13
    report = verify_path(str(either), now_ms=far_future)
    assert report.ok
    assert any(f.kind == "lease_expired" and f.severity == "warning" for f in report.findings)


@pytest.mark.sqlite_only(reason="bytes flipped in the SQLite file")
def test_random_byte_flips_never_pass_unnoticed(ledger: Path, tmp_path: Path) -> None:
    """Flip bytes in copies: a change that alters ledger content is always caught.

    A flip that only touches free space or unused bytes leaves the content (the
    dump) unchanged; verify may then pass, and that is correct.
    """
    conn = sqlite3.connect(ledger)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    original = ledger.read_bytes()
    baseline = dump(ledger)
    rng = random.Random(20261122)
    changed_content = 0
    for trial in range(60):
        mutated = bytearray(original)
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(100, len(mutated))  # past the file header
            mutated[position] ^= 1 << rng.randrange(8)
        target = tmp_path / f"flip-{trial}.db"
        target.write_bytes(bytes(mutated))
        try:
            content: list[str] | None = dump(target)
        except Exception:  # a flipped byte may break decoding as well as parsing
            content = None
        try:
            report = _verify(target)
            passed = report.ok
        except CassetteError:
            passed = False
        if content != baseline:
            changed_content += 1
            assert not passed, f"trial {trial}: content changed but verify passed"
        target.unlink()
    assert changed_content > 10


def test_progress_reports_every_journal_row_once(
    either: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from catalytic_cassette.verify import chain

    monkeypatch.setattr(chain, "PROGRESS_EVERY", 7)
    steps: list[int] = []
    report = verify_path(str(either), progress=steps.append)
    assert report.ok
    assert sum(steps) == report.journal_rows
    assert steps[:-1] == [7] * (len(steps) - 1) and 0 < steps[-1] <= 7


# ------------------------------------------------ the state thread and its snapshot


def _inline(path: Path) -> VerifyReport:
    """Every check on one connection, one after another (no second snapshot)."""
    conn = connect_readonly(path)
    try:
        with read_transaction(conn):
            return verify_connection(
                conn,
                VerifyOptions(now_ms=SystemClock().now_ms(), artifact_root=default_root(str(path))),
            )
    finally:
        conn.close()


def _kinds(report: VerifyReport) -> list[tuple[str, str | None, object, str]]:
    return [(f.kind, f.table, f.key, f.severity) for f in report.findings]


@SQLITE_VERIFIER
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_the_threaded_verify_reports_what_the_inline_one_does(ledger: Path, tamper: str) -> None:
    with unguarded(ledger) as conn:
        TAMPERS[tamper](conn, "cassette_actions")
        conn.execute("UPDATE cassette_journal SET body = body || ' ' WHERE seq = 3")
        _edit_column(conn, "cassette_steps")
    threaded, inline = _verify(ledger), _inline(ledger)
    assert not threaded.ok
    assert _kinds(threaded) == _kinds(inline)
    assert threaded.journal_rows == inline.journal_rows
    assert {"state_mismatch", "leaf_hash"} <= {f.kind for f in threaded.findings}


@SQLITE_VERIFIER
def test_the_state_thread_reads_the_same_snapshot_or_none(ledger: Path) -> None:
    conn = connect_readonly(ledger)
    try:
        with read_transaction(conn):
            same = _same_snapshot(conn, str(ledger), 1)
            assert len(same) == 1
            same[0].close()
            with CausalChain(ledger) as chain:  # a writer moves the journal head
                chain.save_checkpoint("p", {"cursor": 99})
            assert _same_snapshot(conn, str(ledger), 1) == ()
            # ... and verify then runs every check on its own snapshot
            report = verify_connection(conn, VerifyOptions(now_ms=SystemClock().now_ms()))
            assert report.ok, report.findings
    finally:
        conn.close()


@pytest.mark.sqlite_only(
    reason="a body re-rendered by another SQLite, every leaf, link and stored node rehashed"
    " in the file (PostgreSQL's consistent rewrite: test_postgres_verify.py)"
)
def test_a_body_rendered_differently_but_equal_by_value_is_not_a_mismatch(
    ledger: Path,
) -> None:
    """The byte comparison is a fast path; a body another SQLite rendered with other
    spacing still matches its row value by value (and its hashes are recomputed)."""
    with sqlite3.connect(ledger) as conn:
        seq, body = conn.execute(
            "SELECT seq, body FROM cassette_journal WHERE tbl = 'cassette_actions'"
            " ORDER BY seq LIMIT 1"
        ).fetchone()
    spaced = body.replace('","', '", "', 3)
    assert spaced != body
    with unguarded(ledger) as conn:
        conn.execute("UPDATE cassette_journal SET body = ? WHERE seq = ?", (spaced, seq))
        _rehash(conn)
    report = _verify(ledger)
    assert not [
        f for f in report.findings if f.kind in ("state_mismatch", "leaf_hash", "chain_hash")
    ], report.findings
    with unguarded(ledger) as conn:  # the same body with a value changed is caught
        conn.execute(
            "UPDATE cassette_journal SET body = replace(body, '\"success\":1', '\"success\":0')"
            " WHERE seq = ?",
            (seq,),
        )
        _rehash(conn)
    assert any(f.kind == "state_mismatch" for f in _verify(ledger).findings)


def _rehash(conn: sqlite3.Connection) -> None:
    """Recompute every leaf, link and tree node from the stored bodies."""
    bodies = conn.execute("SELECT body FROM cassette_journal ORDER BY seq").fetchall()
    write_journal(conn, [body for (body,) in bodies])


@SQLITE_VERIFIER
def test_the_quick_level_hashed_in_two_processes_reports_what_one_does(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long journal is split between this process and a child at the quick level; the
    findings (a forged body in each half, a gap in the second) are the same as when one
    process walks it all."""
    from catalytic_cassette.verify import Level, run

    size = connect_readonly(ledger).execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    with unguarded(ledger) as conn:
        for seq in (2, size - 3):
            conn.execute(f"UPDATE cassette_journal SET body = body || ' ' WHERE seq = {seq}")
        conn.execute(f"DELETE FROM cassette_journal WHERE seq = {size - 2}")
    whole = verify_path(str(ledger), level=Level.QUICK)
    monkeypatch.setattr(run, "PARALLEL_FROM_ROWS", 4)
    parted = verify_path(str(ledger), level=Level.QUICK)
    assert _kinds(parted) == _kinds(whole)
    assert parted.journal_rows == whole.journal_rows == size
    seen = {(f.kind, f.seq) for f in parted.findings}
    assert {("leaf_hash", 2), ("leaf_hash", size - 3), ("journal_gap", size - 1)} <= seen
