"""Verify's fast path (state and time checked while the journal is walked) never changes
the answer: on any ledger it gives exactly the findings of the full replay, and on an
honest ledger it is the path taken."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catalytic_cassette import ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.errors import CassetteError
from catalytic_cassette.merkle import root_from_leaves
from catalytic_cassette.verify import run as verify_run
from catalytic_cassette.verify import stream as stream_module
from catalytic_cassette.verify import verify_path
from catalytic_cassette.verify.stream import StateStream
from catalytic_cassette.verify.tables import TABLES

from .test_trust import VERIFIED_AT, mutate_behind_the_triggers, sealed  # noqa: F401

pytestmark = [
    pytest.mark.sqlite_only(
        reason="the SQLite verifier's fast path (StateStream) against its full replay, on files"
        " mutated with their triggers dropped; PostgreSQL's verify has no fast path (it replays"
        " the rows it mirrors), and its mutations are test_trust's superuser twin"
    ),
    pytest.mark.slow,
]

T0 = 1_700_000_000_000


class _Spy(StateStream):
    """Records whether the fast path held."""

    outcomes: ClassVar[list[bool]] = []

    def finish(self) -> bool:
        held = super().finish()
        _Spy.outcomes.append(held)
        return held


class _NeverHolds(StateStream):
    """Takes the full replay whatever the ledger holds."""

    def finish(self) -> bool:
        self.held = False
        return super().finish()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    _Spy.outcomes = []
    monkeypatch.setattr(verify_run, "StateStream", _Spy)
    yield _Spy.outcomes


def _findings(path: Path, monkeypatch: pytest.MonkeyPatch, stream: type[StateStream]) -> Any:
    """The report's findings and verdict, or the refusal's code: a mutation can make the
    file one verify refuses outright (a migration row naming a newer schema:
    SCHEMA_TOO_NEW), and both paths must refuse it alike."""
    with monkeypatch.context() as patch:
        patch.setattr(verify_run, "StateStream", stream)
        try:
            report = verify_path(str(path), now_ms=VERIFIED_AT)
        except CassetteError as refused:
            return refused.code
    return [f.to_dict() for f in report.findings], report.ok


def test_an_honest_ledger_takes_the_fast_path(sealed: Path, spy: list[bool]) -> None:  # noqa: F811
    assert verify_path(str(sealed), now_ms=VERIFIED_AT).ok
    assert spy == [True]


def test_a_run_scoped_verify_replays_in_full(sealed: Path, spy: list[bool]) -> None:  # noqa: F811
    assert verify_path(str(sealed), now_ms=VERIFIED_AT, run_id="r1").ok
    assert spy == []  # no stream: the replay filters by run


def test_time_findings_come_from_the_fast_path(tmp_path: Path, spy: list[bool]) -> None:
    """A forged clock two days ahead, and a claim with a lease far over the cap: the
    journal is honest, so the stream judges it, and reports what the full check does."""
    path = tmp_path / "ledger.db"
    clock = ManualClock(T0)
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"n": 1}, "r1", "USER")
        clock.advance(2 * 86_400_000)
        cassette.post_message({"n": 2}, "r1", "USER")
        cassette.claim_step("r1", "w1", 60)
    with CausalChain(path, clock=clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
        )
    report = verify_path(str(path), now_ms=T0 + 60_000)
    kinds = {str(f.kind) for f in report.findings}
    assert {"time_in_future", "time_jump"} <= kinds
    assert spy == [True]


@pytest.mark.parametrize("table", sorted(TABLES))
def test_each_kind_of_row_is_compared(
    sealed: Path,  # noqa: F811
    tmp_path: Path,
    spy: list[bool],
    table: str,
) -> None:
    """One stored date changed in any journaled table (its triggers put back after):
    the stream gives up, and the full check names the row."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(sealed, path)
    dated = TABLES[table].dated_by
    conn = sqlite3.connect(path, isolation_level=None)
    guard = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?"
        " ORDER BY rowid",
        (table,),
    ).fetchall()
    for name, _ in guard:
        conn.execute(f"DROP TRIGGER {name}")
    rowid = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    conn.execute(f"UPDATE {table} SET {dated} = {dated} + 1 WHERE rowid = ?", (rowid,))
    for _, sql in guard:
        conn.execute(sql)
    conn.close()
    report = verify_path(str(path), now_ms=VERIFIED_AT)
    assert [(str(f.kind), f.table) for f in report.errors] == [("state_mismatch", table)]
    assert spy == [table == "cassette_steps"]  # steps are compared after the walk


