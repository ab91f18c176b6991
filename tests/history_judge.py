"""What the history attack modules ask of verify: the first unlawful revision of a row,
named by its seq and by the code the write path refuses that revision with.

Verify judges every journal entry against its row's previous revision (finding kind
``unlawful_history``); a finding's detail begins with the ErrorCode the write path would
raise. Until verify holds that judge, each test that needs it is a strict xfail whose
assertion fails: the attack passes verify, which is the hole the test records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

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


def unlawful(findings: list[dict[str, Any]]) -> dict[tuple[str, Any], tuple[int, str]]:
    """Each reported row's first unlawful revision: (table, key) -> (seq, code)."""
    first: dict[tuple[str, Any], tuple[int, str]] = {}
    for finding in findings:
        if finding["kind"] != KIND:
            continue
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
    target: Path | str, table: str, key: int, seq: int, code: str, *, cli_too: bool = True
) -> None:
    """Verify exits 1 and names ``seq`` as the first unlawful revision of the row, breaking
    ``code``; through the CLI (``cli_too``) and the API."""
    found = unlawful(report(target)["findings"])
    assert found.get((table, key)) == (seq, code), found
    if cli_too:
        status, shown = cli_report(target)
        assert status == 1, shown
        assert unlawful(shown["findings"]).get((table, key)) == (seq, code), shown


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
