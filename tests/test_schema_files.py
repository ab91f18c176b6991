"""The law as written (schema/NN_<concern>.sql) and the law as migrated are one law.

schema/ is the authority: each concern's file holds the objects a ledger keeps and, after
``sqlfiles.TEMP_SECTION``, the TEMP triggers every package connection installs. The
baseline migration is generated from those files; a later migration changes a ledger from
there, and the files change with it. These tests prove, in the manner of procrastinate's
schema check, that a ledger made from the files and one made by the baseline plus every
later migration hold the same objects, and that the triggers fire in the order the law was
written for.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalytic_cassette import ErrorCode, MessageCassette, connect, migrate, sqlfiles

pytestmark = pytest.mark.sqlite_only(reason="SQLite's schema files and baseline migration")

SchemaRow = tuple[str, str, str, "str | None"]


def _by_table(rows: list[SchemaRow]) -> dict[str, list[SchemaRow]]:
    tables: dict[str, list[SchemaRow]] = {}
    for row in rows:
        tables.setdefault(row[2], []).append(row)
    return tables


def assert_same_ledger(written: list[SchemaRow], migrated: list[SchemaRow]) -> None:
    """Every row of sqlite_master in full (type, name, table, SQL text), and each table's
    rows in their order: the order SQLite loads a table's triggers in, so the order they
    fire in. How the rows of different tables interleave carries no meaning (a later
    migration that re-creates an object moves it to the end of sqlite_master)."""
    assert sorted(written, key=repr) == sorted(migrated, key=repr)
    assert _by_table(written) == _by_table(migrated)


def test_the_baseline_migration_is_made_from_the_schema_files() -> None:
    """migrations/0001_baseline.sql is generated (python -m catalytic_cassette.migrate
    baseline), never edited. Once a release has shipped it, it is frozen: a later
    migration changes the ledger, and the equality below is what keeps the files true."""
    shipped = sqlfiles.migrations()
    assert shipped[0].version == 1 and shipped[0].name == "baseline"
    if len(shipped) == 1:
        assert shipped[0].sql == migrate.baseline_sql()


def test_the_schema_files_equal_the_baseline_and_every_later_migration() -> None:
    written = migrate.schema_objects()
    assert len([row for row in written if row[0] == "trigger"]) == 67
    assert_same_ledger(written, migrate.reference_objects())


def test_a_ledger_file_holds_what_the_schema_files_make(db_path: Path) -> None:
    connect(db_path).close()
    conn = sqlite3.connect(db_path)
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid")
    on_file = [(str(a), str(b), str(c), None if d is None else str(d)) for a, b, c, d in rows]
    conn.close()
    assert_same_ledger(on_file, migrate.schema_objects())


# A later migration, as one would come after a release: it adds a table, a trigger that
# fires first among the steps' own, and re-creates the migrations guard for itself.
LATER_MIGRATION = """\
CREATE TABLE cassette_later (n INTEGER PRIMARY KEY) STRICT;
CREATE TRIGGER cassette_steps_later BEFORE UPDATE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: later'); END;
DROP TRIGGER cassette_migrations_insert_guard;
{guard}
"""
LATER_STEPS_TRIGGER = """
CREATE TRIGGER cassette_steps_later BEFORE UPDATE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: later'); END;
"""


@pytest.fixture
def later_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the package's SQL with a migration 0002 and the schema files changed to
    match it; sqlfiles reads the copy while the test runs."""
    copy = tmp_path / "sql"
    shutil.copytree(sqlfiles.SQLITE_SQL, copy)
    ledger = copy / "schema" / "10_ledger.sql"
    text = ledger.read_text()
    old_guard = re.search(
        r"CREATE TRIGGER cassette_migrations_insert_guard .*?\nEND;", text, re.DOTALL
    )
    assert old_guard is not None
    guard = old_guard.group(0).replace(
        "NEW.version IS NOT 1 OR NEW.name IS NOT 'baseline'",
        "NEW.version IS NOT 2 OR NEW.name IS NOT 'later'",
    )
    assert guard != old_guard.group(0)
    ledger.write_text(text.replace(old_guard.group(0), guard))
    steps = copy / "schema" / "30_steps.sql"
    kept, marker, temp = steps.read_text().partition(sqlfiles.TEMP_SECTION)
    steps.write_text(kept + LATER_STEPS_TRIGGER + "\n" + marker + temp)
    (copy / "schema" / "70_later.sql").write_text(
        "CREATE TABLE cassette_later (n INTEGER PRIMARY KEY) STRICT;\n"
    )
    (copy / "migrations" / "0002_later.sql").write_text(LATER_MIGRATION.format(guard=guard))
    monkeypatch.setattr(sqlfiles, "SQLITE_SQL", str(copy))
    _forget_the_sql()
    yield copy
    monkeypatch.undo()
    _forget_the_sql()


