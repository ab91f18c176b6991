"""The PostgreSQL ledger attacked with a raw session (issue 15, LAW.md "PostgreSQL").

Two attackers: the database owner (here the cluster's superuser, who holds every table
privilege: only the triggers stand in the way) and a session under the cassette_worker
role (no table privilege at all: only the worker's functions, whose rules are the
triggers'). Each refusal leaves the journal as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.postgresql.connection import translate

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def seeded(pg_ledger: str) -> str:
    """A ledger with one message of two steps, the first leased by worker w (token 1)."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
        cassette.claim_step("run", "w", ttl_seconds=60)
    return pg_ledger


@pytest.fixture
def owner(seeded: str) -> Iterator[Any]:
    with psycopg.connect(seeded, autocommit=True) as conn:
        yield conn


@pytest.fixture
def worker(seeded: str) -> Iterator[Any]:
    with psycopg.connect(seeded, autocommit=True) as conn:
        conn.execute("SET ROLE cassette_worker")
        yield conn


def journal(conn: Any) -> list[tuple[Any, ...]]:
    return list(conn.execute("SELECT seq, body, chain_hash FROM cassette_journal ORDER BY seq"))


def refused_with(conn: Any, code: ErrorCode, sql: str, params: Any = None) -> None:
    before = journal(conn)
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, params)
    assert translate(caught.value).code is code, caught.value
    assert journal(conn) == before


OWNER_ATTACKS = [
    ("UPDATE cassette_messages SET payload_json = '{}'", ErrorCode.APPEND_ONLY),
    ("DELETE FROM cassette_messages", ErrorCode.APPEND_ONLY),
    ("TRUNCATE cassette_journal", ErrorCode.APPEND_ONLY),
    ("TRUNCATE cassette_steps CASCADE", ErrorCode.APPEND_ONLY),
    ("DELETE FROM cassette_journal WHERE seq = 0", ErrorCode.APPEND_ONLY),
    ("UPDATE cassette_journal SET body = body || ' '", ErrorCode.APPEND_ONLY),
    ("UPDATE cassette_jobs SET intent = 'x'", ErrorCode.APPEND_ONLY),
    (
        "UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = 1",
        ErrorCode.RECEIPT_REQUIRED,
    ),
    (
        "UPDATE cassette_steps SET status = 'LEASED' WHERE step_id = 2",
        ErrorCode.LEASE_FIELDS_LOCKED,
    ),
    (
        "UPDATE cassette_steps SET status = 'PENDING' WHERE step_id = 1",
        ErrorCode.LEASE_FIELDS_LOCKED,
    ),
    (
        "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
        " lease_expires_at = NULL WHERE step_id = 1",
        ErrorCode.LEASE_NOT_EXPIRED,
    ),
    (
        "UPDATE cassette_steps SET fencing_token = 9 WHERE step_id = 1",
        ErrorCode.LEASE_FIELDS_LOCKED,
    ),
    (
        "UPDATE cassette_steps SET payload_json = '{\"x\":1}' WHERE step_id = 1",
        ErrorCode.IMMUTABLE_FIELD,
    ),
    (
        "UPDATE cassette_steps SET lease_owner = NULL WHERE step_id = 1",
        ErrorCode.LEASE_FIELDS_LOCKED,
    ),
    (
        "INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal, status,"
        " fencing_token, payload_json) VALUES (1, 'run', 1, 0, 5, 'LEASED', 0, '{}')",
        ErrorCode.ILLEGAL_TRANSITION,
    ),
    (
        "INSERT INTO cassette_messages (message_id, run_id, source, payload_json)"
        " VALUES (99, 'run', 'USER', '{}')",
        ErrorCode.OUT_OF_ORDER,
    ),
    (
        "INSERT INTO cassette_messages (run_id, source, payload_json)"
        " VALUES ('run', 'USER', '[1]')",
        ErrorCode.INVALID_PAYLOAD,
    ),
    (
        "INSERT INTO cassette_messages (run_id, source, payload_json)"
        " VALUES ('run', 'USER', '{\"n\": 1e999}')",
        ErrorCode.INVALID_PAYLOAD,
    ),
    (
        "INSERT INTO cassette_messages (run_id, source, payload_json)"
        " VALUES ('run', 'USER', '{\"n\": 99999999999999999999}')",
        ErrorCode.INVALID_PAYLOAD,
    ),
    (
        "INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal) VALUES (7, 'run', 'i', 0)",
        ErrorCode.REFERENCE_MISSING,
    ),
    (
        "INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal) VALUES (1, 'x', 'i', 3)",
        ErrorCode.RUN_MISMATCH,
    ),
    (
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json) VALUES (1, 1, 'run', 'w', 0, 'SUCCESS', '{}')",
        ErrorCode.STALE_FENCING_TOKEN,
    ),
    (
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json) VALUES (1, 1, 'run', 'x', 1, 'SUCCESS', '{}')",
        ErrorCode.WRONG_WORKER,
    ),
    (
        "INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)"
        " SELECT 4, '{}', leaf_hash, chain_hash, tbl, row_key FROM cassette_journal WHERE seq = 3",
        ErrorCode.JOURNAL_BROKEN,
    ),
    ("UPDATE cassette_head SET time_ms = 0", ErrorCode.TIME_BACKWARDS),
    (
        "UPDATE cassette_head SET tx = (pg_current_xact_id()::text::bigint + 3)::text::xid8",
        ErrorCode.JOURNAL_BROKEN,
    ),
    ("DELETE FROM cassette_head", ErrorCode.JOURNAL_BROKEN),
    ("SELECT cassette_advance_clock(-1)", ErrorCode.INVALID_ARGUMENT),
    (
        "UPDATE cassette_meta SET value = repeat('a', 32) WHERE key = 'ledger_id'",
        ErrorCode.APPEND_ONLY,
    ),
    ("DELETE FROM cassette_meta", ErrorCode.APPEND_ONLY),
]


