"""Worker keys on both backends (issue 15): the same signed acts, refusals, codes and
verify findings on a SQLite file and a PostgreSQL server; then PostgreSQL's own attacks,
in raw SQL as the database owner and as the cassette_worker role, the journal bytes of an
attestation, the CLI, and copies both ways (LAW.md, "Worker keys" and section 14)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.cli import cli
from catalytic_cassette.copying import copy_ledger
from catalytic_cassette.postgresql.connection import translate
from catalytic_cassette.signing import generate
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import (
    WorkerKey,
    load_pinned_keys,
    sha256_text,
    statement,
    statement_bytes,
)

from .backends import BACKENDS, Ledger
from .test_worker_keys import _VALID, GUARD_CASES

RUN = "run-1"
TTL = 60  # seconds


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, WorkerKey]:
    made = {}
    for worker in ("w1", "w2", "ops"):
        key_path, _ = generate(str(tmp_path / worker))
        made[worker] = WorkerKey.load(worker, key_path)
    return made


@pytest.fixture
def pins(tmp_path: Path, keys: dict[str, WorkerKey]) -> Path:
    directory = tmp_path / "pins"
    directory.mkdir()
    for worker in keys:
        os.rename(tmp_path / f"{worker}.pub", directory / f"{worker}.pub")
    return directory


@pytest.fixture(params=BACKENDS)
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "sqlite":
        return Ledger("sqlite", str(tmp_path / "ledger.db"))
    return Ledger("postgresql", request.getfixturevalue("pg_ledger"))


@pytest.fixture
def leased(either: Ledger, keys: dict[str, WorkerKey]) -> dict[str, Any]:
    """Two posted steps; w1 holds the first under a signed claim (attestations 1-3)."""
    with either.open(worker_key=keys["w1"]) as cassette:
        cassette.post_message({"n": 1}, RUN, "WORKER")
        cassette.post_message({"n": 2}, RUN, "WORKER")
        return dict(cassette.claim_step(RUN, "w1", TTL))


def kinds(ledger: Ledger, pins: Path) -> list[tuple[str, str | None, Any]]:
    """verify --worker-keys at the ledger's own time (the test clock, or the server's)."""
    with ledger.open() as cassette:
        report = cassette.verify_cassette(worker_keys=load_pinned_keys(pins))
    return [(f.kind, f.table, f.key) for f in report.errors]


def refused(code: ErrorCode, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(CassetteError) as caught:
        call(*args, **kwargs)
    assert caught.value.code is code, caught.value


def acts(ledger: Ledger) -> list[tuple[str, str]]:
    """(act, worker_id) of every attestation, from the journal (either backend)."""
    bodies = [json.loads(body) for _, body, _, _ in ledger.journal()]
    return [
        (b["row"]["act"], b["row"]["worker_id"])
        for b in bodies
        if b["table"] == "cassette_attestations"
    ]


# ------------------------------------------------------------ the same API, both


def test_every_act_signed_and_verified(
    either: Ledger, keys: dict[str, WorkerKey], pins: Path
) -> None:
    with either.open(worker_key=keys["w1"]) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, RUN, "WORKER", f"k{n}")
        assert cassette.post_message({"n": 0}, RUN, "WORKER", "k0") == (1, 1)  # not attested
        first = cassette.claim_step(RUN, "w1", TTL)
        cassette.complete_step(
            RUN, first["step_id"], "w1", first["fencing_token"], {"ok": 1}, "SUCCESS"
        )
        second = cassette.claim_step(RUN, "w1", TTL)
        cassette.requeue(RUN, second["step_id"], worker_id="w1", fencing_token=1)
        again = cassette.claim_step(RUN, "w1", TTL)
    either.advance(TTL * 1000)
    with either.open(worker_key=keys["ops"]) as cassette:
        assert cassette.requeue(RUN)[0]["step_id"] == again["step_id"]
    assert acts(either) == [
        ("post", "w1"),
        ("post", "w1"),
        ("post", "w1"),
        ("claim", "w1"),
        ("complete", "w1"),
        ("claim", "w1"),
        ("release", "w1"),
        ("claim", "w1"),
        ("requeue", "ops"),
    ]
    assert kinds(either, pins) == []


def test_batches_and_fused_calls_sign_each_act(
    either: Ledger, keys: dict[str, WorkerKey], pins: Path
) -> None:
    with either.open(worker_key=keys["w2"]) as cassette:
        cassette.post_messages(
            [({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, RUN, "USER", None)]
        )
        cassette.post_messages([({"a": 1}, RUN, "USER", None), ({"a": 2}, RUN, "USER", None)])
        claimed = cassette.claim_steps(RUN, "w2", 2, TTL)
        cassette.complete_steps(
            [(RUN, s["step_id"], "w2", s["fencing_token"], {}, "FAILURE") for s in claimed]
        )
        lease = cassette.claim_step(RUN, "w2", TTL)
        fused = cassette.complete_and_claim(RUN, lease["step_id"], "w2", 1, {}, "SUCCESS")
        last = fused["next"]
        assert last is not None
        fused = cassette.complete_and_claim(RUN, last["step_id"], "w2", 1, {}, "SUCCESS")
        last = fused["next"]
        assert last is not None
        end = cassette.complete_and_claim(RUN, last["step_id"], "w2", 1, {}, "SUCCESS")
        assert end["next"] is None
    assert [a for a, _ in acts(either)] == [
        "post", "post", "post",
        "claim", "claim", "complete", "complete",
        "claim", "complete", "claim", "complete", "claim", "complete",
    ]  # fmt: skip
    assert kinds(either, pins) == []


@pytest.mark.parametrize("act", ["complete", "release"])
def test_without_the_key_a_signed_lease_is_not_ended(
    either: Ledger, leased: dict[str, Any], keys: dict[str, WorkerKey], act: str
) -> None:
    before = either.journal()
    for key, code in ((None, ErrorCode.SIGNATURE_REQUIRED), (keys["w2"], ErrorCode.WRONG_WORKER)):
        with either.open(worker_key=key) as cassette:
            if act == "complete":
                call = (cassette.complete_step, RUN, leased["step_id"], "w1", 1, {}, "SUCCESS")
                refused(code, *call)
            else:
                refused(
                    code, cassette.requeue, RUN, leased["step_id"], worker_id="w1", fencing_token=1
                )
    assert either.journal() == before


def test_requeues_of_a_signed_lease(
    either: Ledger, leased: dict[str, Any], keys: dict[str, WorkerKey], pins: Path
) -> None:
    with either.open(worker_key=keys["ops"]) as cassette:  # not yet expired
        refused(ErrorCode.LEASE_NOT_EXPIRED, cassette.requeue, RUN, leased["step_id"])
    either.advance(TTL * 1000)
    before = either.journal()
    with either.open() as cassette:  # unsigned
        for max_attempts in (None, 1):
            refused(ErrorCode.SIGNATURE_REQUIRED, cassette.requeue, RUN, max_attempts=max_attempts)
    assert either.journal() == before
    with either.open(worker_key=keys["ops"]) as cassette:
        done = cassette.requeue(RUN, max_attempts=1)
    assert done == [{"step_id": leased["step_id"], "action": "aborted", "fencing_token": 1}]
    assert kinds(either, pins) == []


@pytest.mark.parametrize(
    ("run", "token", "code"),
    [
        ("other", 1, ErrorCode.LEASE_NOT_EXPIRED),  # the clock guard comes first
        (RUN, 1, ErrorCode.LEASE_NOT_EXPIRED),
        (RUN, 5, ErrorCode.STALE_FENCING_TOKEN),
        ("other", 5, ErrorCode.RUN_MISMATCH),
    ],
)
def test_an_early_requeue_attestation_gets_the_same_code(
    either: Ledger,
    leased: dict[str, Any],
    keys: dict[str, WorkerKey],
    run: str,
    token: int,
    code: ErrorCode,
) -> None:
    """A requeue attested directly (not through requeue()): on SQLite by a package
    connection, on PostgreSQL through the worker role's cassette_attest."""
    before = either.journal()
    ops = keys["ops"]
    if either.kind == "sqlite":
        from catalytic_cassette.connection import write_transaction
        from catalytic_cassette.worker_keys import attest

        with (
            either.open() as cassette,
            pytest.raises(CassetteError) as caught,
            write_transaction(cassette.conn) as conn,
        ):
            attest(
                conn,
                ops,
                "requeue",
                run_id=run,
                at=either.clock.now_ms(),
                step_id=leased["step_id"],
                fencing_token=token,
            )
        assert caught.value.code is code
    else:
        with psycopg.connect(either.target, autocommit=True) as conn:
            conn.execute("SET ROLE cassette_worker")
            refused_with(
                conn,
                code,
                "SELECT cassette_attest('requeue', %s, NULL, %s, %s, 'ops', %s, %s)",
                (run, leased["step_id"], token, ops.key_id, _VALID["sig"]),
            )
    assert either.journal() == before


