"""Worker keys: signed acts pass; acts in a signing worker's name without its signature are
refused by SQL for every connection; forged, foreign, unsigned and replayed signatures are
reported by verify --worker-keys (LAW.md, "Worker keys")."""

from __future__ import annotations

import base64
import json
import multiprocessing as mp
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette, sqlfiles
from catalytic_cassette.cli import cli
from catalytic_cassette.connection import register_functions
from catalytic_cassette.signing import generate, key_id
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import (
    PinnedKey,
    WorkerKey,
    check_worker_keys,
    load_pinned_keys,
    sha256_text,
    statement,
    statement_bytes,
)

from . import backends
from .backends import Ledger
from .conftest import file_digest

pytestmark = pytest.mark.both_backends

ROOT = Path(__file__).resolve().parent.parent
RUN = "run-1"
TTL = 60  # seconds


# --------------------------------------------------------------------- fixtures


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, WorkerKey]:
    """Private keys of w1, w2 and an operator, each made by keygen, as WorkerKeys."""
    made = {}
    for worker in ("w1", "w2", "ops"):
        key_path, _ = generate(str(tmp_path / worker))
        made[worker] = WorkerKey.load(worker, key_path)
    return made


@pytest.fixture
def pins(tmp_path: Path, keys: dict[str, WorkerKey]) -> Path:
    """A directory pinning every worker's public key, as <worker_id>.pub."""
    directory = tmp_path / "pins"
    directory.mkdir()
    for worker in keys:
        os.rename(tmp_path / f"{worker}.pub", directory / f"{worker}.pub")
    return directory


def signed(db: Path, clock: ManualClock, key: WorkerKey | None) -> MessageCassette:
    return MessageCassette(db, clock=clock, worker_key=key)


@pytest.fixture
def leased(db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey]) -> dict[str, Any]:
    """Two posted steps; w1 holds the first under a signed claim."""
    with signed(db_path, clock, keys["w1"]) as cassette:
        cassette.post_message({"n": 1}, RUN, "WORKER")
        cassette.post_message({"n": 2}, RUN, "WORKER")
        return cassette.claim_step(RUN, "w1", TTL)


def kinds(db: Path, pins: Path) -> list[tuple[str, str | None, Any]]:
    report = verify_path(str(db), worker_keys=load_pinned_keys(pins))
    return [(f.kind, f.table, f.key) for f in report.errors]


def invoke(db: Path, *args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args], input=stdin)


LOOK_ALIKE = (
    "a look-alike sqlite3 client (its own SQL functions and the published TEMP triggers);"
    " PostgreSQL's forgeries are test_postgres_worker_keys.py's (journaled by the server)"
)