@pytest.mark.parametrize(("sql", "code"), OWNER_ATTACKS, ids=[a[0][:60] for a in OWNER_ATTACKS])
def test_the_owner_cannot_break_a_rule(owner: Any, sql: str, code: ErrorCode) -> None:
    refused_with(owner, code, sql)


def test_the_server_dates_and_numbers_every_row(owner: Any) -> None:
    """A client's created_at and id are not taken: the server's clock and the next id are."""
    owner.execute(
        "INSERT INTO cassette_messages (run_id, source, payload_json, created_at)"
        " VALUES ('run', 'USER', '{}', 1)"
    )
    row = owner.execute(
        "SELECT message_id, created_at, (SELECT time_ms FROM cassette_head)"
        " FROM cassette_messages ORDER BY message_id DESC LIMIT 1"
    ).fetchone()
    assert row[0] == 2 and row[1] == row[2] > 1_700_000_000_000


WORKER_DENIED = [
    "INSERT INTO cassette_messages (run_id, source, payload_json) VALUES ('run', 'USER', '{}')",
    "UPDATE cassette_steps SET status = 'PENDING' WHERE step_id = 1",
    "DELETE FROM cassette_receipts",
    "UPDATE cassette_head SET clock_offset_ms = clock_offset_ms + 1000000",
    "SELECT cassette_advance_clock(1000000)",
    "SELECT cassette_tx_ms()",
    "SELECT cassette_journal_append('cassette_messages', 'INSERT', '1', '{}')",
    "TRUNCATE cassette_journal",
    "CREATE TABLE public.planted (x int)",
    "CREATE TRIGGER planted BEFORE INSERT ON cassette_steps"
    " FOR EACH ROW EXECUTE FUNCTION cassette_append_only()",
]


@pytest.mark.parametrize("sql", WORKER_DENIED, ids=[s[:50] for s in WORKER_DENIED])
def test_the_worker_role_writes_only_through_its_functions(worker: Any, sql: str) -> None:
    refused_with(worker, ErrorCode.PERMISSION_DENIED, sql)


