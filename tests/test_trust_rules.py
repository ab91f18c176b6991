"""Each rule of migration 0005 attacked through a raw sqlite3 connection that registers
the package's function names (a look-alike: it journals, and passes every check that calls
a function), and through a plain raw shell connection: refused with its code, the file
unchanged, the ledger still usable (LAW.md, section 3, rules 12 and 13)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from catalytic_cassette import ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.migrate import current_version

from .conftest import file_digest
from .test_audit_attacks import T0, look_alike

pytestmark = pytest.mark.sqlite_only(
    reason=("look-alike functions registered on a raw sqlite3 connection, and the sqlite3 shell")
)

LATER = T0 + 1_000


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """Two of every dated row: messages, jobs, steps, a receipt, a release, actions, a
    checkpoint; all dated T0."""
    path = tmp_path / "ledger.db"
    clock = ManualClock(T0)
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, "r", "USER")
        first = cassette.claim_step("r", "w", 60)
        cassette.complete_step("r", first["step_id"], "w", 1, {}, "SUCCESS")
        second = cassette.claim_step("r", "w", 60)
        cassette.requeue("r", second["step_id"], worker_id="w", fencing_token=1)
    with CausalChain(path, clock=clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "PlanStarted", "function_name": "f"}
        )
        chain.save_checkpoint("p", {"n": 1})
    return path


# (table, column list, values) of a row the look-alike may legally insert next, dated T0
NEXT_ROWS = {
    "cassette_messages": (
        "message_id, run_id, source, payload_json, created_at",
        "{id}, 'r', 'USER', '{{}}', {at}",
    ),
    "cassette_jobs": (
        "job_id, message_id, run_id, intent, ordinal, created_at",
        "{id}, 1, 'r', 'x', 7, {at}",
    ),
    "cassette_steps": (
        "step_id, job_id, run_id, message_id, job_ordinal, ordinal, status, fencing_token,"
        " payload_json, created_at",
        "{id}, 1, 'r', 1, 0, 9, 'PENDING', 0, '{{}}', {at}",
    ),
    "cassette_actions": (
        "action_seq, action_id, plan_id, intent_id, action_type, function_name, success,"
        " cost_micros, duration_ms, timestamp, metadata_json",
        "{id}, '00000000-0000-4000-8000-' || substr('000000000000' || ({id} % 1000000000000), -12),"
        " 'q', 'i', 'InternalStep', 'f', 1,"
        " 0, 0, {at}, '{{}}'",
    ),
}
ID_COLUMN = {
    "cassette_messages": "message_id",
    "cassette_jobs": "job_id",
    "cassette_steps": "step_id",
    "cassette_actions": "action_seq",
}


def _insert(conn: sqlite3.Connection, table: str, row_id: int, at: int) -> None:
    columns, values = NEXT_ROWS[table]
    conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({values.format(id=row_id, at=at)})")


def _refused(conn: sqlite3.Connection, sql: str, code: str) -> None:
    with pytest.raises(sqlite3.IntegrityError) as caught:
        conn.execute(sql)
    assert str(caught.value).startswith(f"{code}: "), str(caught.value)


@pytest.mark.parametrize("table", sorted(NEXT_ROWS))
def test_ids_are_dense_for_a_look_alike(ledger: Path, table: str) -> None:
    before = file_digest(ledger)
    conn = look_alike(ledger)
    last = conn.execute(f"SELECT max({ID_COLUMN[table]}) FROM {table}").fetchone()[0]
    for row_id in (last + 2, 2**63 - 1):
        with pytest.raises(sqlite3.IntegrityError, match=r"^OUT_OF_ORDER: "):
            _insert(conn, table, row_id, T0)
    assert file_digest(ledger) == before
    conn.execute("BEGIN")
    _insert(conn, table, last + 1, T0)  # the next id is fine
    conn.execute("ROLLBACK")
    conn.close()


@pytest.mark.parametrize("table", sorted(NEXT_ROWS))
def test_no_row_is_dated_before_the_ledgers_time(ledger: Path, table: str) -> None:
    conn = look_alike(ledger)
    conn.execute("BEGIN")
    _insert(conn, "cassette_messages", 2, LATER)  # the ledger's time is now LATER
    last = conn.execute(f"SELECT max({ID_COLUMN[table]}) FROM {table}").fetchone()[0]
    with pytest.raises(sqlite3.IntegrityError, match=r"^TIME_BACKWARDS: "):
        _insert(conn, table, last + 1, T0)
    _insert(conn, table, last + 1, LATER) if table != "cassette_messages" else None
    conn.execute("ROLLBACK")
    conn.close()


def test_a_lease_that_expires_before_the_ledgers_time_is_refused(ledger: Path) -> None:
    conn = look_alike(ledger, now=T0 - 120_000)  # its clock is behind the ledger
    pending = conn.execute("SELECT step_id FROM cassette_steps WHERE status = 'PENDING'").fetchone()
    _refused(
        conn,
        "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'm', fencing_token ="
        f" fencing_token + 1, lease_expires_at = {T0 - 60_000} WHERE step_id = {pending[0]}",
        "INVALID_TTL",
    )
    conn.close()


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("cassette_messages", "payload_json"),
        ("cassette_steps", "payload_json"),
        ("cassette_actions", "arguments_json"),
        ("cassette_actions", "result_json"),
        ("cassette_actions", "metadata_json"),
    ],
)
@pytest.mark.parametrize("number", ["1e400", "-1E+400", "123456789012345678901"])
def test_numbers_the_api_cannot_read_are_refused(
    ledger: Path, table: str, column: str, number: str
) -> None:
    before = file_digest(ledger)
    conn = look_alike(ledger)
    last = conn.execute(f"SELECT max({ID_COLUMN[table]}) FROM {table}").fetchone()[0]
    document = f"[{number}]" if column == "arguments_json" else f'{{"n":{number}}}'
    columns, values = NEXT_ROWS[table]
    row = values.format(id=last + 1, at=T0)
    if column in columns:
        row = row.replace("'{}'", f"'{document}'", 1)
    else:
        columns, row = f"{columns}, {column}", f"{row}, '{document}'"
    with pytest.raises(sqlite3.IntegrityError, match=r"^INVALID_PAYLOAD: "):
        conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({row})")
    conn.close()
    assert file_digest(ledger) == before


@pytest.mark.parametrize(
    "reference",
    [
        '{"sha256": "%s", "size": 3, "path": "../x"}',
        '{"sha256": "%s", "size": 3, "path": "/etc/passwd"}',
        '{"sha256": "%s", "size": 3, "path": "a/./%s"}',
        '{"sha256": "%s", "size": 3, "path": "a\\\\b/%s"}',
        '{"sha256": "%s", "size": -1}',
        '{"sha256": "ABC", "size": 3}',
        '{"sha256": "%s", "size": 3, "path": "a/other"}',
    ],
)
def test_an_artifact_reference_names_content_inside_its_folder(
    ledger: Path, reference: str
) -> None:
    digest = "ab" * 32
    ref = reference.replace("%s", digest)
    conn = look_alike(ledger)
    columns, values = NEXT_ROWS["cassette_actions"]
    row = values.format(id=2, at=T0)
    with pytest.raises(sqlite3.IntegrityError, match=r"INVALID_ARTIFACT"):
        conn.execute(
            f"INSERT INTO cassette_actions ({columns}, result_artifact) VALUES ({row}, ?)", (ref,)
        )
    # the honest form is accepted
    conn.execute("BEGIN")
    conn.execute(
        f"INSERT INTO cassette_actions ({columns}, result_artifact) VALUES ({row}, ?)",
        (f'{{"sha256": "{digest}", "size": 3, "path": "ledger.db.artifacts/{digest}"}}',),
    )
    conn.execute("ROLLBACK")
    conn.close()


def test_no_tree_node_ahead_of_the_journal(ledger: Path) -> None:
    conn = look_alike(ledger)
    size = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    ahead = ((size + 64) // 64) * 64 + 63  # a level-6 node past the journal's end
    _refused(
        conn,
        f"INSERT INTO cassette_tree_nodes VALUES ({ahead}, 6, cassette_node_hash(zeroblob(32),"
        " zeroblob(32)))",
        "TREE_BROKEN",
    )
    conn.close()
    with MessageCassette(ledger, clock=ManualClock(T0)) as cassette:  # appends still work
        for _ in range(70):
            cassette.post_message({}, "r", "SYSTEM")


def test_no_migration_or_meta_row_the_package_does_not_ship(ledger: Path) -> None:
    before = file_digest(ledger)
    conn = look_alike(ledger)
    _refused(
        conn,
        f"INSERT INTO cassette_migrations VALUES ({current_version() + 1}, 'future', '{'a' * 64}')",
        "MIGRATION_FAILED",
    )
    _refused(conn, "INSERT INTO cassette_meta VALUES ('owner', 'mallory')", "MIGRATION_FAILED")
    conn.close()
    raw = sqlite3.connect(ledger)  # without the functions: the older rule's code
    _refused(
        raw,
        f"INSERT INTO cassette_migrations VALUES ({current_version() + 1}, 'x', '{'a' * 64}')",
        "JOURNAL_REQUIRED",
    )
    raw.close()
    assert file_digest(ledger) == before
    with MessageCassette(ledger, clock=ManualClock(T0)) as cassette:
        cassette.post_message({}, "r", "USER")


def _vm_steps(path: Path) -> int:
    """SQLite VM instructions (in units of 100) for one post through the package."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    with MessageCassette(path, clock=ManualClock(T0)) as cassette:
        cassette.conn.set_progress_handler(tick, 100)
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "r", "USER")
        cassette.conn.set_progress_handler(None, 100)
    return count[0]


