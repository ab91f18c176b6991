"""What the history attack modules ask of verify: the first unlawful revision of a row,
named by its seq and by the code the write path refuses that revision with.

Verify judges every journal entry against its row's previous revision (finding kind
``unlawful_history``); a finding's detail begins with the ErrorCode the write path would
raise. Until verify holds that judge, each test that needs it is a strict xfail whose
assertion fails: the attack passes verify, which is the hole the test records.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from catalytic_cassette import MessageCassette
from catalytic_cassette.cli import cli
from catalytic_cassette.verify import FindingKind, verify_path

JUDGED = hasattr(FindingKind, "UNLAWFUL_HISTORY")
KIND = "unlawful_history"

# A test that needs verify to judge history: a strict xfail (its assertion fails) when the
# package has no such judge, so it cannot pass by accident, and passes once it has one.
needs_judge = pytest.mark.xfail(
    not JUDGED,
    strict=True,
    raises=AssertionError,
    reason="verify does not judge each revision against the one before it",
)


# Attacks verify's judge still lets pass: each a strict xfail with its reason.
MISSED: dict[str, str] = {}


def judged(attacks: dict[str, Any]) -> list[Any]:
    """The attacks' names as parameters, the ones in MISSED as strict xfails (once the
    judge is in the package: before, every one is a strict xfail of ``needs_judge``)."""
    return [
        pytest.param(
            name,
            marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=MISSED[name]),
        )
        if JUDGED and name in MISSED
        else name
        for name in attacks
    ]


def unlawful(findings: list[dict[str, Any]]) -> dict[tuple[str, Any], tuple[int, str]]:
    """Each reported row's first unlawful revision: (table, key) -> (seq, code)."""
    first: dict[tuple[str, Any], tuple[int, str]] = {}
    for finding in findings:
        if finding["kind"] == "time_backwards" and finding["seq"] is not None:
            code = "TIME_BACKWARDS"  # (the time check's finding names that rule at its seq)
        elif finding["kind"] != KIND:
            continue
        else:
            code = str(finding["detail"]).split(":", 1)[0]
        where = (finding["table"], finding["key"])
        if where not in first or finding["seq"] < first[where][0]:
            first[where] = (int(finding["seq"]), code)
    return first


def report(target: Path | str, **options: Any) -> dict[str, Any]:
    """Verify's report of the ledger, as a dict (the API)."""
    return verify_path(str(target), **options).to_dict()


def cli_report(target: Path | str) -> tuple[int, dict[str, Any]]:
    """`cassette verify --json`: its exit status and its report."""
    result = CliRunner().invoke(cli, ["--db", str(target), "verify", "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def assert_first_unlawful(
    target: Path | str, table: str, key: Any, seq: int, code: str, *, cli_too: bool = True
) -> list[dict[str, Any]]:
    """Verify exits 1 and names ``seq`` as the first unlawful revision of the row, breaking
    ``code``; through the CLI (``cli_too``) and the API. Returns the API's findings."""
    findings: list[dict[str, Any]] = report(target)["findings"]
    found = unlawful(findings)
    assert found.get((table, key)) == (seq, code), found
    if cli_too:
        status, shown = cli_report(target)
        assert status == 1, shown
        assert unlawful(shown["findings"]).get((table, key)) == (seq, code), shown
    return findings


def journal_size(conn: Any) -> int:
    """The number of journal entries (the next entry's seq)."""
    return int(conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0])


def entries_of(conn: Any, table: str, key: int, start: int = 0) -> list[int]:
    """The seqs of a row's journal entries from ``start`` on, in order."""
    rows = conn.execute(
        "SELECT seq, body FROM cassette_journal WHERE seq >= ? ORDER BY seq"
        if not hasattr(conn, "pgconn")
        else "SELECT seq, body FROM cassette_journal WHERE seq >= %s ORDER BY seq",
        (start,),
    ).fetchall()
    seqs = []
    for seq, body in rows:
        parsed = json.loads(body)
        if parsed["table"] == table and parsed["key"] == key:
            seqs.append(int(seq))
    return seqs


# ------------------------------------------------------- how each attacker stores a revision


@functools.cache
def migrated_ledger() -> bytes:
    """An empty ledger's file, migrated once per session (a ledger's ledger_id is its
    own: every example's copy shares it, which nothing here reads)."""
    with tempfile.TemporaryDirectory(prefix="cassette-history-") as folder:
        path = Path(folder) / "empty.db"
        MessageCassette(path).close()
        assert not Path(str(path) + "-wal").exists() or not Path(str(path) + "-wal").stat().st_size
        return path.read_bytes()


def _code(exc: BaseException) -> str:
    return str(exc).split(":", 1)[0]


def write_path_code(conn: sqlite3.Connection, sql: str, params: Any = ()) -> str:
    """The code the write path (the package connection with every trigger in place)
    refuses ``sql`` with; the statement is rolled back either way."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(sql, params)
    except sqlite3.IntegrityError as exc:
        return _code(exc)
    finally:
        conn.execute("ROLLBACK")
    raise AssertionError(f"the write path accepts {sql}")


@contextmanager
def ignoring(
    conn: sqlite3.Connection, event: str, table: str, when: str, *, clock_guard: bool = True
) -> Iterator[None]:
    """The client's own TEMP trigger, created on its package connection: every row of
    ``event`` on ``table`` matching ``when`` is dropped. Created after the package's TEMP
    triggers, it fires after them (SQLite's order for a connection's TEMP triggers of one
    event; ``forge`` checks the entry was written), so the journal records the row first
    and the file's rules, which fire after every TEMP trigger, never see it. Without
    ``clock_guard`` the client also drops the package's TEMP clock guard of the table for
    the while (it is its own connection), which would refuse first."""
    guard = f"{table}_clock_guard"
    saved = ""
    if not clock_guard:
        (saved,) = conn.execute(
            "SELECT sql FROM temp.sqlite_master WHERE name = ?", (guard,)
        ).fetchone()
        conn.execute(f"DROP TRIGGER temp.{guard}")
    conn.execute(
        f"CREATE TEMP TRIGGER client_skip BEFORE {event} ON main.{table} WHEN {when}"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    try:
        yield
    finally:
        conn.execute("DROP TRIGGER temp.client_skip")
        if not clock_guard:
            conn.execute(saved.replace("CREATE TRIGGER", "CREATE TEMP TRIGGER", 1))


def forge(conn: sqlite3.Connection, sql: str, params: Any = ()) -> int:
    """Run ``sql`` in a write transaction of its own; the seq its first entry took."""
    seq = journal_size(conn)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(sql, params)
    conn.execute("COMMIT")
    assert journal_size(conn) > seq, "nothing was journaled"
    return seq


@contextmanager
def owner_transaction(url: str, table: str, trigger: str) -> Iterator[Any]:
    """A PostgreSQL owner's one transaction: ``trigger`` of ``table`` off, the caller's
    writes (the head taken first, as every journaled write of the ledger does), the
    trigger on, commit. Nothing is left disabled."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        conn.execute("SELECT cassette_tx_ms()")
        yield conn
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}")


def pg_write_path_code(url: str, sql: str, params: Any = None) -> str:
    """The code a PostgreSQL ledger's triggers, all on, refuse ``sql`` with (rolled back)."""
    import psycopg

    from catalytic_cassette.postgresql.connection import translate

    with psycopg.connect(url) as conn:
        try:
            conn.execute(sql, params)
        except psycopg.Error as exc:
            return translate(exc).code.value
        finally:
            conn.rollback()
    raise AssertionError(f"the write path accepts {sql}")