def test_the_worker_role_gets_the_same_codes_from_its_functions(worker: Any) -> None:
    refused_with(
        worker,
        ErrorCode.STALE_FENCING_TOKEN,
        "SELECT cassette_complete('run', 1, 'w', 5, 'SUCCESS', '{}')",
    )
    refused_with(
        worker,
        ErrorCode.WRONG_WORKER,
        "SELECT cassette_complete('run', 1, 'x', 1, 'SUCCESS', '{}')",
    )
    refused_with(
        worker,
        ErrorCode.INVALID_PAYLOAD,
        "SELECT cassette_complete('run', 1, 'w', 1, 'SUCCESS', 'not json')",
    )
    refused_with(
        worker, ErrorCode.LEASE_NOT_EXPIRED, "SELECT * FROM cassette_requeue('run', 1, NULL)"
    )
    refused_with(
        worker,
        ErrorCode.INVALID_PAYLOAD,
        "SELECT * FROM cassette_post('run', 'USER', NULL, '{}', ARRAY['i'], ARRAY[2], ARRAY['{}'])",
    )
    refused_with(worker, ErrorCode.INVALID_TTL, "SELECT * FROM cassette_claim('run', 'w', 1, 0)")
    # and what it may do, it does: a claim and its completion, journaled by the server
    (step, token) = worker.execute(
        "SELECT step_id, fencing_token FROM cassette_claim('run', 'v', 1, 60000)"
    ).fetchone()
    worker.execute("SELECT cassette_complete('run', %s, 'v', %s, 'SUCCESS', '{}')", (step, token))
    status = worker.execute("SELECT status FROM cassette_steps WHERE step_id = %s", (step,))
    assert status.fetchone() == ("COMMITTED",)


def test_a_worker_cannot_hijack_the_functions_search_path(worker: Any) -> None:
    """The functions run with their own search_path: a worker's session setting (or a
    pg_temp object shadowing a table) changes nothing they read."""
    worker.execute("SET search_path = pg_temp, public")
    worker.execute("CREATE TEMP TABLE cassette_steps (step_id bigint)")
    (step, _) = worker.execute(
        "SELECT step_id, fencing_token FROM cassette_claim('run', 'v', 1, 60000)"
    ).fetchone()
    assert step == 2


def test_the_auditor_reads_only(seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as conn:
        conn.execute("SET ROLE cassette_auditor")
        assert conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0] == 5
        refused_with(
            conn, ErrorCode.PERMISSION_DENIED, "SELECT * FROM cassette_claim('run', 'v', 1, 60000)"
        )


def test_only_a_superuser_skips_the_triggers_and_the_chain_shows_it(owner: Any) -> None:
    """What remains: a superuser can switch triggers off (session_replication_role) and
    write anything. The rows then disagree with the journal, which is what verify against
    a seal reports (LAW.md, PostgreSQL)."""
    owner.execute("SET session_replication_role = replica")
    owner.execute("UPDATE cassette_messages SET payload_json = '{\"forged\":1}'")
    owner.execute("SET session_replication_role = origin")
    (body,) = owner.execute("SELECT body FROM cassette_journal WHERE seq = 0").fetchone()
    assert "forged" not in body


def test_a_login_role_in_the_worker_role_uses_the_whole_worker_api(seeded: str, owner: Any) -> None:
    """What a runner host gets: its own login, member of cassette_worker, and the package
    used as usual with that URL (post, claim, complete, requeue, status)."""
    import uuid

    from psycopg import sql

    from . import postgres

    name = "runner_" + uuid.uuid4().hex[:8]
    owner.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE cassette_worker").format(sql.Identifier(name))
    )
    try:
        url = seeded.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
        assert postgres.database_name(url) == postgres.database_name(seeded)
        with MessageCassette(url) as cassette:
            cassette.post_message({"from": name}, "run", "WORKER")
            lease = cassette.claim_step("run", name)
            cassette.complete_step("run", lease["step_id"], name, 1, {}, "SUCCESS")
            assert cassette.status("run")["receipts"]["SUCCESS"] == 1
            assert cassette.requeue("run") == []
        with psycopg.connect(url, autocommit=True) as conn:
            refused_with(conn, ErrorCode.PERMISSION_DENIED, "DELETE FROM cassette_receipts")
    finally:
        owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_workers_own_settings_do_not_change_its_functions(worker: Any) -> None:
    """The functions pin the settings their SQL is written for (0006): a session with
    standard_conforming_strings off still posts, and journals the same bytes."""
    worker.execute("SET standard_conforming_strings = off")
    worker.execute("SET extra_float_digits = 3")
    (message_id,) = worker.execute(
        "SELECT message_id FROM cassette_post('run', 'USER', NULL, %s, ARRAY['i'], ARRAY[1],"
        " ARRAY[%s])",
        ('{"x":1.5e300,"y":"\\u00e9"}', '{"x":0.1}'),
    ).fetchone()
    assert message_id == 2
    body = worker.execute("SELECT body FROM cassette_journal WHERE seq = 5").fetchone()[0]
    assert '\\"x\\":1.5e300' in body