def _rewrite_history(path: Path, seq: int, edit: dict[str, Any], row_too: bool) -> None:
    """Change fields of one journal body's row (and with ``row_too`` the row itself) and
    rehash the chain from there, with the triggers dropped: what someone rewriting
    history does (only a seal catches it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    triggers = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
    ).fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    body = conn.execute("SELECT body FROM cassette_journal WHERE seq = ?", (seq,)).fetchone()
    if body is not None:
        entry = json.loads(body[0])
        entry["row"].update(edit)
        text = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        conn.execute("UPDATE cassette_journal SET body = ? WHERE seq = ?", (text, seq))
        spec = TABLES.get(entry["table"])
        if row_too and spec is not None:  # the row as well: only the history changed
            for column, value in edit.items():
                if column in spec.columns:
                    conn.execute("SAVEPOINT edit")
                    with contextlib.suppress(sqlite3.IntegrityError):  # STRICT refuses: no change
                        conn.execute(
                            f"UPDATE {entry['table']} SET {column} = ? WHERE {spec.rowid} = ?",
                            (value, entry["row"][spec.rowid]),
                        )
                    conn.execute("RELEASE edit")
        prev = conn.execute(
            "SELECT chain_hash FROM cassette_journal WHERE seq = ?", (seq - 1,)
        ).fetchone()
        link = prev[0] if prev is not None else bytes(32)
        for s, b in conn.execute(
            "SELECT seq, body FROM cassette_journal WHERE seq >= ? ORDER BY seq", (seq,)
        ).fetchall():
            leaf = hashlib.sha256(b"\x00" + b.encode()).digest()
            link = hashlib.sha256(b"\x02" + struct.pack(">Q", s) + link + leaf).digest()
            conn.execute(
                "UPDATE cassette_journal SET leaf_hash = ?, chain_hash = ? WHERE seq = ?",
                (leaf, link, s),
            )
    for _, sql in triggers:
        conn.execute(sql)
    conn.close()


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_fast_path_and_the_full_replay_agree(
    sealed: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    data: st.DataObject,
) -> None:
    path = tmp_path_factory.mktemp("mutated") / "ledger.db"
    shutil.copyfile(sealed, path)
    _tamper(path, data)
    _Spy.outcomes = []
    fast = _findings(path, monkeypatch, _Spy)
    event(f"fast path held: {_Spy.outcomes}, ok: {fast[1]}")
    full = _findings(path, monkeypatch, _NeverHolds)
    assert fast == full


def _tamper(path: Path, data: st.DataObject) -> None:
    """History rewritten and rehashed, or one raw mutation behind the triggers."""
    if data.draw(st.booleans(), label="rewrite history"):
        conn = sqlite3.connect(path)
        size = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
        conn.close()
        field = data.draw(
            st.sampled_from(["created_at", "timestamp", "lease_expires_at", "status", "source"]),
            label="field",
        )
        value = data.draw(
            st.one_of(st.integers(T0 - 10**9, T0 + 10**11), st.sampled_from(["LEASED", "x"])),
            label="value",
        )
        seq = data.draw(st.integers(0, size - 1), label="seq")
        _rewrite_history(path, seq, {field: value}, data.draw(st.booleans(), label="row too"))
    else:
        mutate_behind_the_triggers(path, data)


def _connections(monkeypatch: pytest.MonkeyPatch, sides: int) -> None:
    """Verify with ``sides`` more connections (0: the walk's alone)."""
    monkeypatch.setattr(verify_run, "_side_connections", lambda: max(sides, 1))
    if not sides:
        monkeypatch.setattr(verify_run, "_same_snapshot", lambda *a: ())


@pytest.mark.parametrize("sides", [0, 1, 3])
@pytest.mark.parametrize("run_rows", [1, 2, 32_768])
@pytest.mark.parametrize("waiting", [0, 1, 64])
@pytest.mark.parametrize("shift", [0, 1, 12])
def test_an_honest_ledger_holds_whoever_compares_the_bodies(
    sealed: Path,  # noqa: F811
    spy: list[bool],
    monkeypatch: pytest.MonkeyPatch,
    sides: int,
    run_rows: int,
    waiting: int,
    shift: int,
) -> None:
    """Blocks of rows are compared by the walk as it reads them, or handed out a run of
    entries at a time to whichever connection is free (to the walk's when too many
    wait): an honest ledger holds either way."""
    monkeypatch.setattr(stream_module, "RUN_ROWS", run_rows)
    monkeypatch.setattr(stream_module, "SHARE_SHIFT", shift)
    monkeypatch.setattr(verify_run._SqlChecks, "MAX_WAITING", waiting)
    _connections(monkeypatch, sides)
    assert verify_path(str(sealed), now_ms=VERIFIED_AT).ok
    assert spy == [True]


def test_a_gap_in_the_ids_and_seqs_splits_the_runs(
    tmp_path: Path, spy: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row and its entry deleted behind the triggers: the rows left are still paired
    with the entries left, in runs split at the gap, and the fast path holds (the chain
    names the gap), with the full replay's findings."""
    path = tmp_path / "ledger.db"
    with CausalChain(path, clock=ManualClock(T0)) as chain:
        chain.append_actions(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
            for _ in range(5)
        )
    conn = sqlite3.connect(path, isolation_level=None)
    triggers = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
    ).fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM cassette_actions WHERE action_seq = 3")
    conn.execute("DELETE FROM cassette_journal WHERE seq = 2")
    for _, sql in triggers:
        conn.execute(sql)
    conn.close()
    monkeypatch.setattr(stream_module, "RUN_ROWS", 2)
    monkeypatch.setattr(stream_module, "SHARE_SHIFT", 0)
    fast = _findings(path, monkeypatch, _Spy)
    assert spy == [True]
    assert "journal_gap" in {f["kind"] for f in fast[0]}
    assert fast == _findings(path, monkeypatch, _NeverHolds)


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_bodies_compared_in_runs_on_any_connection_agree_with_the_full_replay(
    sealed: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    data: st.DataObject,
) -> None:
    """Whatever the blocks of rows the walk compares itself, the length of the runs
    compared elsewhere at once, the number of connections and how many comparisons may
    wait: the findings of the full replay."""
    path = tmp_path_factory.mktemp("mutated") / "ledger.db"
    shutil.copyfile(sealed, path)
    _tamper(path, data)
    full = _findings(path, monkeypatch, _NeverHolds)
    with monkeypatch.context() as patch:
        patch.setattr(
            stream_module, "RUN_ROWS", data.draw(st.sampled_from([1, 2, 3, 32_768]), label="run")
        )
        patch.setattr(
            verify_run._SqlChecks,
            "MAX_WAITING",
            data.draw(st.sampled_from([0, 1, 64]), label="waiting"),
        )
        patch.setattr(
            stream_module, "SHARE_SHIFT", data.draw(st.sampled_from([0, 1, 12]), label="shift")
        )
        _connections(patch, data.draw(st.sampled_from([0, 1, 3]), label="sides"))
        _Spy.outcomes = []
        fast = _findings(path, patch, _Spy)
    event(f"fast path held: {_Spy.outcomes}, ok: {fast[1]}")
    assert fast == full


def _indexes(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        return [
            (str(n), str(t), str(s))
            for n, t, s in conn.execute(
                "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index'"
                " AND sql IS NOT NULL ORDER BY name"
            )
        ]
    finally:
        conn.close()


def test_every_index_of_every_table_is_checked(sealed: Path, tmp_path: Path) -> None:  # noqa: F811
    """The file is checked table by table, split between two connections: emptying any
    index that has entries (its SQL edited, REINDEX, the SQL put back) is reported."""
    checked = 0
    for name, table, sql in _indexes(sealed):
        path = tmp_path / f"{name}.db"
        shutil.copyfile(sealed, path)
        conn = sqlite3.connect(path, isolation_level=None)
        entries = conn.execute(f"SELECT count(*) FROM {table} INDEXED BY {name}").fetchone()[0]
        if " WHERE " in sql:  # a partial index: count what it holds
            where = sql.split(" WHERE ", 1)[1]
            entries = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]
        if not entries:
            conn.close()
            continue
        emptied = sql + (" AND 0" if " WHERE " in sql else " WHERE 0")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (emptied, name))
        conn.execute("PRAGMA writable_schema = OFF")
        conn.close()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"REINDEX {name}")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql, name))
        conn.execute("PRAGMA writable_schema = OFF")
        conn.close()
        report = verify_path(str(path), now_ms=VERIFIED_AT)
        mismatches = [f.detail for f in report.findings if str(f.kind) == "index_mismatch"]
        assert any(name in detail for detail in mismatches), (name, report.to_dict())
        checked += 1
    assert checked >= 10  # the ledger fills most indexes


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger of 582 journal entries: two complete blocks of stored nodes (levels 1 to
    9) and an incomplete last block, which stores none (migration 0009)."""
    path = tmp_path_factory.mktemp("grown") / "ledger.db"
    with CausalChain(path, clock=ManualClock(T0)) as chain:
        chain.append_actions(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
            for _ in range(582)
        )
    return path


SIZES = (1, 33, 64, 70, 256, 300, 511, 512, 513, 582)  # wanted roots, across the blocks


def _tree_findings(path: Path, batch: int) -> list[Any]:
    from catalytic_cassette.verify.chain import TreeWalk, check_chain
    from catalytic_cassette.verify.findings import Collector

    conn = sqlite3.connect(path)
    try:
        out = Collector()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(TreeWalk, "BLOCK", batch)
            walk = TreeWalk(conn, out, set(SIZES), stored_nodes=True)
            check_chain(conn, out, None, walk)
            walk.finish()
        return [[f.to_dict() for f in out.report.findings], walk.roots]
    finally:
        conn.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["delete", "edit", "insert"]), st.integers(0, 600), st.integers(1, 9)
        ),
        max_size=3,
    ),
    batch=st.sampled_from([1, 2, 4, 8, 16, 64, 256, 1024]),
)
def test_the_tree_built_in_blocks_names_what_one_leaf_at_a_time_does(
    grown: Path, tmp_path_factory: pytest.TempPathFactory, edits: list[Any], batch: int
) -> None:
    path = tmp_path_factory.mktemp("tree") / "ledger.db"
    shutil.copyfile(grown, path)
    conn = sqlite3.connect(path, isolation_level=None)
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'cassette_tree_nodes'"
    ).fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    for edit, leaf_end, level in edits:
        if edit == "delete":
            conn.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end = ?", (leaf_end,))
        elif edit == "edit":
            conn.execute(
                "UPDATE cassette_tree_nodes SET hash = zeroblob(32) WHERE leaf_end = ?",
                (leaf_end,),
            )
        else:
            conn.execute(
                "INSERT OR IGNORE INTO cassette_tree_nodes VALUES (?, ?, zeroblob(32))",
                ((1 << level) * (leaf_end // (1 << level) + 1) - 1, level),
            )
    conn.close()
    findings, roots = _tree_findings(path, batch)
    assert [findings, roots] == _tree_findings(path, 4096)
    conn = sqlite3.connect(path)
    leaves = [
        bytes(r[0]) for r in conn.execute("SELECT leaf_hash FROM cassette_journal ORDER BY seq")
    ]
    conn.close()
    assert roots == {n: root_from_leaves(leaves[:n]) for n in SIZES}


def test_a_stored_key_rewritten_behind_its_expression_is_reported(
    sealed: Path,  # noqa: F811
    tmp_path: Path,
    spy: list[bool],
) -> None:
    """With writable_schema the journal's stored key can be made a plain column and
    rewritten, the body untouched: an entry hidden from the by-row index's readers.
    integrity_check is content (the index agrees with the stored value): verify compares
    the stored value with the body."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(sealed, path)
    conn = sqlite3.connect(path, isolation_level=None)
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'cassette_journal'").fetchone()
    generated = "GENERATED ALWAYS AS (json_extract(body, '$.key')) STORED"
    assert generated in sql[0]
    guard = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'cassette_journal_no_update'"
    ).fetchone()[0]
    conn.execute("DROP TRIGGER cassette_journal_no_update")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_journal'",
        (sql[0].replace(generated, ""),),
    )
    conn.execute("PRAGMA writable_schema = RESET")
    conn.execute("UPDATE cassette_journal SET row_key = 'elsewhere' WHERE seq = 3")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_journal'", sql)
    conn.execute("PRAGMA writable_schema = RESET")
    conn.execute(guard)
    conn.close()
    report = verify_path(str(path), now_ms=VERIFIED_AT)
    assert [(str(f.kind), f.seq) for f in report.errors] == [("journal_columns", 3)]
    assert spy == [False]