@pytest.fixture
def look_alike(
    db_path: Path, clock: ManualClock, leased: dict[str, Any]
) -> Iterator[sqlite3.Connection]:
    """A client that is not the package, beside the ``leased`` ledger: a raw connection that
    registers look-alike SQL functions and installs the published TEMP triggers, so its
    writes are journaled."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    register_functions(conn, clock)
    for statement_sql in sqlfiles.connection_statements():
        conn.execute(statement_sql)
    yield conn
    conn.close()


def forge_attestation(
    conn: sqlite3.Connection,
    act: str,
    step_id: int,
    token: int,
    worker: str,
    signer_key_id: str,
    signature: bytes,
    at: int,
) -> None:
    conn.execute(
        "INSERT INTO cassette_attestations (attestation_id, act, run_id, step_id,"
        " fencing_token, worker_id, key_id, signature, created_at)"
        " SELECT coalesce(max(attestation_id), 0) + 1, ?, ?, ?, ?, ?, ?, ?, ?"
        " FROM cassette_attestations",
        (act, RUN, step_id, token, worker, signer_key_id, base64.b64encode(signature).decode(), at),
    )


def forge_receipt(conn: sqlite3.Connection, step: dict[str, Any], worker: str, at: int) -> None:
    conn.execute(
        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,"
        " outcome, receipt_json, created_at) VALUES (?, ?, ?, ?, ?, 'SUCCESS', '{}', ?)",
        (step["step_id"], step["job_id"], RUN, worker, step["fencing_token"], at),
    )


# ------------------------------------------------------------ the signed statement


LAW_VECTOR = re.compile(r"<!-- worker-vector:begin -->\n```json\n(.*?)\n```", re.DOTALL)


class TestStatement:
    """The statement's exact bytes, and that a signature covers every field of it."""

    def test_the_law_md_test_vector(self) -> None:
        vector = json.loads(LAW_VECTOR.search((ROOT / "LAW.md").read_text("utf-8")).group(1))  # type: ignore[union-attr]
        private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["private_key_seed"]))
        fields = dict(vector["statement"])
        assert fields["receipt_sha256"] == sha256_text(vector["receipt_json"])
        made = statement(
            fields.pop("act"),
            ledger=fields.pop("ledger"),
            run_id=fields.pop("run_id"),
            worker_id=fields.pop("worker_id"),
            at=fields.pop("at"),
            **fields,
        )
        signed_bytes = statement_bytes(made)
        assert signed_bytes == vector["signed_bytes"].encode("utf-8")
        assert key_id(private.public_key()) == vector["key_id"]
        assert base64.b64encode(private.sign(signed_bytes)).decode() == vector["signature"]

    @settings(max_examples=200, deadline=None)
    @given(data=st.data())
    def test_changing_any_field_breaks_the_signature(self, data: st.DataObject) -> None:
        names = st.text(min_size=1, max_size=20)
        numbers = st.integers(min_value=0, max_value=2**63 - 1)
        fields: dict[str, Any] = {
            "act": data.draw(st.sampled_from(["post", "claim", "release", "complete", "requeue"])),
            "ledger": data.draw(names),
            "run_id": data.draw(names),
            "worker_id": data.draw(names),
            "at": data.draw(numbers),
            "step_id": data.draw(numbers),
            "fencing_token": data.draw(numbers),
            "outcome": data.draw(st.sampled_from(["SUCCESS", "FAILURE", "ABORTED"])),
        }
        private = Ed25519PrivateKey.from_private_bytes(bytes(32))
        signature = private.sign(statement_bytes(fields))
        field = data.draw(st.sampled_from(sorted(fields)))
        changed = dict(fields)
        if isinstance(fields[field], int):
            changed[field] = data.draw(numbers.filter(lambda v: v != fields[field]))
        else:
            changed[field] = data.draw(names.filter(lambda v: v != fields[field]))
        from cryptography.exceptions import InvalidSignature

        with pytest.raises(InvalidSignature):
            private.public_key().verify(signature, statement_bytes(changed))

    def test_a_statement_is_not_an_action_signature(self) -> None:
        """Domain separation: the signed bytes start with their own domain line."""
        fields = statement("claim", ledger="l", run_id="r", worker_id="w", at=0, step_id=1)
        assert statement_bytes(fields).startswith(b"catalytic-cassette/worker/v1\n{")


# --------------------------------------------------------------- signed happy paths


