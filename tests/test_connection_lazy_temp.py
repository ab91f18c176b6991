"""A connection opened with ``lazy_temp_triggers`` (each one-shot CLI command's) installs a
table's TEMP triggers at the first write transaction that names the table, and nothing
else changes: the same rows and journal, the same TEMP-schema check, and a write to a
table whose triggers are absent is refused by the file's own rules (JOURNAL_REQUIRED),
as on a connection without the package."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from catalytic_cassette import ErrorCode, ManualClock, MessageCassette, cassette, sqlfiles
from catalytic_cassette.connection import temp_triggers_by_table
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.verify import verify_path

from .conftest import dump, file_digest

pytestmark = pytest.mark.sqlite_only(reason="SQLite's per-connection TEMP triggers")

TWO_STEPS = {"jobs": [{"intent": "i", "steps": [{"n": 1}, {"n": 2}]}]}


def temp_triggers(conn: sqlite3.Connection) -> set[str]:
    """The ON table of each TEMP trigger the connection carries."""
    rows = conn.execute("SELECT tbl_name FROM sqlite_temp_master WHERE type = 'trigger'")
    return {str(table) for (table,) in rows}


def trigger_names(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_temp_master WHERE type = 'trigger'")
    return {str(name) for (name,) in rows}


def test_every_trigger_is_grouped_by_its_table_in_order() -> None:
    statements = sqlfiles.connection_statements()
    grouped = temp_triggers_by_table(statements)
    assert sorted(s for group in grouped.values() for s in group) == sorted(statements)
    for table, group in grouped.items():
        assert all(f" ON main.{table}\n" in s or f" ON main.{table} " in s for s in group)
        # a table's triggers keep the order of the file (the order they fire in)
        assert [statements.index(s) for s in group] == sorted(statements.index(s) for s in group)
    with pytest.raises(RuntimeError):
        temp_triggers_by_table(("CREATE TEMP TABLE t (x);",))


def test_each_write_installs_the_triggers_of_the_tables_it_names(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    MessageCassette(path, clock=ManualClock()).close()
    lazy = MessageCassette(path, clock=ManualClock(), lazy_temp_triggers=True)
    assert temp_triggers(lazy.conn) == set()
    lazy.post_message(TWO_STEPS, "r", "USER")
    assert temp_triggers(lazy.conn) == {"cassette_messages", "cassette_jobs", "cassette_steps"}
    lease = lazy.claim_step("r", "w", 60)
    assert temp_triggers(lazy.conn) == {"cassette_messages", "cassette_jobs", "cassette_steps"}
    lazy.complete_step("r", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS")
    assert "cassette_receipts" in temp_triggers(lazy.conn)
    lazy.claim_step("r", "w", 60)
    lazy.requeue("r")  # a write naming no tables installs every trigger left
    eager = MessageCassette(tmp_path / "eager.db")
    assert trigger_names(lazy.conn) == trigger_names(eager.conn)
    assert lazy.conn.temp_triggers_pending is None  # type: ignore[attr-defined]
    eager.close()
    lazy.post_message({"n": 3}, "r", "USER")  # the check takes the package's own as installed
    lazy.close()
    assert verify_path(str(path)).ok


@pytest.mark.parametrize("operation", ["post", "claim", "complete"])
def test_a_write_whose_tables_were_not_named_is_refused_by_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """Were a write path to name too few tables, its TEMP journal triggers would be
    missing and the file's rules refuse the write, JOURNAL_REQUIRED: it fails closed."""
    path = tmp_path / "ledger.db"
    with MessageCassette(path, clock=ManualClock()) as setup:
        setup.post_message(TWO_STEPS, "r", "USER")
        lease = setup.claim_step("r", "w", 60)
    for name in ("_POST_WRITES", "_CLAIM_WRITES", "_COMPLETE_WRITES"):
        monkeypatch.setattr(cassette, name, ())
    lazy = MessageCassette(path, clock=ManualClock(), lazy_temp_triggers=True)
    before = (dump(path), file_digest(path))
    with pytest.raises(CassetteError) as refused:
        if operation == "post":
            lazy.post_message({"n": 3}, "r", "USER")
        elif operation == "claim":
            lazy.claim_step("r", "w", 60)
        else:
            lazy.complete_step("r", lease["step_id"], "w", lease["fencing_token"], {}, "SUCCESS")
    assert refused.value.code is ErrorCode.JOURNAL_REQUIRED
    assert not lazy.conn.in_transaction
    assert temp_triggers(lazy.conn) == set()
    lazy.close()
    assert (dump(path), file_digest(path)) == before


def test_raw_sql_on_a_lazy_connection_is_refused_by_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with MessageCassette(path, clock=ManualClock()) as setup:
        setup.post_message(TWO_STEPS, "r", "USER")
    lazy = MessageCassette(path, clock=ManualClock(), lazy_temp_triggers=True)
    before = (dump(path), file_digest(path))
    for sql in (
        "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'w', fencing_token = 1,"
        " lease_expires_at = 1800000000000 WHERE step_id = 1",
        "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
        " VALUES ('r', 'USER', '{}', 1700000000000)",
    ):
        with pytest.raises(sqlite3.IntegrityError, match=r"^JOURNAL_REQUIRED:"):
            lazy.conn.execute(sql)
    lazy.close()
    assert (dump(path), file_digest(path)) == before


def test_a_foreign_temp_object_is_refused_before_and_after_installing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    lazy = MessageCassette(path, clock=ManualClock(), lazy_temp_triggers=True)
    lazy.conn.execute("CREATE TEMP TABLE scratch (x)")
    with pytest.raises(CassetteError) as refused:
        lazy.post_message(TWO_STEPS, "r", "USER")
    assert refused.value.code is ErrorCode.FOREIGN_TEMP_OBJECT
    assert temp_triggers(lazy.conn) == set()  # nothing installed past the refusal
    lazy.conn.execute("DROP TABLE temp.scratch")
    lazy.post_message(TWO_STEPS, "r", "USER")
    # a trigger the package installed lazily, dropped, is refused like any other
    lazy.conn.execute("DROP TRIGGER temp.cassette_steps_journal_update")
    for write in (
        lambda: lazy.claim_step("r", "w", 60),
        lambda: lazy.requeue("r"),  # (would install the rest)
    ):
        with pytest.raises(CassetteError) as refused:
            write()
        assert refused.value.code is ErrorCode.FOREIGN_TEMP_OBJECT
    assert "cassette_receipts" not in temp_triggers(lazy.conn)
    lazy.close()