@pytest.mark.parametrize("sides", [0, 3])
def test_the_report_is_the_same_whatever_the_number_of_connections(
    sealed: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sides: int,
) -> None:
    """An emptied index and a changed row: found, and reported in one order, whether the
    pages-and-indexes check runs on the walk's connection alone or on three more."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(sealed, path)
    conn = sqlite3.connect(path, isolation_level=None)
    sql = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'cassette_receipts_by_run'"
    ).fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_receipts_by_run'",
        (sql + " WHERE 0",),
    )
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("REINDEX cassette_receipts_by_run")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_receipts_by_run'", (sql,))
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()
    expected = [f.to_dict() for f in verify_path(str(path), now_ms=VERIFIED_AT).findings]
    assert any(f["kind"] == "index_mismatch" for f in expected)
    opened: list[int] = []
    same_snapshot = verify_run._same_snapshot

    def counting(conn: sqlite3.Connection, path: str, count: int) -> Any:
        found = same_snapshot(conn, path, count)
        opened.append(len(found))
        return found

    monkeypatch.setattr(verify_run, "_side_connections", lambda: max(sides, 1))
    monkeypatch.setattr(verify_run, "_same_snapshot", counting if sides else lambda *a: ())
    report = verify_path(str(path), now_ms=VERIFIED_AT)
    assert [f.to_dict() for f in report.findings] == expected
    assert opened == ([3] if sides else [])
