"""Random raw mutations of a sealed ledger, made as someone who can write the file does:
drop the triggers, change something, put the triggers back exactly as they were. Verify
must fail, or the mutation must have changed nothing (LAW.md, section 12, attackers (a)
and (c))."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.seals import record_seal
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import WorkerKey

pytestmark = pytest.mark.sqlite_only(
    reason=("random raw mutations of the SQLite file with its triggers dropped and put back")
)

T0 = 1_700_000_000_000
VERIFIED_AT = T0 + 3_600_000
LEDGER_TABLES = (
    "cassette_messages",
    "cassette_jobs",
    "cassette_steps",
    "cassette_receipts",
    "cassette_releases",
    "cassette_actions",
    "cassette_checkpoints",
    "cassette_seals",
    "cassette_journal",
    "cassette_tree_nodes",
    "cassette_meta",
    "cassette_migrations",
    "cassette_attestations",
)
VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.sampled_from(["LEASED", "COMMITTED", "PENDING", "SUCCESS", "{}", "[]", "w1", "r1"]),
)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger with every kind of row, sealed, closed (so checkpointed)."""
    path = tmp_path_factory.mktemp("sealed") / "ledger.db"
    clock = ManualClock(T0)
    with MessageCassette(path, clock=clock) as cassette:
        jobs = [
            {"intent": "fetch", "steps": [{"u": 1}, {"u": 2}]},
            {"intent": "sum", "steps": [{}]},
        ]
        cassette.post_message({"jobs": jobs}, "r1", "USER", "k1")
        cassette.post_message({"n": 1}, "r2", "PLANNER")
        first = cassette.claim_step("r1", "w1", 60)
        cassette.complete_step("r1", first["step_id"], "w1", first["fencing_token"], {}, "SUCCESS")
        second = cassette.claim_step("r1", "w2", 60)
        cassette.requeue("r1", second["step_id"], worker_id="w2", fencing_token=1)
        cassette.claim_step("r1", "w3", 60)
    signer = WorkerKey("w9", Ed25519PrivateKey.generate())
    with MessageCassette(path, clock=clock, worker_key=signer) as signed:
        signed.post_message({"n": 2}, "r3", "USER")  # an attestation row
    with CausalChain(path, clock=clock) as chain:
        plan = chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "CapabilityCall",
                "function_name": "search",
                "arguments": ["x"],
                "caused_by": plan.action_id,
            }
        )
        chain.save_checkpoint("p", {"at": 1})
        record_seal(chain.conn, Ed25519PrivateKey.generate(), now_ms=T0, origin=None)
    assert verify_path(str(path), now_ms=VERIFIED_AT).ok
    return path


@pytest.fixture
def copy(sealed: Path, tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "ledger.db"
    shutil.copyfile(sealed, target)
    yield target


def snapshot(path: Path) -> tuple[Any, ...]:
    """Everything a reader can see: header fields, schema and rows (not index contents),
    in no particular order (re-created triggers move in sqlite_master, nothing else)."""
    conn = sqlite3.connect(path)
    try:
        header = tuple(
            conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("application_id", "user_version")
        )
        return header, tuple(sorted(conn.iterdump()))
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]


