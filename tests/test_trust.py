"""Random raw mutations of a sealed ledger, made as someone who owns the storage: on
SQLite who can write the file (drop the triggers, change something, put the triggers back
exactly as they were); on PostgreSQL the superuser (ordinary triggers off for the session,
any row or object of the schema changed). Verify must fail, or the mutation must have
changed nothing (LAW.md, section 12, attackers (a) and (c); section 14)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import WorkerKey

from . import backends

pytestmark = pytest.mark.slow

SQLITE_FILE = pytest.mark.sqlite_only(
    reason="mutations of the SQLite file's rows, schema, indexes and header with its"
    " triggers dropped and put back; PostgreSQL's superuser has its twin below"
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


def fill(target: Path | str) -> None:
    """Every kind of row, sealed: messages, jobs, steps, a receipt, a release, a signed
    post (an attestation), actions, a checkpoint (dated T0 on SQLite; the server's time
    on PostgreSQL)."""
    options: dict[str, Any] = {}
    if not backends.is_postgresql(target):
        options["clock"] = ManualClock(T0)
    with MessageCassette(target, **options) as cassette:
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
    with MessageCassette(target, worker_key=signer, **options) as signed:
        signed.post_message({"n": 2}, "r3", "USER")  # an attestation row
    with CausalChain(target, **options) as chain:
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
        chain.seal(Ed25519PrivateKey.generate())


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger with every kind of row, sealed, closed (so checkpointed)."""
    path = tmp_path_factory.mktemp("sealed") / "ledger.db"
    fill(path)
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


@SQLITE_FILE
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
    changed = index_rewritten or snapshot(path) != before
    try:
        report = verify_path(str(path), now_ms=VERIFIED_AT)
    except CassetteError as refused:
        # A mutation can make the file one verify will not check at all (a migration row
        # naming a newer schema: SCHEMA_TOO_NEW; another name or digest of the baseline,
        # as a development build wrote: SCHEMA_UNRELEASED; none at all: NOT_A_CASSETTE): a
        # coded refusal, exit 3, no pass. Only a changed file may be refused.
        assert refused.code in {
            ErrorCode.SCHEMA_TOO_NEW,
            ErrorCode.SCHEMA_UNRELEASED,
            ErrorCode.NOT_A_CASSETTE,
        }, refused
        assert changed
        return
    assert not report.ok or not changed, [f.to_dict() for f in report.findings]


# ------------------------------------------------------------- PostgreSQL's superuser


@pytest.fixture(scope="module")
def pg_sealed(pg_server: str, pg_template: str) -> Iterator[str]:
    """The name of a PostgreSQL database holding ``fill``'s ledger, copied per example."""
    from . import postgres

    url = postgres.clone_database(pg_server, pg_template)
    try:
        fill(url)
        assert verify_path(url).ok
        yield postgres.database_name(url)
    finally:
        postgres.drop_database(pg_server, url)


# A value for a column of each type the schema uses; anything else is a text PostgreSQL
# casts (or refuses: then nothing changed).
PG_VALUES = {
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "smallint": st.integers(-(2**15), 2**15 - 1),
    "boolean": st.booleans(),
    "bytea": st.binary(max_size=33),
}
PG_TEXT = st.one_of(
    # Text a client can send: UTF-8 (no lone surrogate, which the driver cannot encode), no NUL.
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    st.sampled_from(["LEASED", "COMMITTED", "PENDING", "SUCCESS", "{}", "[]", "w1", "r1", "p"]),
)


def _pg_schema_objects(conn: Any) -> tuple[Any, ...]:
    """What the superuser's DDL can change: the schema's relations, indexes, triggers
    (with whether each is enabled), functions (with their bodies) and views."""
    return (
        sorted(
            conn.execute(
                "SELECT c.relname, c.relkind, coalesce(pg_get_indexdef(c.oid), '')"
                " FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace"
            ).fetchall()
        ),
        sorted(
            conn.execute(
                "SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger"
                " WHERE NOT tgisinternal"
            ).fetchall()
        ),
        sorted(
            conn.execute(
                "SELECT proname, md5(prosrc), proconfig::text, prosecdef FROM pg_proc"
                " WHERE pronamespace = current_schema()::regnamespace"
            ).fetchall()
        ),
    )


