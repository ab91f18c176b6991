"""Every statement the package sends to PostgreSQL is named in ``sql/postgresql``, and
every name is used (issue 15, item 8). The guards live in tests/named_sql.py; the
recording one also runs around every PostgreSQL test (conftest.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from catalytic_cassette import MessageCassette
from catalytic_cassette.postgresql import sqlfiles

from .named_sql import (
    PACKAGE,
    SQLITE_STATEMENTS,
    inline_sql,
    is_named,
    postgresql_modules,
    recording,
    unnamed,
    used_names,
)


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_no_module_that_talks_to_postgresql_writes_sql_in_python() -> None:
    modules = postgresql_modules()
    assert PACKAGE / "postgresql" / "connection.py" in modules
    problems = [
        line for path in modules for line in inline_sql(path.read_text("utf-8"), _relative(path))
    ]
    assert problems == []


def test_the_counted_sqlite_statements_are_in_modules_that_are_scanned() -> None:
    scanned = {_relative(path) for path in postgresql_modules()}
    assert {module for module, _ in SQLITE_STATEMENTS} <= scanned


# Each a way SQL could come back inline, and what the scan reports (by line).
_INLINE = {
    "a literal statement": ("conn.execute('SELECT 1')", 2),
    "lower case, sent": ("conn.execute('select value from cassette_meta')", 2),
    "one word, sent": ("conn.execute('COMMIT')", 2),
    "an f-string": ("conn.execute(f'SELECT {column} FROM cassette_head')", 2),
    "a sum": ("cursor.execute('SELECT ' + columns + ' FROM t', (1,))", 2),
    "a literal set aside": ("sql = 'UPDATE cassette_head SET time_ms = %s'", 2),
    "bytes": ("conn.execute(b'set search_path = public')", 2),
    "through statement()": ("connection.statement(conn, 'show all', {})", 2),
    "through batch()": ("connection.batch(conn, 'select 1', [{}])", 2),
    "a formatted literal": ("conn.execute('DELETE FROM {t}'.format(t=t))", 2),
}


@pytest.mark.parametrize("case", sorted(_INLINE))
def test_the_scan_sees_sql_written_inline(case: str) -> None:
    line, number = _INLINE[case]
    source = f"def f(conn, cursor, columns, t):\n    {line}\n"
    (found,) = inline_sql(source, "postgresql/example.py")
    assert found.startswith(f"postgresql/example.py:{number}: f: ")


def test_the_scan_lets_named_queries_and_prose_through() -> None:
    source = textwrap.dedent(
        '''
        """SELECT in a docstring is prose."""
        def f(conn, op):
            """Insert the rows."""
            conn.execute(query("ledger_id"))
            conn.execute(sqlfiles.query("migration_lock"), {"key": 1})
            if op == "INSERT":
                raise ValueError("set the key first")
        '''
    )
    assert inline_sql(source, "postgresql/example.py") == []


def test_a_counted_sqlite_function_cannot_hide_one_more_statement() -> None:
    source = (PACKAGE / "postgresql" / "ledger.py").read_text("utf-8")
    pragma = '            conn.execute("PRAGMA journal_mode = DELETE")'
    hidden = source.replace(pragma, '            conn.execute("SELECT 1")\n' + pragma)
    assert hidden != source
    assert inline_sql(hidden, "postgresql/ledger.py") == [
        "postgresql/ledger.py: PgLedger.export_snapshot: 2 SQLite statements, 1 counted"
    ]


def test_every_named_query_is_used_by_the_package() -> None:
    sources = [
        path.read_text("utf-8")
        for path in PACKAGE.rglob("*.py")
        if "sql" not in path.relative_to(PACKAGE).parts
    ]
    used = used_names(sources)
    assert sorted(set(sqlfiles.queries()) - used) == []
    assert "journal_from" in used  # (the check itself sees names)
    assert "no_such_query" not in used


def test_the_named_queries_are_read_from_every_file_of_the_folder() -> None:
    queries = sqlfiles.queries()
    assert {"post", "verify_journal", "migration_lock"} <= set(queries)  # three files
    assert all(body.rstrip().endswith(";") for body in queries.values())


def test_what_is_sent_is_named_or_a_migration() -> None:
    assert is_named(sqlfiles.query("server_encoding"))
    assert is_named(sqlfiles.migrations()[0].sql)
    filled = sqlfiles.query("candidates").format(column="plan_id")
    assert is_named(filled)
    assert not is_named("SHOW server_encoding")  # the text must be the named one's
    assert unnamed(["SELECT 1", filled]) == ["SELECT 1"]


def test_the_recording_sees_what_the_package_sends_and_not_the_tests(pg_ledger: str) -> None:
    import psycopg

    from catalytic_cassette.postgresql import connection

    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
    with recording() as sent, psycopg.connect(pg_ledger, autocommit=True) as raw:
        raw.execute("SELECT 1")  # the test's own: not recorded
        connection.statement(raw, "SELECT 2", {})  # the package's, inline: recorded
        with MessageCassette(pg_ledger) as cassette:
            assert cassette.status("run")["messages"] == 1
    assert "SELECT 1" not in sent
    assert unnamed(sent) == ["SELECT 2"]
    assert sqlfiles.query("steps_by_status") in sent
    assert sqlfiles.query("session_settings") in sent


def test_a_copy_sends_only_named_statements(tmp_path: Path, pg_ledger: str) -> None:
    """The copy's writes are composed from templates (copy_insert, copy_step_update)."""
    from catalytic_cassette.copying import copy_ledger

    source = tmp_path / "source.db"
    with MessageCassette(source) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
        lease = cassette.claim_step("run", "w")
        cassette.complete_step("run", lease["step_id"], "w", 1, {}, "SUCCESS")
    with recording() as sent:
        copy_ledger(str(source), pg_ledger)
    assert unnamed(sent) == []
    assert any('INSERT INTO "cassette_steps" ("step_id", "job_id",' in s for s in sent)
    assert sqlfiles.query("copy_step_update") in sent