def test_a_faulty_signer_writes_nothing(
    either: Ledger, leased: dict[str, Any], keys: dict[str, WorkerKey]
) -> None:
    class Faulty(WorkerKey):
        def sign(self, message: bytes) -> bytes:
            return super().sign(message + b"!")

    before = either.journal()
    with either.open(worker_key=Faulty("w1", keys["w1"].private)) as cassette:
        refused(
            ErrorCode.BAD_SIGNATURE,
            cassette.complete_step,
            RUN,
            leased["step_id"],
            "w1",
            1,
            {},
            "SUCCESS",
        )
        refused(ErrorCode.BAD_SIGNATURE, cassette.post_messages, [({}, RUN, "USER", None)] * 2)
    assert either.journal() == before


# ------------------------------------------------------ PostgreSQL, in raw SQL


@pytest.fixture
def pg_leased(pg_ledger: str, keys: dict[str, WorkerKey]) -> dict[str, Any]:
    with MessageCassette(pg_ledger, worker_key=keys["w1"]) as cassette:
        cassette.post_message({"n": 1}, RUN, "WORKER")
        cassette.post_message({"n": 2}, RUN, "WORKER")
        return {"url": pg_ledger, **cassette.claim_step(RUN, "w1", TTL)}


@pytest.fixture
def owner(pg_leased: dict[str, Any]) -> Iterator[Any]:
    with psycopg.connect(pg_leased["url"], autocommit=True) as conn:
        yield conn


