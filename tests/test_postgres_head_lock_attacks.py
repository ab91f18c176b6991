"""The PostgreSQL head attacked as the chain's lock and the ledger's clock only
(``sql/postgresql/schema/10_ledger.sql``, ``50_journal.sql``), the claim's generic plan, the
requeue's signature check folded into the step's guard (``30_steps.sql``).

1. With no copy of the journal's end in the head, an entry is placed by what the journal's
   guard reads: the head's stamp and the journal's last entry. The attacks: an entry
   under the head's row lock without its stamp; a stamp rolled back with its savepoint;
   rows COPYed in (one guard per row, each seeing the rows before it); a statement whose
   own snapshot was taken before the last writer committed (a CTE that takes the head
   for a multi-row INSERT, an INSERT ... SELECT whose first row takes the head,
   cassette_post), which must link after that writer's entries in READ COMMITTED and,
   from a REPEATABLE READ or SERIALIZABLE snapshot, fail rather than link to an older
   end. The primary key on seq is what would make a fork a refusal rather than a second
   chain; these tests check that no shape even gets there. (Prepared transactions were
   tried by hand on a server with max_prepared_transactions > 0: a racer waits for
   COMMIT PREPARED and links after the prepared entries; the test servers allow none.)
2. The claim's generic plan: the index scan on the PENDING partial index, in claim order
   (no Sort of a run's pending steps), whatever the statistics say and however many
   steps are asked for.
3. The requeue's refusals, differential against the two-trigger form that
   scripts/levers/undo_0017.sql restores: the same code or the same outcome for every shape.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import ErrorCode, MessageCassette
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.signing import generate
from catalytic_cassette.worker_keys import WorkerKey

from . import postgres
from .pg_chain import BODY, journal_end

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgresql

ROOT = Path(__file__).resolve().parents[1]
UNDO_0017 = ROOT / "scripts" / "levers" / "undo_0017.sql"

RAW_ENTRY = (
    "INSERT INTO public.cassette_journal (body, tbl, row_key)"
    " VALUES (%s, 'cassette_messages', '99')"
)
TAKE_HEAD = "UPDATE public.cassette_head SET tx = pg_current_xact_id()"


@pytest.fixture
def owner(pg_ledger: str) -> Iterator[Any]:
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}]}]}, "run", "USER")
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        yield conn


def entries(conn: Any) -> list[tuple[int, str]]:
    rows = conn.execute("SELECT seq, body FROM public.cassette_journal ORDER BY seq")
    return [(int(seq), body) for seq, body in rows.fetchall()]


def waiting_for_a_lock(observer: Any, pid: int, deadline_s: float = 20.0) -> None:
    """Block until backend ``pid`` waits for a heavyweight lock (here: the head's)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for the head")


# ------------------------------------------------------------------ 1. the head


def test_an_entry_under_the_heads_row_lock_without_its_stamp(owner: Any) -> None:
    """The owner holds the head's row lock (FOR UPDATE, and a bare UPDATE of its time)
    but never stamps it: the lock alone is not the head."""
    before = entries(owner)
    for take in (
        "SELECT 1 FROM public.cassette_head FOR UPDATE",
        "UPDATE public.cassette_head SET time_ms = time_ms",
    ):
        with pytest.raises(psycopg.Error) as caught, owner.transaction():
            owner.execute(take)
            owner.execute(RAW_ENTRY, (BODY,))
        assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert entries(owner) == before


def test_a_stamp_rolled_back_with_its_savepoint_is_no_head(owner: Any, pg_ledger: str) -> None:
    """A stamp made in a savepoint that is rolled back goes with its row lock: another
    session takes the head at once, and this transaction's entry is refused."""
    before = entries(owner)
    with psycopg.connect(pg_ledger, autocommit=True) as other:
        other.execute("SET lock_timeout = '5s'")
        with pytest.raises(psycopg.Error) as caught, owner.transaction():
            with owner.transaction():  # a savepoint
                owner.execute(TAKE_HEAD)
                raise psycopg.Rollback()
            with other.transaction():  # not BUSY: the lock went with the savepoint
                other.execute(TAKE_HEAD)
            owner.execute(RAW_ENTRY, (BODY,))
        assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert entries(owner) == before


def test_entries_copied_in_are_placed_one_after_another(owner: Any) -> None:
    """COPY FROM fires the guard for each row (no multi-insert with a BEFORE trigger), and
    each row's guard sees the rows copied before it: without the head nothing is stored;
    with it, the rows are dense and linked."""
    size, _ = journal_end(owner)
    rows = [(BODY, "cassette_messages", str(n)) for n in range(3)]
    copy = "COPY public.cassette_journal (body, tbl, row_key) FROM STDIN"
    with (
        pytest.raises(psycopg.Error) as caught,
        owner.transaction(),
        owner.cursor().copy(copy) as feed,
    ):
        for row in rows:
            feed.write_row(row)
    assert translate(caught.value).code is ErrorCode.JOURNAL_BROKEN
    assert journal_end(owner)[0] == size
    with owner.transaction():
        owner.execute(TAKE_HEAD)
        with owner.cursor().copy(copy) as feed:
            for row in rows:
                feed.write_row(row)
    assert journal_end(owner)[0] == size + 3


# Each takes the head and journals ENTRIES raw entries in ONE statement, whose snapshot is
# taken before the head is free: the writer holding it commits while the statement waits.
SHAPES = {
    "a CTE takes the head": (
        "WITH taken AS (UPDATE public.cassette_head SET tx = pg_current_xact_id() RETURNING 1)"
        " INSERT INTO public.cassette_journal (body, tbl, row_key)"
        " SELECT %(body)s, 'cassette_messages', '99' FROM taken, generate_series(1, 3)"
    ),
    "the first row of an INSERT ... SELECT takes the head": (
        "INSERT INTO public.cassette_journal (body, tbl, row_key)"
        " SELECT CASE WHEN i = 1 THEN (SELECT %(body)s || left(cassette_append_time()::text, 0))"
        " ELSE %(body)s END, 'cassette_messages', '99' FROM generate_series(1, 3) AS i"
    ),
    "a message's row takes it (three entries: message, job, step)": (
        "SELECT * FROM cassette_post('run', 'USER', NULL, '{}', ARRAY['i'], ARRAY[1], ARRAY['{}'])"
    ),
}
ENTRIES = 3


def _racing_statement(pg_ledger: str, statement: str, isolation: str | None) -> dict[str, Any]:
    """Run ``statement`` in a session of its own, after the head's holder (the caller)
    has written; return what happened. With ``isolation``, the session's snapshot is
    taken (by a first read) before it runs the statement."""
    outcome: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        with psycopg.connect(pg_ledger) as conn:
            outcome["pid"] = conn.info.backend_pid
            try:
                with conn.transaction():
                    if isolation is not None:
                        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                        conn.execute("SELECT count(*) FROM public.cassette_journal")
                    ready.set()
                    conn.execute(statement, {"body": BODY} if "%(body)s" in statement else None)
                outcome["ok"] = True
            except psycopg.Error as error:
                outcome["error"] = error
            finally:
                ready.set()

    thread = threading.Thread(target=run)
    thread.start()
    outcome["thread"] = thread
    ready.wait(20)
    return outcome


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_statement_waiting_for_the_head_links_to_the_last_commit(
    owner: Any, pg_ledger: str, shape: str
) -> None:
    """READ COMMITTED: the waiting statement's snapshot predates the holder's commit, yet
    its entries go after the holder's, linked to them (the guard reads the journal's end
    in a snapshot of its own, taken once the head is held)."""
    size, _ = journal_end(owner)
    with psycopg.connect(pg_ledger, autocommit=True) as observer:
        with owner.transaction():
            owner.execute(TAKE_HEAD)
            owner.execute(RAW_ENTRY, (BODY,))
            racing = _racing_statement(pg_ledger, SHAPES[shape], None)
            waiting_for_a_lock(observer, racing["pid"])
        racing["thread"].join(30)
    assert racing.get("ok"), racing.get("error")
    assert journal_end(owner)[0] == size + 1 + ENTRIES  # whole, dense, linked


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_older_snapshot_cannot_link_to_an_older_end(
    owner: Any, pg_ledger: str, shape: str, isolation: str
) -> None:
    """A snapshot taken before the holder committed: the statement fails (serialization,
    BUSY) and stores nothing; it never links to the end its snapshot shows."""
    size, _ = journal_end(owner)
    with psycopg.connect(pg_ledger, autocommit=True) as observer:
        with owner.transaction():
            owner.execute(TAKE_HEAD)
            owner.execute(RAW_ENTRY, (BODY,))
            racing = _racing_statement(pg_ledger, SHAPES[shape], isolation)
            waiting_for_a_lock(observer, racing["pid"])
        racing["thread"].join(30)
    error = racing.get("error")
    assert error is not None and error.sqlstate == "40001", racing
    assert translate(error).code is ErrorCode.BUSY
    assert journal_end(owner)[0] == size + 1


# ------------------------------------------------------------ 2. the claim's plan

CLAIM_QUERY = "LIMIT p_n FOR UPDATE SKIP LOCKED"


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def claim_plan(conn: Any, run: str, n: int) -> list[dict[str, Any]]:
    """The plan nodes of the claim's "next PENDING steps" query as cassette_claim runs it
    (auto_explain of nested statements, sent to this session as notices), in a
    transaction rolled back. Taken in REPEATABLE READ, so the claim never returns early."""
    plans: list[dict[str, Any]] = []

    def collect(notice: Any) -> None:
        text = notice.message_primary or ""
        start = text.find("{")
        if start >= 0:
            found = json.loads(text[start:])
            if CLAIM_QUERY in found.get("Query Text", ""):
                plans.append(found["Plan"])

    conn.add_notice_handler(collect)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("LOAD 'auto_explain'")
            conn.execute("SET LOCAL auto_explain.log_min_duration = 0")
            conn.execute("SET LOCAL auto_explain.log_nested_statements = on")
            conn.execute("SET LOCAL auto_explain.log_format = json")
            conn.execute("SET LOCAL client_min_messages = log")
            conn.execute("SELECT * FROM cassette_claim(%s, 'w', %s, 60000)", (run, n)).fetchall()
    finally:
        conn.remove_notice_handler(collect)
    assert len(plans) == 1, plans
    return list(_nodes(plans[0]))


def _post_steps(conn: Any, run: str, steps: int) -> None:
    conn.execute(
        "SELECT * FROM cassette_post(%s, 'USER', NULL, '{}', ARRAY['i'], ARRAY[%s],"
        " (SELECT array_agg('{}'::text) FROM generate_series(1, %s)))",
        (run, steps, steps),
    )


STATISTICS = {
    "none": [],
    "analyzed while empty": ["ANALYZE"],
    "analyzed full": ["<post>", "ANALYZE"],
    # a superuser's edit: run_id uncorrelated with the heap and a run of one step
    "pg_statistic edited": [
        "<post>",
        "ANALYZE",
        "UPDATE pg_statistic SET stanumbers2 = '{0}', stadistinct = -1"
        " WHERE starelid = 'cassette_steps'::regclass AND staattnum = (SELECT attnum"
        " FROM pg_attribute WHERE attrelid = 'cassette_steps'::regclass"
        " AND attname = 'run_id')",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("statistics", list(STATISTICS))
def test_the_claims_generic_plan_is_the_pending_index_in_claim_order(
    pg_ledger: str, statistics: str
) -> None:
    """For p_n 1, 7 and 10,000, for a run with pending steps, one without any and one
    that does not exist: the claim's query is planned once, generic (the run is a
    parameter), and is an index scan of the PENDING index with no Sort above it."""
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        for statement in STATISTICS[statistics]:
            if statement == "<post>":
                _post_steps(conn, "big", 2000)
            else:
                conn.execute(statement)
        _post_steps(conn, "big", 2000)
        _post_steps(conn, "done", 2)
        for _ in range(2):
            step, token = conn.execute(
                "SELECT step_id, fencing_token FROM cassette_claim('done', 'w', 1, 60000)"
            ).fetchone()
            conn.execute(
                "SELECT cassette_complete('done', %s, 'w', %s, 'SUCCESS', '{}')", (step, token)
            )
        for run in ("big", "done", "absent"):
            for n in (1, 7, 10_000):
                nodes = claim_plan(conn, run, n)
                kinds = [node["Node Type"] for node in nodes]
                assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
                scans = [node for node in nodes if "Relation Name" in node]
                assert [(s["Node Type"], s.get("Index Name")) for s in scans] == [
                    ("Index Scan", "cassette_steps_pending")
                ], kinds
                assert scans[0]["Index Cond"] == "(run_id = $1)"  # generic: no literal run


# --------------------------------------------------- 3. requeues, 0017 against 0016

TTL = 60_000


def _keys(directory: Path) -> dict[str, WorkerKey]:
    made = {}
    for worker in ("w1", "ops"):
        key_path, _ = generate(str(directory / worker))
        made[worker] = WorkerKey.load(worker, key_path)
    return made


def _leases(url: str, keys: dict[str, WorkerKey]) -> dict[str, int]:
    """Three steps of run-1: the first leased signed by w1, the second unsigned by w2,
    the third left PENDING."""
    with MessageCassette(url, worker_key=keys["w1"]) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, "run-1", "WORKER")
        signed = cassette.claim_step("run-1", "w1", TTL // 1000)
    with MessageCassette(url) as cassette:
        unsigned = cassette.claim_step("run-1", "w2", TTL // 1000)
    return {"signed": int(signed["step_id"]), "unsigned": int(unsigned["step_id"])}


_REQUEUE = (
    "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL"
)
_RELEASE = (
    "INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token)"
    " SELECT step_id, run_id, lease_owner, fencing_token FROM cassette_steps"
)
_ATTEST = (
    "INSERT INTO cassette_attestations (act, run_id, message_id, step_id, fencing_token,"
    " worker_id, key_id, signature, created_at) SELECT 'requeue', run_id, NULL, step_id,"
    " fencing_token, 'ops', %(key)s, %(sig)s, 0 FROM cassette_steps"
)
# (expired?, role, statements): every shape of a requeue, by hand and through functions.
SCENARIOS: dict[str, tuple[bool, str | None, list[str]]] = {}
for _step in ("signed", "unsigned"):
    _where = f" WHERE step_id = %({_step})s"
    for _expired in (False, True):
        _tag = f"{_step}, {'expired' if _expired else 'live'}"
        SCENARIOS.update(
            {
                f"{_tag}: requeue by hand": (_expired, None, [_REQUEUE + _where]),
                f"{_tag}: requeue keeping the owner": (
                    _expired,
                    None,
                    [_REQUEUE + ", lease_owner = 'w1'" + _where],
                ),
                f"{_tag}: requeue moving the token": (
                    _expired,
                    None,
                    [_REQUEUE + ", fencing_token = fencing_token + 1" + _where],
                ),
                f"{_tag}: requeue changing the payload": (
                    _expired,
                    None,
                    [_REQUEUE + ", payload_json = '{\"x\":1}'" + _where],
                ),
                f"{_tag}: requeue to a bad status": (
                    _expired,
                    None,
                    ["UPDATE cassette_steps SET status = 'GONE'" + _where],
                ),
                f"{_tag}: release by hand": (_expired, None, [_RELEASE + _where]),
                f"{_tag}: attested, then requeued by hand": (
                    _expired,
                    None,
                    [_ATTEST + _where, _REQUEUE + _where],
                ),
                f"{_tag}: cassette_requeue of the step": (
                    _expired,
                    "cassette_worker",
                    [f"SELECT * FROM cassette_requeue('run-1', %({_step})s, NULL)"],
                ),
                f"{_tag}: cassette_requeue of the run, one attempt": (
                    _expired,
                    "cassette_worker",
                    ["SELECT * FROM cassette_requeue('run-1', NULL, 1)"],
                ),
                f"{_tag}: cassette_release": (
                    _expired,
                    "cassette_worker",
                    [
                        "SELECT cassette_release('run-1', %(" + _step + ")s,"
                        f" '{'w1' if _step == 'signed' else 'w2'}', 1)"
                    ],
                ),
            }
        )


def _outcomes(url: str, steps: dict[str, int], key_id: str) -> dict[str, Any]:
    """Each scenario in a transaction rolled back: its code, or the steps it left."""
    params = {**steps, "key": key_id, "sig": "A" * 86 + "=="}
    found: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, (expired, role, statements) in SCENARIOS.items():
            try:
                with conn.transaction(force_rollback=True):
                    if expired:
                        conn.execute("SELECT cassette_advance_clock(%s)", (TTL,))
                    if role is not None:
                        conn.execute(f"SET LOCAL ROLE {role}")
                    for statement in statements:
                        conn.execute(statement, params)
                    conn.execute("RESET ROLE")
                    found[name] = conn.execute(
                        "SELECT step_id, status, lease_owner, fencing_token FROM cassette_steps"
                        " ORDER BY step_id"
                    ).fetchall()
            except psycopg.Error as error:
                found[name] = translate(error).code
    return found


def test_every_requeue_is_refused_as_by_the_two_trigger_form(
    pg_server: str, pg_template: str, tmp_path: Path
) -> None:
    keys = _keys(tmp_path)
    outcomes = {}
    for form in ("0017", "0016"):
        url = postgres.clone_database(pg_server, pg_template)
        try:
            steps = _leases(url, keys)
            if form == "0016":
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(UNDO_0017.read_text(encoding="utf-8"))
                    assert conn.execute(
                        "SELECT count(*) FROM pg_trigger"
                        " WHERE tgname = 'cassette_steps_update_signature'"
                    ).fetchone() == (1,)
            outcomes[form] = _outcomes(url, steps, keys["ops"].key_id)
        finally:
            postgres.drop_database(pg_server, url)
    assert outcomes["0017"] == outcomes["0016"]
    # The differential is not vacuous: each refusal of the branch, and a requeue that
    # passes, signed and not, are among the outcomes.
    seen = {o for o in outcomes["0017"].values() if isinstance(o, ErrorCode)}
    assert {
        ErrorCode.SIGNATURE_REQUIRED,
        ErrorCode.LEASE_NOT_EXPIRED,
        ErrorCode.LEASE_FIELDS_LOCKED,
        ErrorCode.IMMUTABLE_FIELD,
        ErrorCode.INVALID_STATUS,
    } <= seen
    assert not isinstance(
        outcomes["0017"]["signed, expired: attested, then requeued by hand"], ErrorCode
    )
    assert not isinstance(outcomes["0017"]["unsigned, expired: requeue by hand"], ErrorCode)
    assert outcomes["0017"]["signed, expired: requeue by hand"] is ErrorCode.SIGNATURE_REQUIRED
    assert outcomes["0017"]["signed, live: requeue by hand"] is ErrorCode.LEASE_NOT_EXPIRED


# ------------------------------------- 4. the lever files on a ledger past 0017

# scripts/bench_pg_levers.py ab runs a variant's SQL on a ledger at this checkout's last
# migration. 0017 dropped what the older undo files name (cassette_head.next_seq,
# cassette_tail_malformed(), cassette_steps_update_signature()), so each of them applies
# only after the newer ones have put back what came after it.
LEVERS = sorted((ROOT / "scripts" / "levers").glob("undo_*.sql"), reverse=True)


def _worker_path_runs(url: str) -> None:
    """A post, a claim and a completion through the package, and a whole chain."""
    with MessageCassette(url) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "run", "USER")
        step = cassette.claim_step("run", "w", 60)
        assert step is not None
        cassette.complete_step("run", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
        assert cassette.status("run")["steps"] == {"PENDING": 1, "LEASED": 0, "COMMITTED": 1}
    with psycopg.connect(url) as conn:
        assert journal_end(conn)[0] == 4 + 1 + 2  # the post's rows, the claim, the receipt


def _apply(url: str, levers: list[Path]) -> None:
    """As bench_pg_levers applies a variant: its text, in one statement string, as the
    ledger's owner."""
    text = "".join(path.read_text(encoding="utf-8") for path in levers)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'SET ROLE "{postgres.OWNER}"')
        conn.execute(text.encode("utf-8"))


@pytest.mark.parametrize("oldest", range(len(LEVERS)), ids=[p.name for p in LEVERS])
def test_each_lever_applies_after_the_newer_ones(pg_ledger: str, oldest: int) -> None:
    _apply(pg_ledger, LEVERS[: oldest + 1])
    _worker_path_runs(pg_ledger)


def test_the_lever_the_readme_names_applies_alone(pg_server: str, pg_template: str) -> None:
    """README's example of `bench_pg_levers.py ab - variant.sql` names a lever file: run
    alone on the ledger the script makes, it must leave a working ledger (since 0017,
    undo_0015.sql alone left every write failing: cassette_tail_malformed() is gone)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = sorted(set(re.findall(r"scripts/levers/(undo_\d+\.sql)", readme)))
    assert named
    for name in named:
        url = postgres.clone_database(pg_server, pg_template)
        try:
            _apply(url, [ROOT / "scripts" / "levers" / name])
            _worker_path_runs(url)
        finally:
            postgres.drop_database(pg_server, url)