class TestSignedActs:
    """A worker with a key: every act attested, journaled, and verify passes with pins."""

    def test_post_claim_complete_release_requeue_all_verify(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], pins: Path
    ) -> None:
        with signed(db_path, clock, keys["w1"]) as cassette:
            for n in range(3):
                cassette.post_message({"n": n}, RUN, "WORKER", f"k{n}")
            first = cassette.claim_step(RUN, "w1", TTL)
            cassette.complete_step(
                RUN, first["step_id"], "w1", first["fencing_token"], {"ok": 1}, "SUCCESS"
            )
            second = cassette.claim_step(RUN, "w1", TTL)
            cassette.requeue(RUN, second["step_id"], worker_id="w1", fencing_token=1)
            again = cassette.claim_step(RUN, "w1", TTL)
        clock.advance(TTL * 1000)
        with signed(db_path, clock, keys["ops"]) as cassette:
            assert cassette.requeue(RUN)[0]["step_id"] == again["step_id"]
            acts = backends.rows(
                db_path, "SELECT act, worker_id FROM cassette_attestations ORDER BY attestation_id"
            )
            assert cassette.verify_cassette(worker_keys=load_pinned_keys(pins)).ok
        assert acts == [
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
        report = verify_path(str(db_path), worker_keys=load_pinned_keys(pins))
        assert report.ok and report.findings == [], report.findings

    def test_claim_steps_signs_each_step(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], pins: Path
    ) -> None:
        with signed(db_path, clock, keys["w2"]) as cassette:
            cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, RUN, "USER")
            claimed = cassette.claim_steps(RUN, "w2", 5, TTL)
            cassette.complete_steps(
                [(RUN, s["step_id"], "w2", s["fencing_token"], {}, "FAILURE") for s in claimed]
            )
        assert len(claimed) == 3
        assert kinds(db_path, pins) == []

    def test_the_cli_signs_with_worker_key(
        self, db_path: Path, tmp_path: Path, keys: dict[str, WorkerKey], pins: Path
    ) -> None:
        w1 = str(tmp_path / "w1.key")
        posted = invoke(
            db_path,
            *("post", "--payload", "-", "--run-id", RUN, "--source", "WORKER"),
            *("--worker-key", w1, "--signer", "w1"),
            stdin=b'{"a": 1}',
        )
        assert posted.exit_code == 0, posted.stderr
        claim = invoke(db_path, "claim", "--run-id", RUN, "--worker", "w1", "--worker-key", w1)
        step = json.loads(claim.stdout)
        done = invoke(
            db_path,
            *("complete", "--run-id", RUN, "--step", str(step["step_id"]), "--worker", "w1"),
            *("--token", str(step["fencing_token"]), "--receipt", "-", "--outcome", "SUCCESS"),
            *("--worker-key", w1),
            stdin=b'{"ok": true}',
        )
        assert done.exit_code == 0, done.stderr
        checked = invoke(db_path, "verify", "--worker-keys", str(pins))
        assert checked.exit_code == 0, checked.stdout
        assert "PASS" in checked.stderr
        count = backends.rows(db_path, "SELECT count(*) FROM cassette_attestations")
        assert count[0][0] == 3

    def test_the_cli_signs_both_acts_of_claim_next(
        self, db_path: Path, tmp_path: Path, keys: dict[str, WorkerKey], pins: Path
    ) -> None:
        """complete --claim-next --worker-key: the completion and the next claim each
        carry w1's attestation, as the two separate commands would."""
        w1 = str(tmp_path / "w1.key")
        with MessageCassette(db_path, worker_key=keys["w1"]) as cassette:  # the CLI's clock
            for n in range(2):
                cassette.post_message({"n": n}, RUN, "WORKER")
            step = cassette.claim_step(RUN, "w1", TTL)
        done = invoke(
            db_path,
            *("complete", "--run-id", RUN, "--step", str(step["step_id"]), "--worker", "w1"),
            *("--token", str(step["fencing_token"]), "--receipt", "-", "--outcome", "SUCCESS"),
            *("--claim-next", "--worker-key", w1),
            stdin=b'{"ok": true}',
        )
        assert done.exit_code == 0, done.stderr
        assert json.loads(done.stdout)["next"]["step_id"] == step["step_id"] + 1
        acts = backends.rows(
            db_path, "SELECT act, step_id FROM cassette_attestations ORDER BY attestation_id"
        )
        assert acts == [
            ("post", None),
            ("post", None),
            ("claim", step["step_id"]),
            ("complete", step["step_id"]),
            ("claim", step["step_id"] + 1),
        ]
        checked = invoke(db_path, "verify", "--worker-keys", str(pins))
        assert checked.exit_code == 0, checked.stdout
        unsigned = invoke(
            db_path,
            *("complete", "--run-id", RUN, "--step", str(step["step_id"] + 1), "--worker", "w1"),
            *("--token", "1", "--receipt", "-", "--outcome", "SUCCESS", "--claim-next"),
            stdin=b"{}",
        )
        assert unsigned.exit_code == 1
        assert unsigned.stderr.startswith("error: SIGNATURE_REQUIRED: ")

    @pytest.mark.parametrize("command", ["post", "requeue"])
    def test_the_cli_needs_a_key_for_a_signer_and_a_signer_for_a_key(
        self, db_path: Path, tmp_path: Path, keys: dict[str, WorkerKey], command: str
    ) -> None:
        before = backends.dump(db_path) if backends.is_postgresql(db_path) else None
        args = {
            "post": ("post", "--payload", "-", "--run-id", RUN, "--source", "USER"),
            "requeue": ("requeue", "--run-id", RUN),
        }[command]
        for extra in (("--signer", "w1"), ("--worker-key", str(tmp_path / "w1.key"))):
            result = invoke(db_path, *args, *extra, stdin=b"{}")
            assert result.exit_code == 2, result.output
            assert "Traceback" not in result.output
        if before is not None:  # a PostgreSQL ledger exists already: it is unchanged
            assert backends.dump(db_path) == before
        else:
            assert not db_path.exists()


# ----------------------------------------------------- impersonation refused by SQL