@pytest.fixture
def worker(pg_leased: dict[str, Any]) -> Iterator[Any]:
    with psycopg.connect(pg_leased["url"], autocommit=True) as conn:
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


_INSERT_ATTESTATION = (
    "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id, step_id,"
    " fencing_token, worker_id, key_id, signature, created_at)"
    " VALUES (%(id)s, %(act)s, %(run)s, %(message)s, %(step)s, %(token)s, %(worker)s,"
    " %(key)s, %(sig)s, 0)"
)


@pytest.mark.parametrize(("change", "code"), GUARD_CASES[1:])  # (the journal is the server's)
def test_the_attestation_guard_holds_the_owner(
    owner: Any, change: dict[str, Any], code: str
) -> None:
    """SQLite's cases, with SQLite's codes, against the table's owner."""
    refused_with(owner, ErrorCode(code), _INSERT_ATTESTATION, {**_VALID, **change})


def test_the_owner_cannot_attest_a_requeue_early_nor_change_attestations(owner: Any) -> None:
    early = {**_VALID, "act": "requeue", "worker": "ops"}
    refused_with(owner, ErrorCode.LEASE_NOT_EXPIRED, _INSERT_ATTESTATION, early)
    for sql in (
        "UPDATE cassette_attestations SET worker_id = 'w2'",
        "DELETE FROM cassette_attestations",
        "TRUNCATE cassette_attestations",
    ):
        refused_with(owner, ErrorCode.APPEND_ONLY, sql)


