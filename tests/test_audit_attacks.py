"""Attacks found by an adversarial review of issue 11's verify and guards, each replayed as
the attacker did it and asserted refused with its code, or reported by verify (never a
traceback, never a bricked ledger)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ManualClock, MessageCassette, sqlfiles
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.connection import register_functions
from catalytic_cassette.errors import ErrorCode
from catalytic_cassette.seals import record_seal
from catalytic_cassette.verify import verify_path

from .backends import Ledger
from .conftest import file_digest

# What only someone who writes the SQLite file can do; the JSON guards below run on both.
SQLITE_FILE = pytest.mark.sqlite_only(
    reason="attacks by someone who writes the SQLite file (a client clock, look-alike"
    " functions, triggers dropped, writable_schema, ANALYZE)"
)

T0 = 1_700_000_000_000
YEAR_10000_MS = 253_402_300_800_000


class FixedClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def now_ms(self) -> int:
        return self.now


def look_alike(path: Path, now: int = T0, **forged: Any) -> sqlite3.Connection:
    """A raw connection with the package's function names (forged ones replacing them)
    and its TEMP triggers: it journals, and passes every check that calls a function."""
    conn = sqlite3.connect(path, isolation_level=None)
    register_functions(conn, FixedClock(now))
    for name, (arity, function) in forged.items():
        conn.create_function(name, arity, function)
    for statement in sqlfiles.connection_statements():
        conn.execute(statement)
    return conn


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    with MessageCassette(path, clock=ManualClock(T0)) as cassette:
        cassette.post_message({"a": 1}, "r1", "USER")
    return path


def kinds(path: Path) -> set[str]:
    return {f.kind.value for f in verify_path(str(path), now_ms=T0 + 60_000).errors}


@SQLITE_FILE
def test_a_date_past_the_year_9999_is_refused_and_honest_claims_keep_working(
    ledger: Path,
) -> None:
    before = file_digest(ledger)
    for date in (2**63 - 1, YEAR_10000_MS):
        conn = look_alike(ledger, now=date)
        with pytest.raises(sqlite3.IntegrityError, match=r"^INVALID_TIME: "):
            conn.execute(
                "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
                " VALUES ('r2', 'USER', '{}', ?)",
                (date,),
            )
        conn.close()
    with pytest.raises(CassetteError) as caught:  # the package with such a clock, too
        MessageCassette(ledger, clock=ManualClock(2**63 - 1)).post_message({}, "r2", "USER")
    assert caught.value.code is ErrorCode.INVALID_TIME
    assert file_digest(ledger) == before
    # The latest possible date is carried forward, and claims still work.
    conn = look_alike(ledger, now=YEAR_10000_MS - 1)
    conn.execute(
        "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
        " VALUES ('r2', 'USER', '{\"jobs\": []}', ?)",
        (YEAR_10000_MS - 1,),
    )
    conn.close()
    with MessageCassette(ledger, clock=ManualClock(T0)) as cassette:
        claimed = cassette.claim_step("r1", "w1", 60)
        assert claimed["lease_expires_at"] == YEAR_10000_MS - 1 + 60_000
    assert "time_in_future" in kinds(ledger)


@pytest.fixture
def posted(backend: Ledger) -> Ledger:
    """``ledger``'s message, on the backend under test."""
    with backend.open() as cassette:
        cassette.post_message({"a": 1}, "r1", "USER")
    return backend


def raw_message(backend: Ledger, run_id: str, payload: str) -> ErrorCode | None:
    """A message inserted as the strongest SQL client of each backend: on SQLite the
    look-alike (it journals, passes every check that calls a function), on PostgreSQL the
    database owner. The code it is refused with, or None."""
    if backend.postgresql:
        return backend.raw_sql(
            "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES (?, 'USER', ?)",
            run_id,
            payload,
        )
    conn = look_alike(Path(backend.target), backend.now_ms())
    try:
        conn.execute(
            "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
            " VALUES (?, 'USER', ?, ?)",
            (run_id, payload, backend.now_ms()),
        )
    except sqlite3.IntegrityError as error:
        assert str(error).startswith("INVALID_PAYLOAD: "), str(error)
        return ErrorCode.INVALID_PAYLOAD
    finally:
        conn.close()
    return None


@pytest.mark.parametrize(
    "payload",
    [
        '{"a":"\\ud800"}',  # a lone high surrogate
        '{"a":"x\\udfff"}',  # a lone low surrogate
        '{"\\udc00":1}',  # in a key
        '{"a":' + "[" * 1030 + "]" * 1030 + "}",  # deeper than the API reads
        '{"a":' + '{"b":' * 1025 + "1" + "}" * 1025 + "}",
    ],
    ids=["high", "low", "key", "deep-arrays", "deep-objects"],
)
@pytest.mark.both_backends
def test_json_the_api_cannot_read_back_is_refused_for_any_connection(
    posted: Ledger, payload: str
) -> None:
    before = file_digest(posted.target)  # type: ignore[arg-type]
    assert raw_message(posted, "r1", payload) is ErrorCode.INVALID_PAYLOAD
    assert file_digest(posted.target) == before  # type: ignore[arg-type]
    with posted.open() as cassette:
        assert cassette.claim_step("r1", "w1", 60)["payload"] == {"a": 1}