def _forget_the_sql() -> None:
    for cached in (
        sqlfiles.migrations,
        sqlfiles.schema_files,
        sqlfiles.connection_statements,
        migrate.shipped_migrations,
    ):
        cached.cache_clear()


def test_the_equality_keeps_proving_after_a_later_migration(later_package: Path) -> None:
    assert [m.version for m in sqlfiles.migrations()] == [1, 2]
    written, migrated = migrate.schema_objects(), migrate.reference_objects()
    assert ("table", "cassette_later") in {(row[0], row[1]) for row in migrated}
    assert_same_ledger(written, migrated)
    # the baseline is not made again from files that a later migration changed
    assert sqlfiles.migrations()[0].sql != migrate.baseline_sql()


def test_the_equality_fails_when_the_files_and_the_migrations_differ(
    later_package: Path,
) -> None:
    """A trigger written in the wrong place of its table's file fires in another order:
    the same objects, another law."""
    steps = later_package / "schema" / "30_steps.sql"
    text = steps.read_text()
    moved = text.replace(LATER_STEPS_TRIGGER, "\n")
    first_trigger = moved.index("CREATE TRIGGER cassette_steps_")
    steps.write_text(
        moved[:first_trigger] + LATER_STEPS_TRIGGER.lstrip() + "\n" + moved[first_trigger:]
    )
    _forget_the_sql()
    written, migrated = migrate.schema_objects(), migrate.reference_objects()
    assert sorted(written, key=repr) == sorted(migrated, key=repr)
    with pytest.raises(AssertionError):
        assert_same_ledger(written, migrated)


def test_a_baseline_ledger_takes_the_later_migration_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from catalytic_cassette.verify import verify_path

    db_path = tmp_path / "baseline.db"
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
    with monkeypatch.context() as patched:
        copy = tmp_path / "sql"
        shutil.copytree(sqlfiles.SQLITE_SQL, copy)
        ledger_sql = (copy / "schema" / "10_ledger.sql").read_text()
        guard = re.search(
            r"CREATE TRIGGER cassette_migrations_insert_guard .*?\nEND;", ledger_sql, re.DOTALL
        )
        assert guard is not None
        (copy / "migrations" / "0002_later.sql").write_text(
            LATER_MIGRATION.format(
                guard=guard.group(0).replace(
                    "NEW.version IS NOT 1 OR NEW.name IS NOT 'baseline'",
                    "NEW.version IS NOT 2 OR NEW.name IS NOT 'later'",
                )
            )
        )
        patched.setattr(sqlfiles, "SQLITE_SQL", str(copy))
        _forget_the_sql()
        try:
            with MessageCassette(db_path) as cassette:  # migrates to 2
                assert cassette.conn.execute("PRAGMA user_version").fetchone()[0] == 2
                cassette.post_message({"n": 2}, "r", "USER")
            assert verify_path(str(db_path)).ok
        finally:
            patched.undo()
            _forget_the_sql()