class TestImpersonationRefused:
    """A requeue or completion in a signing worker's name, without its signature, is
    refused with SIGNATURE_REQUIRED, and the file stays byte for byte unchanged."""

    @pytest.mark.parametrize("act", ["complete", "release"])
    def test_through_the_api_without_a_key(
        self, db_path: Path, clock: ManualClock, leased: dict[str, Any], act: str
    ) -> None:
        before = file_digest(db_path)
        with signed(db_path, clock, None) as cassette, pytest.raises(CassetteError) as caught:
            if act == "complete":
                cassette.complete_step(RUN, leased["step_id"], "w1", 1, {"forged": 1}, "SUCCESS")
            else:
                cassette.requeue(RUN, leased["step_id"], worker_id="w1", fencing_token=1)
        assert caught.value.code is ErrorCode.SIGNATURE_REQUIRED
        assert file_digest(db_path) == before

    @pytest.mark.parametrize("act", ["complete", "release"])
    def test_through_the_api_with_another_workers_key(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        act: str,
    ) -> None:
        before = file_digest(db_path)
        with signed(db_path, clock, keys["w2"]) as cassette, pytest.raises(CassetteError) as caught:
            if act == "complete":
                cassette.complete_step(RUN, leased["step_id"], "w1", 1, {"forged": 1}, "SUCCESS")
            else:
                cassette.requeue(RUN, leased["step_id"], worker_id="w1", fencing_token=1)
        assert caught.value.code is ErrorCode.WRONG_WORKER
        assert file_digest(db_path) == before

    def test_a_key_under_the_victims_name(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        pins: Path,
    ) -> None:
        """w2's key presented as w1's: SQL refuses it on w1's lease (the key id differs
        from the claim's); on acts of its own, SQL cannot tell, and verify names each."""
        impostor = WorkerKey("w1", keys["w2"].private)
        before = file_digest(db_path)
        with signed(db_path, clock, impostor) as cassette:
            with pytest.raises(CassetteError) as caught:
                cassette.complete_step(RUN, leased["step_id"], "w1", 1, {"forged": 1}, "SUCCESS")
            assert caught.value.code is ErrorCode.SIGNATURE_REQUIRED
            assert file_digest(db_path) == before
            second = cassette.claim_step(RUN, "w1", TTL)
            cassette.complete_step(RUN, second["step_id"], "w1", 1, {}, "SUCCESS")
        assert kinds(db_path, pins) == [
            ("foreign_key", "cassette_attestations", 4),
            ("foreign_key", "cassette_attestations", 5),
        ]

    @pytest.mark.parametrize("statement_sql", ["receipt", "release", "requeue"])
    def test_through_a_raw_connection(
        self, db_path: Path, backend: Ledger, leased: dict[str, Any], statement_sql: str
    ) -> None:
        if statement_sql == "requeue":
            # Past the lease's expiry, so only the missing signature stands in the way: a
            # PostgreSQL server checks expiry first (LEASE_NOT_EXPIRED); a raw sqlite3
            # connection has no clock to check it with.
            backend.advance(TTL * 1000)
        before = file_digest(db_path)
        sql = {
            "receipt": "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
            " fencing_token, outcome, receipt_json, created_at)"
            " VALUES (:step, :job, 'run-1', 'w1', 1, 'SUCCESS', '{}', 0)",
            "release": "INSERT INTO cassette_releases (step_id, run_id, worker_id,"
            " fencing_token, created_at) VALUES (:step, 'run-1', 'w1', 1, 0)",
            "requeue": "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
            " lease_expires_at = NULL WHERE step_id = :step",
        }[statement_sql]
        sql = sql.replace(":step", str(int(leased["step_id"])))
        sql = sql.replace(":job", str(int(leased["job_id"])))
        assert backend.raw_sql(sql) is ErrorCode.SIGNATURE_REQUIRED
        assert file_digest(db_path) == before

    def test_an_unsigned_requeue_of_an_expired_signed_lease(
        self, db_path: Path, clock: ManualClock, leased: dict[str, Any]
    ) -> None:
        clock.advance(TTL * 1000)
        before = file_digest(db_path)
        with signed(db_path, clock, None) as cassette:
            for max_attempts in (None, 1):
                with pytest.raises(CassetteError) as caught:
                    cassette.requeue(RUN, max_attempts=max_attempts)
                assert caught.value.code is ErrorCode.SIGNATURE_REQUIRED
        assert file_digest(db_path) == before

    def test_a_signed_requeue_after_expiry_closes_with_aborted(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        pins: Path,
    ) -> None:
        clock.advance(TTL * 1000)
        with signed(db_path, clock, keys["ops"]) as cassette:
            done = cassette.requeue(RUN, max_attempts=1)
        assert done == [{"step_id": leased["step_id"], "action": "aborted", "fencing_token": 1}]
        assert kinds(db_path, pins) == []

    def test_a_requeue_is_attested_only_after_expiry(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], leased: dict[str, Any]
    ) -> None:
        before = file_digest(db_path)
        with signed(db_path, clock, keys["ops"]) as cassette:
            with pytest.raises(CassetteError) as caught:
                cassette.requeue(RUN, leased["step_id"])
            assert caught.value.code is ErrorCode.LEASE_NOT_EXPIRED
            if not backends.is_postgresql(db_path):  # attest() takes a sqlite3 connection
                from catalytic_cassette.connection import write_transaction
                from catalytic_cassette.worker_keys import attest

                with (
                    pytest.raises(CassetteError) as direct,
                    write_transaction(cassette.conn) as conn,
                ):
                    attest(
                        conn,
                        keys["ops"],
                        "requeue",
                        run_id=RUN,
                        at=clock.now_ms(),
                        step_id=leased["step_id"],
                        fencing_token=1,
                    )
                assert direct.value.code is ErrorCode.LEASE_NOT_EXPIRED
        assert file_digest(db_path) == before

    def test_a_stale_signed_worker_still_gets_the_fencing_code(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], leased: dict[str, Any]
    ) -> None:
        clock.advance(TTL * 1000)
        with signed(db_path, clock, keys["ops"]) as cassette:
            cassette.requeue(RUN)
        with signed(db_path, clock, keys["w2"]) as cassette:
            cassette.claim_step(RUN, "w2", TTL)
        with signed(db_path, clock, keys["w1"]) as cassette, pytest.raises(CassetteError) as caught:
            cassette.complete_step(RUN, leased["step_id"], "w1", 1, {"late": 1}, "SUCCESS")
        assert caught.value.code is ErrorCode.STALE_FENCING_TOKEN

    def test_a_faulty_signer_is_refused_before_writing(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], leased: dict[str, Any]
    ) -> None:
        class Faulty(WorkerKey):
            def sign(self, message: bytes) -> bytes:
                return super().sign(message + b"!")

        before = file_digest(db_path)
        faulty = Faulty("w1", keys["w1"].private)
        with signed(db_path, clock, faulty) as cassette, pytest.raises(CassetteError) as caught:
            cassette.complete_step(RUN, leased["step_id"], "w1", 1, {}, "SUCCESS")
        assert caught.value.code is ErrorCode.BAD_SIGNATURE
        assert file_digest(db_path) == before

    def test_the_cli_refuses_with_the_code_and_no_traceback(
        self, db_path: Path, keys: dict[str, WorkerKey]
    ) -> None:
        with MessageCassette(db_path, worker_key=keys["w1"]) as cassette:  # the CLI's clock
            cassette.post_message({}, RUN, "WORKER")
            leased = cassette.claim_step(RUN, "w1", 600)
        before = file_digest(db_path)
        result = invoke(
            db_path,
            *("complete", "--run-id", RUN, "--step", str(leased["step_id"]), "--worker", "w1"),
            *("--token", "1", "--receipt", "-", "--outcome", "SUCCESS"),
            stdin=b"{}",
        )
        assert result.exit_code == 1
        assert result.stderr.startswith("error: SIGNATURE_REQUIRED: ")
        assert "Traceback" not in result.stderr + result.stdout
        assert file_digest(db_path) == before