@pytest.mark.both_backends
def test_json_the_api_reads_is_accepted(posted: Ledger) -> None:
    """The walk refuses only what it must: a surrogate pair, Arabic text, 1024 levels."""
    payloads = (
        '{"a":"\\ud83d\\ude00"}',
        '{"a":"\u068e\u069e \u00e9"}',
        '{"a":' + "[" * 1023 + "]" * 1023 + "}",
        '{"a":' + "1" * 18 + "}",
    )
    for payload in payloads:
        assert raw_message(posted, "r9", payload) is None, payload
    stored = posted.rows("SELECT payload_json FROM cassette_messages WHERE run_id = 'r9'")
    assert [text for (text,) in stored] == list(payloads)  # as written


def _loosen_and_store(path: Path, table: str, loose: str, insert: str) -> None:
    """writable_schema: strip STRICT, store a value the schema forbids, put the exact SQL
    text back (so the schema check sees nothing)."""
    db = sqlite3.connect(path, isolation_level=None)
    original = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    triggers = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,)
    ).fetchall()
    for name, _ in triggers:
        db.execute(f"DROP TRIGGER {name}")
    for sql in (loose, None):
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql or original, table))
        db.execute("PRAGMA writable_schema = OFF")
        db.close()
        db = sqlite3.connect(path, isolation_level=None)
        if sql is not None:
            db.execute(insert)
    for _, sql in triggers:
        db.execute(sql)
    db.close()


@SQLITE_FILE
@pytest.mark.parametrize("table", ["cassette_tree_nodes", "cassette_seals"])
def test_a_value_of_a_forbidden_type_is_a_finding_not_a_traceback(ledger: Path, table: str) -> None:
    if table == "cassette_tree_nodes":
        loose = (
            "CREATE TABLE cassette_tree_nodes (leaf_end ANY, level ANY, hash ANY,"
            " PRIMARY KEY (leaf_end, level)) WITHOUT ROWID"
        )
        insert = "INSERT INTO cassette_tree_nodes VALUES ('zz', 1, zeroblob(32))"
    else:
        loose = (
            "CREATE TABLE cassette_seals (seal_id INTEGER PRIMARY KEY, tree_size ANY,"
            " root_hex ANY, origin ANY, key_id ANY, note ANY, created_at ANY)"
        )
        insert = "INSERT INTO cassette_seals VALUES (1, 'zz', 'x', 'o', 'k', 'n', 1)"
    _loosen_and_store(ledger, table, loose, insert)
    report = verify_path(str(ledger))
    assert not report.ok
    assert "corrupt" in {f.kind.value for f in report.errors}


@SQLITE_FILE
def test_a_squatted_checkpoint_id_is_refused_to_the_honest_writer(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    context = {"step": 3}
    with CausalChain(path, clock=ManualClock(T0)) as chain:
        started = chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        assert started.action_seq == 1
    # the id the honest writer will compute, under a forged hash function, other content
    from catalytic_cassette.plans import checkpoint_id_for, checkpoint_text

    honest_text = checkpoint_text("p", context)
    forged_id = checkpoint_id_for(honest_text)
    conn = look_alike(path, cassette_sha256_hex=(1, lambda text: forged_id[3:]))
    conn.execute(
        "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)"
        " VALUES (?, 'p', ?, ?)",
        (forged_id, '{"context":{"step":666},"plan_id":"p"}', T0),
    )
    conn.close()
    assert honest_text != '{"context":{"step":666},"plan_id":"p"}'
    with CausalChain(path, clock=ManualClock(T0)) as chain, pytest.raises(CassetteError) as err:
        chain.save_checkpoint("p", context)
    assert err.value.code is ErrorCode.CHECKPOINT_MISMATCH
    assert "checkpoint_id" in kinds(path)


@SQLITE_FILE
def test_a_table_named_like_sqlite_statistics_is_an_extra_table(ledger: Path) -> None:
    db = sqlite3.connect(ledger, isolation_level=None)
    db.execute("CREATE TABLE stolen (secret, payload, n)")
    db.execute("INSERT INTO stolen VALUES ('key material', '{}', 42)")
    db.execute("PRAGMA writable_schema = ON")
    db.execute(
        "UPDATE sqlite_master SET name = 'sqlite_stat3', tbl_name = 'sqlite_stat3',"
        " sql = 'CREATE TABLE sqlite_stat3 (secret, payload, n)' WHERE name = 'stolen'"
    )
    db.execute("PRAGMA writable_schema = OFF")
    db.close()
    assert "schema_extra" in kinds(ledger)


@SQLITE_FILE
def test_real_statistics_are_only_a_warning(ledger: Path) -> None:
    db = sqlite3.connect(ledger, isolation_level=None)
    db.execute("ANALYZE")
    db.close()
    report = verify_path(str(ledger), now_ms=T0 + 60_000)
    assert report.ok
    assert "planner_statistics" in {f.kind.value for f in report.findings}


@SQLITE_FILE
def test_a_rewritten_ledger_id_no_longer_matches_its_seals(ledger: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    with MessageCassette(ledger, clock=ManualClock(T0)) as cassette:
        record_seal(cassette.conn, Ed25519PrivateKey.generate(), now_ms=T0, origin=None)
    assert verify_path(str(ledger), now_ms=T0 + 60_000).ok
    db = sqlite3.connect(ledger, isolation_level=None)
    for trigger in ("cassette_meta_no_update",):
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (trigger,)).fetchone()[0]
        db.execute(f"DROP TRIGGER {trigger}")
        db.execute("UPDATE cassette_meta SET value = ? WHERE key = 'ledger_id'", ("0" * 32,))
        db.execute(sql)
    db.close()
    assert "schema_changed" in kinds(ledger)