@pytest.mark.parametrize("kind", ["receipt", "release", "requeue", "aborted"])
def test_the_owner_cannot_end_a_signed_lease_unsigned(
    owner: Any, pg_leased: dict[str, Any], kind: str
) -> None:
    if kind in ("requeue", "aborted"):
        owner.execute("SELECT cassette_advance_clock(%s)", (TTL * 1000,))
    sql = {
        "receipt": "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json) VALUES (%(step)s, %(job)s, 'run-1', 'w1', 1,"
        " 'SUCCESS', '{}')",
        "release": "INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token)"
        " VALUES (%(step)s, 'run-1', 'w1', 1)",
        "requeue": "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
        " lease_expires_at = NULL WHERE step_id = %(step)s",
        "aborted": "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
        " fencing_token, outcome, receipt_json) VALUES (%(step)s, %(job)s, 'run-1', 'w1', 1,"
        " 'ABORTED', '{}')",
    }[kind]
    params = {"step": pg_leased["step_id"], "job": pg_leased["job_id"]}
    refused_with(owner, ErrorCode.SIGNATURE_REQUIRED, sql, params)


def test_the_worker_role_cannot_end_a_signed_lease_unsigned(
    worker: Any, owner: Any, pg_leased: dict[str, Any]
) -> None:
    step = pg_leased["step_id"]
    refused_with(
        worker,
        ErrorCode.SIGNATURE_REQUIRED,
        "SELECT cassette_complete('run-1', %s, 'w1', 1, 'SUCCESS', '{}')",
        (step,),
    )
    refused_with(
        worker,
        ErrorCode.SIGNATURE_REQUIRED,
        "SELECT cassette_release('run-1', %s, 'w1', 1)",
        (step,),
    )
    owner.execute("SELECT cassette_advance_clock(%s)", (TTL * 1000,))
    for attempts in (None, 1):
        refused_with(
            worker,
            ErrorCode.SIGNATURE_REQUIRED,
            "SELECT * FROM cassette_requeue('run-1', NULL, %s)",
            (attempts,),
        )


def test_the_worker_role_writes_attestations_only_through_its_function(worker: Any) -> None:
    refused_with(worker, ErrorCode.PERMISSION_DENIED, _INSERT_ATTESTATION, {**_VALID, "id": None})
    for sql in (
        "UPDATE cassette_attestations SET worker_id = 'w2'",
        "DELETE FROM cassette_attestations",
        "TRUNCATE cassette_attestations",
    ):
        refused_with(worker, ErrorCode.PERMISSION_DENIED, sql)
    # its function gets the guard's codes
    refused_with(
        worker,
        ErrorCode.WRONG_WORKER,
        "SELECT cassette_attest('complete', 'run-1', NULL, 1, 1, 'w2', %s, %s)",
        (_VALID["key"], _VALID["sig"]),
    )
    refused_with(
        worker,
        ErrorCode.INVALID_ATTESTATION,
        "SELECT cassette_attest('complete', 'run-1', NULL, 1, 1, 'w1', 'nothex', %s)",
        (_VALID["sig"],),
    )