# Each rule of the attestation guard, provoked through a raw connection on the ``leased``
# ledger (step 1 LEASED by w1 at token 1, step 2 PENDING at token 0, attestations 1-3).
_VALID = {
    "id": 4,
    "act": "release",
    "run": RUN,
    "message": None,
    "step": 1,
    "token": 1,
    "worker": "w1",
    "key": "0" * 16,
    "sig": "A" * 86 + "==",
}
GUARD_CASES = [
    pytest.param({}, "JOURNAL_REQUIRED", id="well-formed-but-unjournaled"),
    pytest.param({"act": "steal"}, "INVALID_ATTESTATION", id="unknown-act"),
    pytest.param({"worker": ""}, "INVALID_WORKER", id="empty-worker"),
    pytest.param({"id": 3}, "APPEND_ONLY", id="existing-id"),
    pytest.param({"id": 9}, "OUT_OF_ORDER", id="id-gap"),
    pytest.param({"act": "claim"}, "APPEND_ONLY", id="claim-attested-twice"),
    pytest.param(
        {"act": "post", "message": 0, "step": None, "token": None}, "OUT_OF_ORDER", id="old-post"
    ),
    pytest.param({"step": 99}, "STEP_NOT_FOUND", id="no-step"),
    pytest.param({"run": "other"}, "RUN_MISMATCH", id="other-run"),
    pytest.param({"act": "claim", "worker": "w2"}, "INVALID_ATTESTATION", id="claim-leased"),
    pytest.param(
        {"act": "claim", "step": 2, "token": 5}, "STALE_FENCING_TOKEN", id="claim-wrong-token"
    ),
    pytest.param({"step": 2, "token": 0}, "NOT_LEASED", id="release-pending"),
    pytest.param({"act": "complete", "token": 2}, "STALE_FENCING_TOKEN", id="complete-stale"),
    pytest.param({"act": "complete", "worker": "w2"}, "WRONG_WORKER", id="complete-not-owner"),
    pytest.param({"key": "XYZ"}, "INVALID_ATTESTATION", id="key-id-form"),
    pytest.param({"sig": "c2hvcnQ="}, "INVALID_ATTESTATION", id="signature-form"),
    pytest.param({"message": 3}, "INVALID_ATTESTATION", id="step-act-naming-a-message"),
]