# ----------------------------------------------------------------- trigger order
# SQLite runs a connection's TEMP triggers before the file's, and of the file's own the
# newest first. Which refusal a write gets, and whether the journal entry is written
# before the rules look for it, depend on it. This is the order, per table and event,
# first to last, TEMP triggers included.
FIRING_ORDER: dict[tuple[str, str, str], list[str]] = {
    ("cassette_actions", "BEFORE", "DELETE"): ["cassette_actions_no_delete"],
    ("cassette_actions", "BEFORE", "INSERT"): [
        "cassette_actions_journal",
        "cassette_actions_plan_hash_guard",
        "cassette_actions_plan_finished",
        "cassette_actions_lifecycle_gate",
        "cassette_actions_cause_guard",
        "cassette_actions_insert_guard",
        "cassette_actions_rules",
    ],
    ("cassette_actions", "BEFORE", "UPDATE"): ["cassette_actions_no_update"],
    ("cassette_actions_lifecycle", "INSTEAD OF", "INSERT"): ["cassette_actions_lifecycle_guard"],
    ("cassette_actions_readable", "INSTEAD OF", "INSERT"): [
        "cassette_actions_artifact_refs",
        "cassette_actions_readable_result_artifact",
        "cassette_actions_readable_arguments_artifact",
        "cassette_actions_readable_metadata",
        "cassette_actions_readable_result",
        "cassette_actions_readable_arguments",
    ],
    ("cassette_attestations", "BEFORE", "DELETE"): ["cassette_attestations_no_delete"],
    ("cassette_attestations", "BEFORE", "INSERT"): [
        "cassette_attestations_journal",
        "cassette_attestations_clock_guard",
        "cassette_attestations_insert_guard",
        "cassette_attestations_rules",
    ],
    ("cassette_attestations", "BEFORE", "UPDATE"): ["cassette_attestations_no_update"],
    ("cassette_checkpoints", "BEFORE", "DELETE"): ["cassette_checkpoints_no_delete"],
    ("cassette_checkpoints", "BEFORE", "INSERT"): [
        "cassette_checkpoints_journal",
        "cassette_checkpoints_hash_guard",
        "cassette_checkpoints_insert_guard",
        "cassette_checkpoints_rules",
    ],
    ("cassette_checkpoints", "BEFORE", "UPDATE"): ["cassette_checkpoints_no_update"],
    ("cassette_jobs", "BEFORE", "DELETE"): ["cassette_jobs_no_delete"],
    ("cassette_jobs", "BEFORE", "INSERT"): [
        "cassette_jobs_journal",
        "cassette_jobs_insert_guard",
        "cassette_jobs_rules",
    ],
    ("cassette_jobs", "BEFORE", "UPDATE"): ["cassette_jobs_no_update"],
    ("cassette_journal", "AFTER", "INSERT"): ["cassette_journal_grow_tree"],
    ("cassette_journal", "BEFORE", "DELETE"): ["cassette_journal_no_delete"],
    ("cassette_journal", "BEFORE", "INSERT"): ["cassette_journal_insert_guard"],
    ("cassette_journal", "BEFORE", "UPDATE"): ["cassette_journal_no_update"],
    ("cassette_messages", "BEFORE", "DELETE"): ["cassette_messages_no_delete"],
    ("cassette_messages", "BEFORE", "INSERT"): [
        "cassette_messages_journal",
        "cassette_messages_insert_guard",
        "cassette_messages_rules",
    ],
    ("cassette_messages", "BEFORE", "UPDATE"): ["cassette_messages_no_update"],
    ("cassette_meta", "BEFORE", "DELETE"): ["cassette_meta_no_delete"],
    ("cassette_meta", "BEFORE", "INSERT"): ["cassette_meta_insert_guard"],
    ("cassette_meta", "BEFORE", "UPDATE"): ["cassette_meta_no_update"],
    ("cassette_migrations", "BEFORE", "DELETE"): ["cassette_migrations_no_delete"],
    ("cassette_migrations", "BEFORE", "INSERT"): ["cassette_migrations_insert_guard"],
    ("cassette_migrations", "BEFORE", "UPDATE"): ["cassette_migrations_no_update"],
    ("cassette_receipts", "AFTER", "INSERT"): ["cassette_receipts_commit_step"],
    ("cassette_receipts", "BEFORE", "DELETE"): ["cassette_receipts_no_delete"],
    ("cassette_receipts", "BEFORE", "INSERT"): [
        "cassette_receipts_journal",
        "cassette_receipts_clock_guard",
        "cassette_receipts_signature_guard",
        "cassette_receipts_insert_guard",
        "cassette_receipts_rules",
    ],
    ("cassette_receipts", "BEFORE", "UPDATE"): ["cassette_receipts_no_update"],
    ("cassette_releases", "AFTER", "INSERT"): ["cassette_releases_requeue_step"],
    ("cassette_releases", "BEFORE", "DELETE"): ["cassette_releases_no_delete"],
    ("cassette_releases", "BEFORE", "INSERT"): [
        "cassette_releases_journal",
        "cassette_releases_signature_guard",
        "cassette_releases_insert_guard",
        "cassette_releases_rules",
    ],
    ("cassette_releases", "BEFORE", "UPDATE"): ["cassette_releases_no_update"],
    ("cassette_seals", "BEFORE", "DELETE"): ["cassette_seals_no_delete"],
    ("cassette_seals", "BEFORE", "INSERT"): [
        "cassette_seals_journal",
        "cassette_seals_insert_guard",
        "cassette_seals_rules",
    ],
    ("cassette_seals", "BEFORE", "UPDATE"): ["cassette_seals_no_update"],
    ("cassette_steps", "BEFORE", "DELETE"): ["cassette_steps_no_delete"],
    ("cassette_steps", "BEFORE", "INSERT"): [
        "cassette_steps_journal",
        "cassette_steps_insert_guard",
        "cassette_steps_rules",
    ],
    ("cassette_steps", "BEFORE", "UPDATE"): [
        "cassette_steps_journal_update",
        "cassette_steps_clock_guard",
        "cassette_steps_signature_guard",
        "cassette_steps_update_guard",
        "cassette_steps_update_rules",
    ],
    ("cassette_tree_nodes", "AFTER", "INSERT"): ["cassette_tree_nodes_grow"],
    ("cassette_tree_nodes", "BEFORE", "DELETE"): ["cassette_tree_nodes_no_delete"],
    ("cassette_tree_nodes", "BEFORE", "INSERT"): [
        "cassette_tree_nodes_bounded",
        "cassette_tree_nodes_insert_guard",
    ],
    ("cassette_tree_nodes", "BEFORE", "UPDATE"): ["cassette_tree_nodes_no_update"],
}