def test_a_forged_attestation_passes_sql_and_verify_names_it(
    worker: Any, pg_leased: dict[str, Any], keys: dict[str, WorkerKey], pins: Path
) -> None:
    """The worker role attests w1's completion under w1's key id with a signature of
    nothing, then completes: SQL cannot check Ed25519, verify --worker-keys does."""
    with worker.transaction():
        worker.execute(
            "SELECT cassette_attest('complete', 'run-1', NULL, %s, 1, 'w1', %s, %s)",
            (pg_leased["step_id"], keys["w1"].key_id, base64.b64encode(bytes(64)).decode()),
        )
        worker.execute(
            "SELECT cassette_complete('run-1', %s, 'w1', 1, 'SUCCESS', '{}')",
            (pg_leased["step_id"],),
        )
    ledger = Ledger("postgresql", pg_leased["url"])
    with ledger.open() as cassette:
        assert cassette.verify_cassette().ok  # without the keys nothing is wrong
    assert kinds(ledger, pins) == [("bad_signature", "cassette_attestations", 4)]


def test_a_genuine_signature_over_another_receipt(
    worker: Any, pg_leased: dict[str, Any], keys: dict[str, WorkerKey], pins: Path
) -> None:
    """w1 signed a completion with one receipt (at the transaction's time, read first,
    as the package does); the receipt recorded is another: bad_signature."""
    with worker.transaction():
        (at, ledger_id) = worker.execute(
            "SELECT now_ms, ledger_id FROM cassette_signer_context()"
        ).fetchone()
        signed = statement(
            "complete",
            ledger=ledger_id,
            run_id=RUN,
            worker_id="w1",
            at=at,
            step_id=pg_leased["step_id"],
            fencing_token=1,
            outcome="SUCCESS",
            receipt_sha256=sha256_text('{"honest":1}'),
        )
        signature = base64.b64encode(keys["w1"].sign(statement_bytes(signed))).decode()
        worker.execute(
            "SELECT cassette_attest('complete', 'run-1', NULL, %s, 1, 'w1', %s, %s)",
            (pg_leased["step_id"], keys["w1"].key_id, signature),
        )
        worker.execute(
            "SELECT cassette_complete('run-1', %s, 'w1', 1, 'SUCCESS', '{}')",
            (pg_leased["step_id"],),
        )
    assert kinds(Ledger("postgresql", pg_leased["url"]), pins) == [
        ("bad_signature", "cassette_attestations", 4)
    ]


def test_an_attestation_body_is_sqlites_json_object(owner: Any) -> None:
    """Each journaled attestation, rendered again by SQLite's json_object(): the same text."""
    rows = owner.execute(
        "SELECT j.body, a.attestation_id, a.act, a.run_id, a.message_id, a.step_id,"
        " a.fencing_token, a.worker_id, a.key_id, a.signature, a.created_at"
        " FROM cassette_journal j JOIN cassette_attestations a"
        " ON j.tbl = 'cassette_attestations' AND j.row_key = a.attestation_id::text ORDER BY j.seq"
    ).fetchall()
    assert len(rows) == 3
    sqlite = sqlite3.connect(":memory:")
    for body, *values in rows:
        (rendered,) = sqlite.execute(
            "SELECT json_object('table', 'cassette_attestations', 'op', 'INSERT', 'key', ?1,"
            " 'row', json_object('attestation_id', ?1, 'act', ?2, 'run_id', ?3, 'message_id', ?4,"
            " 'step_id', ?5, 'fencing_token', ?6, 'worker_id', ?7, 'key_id', ?8,"
            " 'signature', ?9, 'created_at', ?10))",
            values,
        ).fetchone()
        assert body == rendered


# ------------------------------------------------------------- the CLI, copies


