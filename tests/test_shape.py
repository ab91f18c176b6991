"""Each journaled table's columns have one home: the migrations (issue 12, "Shape").

The columns are also spelled in the journaling TEMP triggers (each schema file's TEMP section),
verify's table list (verify/tables.py) and ``actions.COLUMNS``. These tests read each of
those copies and compare it, column by column and in order, with the table SQLite built
from the migrations, so that a column added in one place and forgotten in another fails
here rather than as a verify finding on a user's ledger.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from catalytic_cassette import connect, sqlfiles
from catalytic_cassette.actions import COLUMNS as ACTION_COLUMNS
from catalytic_cassette.verify.tables import DENSE_TABLES, TABLES

pytestmark = pytest.mark.sqlite_only(reason="the columns SQLite's TEMP journaling triggers spell")

# One journaling trigger: its event, its table, the key it journals and the row's columns.
# (Since 0011 they fire BEFORE the row, only for a row its constraints will take, and
# write the rowid as k.id: the next id when NULL is inserted.)
_JOURNAL_TRIGGER = re.compile(
    r"CREATE TEMP TRIGGER (?P<name>\w+) BEFORE (?P<event>INSERT|UPDATE) ON main\.(?P<table>\w+)\s+"
    r"(?:--[^\n]*\n)?WHEN (?:(?!\nEND;).)*?\nBEGIN\s+"
    r"INSERT INTO cassette_journal\b(?P<body>.*?)\nEND;",
    re.DOTALL,
)
_HEADER = re.compile(
    r"json_object\('table', '(?P<table>\w+)', 'op', '(?P<op>\w+)',\s*'key',"
    r" (?:NEW\.(?P<key>\w+)|(?P<rowid>k\.id)),"
)
_ROW = re.compile(r"'row', json_object\((?P<pairs>.*?)\)\) AS body", re.DOTALL)
_PAIR = re.compile(r"'(\w+)', (NEW\.\w+|k\.id)")


def _journal_triggers() -> list[re.Match[str]]:
    return list(_JOURNAL_TRIGGER.finditer(sqlfiles.connection_sql()))


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> sqlite3.Connection:
    path: Path = tmp_path_factory.mktemp("shape") / "shape.db"
    connect(path).close()
    return sqlite3.connect(path)


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    # table_xinfo lists generated columns too (hidden = 2 or 3); no journaled table has one
    rows = conn.execute("SELECT name, hidden FROM pragma_table_xinfo(?)", (table,)).fetchall()
    return tuple(name for name, hidden in rows if hidden == 0)


def test_verify_lists_every_table_that_refuses_unjournaled_writes(
    migrated: sqlite3.Connection,
) -> None:
    journaled = {
        table
        for (table,) in migrated.execute(
            "SELECT tbl_name FROM sqlite_schema WHERE type = 'trigger' AND name GLOB '*_rules'"
            " AND sql LIKE '%JOURNAL_REQUIRED%'"
        )
    }
    assert journaled == set(TABLES)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_verify_columns_are_the_migrated_columns(migrated: sqlite3.Connection, table: str) -> None:
    spec = TABLES[table]
    assert spec.columns == _table_columns(migrated, table)
    assert spec.key in spec.columns and spec.rowid in spec.columns
    assert spec.dated_by in spec.columns


def test_action_columns_are_the_migrated_columns(migrated: sqlite3.Connection) -> None:
    assert _table_columns(migrated, "cassette_actions") == ACTION_COLUMNS


def test_every_journaled_table_has_its_insert_trigger_and_only_steps_an_update_trigger() -> None:
    events = {(m["table"], m["event"]) for m in _journal_triggers()}
    assert {table for table, event in events if event == "INSERT"} == set(TABLES)
    assert {table for table, event in events if event == "UPDATE"} == {"cassette_steps"}
    assert len(_journal_triggers()) == len(TABLES) + 1  # no table journaled twice


@pytest.mark.parametrize("trigger", _journal_triggers(), ids=lambda m: m["name"])
def test_each_journal_trigger_writes_the_table_columns_in_order(trigger: re.Match[str]) -> None:
    spec = TABLES[trigger["table"]]
    header = _HEADER.search(trigger["body"])
    assert header is not None, trigger["name"]
    assert header["table"] == trigger["table"]
    assert header["op"] == trigger["event"]
    assert (header["key"] or spec.rowid) == spec.key
    assert header["rowid"] is None or trigger["event"] == "INSERT"
    row = _ROW.search(trigger["body"])
    assert row is not None, trigger["name"]
    pairs = _PAIR.findall(row["pairs"])
    rowid = "k.id" if trigger["event"] == "INSERT" else f"NEW.{spec.rowid}"
    assert all(
        value == (rowid if label == spec.rowid else f"NEW.{label}") for label, value in pairs
    ), pairs
    assert tuple(label for label, _ in pairs) == spec.columns
    # nothing else between the parentheses: every name is a 'label', NEW.column pair
    assert len(re.findall(r"NEW\.|k\.id", row["pairs"])) == len(pairs)


def test_the_drift_check_sees_a_missing_column() -> None:
    """The parser is not vacuous: dropping one column from a trigger is noticed."""
    trigger = next(m for m in _journal_triggers() if m["table"] == "cassette_messages")
    mutilated = trigger["body"].replace("'source', NEW.source, ", "")
    row = _ROW.search(mutilated)
    assert row is not None
    labels = tuple(label for label, _ in _PAIR.findall(row["pairs"]))
    assert labels != TABLES["cassette_messages"].columns
    assert "source" not in labels


def test_verify_checks_dense_ids_of_exactly_the_tables_the_sql_keeps_dense(
    migrated: sqlite3.Connection,
) -> None:
    dense = {
        table
        for (table,) in migrated.execute(
            "SELECT tbl_name FROM sqlite_schema WHERE type = 'trigger'"
            " AND name = tbl_name || '_rules' AND sql LIKE '%ids are dense%'"
        )
    }
    assert dense and set(DENSE_TABLES) == dense