def _mutate(conn: sqlite3.Connection, data: st.DataObject) -> bool:
    """One raw mutation; True when it rewrote an index's content behind its SQL."""
    kind = data.draw(
        st.sampled_from(["edit", "delete", "insert", "extra", "drop_index", "header", "index"]),
        label="kind",
    )
    if kind in ("edit", "delete", "insert"):
        table = data.draw(st.sampled_from(LEDGER_TABLES), label="table")
        rowids = (
            [r[0] for r in conn.execute(f"SELECT rowid FROM {table}")]
            if table not in ("cassette_tree_nodes",)
            else []
        )
        if kind == "edit":
            column = data.draw(st.sampled_from(_columns(conn, table)), label="column")
            value = data.draw(VALUES, label="value")
            where = data.draw(st.sampled_from(rowids), label="rowid") if rowids else None
            clause = "" if where is None else f" WHERE rowid = {where}"
            conn.execute(f"UPDATE {table} SET {column} = ?{clause}", (value,))
        elif kind == "delete":
            where = data.draw(st.sampled_from(rowids), label="rowid") if rowids else None
            conn.execute(
                f"DELETE FROM {table}" + ("" if where is None else f" WHERE rowid = {where}")
            )
        else:
            columns = _columns(conn, table)
            values = [data.draw(VALUES, label=c) for c in columns]
            marks = ", ".join("?" * len(columns))
            conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", values)
    elif kind == "extra":
        name = data.draw(
            st.sampled_from(["sqlitex", "sqlite_x", "Cassette_Messages_Guard", "zz", "cassette_x"]),
            label="name",
        )
        what = data.draw(st.sampled_from(["trigger", "index", "view", "table"]), label="object")
        conn.execute(
            {
                "trigger": f"CREATE TRIGGER {name} AFTER INSERT ON cassette_receipts"
                " BEGIN SELECT 1; END",
                "index": f"CREATE INDEX {name} ON cassette_steps (status)",
                "view": f"CREATE VIEW {name} AS SELECT 1",
                "table": f"CREATE TABLE {name} (a)",
            }[what]
        )
    elif kind == "drop_index":
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        ]
        conn.execute(f"DROP INDEX {data.draw(st.sampled_from(names), label='index')}")
    elif kind == "header":
        pragma = data.draw(st.sampled_from(["application_id", "user_version"]), label="pragma")
        conn.execute(f"PRAGMA {pragma} = {data.draw(st.integers(0, 2**31 - 1), label='v')}")
    else:  # the headline attack: the journal's index made to skip some entries
        sql = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'cassette_journal_by_row'"
        ).fetchone()[0]
        skip = data.draw(st.integers(0, 40), label="skip_seq")
        skipping = conn.execute("SELECT count(*) FROM cassette_journal WHERE seq = ?", (skip,))
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_journal_by_row'",
            (sql + f" WHERE seq <> {skip}",),
        )
        conn.execute("PRAGMA writable_schema = OFF")
        return bool(skipping.fetchone()[0])
    return False


def mutate_behind_the_triggers(path: Path, data: st.DataObject) -> bool:
    """Drop every trigger, make one raw mutation, put the triggers back exactly as they
    were; True when the mutation rewrote an index's content behind its SQL."""
    conn = sqlite3.connect(path, isolation_level=None)
    triggers = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
    ).fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    index_rewritten = [False]
    with contextlib.suppress(sqlite3.Error):  # a mutation refused (STRICT, UNIQUE) changes nothing
        index_rewritten[0] = _mutate(conn, data)
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    if index_rewritten[0]:  # rebuild the index under the edited SQL, then put the SQL back
        sql = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'cassette_journal_by_row'"
        ).fetchone()[0]
        conn.execute("REINDEX cassette_journal_by_row")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = ? WHERE name = 'cassette_journal_by_row'",
            (sql.rsplit(" WHERE seq <> ", 1)[0],),
        )
        conn.execute("PRAGMA writable_schema = OFF")
        conn.close()
        conn = sqlite3.connect(path, isolation_level=None)
    for _, sql in triggers:  # the triggers back, exactly as they were, in their order
        conn.execute(sql)
    conn.close()
    return index_rewritten[0]


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_raw_mutation_is_reported_or_changed_nothing(
    sealed: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("mutated") / "ledger.db"
    shutil.copyfile(sealed, path)
    before = snapshot(path)
    index_rewritten = mutate_behind_the_triggers(path, data)
    report = verify_path(str(path), now_ms=VERIFIED_AT)
    changed = index_rewritten or snapshot(path) != before
    assert not report.ok or not changed, [f.to_dict() for f in report.findings]
