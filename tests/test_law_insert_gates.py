"""A rule's gate (``law.InsertRule.gate``) only saves work: over any block of rows, it holds
whenever the rule's scope holds for one of them, and the scope whenever a case does, so a
judge that skips the blocks its gate is false for reports exactly the rows it reports
without the gate.

Rows are generated as texts that break the readable-JSON rule (numbers beyond a 64-bit
integer or a double, nesting beyond the limit, lone surrogates, long texts), texts that
come near it (digits before an e in words and UUIDs, 18 digits, escapes that are no
surrogate), and pieces that could hide a match from a joined text (NUL, multi-byte and
invalid UTF-8, BLOBs, numbers, NULL), in blocks of rows as a table holds them.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from catalytic_cassette import law
from catalytic_cassette.verify import inserts
from catalytic_cassette.verify.tables import TABLES

GATED = [rule for rule in law.INSERT_RULES if rule.gate]
BLOCKS = 24  # (enough for a gate to open more than the judge's share of them)
BIG = "1180591620717411303424"
PIECES = [
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    " ",
    "\n",
    "\t",
    "-",
    ".",
    '"a"',
    '"k":',
    "e",
    "E",
    "1",
    "9",
    "0",
    "10",
    "123456789012345678",  # 18 digits
    "9223372036854775807",  # the largest 64-bit integer
    "9223372036854775808",
    BIG,
    "1e999",
    "-1E+400",
    "1.5e3",
    "4e2a-11ee",  # a UUID's digits before an e
    "\\ud800",
    "\\uDC00",
    "\\u0041",
    "\\",
    "\x00",
    "é",
    "\U0001f600",
    '"checkpoint_id"',
]
WHOLE = [
    "{}",
    "[]",
    f"[{BIG}]",
    f'{{"n":{BIG}}}',
    "[1e999]",
    '{"x":"\\ud800"}',
    '{"\\udc00":1}',
    "[" * 1100 + "]" * 1100,
    '"' + "a" * 2100 + '"',
    '{"checkpoint_id":"cp-x"}',
    '["disk full on /var",{"limit":10}]',
]
TEXTS = st.one_of(
    st.sampled_from(WHOLE),
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.text(max_size=30),
)
VALUES = st.one_of(
    TEXTS,
    TEXTS,
    TEXTS,
    st.none(),
    TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")),  # a BLOB
    st.binary(max_size=8).map(lambda b: b"\xc3" + b + b"1e999"),  # invalid UTF-8, as a BLOB
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
)


def _table(rule: law.InsertRule) -> tuple[str, list[str]]:
    columns = list(law.JSON_COLUMNS[rule.table])
    if rule.table == "cassette_actions":
        columns += ["plan_id"]
    return TABLES[rule.table].rowid, columns


def _scratch(
    rule: law.InsertRule, rows: list[list[Any]], text_rows: list[int]
) -> sqlite3.Connection:
    """A table of the rule's name with only the columns its rules read (no type, so a
    value stays as given), and an empty table of checkpoints. ``text_rows``: rows whose
    BLOBs are stored as text (invalid UTF-8 in a text value)."""
    rowid, columns = _table(rule)
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE TABLE {rule.table} ({rowid} INTEGER PRIMARY KEY, {', '.join(columns)})")
    if rule.table != "cassette_checkpoints":
        conn.execute("CREATE TABLE cassette_checkpoints (checkpoint_id, plan_id)")
    marks = ", ".join("?" for _ in columns)
    conn.executemany(
        f"INSERT INTO {rule.table} VALUES (?, {marks})",
        ((i, *[*row, "p"][: len(columns)]) for i, row in enumerate(rows, 1)),
    )
    for i in text_rows:
        for column in columns:
            conn.execute(
                f"UPDATE {rule.table} SET {column} = CAST({column} AS TEXT)"
                f" WHERE {rowid} = ? AND typeof({column}) = 'blob'",
                (i,),
            )
    return conn


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("rule", GATED, ids=[rule.table for rule in GATED])
@SETTINGS
@given(
    rows=st.lists(st.lists(VALUES, min_size=6, max_size=6), min_size=1, max_size=6),
    text_rows=st.lists(st.integers(1, 6), max_size=3),
)
def test_a_gate_holds_for_every_block_a_case_or_the_scope_holds_in(
    rule: law.InsertRule, rows: list[list[Any]], text_rows: list[int]
) -> None:
    conn = _scratch(rule, rows, text_rows)
    which = " ".join(f"WHEN {cond} THEN {i}" for i, (_, _, cond) in enumerate(rule.cases))
    judged = conn.execute(
        f"SELECT CASE {which} END IS NOT NULL, coalesce(({rule.scope}), 0) FROM {rule.table} AS t"
    ).fetchall()
    (gate,) = conn.execute(f"SELECT {rule.gate} FROM {rule.table} AS t").fetchone()
    for case, scope in judged:
        assert not case or scope, "a case holds outside the scope"
    if any(scope for _, scope in judged):
        assert gate, "the scope holds for a row of a block the gate is false for"


@pytest.mark.slow
@pytest.mark.parametrize("rule", GATED, ids=[rule.table for rule in GATED])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # every block opened: the judge reads the rest of the table in one range
    broken=[n * inserts.GATE_BLOCK + 7 for n in range(BLOCKS)],
    texts=["[1e999]"],
    gap=0,
    limit=inserts.MAX_KEYS,
)
@given(
    broken=st.lists(st.integers(1, BLOCKS * inserts.GATE_BLOCK), max_size=30),
    texts=st.lists(st.sampled_from(WHOLE[2:7]), min_size=1, max_size=5),
    gap=st.sampled_from([0, 100_000]),
    limit=st.sampled_from([3, inserts.MAX_KEYS]),
)
def test_a_gated_judge_reports_what_the_rule_alone_reports(
    rule: law.InsertRule, broken: list[int], texts: list[str], gap: int, limit: int
) -> None:
    """Blocks of rows, a block opened now and then or most of the time (the rest judged
    in one range), ids sparse or not, more broken rows than a rule reports: the same rows,
    gated or not."""
    rows = [["[1]"] * 6 for _ in range(BLOCKS * inserts.GATE_BLOCK)]
    for n, at in enumerate(broken):
        rows[at - 1][n % len(law.JSON_COLUMNS[rule.table])] = texts[n % len(texts)]
    conn = _scratch(rule, rows, [])
    rowid, _ = _table(rule)
    if gap:  # sparse ids: blocks would cost more than they save
        conn.execute(
            f"UPDATE {rule.table} SET {rowid} = {rowid} + {gap} WHERE {rowid} > {len(rows) // 2}"
        )
    ungated = law.InsertRule(rule.table, rule.cases, join=rule.join, scope=rule.scope)
    kept = inserts.MAX_KEYS
    inserts.MAX_KEYS = limit  # (the first rows a rule reports, whichever block holds them)
    try:
        gated = inserts.broken_rows(conn, rule)
        assert gated == inserts.broken_rows(conn, ungated)
    finally:
        inserts.MAX_KEYS = kept
    assert len(gated) == min(len(set(broken)), limit)