@pytest.mark.sqlite_only(
    reason="SQLite's guard through a sqlite3 connection (cassette_ledger_time, CHECK"
    " messages); PostgreSQL's: test_postgres_worker_keys.py's attestation guard tests"
)
@pytest.mark.parametrize(("change", "code"), GUARD_CASES)
def test_the_attestation_guard_for_any_connection(
    db_path: Path, leased: dict[str, Any], change: dict[str, Any], code: str
) -> None:
    before = file_digest(db_path)
    raw = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match=rf"^{code}: |CHECK constraint failed: {code}"):
        raw.execute(
            "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id, step_id,"
            " fencing_token, worker_id, key_id, signature, created_at)"
            " VALUES (:id, :act, :run, :message, :step, :token, :worker, :key, :sig,"
            " (SELECT ms FROM cassette_ledger_time))",
            {**_VALID, **change},
        )
    for sql in (
        "UPDATE cassette_attestations SET worker_id = 'w2'",
        "DELETE FROM cassette_attestations",
    ):
        with pytest.raises(sqlite3.IntegrityError, match=r"^APPEND_ONLY: "):
            raw.execute(sql)
    raw.rollback()
    raw.close()
    assert file_digest(db_path) == before


# -------------------------------------------------------------- verify --worker-keys


class TestVerifyWorkerKeys:
    """What SQL cannot check, verify does: each problem named by kind, table and key."""

    @pytest.mark.sqlite_only(reason=LOOK_ALIKE)
    def test_a_look_alike_client_forges_an_attestation(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        look_alike: sqlite3.Connection,
        pins: Path,
    ) -> None:
        """Right worker, right key id, a signature of nothing: SQL accepts, verify names it."""
        look_alike.execute("BEGIN IMMEDIATE")
        forge_attestation(
            look_alike,
            "complete",
            leased["step_id"],
            1,
            "w1",
            keys["w1"].key_id,
            bytes(64),
            clock.now_ms(),
        )
        forge_receipt(look_alike, leased, "w1", clock.now_ms())
        look_alike.execute("COMMIT")
        assert verify_path(str(db_path)).ok  # without the keys nothing is wrong
        assert kinds(db_path, pins) == [("bad_signature", "cassette_attestations", 4)]
        result = invoke(db_path, "verify", "--worker-keys", str(pins))
        assert result.exit_code == 1
        assert "bad_signature" in result.stdout and "cassette_attestations[4]" in result.stdout

    @pytest.mark.sqlite_only(reason=LOOK_ALIKE)
    def test_a_signature_replayed_for_another_step_is_detected(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        look_alike: sqlite3.Connection,
        pins: Path,
    ) -> None:
        """w1's genuine claim signature of step 1, copied onto a claim of step 2."""
        row = look_alike.execute(
            "SELECT signature, created_at FROM cassette_attestations WHERE act = 'claim'"
        ).fetchone()
        look_alike.execute("BEGIN IMMEDIATE")
        forge_attestation(
            look_alike, "claim", 2, 1, "w1", keys["w1"].key_id, base64.b64decode(row[0]), row[1]
        )
        look_alike.execute(
            "UPDATE cassette_steps SET status = 'LEASED', lease_owner = 'w1',"
            " lease_expires_at = ?, fencing_token = 1 WHERE step_id = 2",
            (leased["lease_expires_at"],),
        )
        look_alike.execute("COMMIT")
        assert kinds(db_path, pins) == [("bad_signature", "cassette_attestations", 4)]

    @pytest.mark.sqlite_only(reason=LOOK_ALIKE)
    def test_a_replayed_attestation_row_is_refused_by_sql(
        self, db_path: Path, leased: dict[str, Any], look_alike: sqlite3.Connection
    ) -> None:
        """The same act attested twice, or an act that is not possible now: refused."""
        row = look_alike.execute(
            "SELECT act, step_id, fencing_token, worker_id, key_id, signature, created_at"
            " FROM cassette_attestations WHERE act = 'claim'"
        ).fetchone()
        signature = base64.b64decode(row[5])
        with pytest.raises(sqlite3.IntegrityError, match=r"^APPEND_ONLY: "):
            forge_attestation(look_alike, *row[:5], signature, row[6])
        with pytest.raises(sqlite3.IntegrityError, match=r"^INVALID_ATTESTATION: "):
            forge_attestation(look_alike, "claim", row[1], 1, "w2", row[4], signature, 0)
        with pytest.raises(sqlite3.IntegrityError, match=r"^STALE_FENCING_TOKEN: "):
            forge_attestation(look_alike, "complete", row[1], 7, "w1", row[4], signature, 0)

    def test_unsigned_entries_of_a_pinned_worker(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], pins: Path
    ) -> None:
        with signed(db_path, clock, None) as cassette:
            cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, RUN, "USER")
            one = cassette.claim_step(RUN, "w1", TTL)
            cassette.complete_step(RUN, one["step_id"], "w1", 1, {}, "SUCCESS")
            two = cassette.claim_step(RUN, "w1", TTL)
            cassette.requeue(RUN, two["step_id"], worker_id="w1", fencing_token=1)
            cassette.claim_step(RUN, "someone-unpinned", TTL)
        found = kinds(db_path, pins)
        assert sorted(found) == [
            ("unsigned_entry", "cassette_receipts", 1),
            ("unsigned_entry", "cassette_releases", 1),
            ("unsigned_entry", "cassette_steps", one["step_id"]),
            ("unsigned_entry", "cassette_steps", two["step_id"]),
        ]
        result = invoke(db_path, "verify", "--worker-keys", str(pins), "--json")
        assert result.exit_code == 1
        errors = [f for f in json.loads(result.stdout)["findings"] if f["severity"] == "error"]
        assert {f["kind"] for f in errors} == {"unsigned_entry"}

    def test_an_unpinned_signer_is_an_unknown_key(
        self, db_path: Path, clock: ManualClock, pins: Path
    ) -> None:
        stranger = WorkerKey("w9", Ed25519PrivateKey.generate())
        with signed(db_path, clock, stranger) as cassette:
            cassette.post_message({}, RUN, "WORKER")
        assert kinds(db_path, pins) == [("unknown_key", "cassette_attestations", 1)]

    @pytest.mark.sqlite_only(reason=LOOK_ALIKE)
    def test_an_edited_receipt_breaks_its_completion_signature(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        look_alike: sqlite3.Connection,
        pins: Path,
    ) -> None:
        """w1 signed a completion with one receipt; the receipt recorded is another."""
        statement_at = clock.now_ms()
        wanted = statement(
            "complete",
            ledger=look_alike.execute(
                "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
            ).fetchone()[0],
            run_id=RUN,
            worker_id="w1",
            at=statement_at,
            step_id=leased["step_id"],
            fencing_token=1,
            outcome="SUCCESS",
            receipt_sha256=sha256_text('{"honest":1}'),
        )
        signature = keys["w1"].sign(statement_bytes(wanted))
        look_alike.execute("BEGIN IMMEDIATE")
        forge_attestation(
            look_alike,
            "complete",
            leased["step_id"],
            1,
            "w1",
            keys["w1"].key_id,
            signature,
            statement_at,
        )
        forge_receipt(look_alike, leased, "w1", statement_at)  # receipt_json '{}'
        look_alike.execute("COMMIT")
        assert kinds(db_path, pins) == [("bad_signature", "cassette_attestations", 4)]

    @pytest.mark.sqlite_only(reason=LOOK_ALIKE)
    def test_an_attestation_of_an_act_that_never_happened(
        self,
        db_path: Path,
        clock: ManualClock,
        keys: dict[str, WorkerKey],
        leased: dict[str, Any],
        look_alike: sqlite3.Connection,
        pins: Path,
    ) -> None:
        look_alike.execute("BEGIN IMMEDIATE")
        forge_attestation(
            look_alike,
            "complete",
            leased["step_id"],
            1,
            "w1",
            keys["w1"].key_id,
            bytes(64),
            clock.now_ms(),
        )
        look_alike.execute("COMMIT")
        assert kinds(db_path, pins) == [("attestation_mismatch", "cassette_attestations", 4)]

    def test_a_forged_pin_directory_cannot_be_verified(
        self, db_path: Path, leased: dict[str, Any], pins: Path, tmp_path: Path
    ) -> None:
        os.symlink(pins / "w1.pub", pins / "w3.pub")
        result = invoke(db_path, "verify", "--worker-keys", str(pins))
        assert result.exit_code == 3 and result.stderr.startswith("error: KEY_ERROR: ")
        assert "symbolic link" in result.stderr  # an entry of the directory: cannot verify
        os.unlink(pins / "w3.pub")
        os.mkfifo(pins / "w4.pub")
        with pytest.raises(CassetteError) as caught:
            load_pinned_keys(pins)
        assert caught.value.code is ErrorCode.KEY_ERROR and "regular" in caught.value.message
        os.unlink(pins / "w4.pub")
        (pins / "w5.pub").write_bytes(b"x" * 5000)
        with pytest.raises(CassetteError, match="larger than"):
            load_pinned_keys(pins)
        empty = tmp_path / "empty"
        empty.mkdir()
        with pytest.raises(CassetteError, match=r"no \*\.pub"):
            load_pinned_keys(empty)

    def test_the_finding_names_worker_and_key(
        self, db_path: Path, clock: ManualClock, keys: dict[str, WorkerKey], leased: dict[str, Any]
    ) -> None:
        pinned = {"w1": PinnedKey("w1", keys["w2"].public, keys["w2"].key_id)}
        if backends.is_postgresql(db_path):  # the same check, through verify's reads
            found = verify_path(str(db_path), worker_keys=pinned).errors
        else:
            conn = sqlite3.connect(db_path)
            found = check_worker_keys(conn, pinned)
            conn.close()
        assert {f.kind for f in found} == {"foreign_key"}
        if not backends.is_postgresql(db_path):  # check_worker_keys's own findings name both
            assert all(f.worker_id == "w1" and f.key_id == keys["w1"].key_id for f in found)