def invoke(target: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--db", target, *args], input=stdin)


def test_the_cli_signs_on_postgresql(
    pg_ledger: str, tmp_path: Path, keys: dict[str, WorkerKey], pins: Path
) -> None:
    w1 = str(tmp_path / "w1.key")
    for n in range(2):
        posted = invoke(
            pg_ledger,
            *("post", "--payload", "-", "--run-id", RUN, "--source", "WORKER"),
            *("--worker-key", w1, "--signer", "w1"),
            stdin=json.dumps({"n": n}),
        )
        assert posted.exit_code == 0, posted.stderr
    claim = invoke(pg_ledger, "claim", "--run-id", RUN, "--worker", "w1", "--worker-key", w1)
    assert claim.exit_code == 0, claim.stderr
    step = json.loads(claim.stdout)
    done = invoke(
        pg_ledger,
        *("complete", "--run-id", RUN, "--step", str(step["step_id"]), "--worker", "w1"),
        *("--token", str(step["fencing_token"]), "--receipt", "-", "--outcome", "SUCCESS"),
        *("--claim-next", "--worker-key", w1),
        stdin='{"ok": true}',
    )
    assert done.exit_code == 0, done.stderr
    nxt = json.loads(done.stdout)["next"]
    unsigned = invoke(
        pg_ledger,
        *("complete", "--run-id", RUN, "--step", str(nxt["step_id"]), "--worker", "w1"),
        *("--token", "1", "--receipt", "-", "--outcome", "SUCCESS"),
        stdin="{}",
    )
    assert unsigned.exit_code == 1
    assert unsigned.stderr.startswith("error: SIGNATURE_REQUIRED: ")
    assert "Traceback" not in unsigned.output
    checked = invoke(pg_ledger, "verify", "--worker-keys", str(pins))
    assert checked.exit_code == 0, checked.stdout
    assert "PASS" in checked.stderr
    assert [a for a, _ in acts(Ledger("postgresql", pg_ledger))] == [
        "post", "post", "claim", "complete", "claim",
    ]  # fmt: skip


def _signed_history(ledger: Ledger, keys: dict[str, WorkerKey]) -> None:
    with ledger.open(worker_key=keys["w1"]) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, RUN, "WORKER")
        one = cassette.claim_step(RUN, "w1", TTL)
        cassette.complete_step(RUN, one["step_id"], "w1", 1, {"ok": 1}, "SUCCESS")
        two = cassette.claim_step(RUN, "w1", TTL)
        cassette.requeue(RUN, two["step_id"], worker_id="w1", fencing_token=1)
        cassette.claim_step(RUN, "w1", 1)
    ledger.advance(2000)
    with ledger.open(worker_key=keys["ops"]) as cassette:
        cassette.requeue(RUN, max_attempts=2)


@pytest.mark.parametrize("direction", ["to_sqlite", "to_postgresql"])
def test_a_copy_carries_attestations_and_verifies_on_the_other_backend(
    direction: str,
    tmp_path: Path,
    pg_ledger: str,
    keys: dict[str, WorkerKey],
    pins: Path,
) -> None:
    file = str(tmp_path / "copy.db")
    source, dest = (
        (Ledger("postgresql", pg_ledger), Ledger("sqlite", file))
        if direction == "to_sqlite"
        else (Ledger("sqlite", file), Ledger("postgresql", pg_ledger))
    )
    _signed_history(source, keys)
    copy_ledger(source.target, dest.target)
    assert dest.journal() == source.journal()
    assert len(acts(dest)) == 9
    if dest.kind == "sqlite":  # judged at the server's time, which the test moved on
        with psycopg.connect(pg_ledger) as conn:
            (now,) = conn.execute("SELECT time_ms + 60000 FROM cassette_head").fetchone()
        report = verify_path(file, worker_keys=load_pinned_keys(pins), now_ms=now)
        assert report.ok, report.findings
    else:
        assert kinds(dest, pins) == []


# ------------------------------------------------- a runner's login, real processes