def pg_snapshot(url: str) -> tuple[Any, ...]:
    """Every row of every table and every object of the schema. The head's clock (its
    time, transaction and the owner's offset) is left out, as ``backends.dump`` leaves it:
    verify judges that clock only through the rows it dates
    (test_a_superuser_moving_the_heads_clock_back_shows_in_the_rows_it_dates)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        objects = _pg_schema_objects(conn)
    return tuple(backends.dump(url)), objects


def _pg_mutate(conn: Any, data: st.DataObject) -> str:
    """One mutation by the superuser, ordinary triggers off for its session; its kind."""
    kind = data.draw(
        st.sampled_from(
            ["edit", "delete", "insert", "extra", "drop_index", "disable_trigger", "function"]
        ),
        label="kind",
    )
    conn.execute("SET session_replication_role = replica")
    if kind in ("edit", "delete", "insert"):
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " ORDER BY tablename"
            )
        ]
        table = data.draw(st.sampled_from(tables), label="table")
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
        rows = [ctid for (ctid,) in conn.execute(f'SELECT ctid::text FROM "{table}"')]
        where = ""
        if rows and kind != "insert":
            row = data.draw(st.sampled_from([*rows, None]), label="ctid")
            where = "" if row is None else f" WHERE ctid = '{row}'::tid"

        def value(data_type: str) -> Any:
            return data.draw(
                st.one_of(st.none(), PG_VALUES.get(data_type, PG_TEXT)), label=data_type
            )

        if kind == "edit":
            column, data_type = data.draw(st.sampled_from(columns), label="column")
            conn.execute(f'UPDATE "{table}" SET "{column}" = %s{where}', (value(data_type),))
        elif kind == "delete":
            conn.execute(f'DELETE FROM "{table}"{where}')
        else:
            names = ", ".join(f'"{column}"' for column, _ in columns)
            marks = ", ".join("%s" for _ in columns)
            conn.execute(
                f'INSERT INTO "{table}" ({names}) VALUES ({marks})',
                [value(data_type) for _, data_type in columns],
            )
    elif kind == "extra":
        what = data.draw(st.sampled_from(["trigger", "index", "view", "table"]), label="object")
        conn.execute(
            {
                "trigger": "CREATE TRIGGER zz AFTER INSERT ON cassette_receipts"
                " FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
                "index": "CREATE INDEX zz ON cassette_steps (status)",
                "view": "CREATE VIEW zz AS SELECT 1",
                "table": "CREATE TABLE zz (a int)",
            }[what]
        )
    elif kind == "drop_index":
        names = [
            name
            for (name,) in conn.execute(
                "SELECT indexrelid::regclass::text FROM pg_index i JOIN pg_class c"
                " ON c.oid = i.indrelid WHERE c.relnamespace = current_schema()::regnamespace"
                " AND NOT i.indisprimary AND NOT i.indisunique ORDER BY 1"
            )
        ]
        conn.execute(f"DROP INDEX {data.draw(st.sampled_from(names), label='index')}")
    elif kind == "disable_trigger":
        table, name = data.draw(
            st.sampled_from(
                conn.execute(
                    "SELECT tgrelid::regclass::text, tgname FROM pg_trigger"
                    " WHERE NOT tgisinternal ORDER BY 1, 2"
                ).fetchall()
            ),
            label="trigger",
        )
        conn.execute(f'ALTER TABLE {table} DISABLE TRIGGER "{name}"')
    else:  # a rule's trigger function made to wave every row through
        name = data.draw(
            st.sampled_from(
                [
                    name
                    for (name,) in conn.execute(
                        "SELECT proname FROM pg_proc WHERE prorettype = 'trigger'::regtype"
                        " AND pronamespace = current_schema()::regnamespace ORDER BY 1"
                    )
                ]
            ),
            label="function",
        )
        conn.execute(
            f'CREATE OR REPLACE FUNCTION "{name}"() RETURNS trigger LANGUAGE plpgsql'
            " AS $$ BEGIN RETURN coalesce(NEW, OLD); END $$"
        )
    return kind


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_superusers_mutation_is_reported_or_changed_nothing(
    pg_server: str, pg_sealed: str, data: st.DataObject
) -> None:
    import psycopg

    from . import postgres

    url = postgres.clone_database(pg_server, pg_sealed)
    try:
        before = pg_snapshot(url)
        kind = "refused"
        with psycopg.connect(url, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
            kind = _pg_mutate(conn, data)  # one refused (a type, a constraint) changes nothing
        report = verify_path(url)
        changed = pg_snapshot(url) != before
        event(f"{kind}: {'changed' if changed else 'unchanged'}")
        assert not report.ok or not changed, [f.to_dict() for f in report.findings]
    finally:
        postgres.drop_database(pg_server, url)


def test_a_superuser_moving_the_heads_clock_back_shows_in_the_rows_it_dates(
    pg_ledger: str,
) -> None:
    """The head's time and the owner's offset are the floor of the next write's date (SQLite
    derives its ledger time from the rows, a view; PostgreSQL keeps it in cassette_head).
    Moved back by the superuser, nothing is misdated yet, but verify names the head at once
    (its time before the newest row's); the next write is dated before the rows already
    there, and verify names those rows too."""
    ledger = backends.Ledger("postgresql", pg_ledger)
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
    ledger.advance(3_600_000)  # the owner's say over time: an hour ahead
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 2}, "r", "USER")
    later = ledger.now_ms() + 60_000
    assert verify_path(pg_ledger, now_ms=later).ok
    assert backends.raw_script(
        pg_ledger,
        "SET LOCAL session_replication_role = replica",
        "UPDATE cassette_head SET time_ms = 0, clock_offset_ms = 0",
    )
    head = ("time_backwards", "cassette_head", None)
    report = verify_path(pg_ledger, now_ms=later)
    assert {(f.kind.value, f.table, f.key) for f in report.findings} == {head}
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"n": 3}, "r", "USER")
    report = verify_path(pg_ledger, now_ms=later)
    assert {(f.kind.value, f.table, f.key) for f in report.findings} == {head} | {
        ("time_backwards", table, 3)
        for table in ("cassette_messages", "cassette_jobs", "cassette_steps")
    }