# -------------------------------------------------------------------- real processes


def signed_worker(path: str, worker_id: str, key_file: str, start: Any, out: Any) -> None:
    """A worker process with its own key: claim and complete until nothing is pending."""
    done = 0
    try:
        with MessageCassette(path, worker_key=WorkerKey.load(worker_id, key_file)) as cassette:
            start.wait(60)
            while True:
                try:
                    step = cassette.claim_step(RUN, worker_id, 600)
                except CassetteError as refusal:
                    if refusal.code is ErrorCode.NO_PENDING_STEPS:
                        break
                    raise
                cassette.complete_step(
                    RUN,
                    step["step_id"],
                    worker_id,
                    step["fencing_token"],
                    {"by": worker_id},
                    "SUCCESS",
                )
                done += 1
        out.put((worker_id, done, None))
    except BaseException as error:  # reported to the test, which fails on it
        out.put((worker_id, done, f"{type(error).__name__}: {error}"))


@pytest.mark.slow
def test_signed_workers_racing_in_processes(
    db_path: Path, tmp_path: Path, keys: dict[str, WorkerKey], pins: Path
) -> None:
    """Two processes, two keys, one file: each step is claimed and completed once, each
    attestation is its claimer's, and verify with the pinned keys finds nothing."""
    steps = 40
    with MessageCassette(db_path) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}] * steps}]}, RUN, "USER")
    context = mp.get_context("spawn")
    start, out = context.Event(), context.Queue()
    workers = [
        context.Process(
            target=signed_worker,
            args=(str(db_path), worker, str(tmp_path / f"{worker}.key"), start, out),
        )
        for worker in ("w1", "w2")
    ]
    for process in workers:
        process.start()
    start.set()
    results = [out.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    assert [error for _, _, error in results] == [None, None]
    assert sum(done for _, done, _ in results) == steps
    mismatched = backends.rows(
        db_path,
        "SELECT count(*) FROM cassette_attestations a JOIN cassette_receipts r"
        " ON r.step_id = a.step_id AND a.act IN ('claim', 'complete')"
        " WHERE a.worker_id IS DISTINCT FROM r.worker_id",
    )[0][0]
    attested = backends.rows(db_path, "SELECT count(*) FROM cassette_attestations")[0][0]
    assert mismatched == 0 and attested == 2 * steps
    assert kinds(db_path, pins) == []