def test_a_runner_login_signs_the_whole_worker_api(
    pg_ledger: str, keys: dict[str, WorkerKey], pins: Path
) -> None:
    """A host's own login, member of cassette_worker, with a worker key: every act
    signed through the role's functions, and verify (the owner's) finds nothing."""
    import uuid

    from psycopg import sql

    name = "runner_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_ledger, autocommit=True) as owner:
        owner.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE cassette_worker").format(sql.Identifier(name))
        )
        try:
            url = pg_ledger.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
            with MessageCassette(url, worker_key=keys["w1"]) as cassette:
                for n in range(3):
                    cassette.post_message({"n": n}, RUN, "WORKER")
                one = cassette.claim_step(RUN, "w1", TTL)
                cassette.complete_and_claim(RUN, one["step_id"], "w1", 1, {}, "SUCCESS")
                cassette.requeue(RUN, one["step_id"] + 1, worker_id="w1", fencing_token=1)
                cassette.claim_step(RUN, "w1", 1)
            owner.execute("SELECT cassette_advance_clock(2000)")
            with MessageCassette(url, worker_key=keys["ops"]) as cassette:
                assert [r["action"] for r in cassette.requeue(RUN)] == ["requeued"]
        finally:
            owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    ledger = Ledger("postgresql", pg_ledger)
    assert [a for a, _ in acts(ledger)] == [
        "post", "post", "post", "claim", "complete", "claim", "release", "claim", "requeue",
    ]  # fmt: skip
    assert kinds(ledger, pins) == []


@pytest.mark.slow
def test_signed_workers_racing_on_the_server(
    pg_ledger: str, tmp_path: Path, keys: dict[str, WorkerKey], pins: Path
) -> None:
    """Three processes, three keys, one server: each step claimed and completed once,
    each attestation its claimer's, verify with the pinned keys finds nothing."""
    import multiprocessing as mp

    from .test_worker_keys import signed_worker

    steps = 45
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}] * steps}]}, RUN, "USER")
    context = mp.get_context("spawn")
    start, out = context.Event(), context.Queue()
    workers = [
        context.Process(
            target=signed_worker,
            args=(pg_ledger, worker, str(tmp_path / f"{worker}.key"), start, out),
        )
        for worker in keys
    ]
    for process in workers:
        process.start()
    start.set()
    results = [out.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    assert [error for _, _, error in results] == [None] * len(workers)
    assert sum(done for _, done, _ in results) == steps
    ledger = Ledger("postgresql", pg_ledger)
    assert len(acts(ledger)) == 2 * steps
    with psycopg.connect(pg_ledger) as conn:
        (mismatched,) = conn.execute(
            "SELECT count(*) FROM cassette_attestations a JOIN cassette_receipts r"
            " ON r.step_id = a.step_id AND a.act IN ('claim', 'complete')"
            " WHERE a.worker_id IS DISTINCT FROM r.worker_id"
        ).fetchone()
    assert mismatched == 0
    assert kinds(ledger, pins) == []


def test_the_benchmark_script_runs(pg_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from . import postgres

    sys.path.insert(0, str(postgres.SCRIPTS))
    try:
        import bench_worker_keys_pg
    finally:
        sys.path.remove(str(postgres.SCRIPTS))
    assert bench_worker_keys_pg.main([pg_server, "--steps", "5", "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "postgresql" in printed and "sqlite" in printed and "signed" in printed


def test_a_signed_claim_of_a_locked_step_keeps_nothing(
    pg_ledger: str, keys: dict[str, WorkerKey]
) -> None:
    """Another session holds the next step's row lock (a claim skips locked rows): the
    attested step is not the one the claim would lease, so the call is BUSY and writes
    nothing; once the lock is gone the same call leases that step."""
    ledger = Ledger("postgresql", pg_ledger)
    with ledger.open(worker_key=keys["w1"]) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, RUN, "USER")
        before = ledger.journal()
        with psycopg.connect(pg_ledger) as holder:
            holder.execute("SELECT 1 FROM cassette_steps WHERE step_id = 1 FOR UPDATE")
            refused(ErrorCode.BUSY, cassette.claim_step, RUN, "w1", TTL)
            assert ledger.journal() == before
        assert cassette.claim_step(RUN, "w1", TTL)["step_id"] == 1