_EVENT = re.compile(r"\b(BEFORE|AFTER|INSTEAD\s+OF)?\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def _event(sql: str) -> tuple[str, str]:
    head = re.split(r"\sON\s", sql, maxsplit=1, flags=re.IGNORECASE)[0]
    found = _EVENT.search(head)
    assert found is not None
    return " ".join((found.group(1) or "BEFORE").upper().split()), found.group(2).upper()


def firing_order(conn: sqlite3.Connection) -> dict[tuple[str, str, str], list[str]]:
    """The order SQLite fires the triggers of ``conn`` in, per table and event, measured:
    a private database gets triggers of the same names on tables of the same names,
    created in the same order (the file's in sqlite_master order, which is the order
    SQLite loads them in, then the TEMP ones), each logging its name when it fires."""
    query = "SELECT name, tbl_name, sql FROM {} WHERE type = 'trigger' ORDER BY rowid"
    kept = [tuple(map(str, row)) for row in conn.execute(query.format("sqlite_master"))]
    temp = [tuple(map(str, row)) for row in conn.execute(query.format("sqlite_temp_master"))]
    mirror = sqlite3.connect(":memory:", isolation_level=None)
    mirror.execute("CREATE TABLE fired (name TEXT)")
    events = {(table, _event(sql)) for _, table, sql in kept + temp}
    views = {table for table, (timing, _) in events if timing == "INSTEAD OF"}
    for table in sorted({table for table, _ in events}):
        shape = "VIEW {} AS SELECT 1 AS x" if table in views else "TABLE {} (x)"
        mirror.execute("CREATE " + shape.format(table))
    for scope, triggers in (("", kept), ("TEMP ", temp)):
        for name, table, sql in triggers:
            timing, op = _event(sql)
            target = f"main.{table}" if scope else table
            mirror.execute(
                f"CREATE {scope}TRIGGER {name} {timing} {op} ON {target}"
                f" BEGIN INSERT INTO fired VALUES ('{name}'); END"
            )
    order: dict[tuple[str, str, str], list[str]] = {}
    for table in sorted({table for table, _ in events}):
        for op, statement in (
            ("INSERT", f"INSERT INTO {table} (x) VALUES (1)"),
            ("UPDATE", f"UPDATE {table} SET x = 2"),
            ("DELETE", f"DELETE FROM {table}"),
        ):
            if table in views and (table, ("INSTEAD OF", op)) not in events:
                continue
            mirror.execute("DELETE FROM fired")
            mirror.execute(statement)
            fired = [
                str(name) for (name,) in mirror.execute("SELECT name FROM fired ORDER BY rowid")
            ]
            for timing in ("BEFORE", "INSTEAD OF", "AFTER"):
                names = [
                    name
                    for name in fired
                    if any(n == name and _event(sql) == (timing, op) for n, _, sql in kept + temp)
                ]
                if names:
                    order[(table, timing, op)] = names
    mirror.close()
    return order


def test_the_triggers_fire_in_the_laws_order(db_path: Path) -> None:
    conn = connect(db_path)  # makes the ledger: triggers as the baseline created them
    try:
        assert firing_order(conn) == FIRING_ORDER
    finally:
        conn.close()
    conn = connect(db_path)  # opens it: triggers as SQLite loads them from the file
    try:
        assert firing_order(conn) == FIRING_ORDER
    finally:
        conn.close()


def _raw_ledger(db_path: Path) -> sqlite3.Connection:
    """A ledger with one LEASED step, and a raw connection to it (none of the package's
    functions or TEMP triggers: every refusal below comes from the file's own triggers)."""
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
        cassette.claim_step("r", "w", 60)
    return sqlite3.connect(db_path, isolation_level=None)


def _refusal(conn: sqlite3.Connection, statement: str) -> str:
    with pytest.raises(sqlite3.IntegrityError) as caught:
        conn.execute(statement)
    return str(caught.value).split(":", 1)[0]


def test_a_steps_guard_refuses_before_its_rules(db_path: Path) -> None:
    """The step's guard fires before the rules (which would say JOURNAL_REQUIRED to a raw
    connection): a raw change of a payload gets the code of what it broke."""
    conn = _raw_ledger(db_path)
    try:
        assert _refusal(conn, "UPDATE cassette_steps SET payload_json = '{}'") == "IMMUTABLE_FIELD"
        # a lawful-looking transition still needs the journal: the rules, last, say so
        assert (
            _refusal(
                conn,
                "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
                " lease_expires_at = NULL",
            )
            == "JOURNAL_REQUIRED"
        )
    finally:
        conn.close()


def test_a_receipts_guard_refuses_before_its_rules(db_path: Path) -> None:
    conn = _raw_ledger(db_path)
    try:
        assert (
            _refusal(
                conn,
                "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
                " fencing_token, outcome, receipt_json, created_at)"
                " VALUES (99, 1, 'r', 'w', 1, 'SUCCESS', '{}', 1)",
            )
            == "STEP_NOT_FOUND"
        )
    finally:
        conn.close()


def test_a_connections_clock_guard_refuses_before_the_files_guard(db_path: Path) -> None:
    """A TEMP trigger fires before the file's: a receipt after the lease expired whose
    outcome the file's guard refuses too gets the clock's code."""
    from catalytic_cassette import ManualClock
    from catalytic_cassette.errors import translate

    clock = ManualClock(1_790_000_000_000)
    with MessageCassette(db_path, clock=clock) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
        step = cassette.claim_step("r", "w", 60)
        clock.advance(120_000)
        with pytest.raises(sqlite3.IntegrityError) as caught:
            cassette.conn.execute(
                "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
                " fencing_token, outcome, receipt_json, created_at)"
                " VALUES (?, ?, 'r', 'w', ?, 'BOGUS', '{}', ?)",
                (step["step_id"], step["job_id"], step["fencing_token"], clock.now_ms()),
            )
    assert translate(caught.value).code is ErrorCode.LEASE_EXPIRED


# ----------------------------------------------------------------- the TEMP sections
def test_each_concern_file_holds_the_temp_triggers_of_its_own_tables() -> None:
    files = sqlfiles.schema_files()
    assert [schema.name for schema in files] == sorted(schema.name for schema in files)
    assert "30_steps.sql" in {schema.name for schema in files}
    for schema in files:
        assert "CREATE TEMP" not in schema.kept.upper().replace("\n", " ")
        kept_tables = set(re.findall(r"CREATE (?:TABLE|VIEW) (\w+)", schema.kept))
        for statement in sqlfiles.statements(schema.temp):
            body = statement[statement.index("CREATE") :]
            assert body.startswith("CREATE TEMP TRIGGER "), body[:60]
            table = re.search(r" ON main\.(\w+)", body.splitlines()[0])
            assert table is not None and table.group(1) in kept_tables, schema.name
    temp = [s[s.index("CREATE") :] for s in sqlfiles.connection_statements()]
    assert temp == [
        s[s.index("CREATE") :] for schema in files for s in sqlfiles.statements(schema.temp)
    ]
    assert len(temp) == 15