def test_forged_statistics_cannot_turn_a_write_into_a_scan(ledger: Path, tmp_path: Path) -> None:
    with MessageCassette(ledger, clock=ManualClock(T0)) as cassette:
        for n in range(300):  # a journal of about 1,500 entries
            cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, f"r{n}", "USER")
    honest = _vm_steps(ledger)
    raw = sqlite3.connect(ledger, isolation_level=None)
    raw.execute("ANALYZE")
    # every index claims to be useless, every table tiny: a planner that trusted this
    # would scan
    raw.execute("UPDATE sqlite_stat1 SET stat = '1000000 1000000 1000000 1000000'")
    raw.execute(
        "INSERT INTO sqlite_stat1 SELECT name, NULL, '1' FROM sqlite_master WHERE type = 'table'"
        " AND name LIKE 'cassette%' AND name NOT IN (SELECT tbl FROM sqlite_stat1)"
    )
    raw.close()
    forged = _vm_steps(ledger)
    assert forged <= honest * 1.5 + 5, (honest, forged)


def _cli_verify(path: Path, *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from catalytic_cassette.cli import cli

    result = CliRunner().invoke(cli, ["--db", str(path), "verify", "--json", *args])
    return result.exit_code, result.stdout


@pytest.mark.parametrize("pragma", ["application_id = 0", "user_version = 99"])
def test_a_changed_header_is_tampering_not_a_foreign_file(ledger: Path, pragma: str) -> None:
    raw = sqlite3.connect(ledger)
    raw.execute(f"PRAGMA {pragma}")
    raw.commit()
    raw.close()
    status, out = _cli_verify(ledger)
    assert status == 1 and '"kind": "header"' in out


@pytest.mark.parametrize("name", ["sqlitex", "Cassette_Receipts_Guard"])
def test_a_planted_trigger_is_reported_whatever_its_name(ledger: Path, name: str) -> None:
    raw = sqlite3.connect(ledger)
    raw.execute(
        f'CREATE TRIGGER "{name}" AFTER INSERT ON cassette_receipts'
        " BEGIN SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: forged'); END"
    )
    raw.commit()
    raw.close()
    status, out = _cli_verify(ledger)
    assert status == 1 and '"kind": "schema_extra"' in out and name in out


def test_a_forged_clock_is_bounded_and_reported(ledger: Path) -> None:
    """A look-alike whose clock says "in 100 years" takes a 100-year lease (a claim records
    no date, so SQL cannot tell); an honest writer 2 days ahead dates its rows there and
    every later writer is carried along. Verify, on the verifier's clock, reports all of it."""
    century = 100 * 365 * 86_400_000
    conn = look_alike(ledger, now=T0 + century)
    pending = conn.execute("SELECT step_id FROM cassette_steps WHERE status = 'PENDING'").fetchone()
    expires = T0 + century + 60_000
    conn.execute(
        "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'm', fencing_token ="
        f" fencing_token + 1, lease_expires_at = {expires} WHERE step_id = {pending[0]}"
    )
    conn.close()
    ahead = ManualClock(T0 + 2 * 86_400_000)
    with MessageCassette(ledger, clock=ahead) as cassette:
        cassette.post_message({}, "r", "USER")
    with MessageCassette(ledger, clock=ManualClock(T0)) as honest:  # behind: not blocked
        honest.post_message({}, "r", "USER")
    from catalytic_cassette.verify import verify_path

    report = verify_path(str(ledger), now_ms=T0 + 60_000)
    kinds = {(f.kind.value, f.severity.value) for f in report.findings}
    assert ("lease_over_cap", "error") in kinds
    assert ("time_in_future", "error") in kinds
    assert ("time_jump", "warning") in kinds