def test_the_schema_takes_no_object_from_a_role(seeded: str, owner: Any) -> None:
    """No ledger role may create objects in the ledger's schema (0006), and a grant that
    would let one is a change verify reports."""
    from catalytic_cassette.verify import verify_path

    for role in ("cassette_worker", "cassette_appender", "cassette_auditor"):
        (may,) = owner.execute(
            "SELECT has_schema_privilege(%s, 'public', 'CREATE')", (role,)
        ).fetchone()
        assert may is False
    assert verify_path(seeded).ok
    owner.execute("GRANT CREATE ON SCHEMA public TO cassette_worker")
    try:
        report = verify_path(seeded)
        assert not report.ok
        assert any(
            f.kind.value == "schema_changed" and "public" in f.detail for f in report.findings
        )
    finally:
        owner.execute("REVOKE CREATE ON SCHEMA public FROM cassette_worker")


# ------------------------------------------- the step state machine, pair by pair
#
# test_sql_rules.py's allow-list, every (old, new) status pair bare and dressed as the
# target state, given to the owner on a copy of the same ledger (build_ledger there).


@pytest.fixture(scope="module")
def rules_ledger(pg_server: str, pg_template: str) -> Iterator[str]:
    """The name of a database holding test_sql_rules' ledger (step ids 1-5 in the same
    states), built once; the server's offset stands in for its ManualClock."""
    from . import postgres
    from .backends import Ledger
    from .test_sql_rules import build_ledger

    url = postgres.clone_database(pg_server, pg_template)
    try:
        with MessageCassette(url) as cassette:
            build_ledger(cassette, Ledger("postgresql", url).clock)  # type: ignore[arg-type]
        yield postgres.database_name(url)
    finally:
        postgres.drop_database(pg_server, url)


def expected_of_the_owner(old: str, new: str, dressed: bool) -> ErrorCode | None:
    """SQLite's code for the pair, but where a raw sqlite3 connection can only fail closed
    (JOURNAL_REQUIRED: legal-looking, and it cannot journal) the server journals the
    owner's write and judges it as the API's: a claim of a pending step is taken, a
    requeue of step 2's live lease is LEASE_NOT_EXPIRED."""
    from .test_sql_rules import expected_transition_code

    code = expected_transition_code(old, new, dressed)
    if code is not ErrorCode.JOURNAL_REQUIRED:
        return code
    return None if new == "LEASED" else ErrorCode.LEASE_NOT_EXPIRED


@pytest.mark.parametrize("dressed", [False, True], ids=["status-only", "with-target-lease"])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        (old, new)
        for old in ("PENDING", "LEASED", "COMMITTED")
        for new in ("PENDING", "LEASED", "COMMITTED")
    ],
    ids=str.lower,
)
def test_every_status_pair_follows_the_allow_list_for_the_owner(
    pg_server: str, rules_ledger: str, old: str, new: str, dressed: bool
) -> None:
    from catalytic_cassette.verify import verify_path

    from . import postgres
    from .backends import Ledger
    from .test_sql_rules import DRESS, LATER, STEP_IN, upd

    url = postgres.clone_database(pg_server, rules_ledger)
    try:
        ledger = Ledger("postgresql", url)
        # a forged lease that expires after the server's now (SQLite's LATER is 2023)
        dress = DRESS[new].replace(LATER, "(SELECT time_ms FROM cassette_head) + 999000")
        sql = upd(STEP_IN[old], f"status = '{new}'" + (dress if dressed else ""))
        before = ledger.journal()
        expected = expected_of_the_owner(old, new, dressed)
        assert ledger.raw_sql(sql) is expected
        after = ledger.journal()
        if expected is None:  # journaled by the server, as the API's claim is
            assert after[:-1] == before and len(after) == len(before) + 1
            assert verify_path(url, now_ms=ledger.now_ms()).ok
        else:
            assert after == before
    finally:
        postgres.drop_database(pg_server, url)
