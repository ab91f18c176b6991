"""MessageCassette on PostgreSQL: the same methods, arguments, results and codes.

Arguments are checked and encoded by the SQLite class's own helpers; each method is one
transaction calling the worker's SECURITY DEFINER functions (0002_roles.sql), so the
server's triggers hold the law and date every row. Chosen once, when a ledger is opened
with a PostgreSQL URL (``LedgerFile.__new__``); nothing here branches on the backend.

With a worker key every act is preceded, in its transaction, by its signed attestation
(0007_worker_keys.sql, ``cassette_attest``): the transaction first reads its own time
(``_Signer``), which every row it writes will carry and which the statement names as
``at``; the statement is signed as on SQLite (``worker_keys.sign_act``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .. import payloads
from ..cassette import (
    MessageCassette,
    _Completion,
    _indexed,
    _integer,
    _name,
    _prepare_complete,
    _ttl_ms,
)
from ..clock import Clock
from ..connection import DEFAULT_BUSY_TIMEOUT_MS
from ..errors import CassetteError, ErrorCode
from ..law import OUTCOMES, STATUSES
from ..lease_limits import DEFAULT_TTL_SECONDS
from ..worker_keys import sha256_text, sign_act
from . import connection
from .ledger import PgLedger
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg

    from ..seals import AutoSeal
    from ..verify import VerifyReport
    from ..worker_keys import PinnedKey, WorkerKey

T = TypeVar("T")


class PgMessageCassette(PgLedger, MessageCassette):
    """Messages -> jobs -> steps -> receipts in a PostgreSQL database."""

    def __init__(
        self,
        db_path: str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
        durability: str | None = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        auto_seal: AutoSeal | None = None,
        worker_key: WorkerKey | None = None,
        read_only: bool = False,
        lazy_temp_triggers: bool = False,  # (SQLite's TEMP triggers: none here)
    ) -> None:
        self.worker_key = worker_key
        self._open_ledger(
            db_path,
            clock=clock,
            durability=durability,
            busy_timeout_ms=busy_timeout_ms,
            auto_seal=auto_seal,
            read_only=read_only,
        )

    # -------------------------------------------------------------------- posts

    def post_messages(
        self, items: list[tuple[dict[str, Any], str, str, str | None]]
    ) -> list[tuple[int, int]]:
        prepared = [
            _indexed(index, len(items), self._prepare_post, *item)
            for index, item in enumerate(items)
        ]
        if self.worker_key is not None:  # each post attested first: one at a time
            repeated = self._repeats(prepared)
            if repeated is not None:
                return repeated
            return self._post_signed(prepared, self.worker_key)
        batch = [_post_params(*item) for item in prepared]
        # No savepoint per item: the batch is refused whole, and past 64 subtransactions
        # every PostgreSQL visibility check slows (batches of 1,000 posted at 172
        # messages/s with one savepoint each).
        with self._writing() as conn:
            rows = connection.batch(conn, query("post"), batch)
        return [(int(row[0]), int(row[1])) for row in rows]

    def _repeats(self, prepared: list[Any]) -> list[tuple[int, int]] | None:
        """Each item's ids when every item repeats a committed post under its key, with the
        same source and payload: nothing to attest or write, so no head is taken
        (schema/20_messages.sql). Otherwise None, and the signed path decides (a conflict
        is refused there)."""
        if any(item[4] is None for item in prepared):
            return None
        asked = [
            {
                "run_id": run_id,
                "idempotency_key": key,
                "source": source,
                "payload_json": payload_json,
            }
            for payload_json, _, run_id, source, key in prepared
        ]
        try:
            rows = connection.batch(self.pg, query("posted_under_key"), asked)
        except (CassetteError, UnicodeEncodeError):
            return None  # (text the server cannot take: the signed path names the item)
        if all(row[0] is not None and row[2] for row in rows):
            if self.commits_early:
                # the posts repeated may be another writer's early commits not flushed
                # yet: "posted" is said once a crash cannot take them back, as the
                # unsigned repost's own statement flushes (connection.commit_early)
                connection.flush(self.pg)
            return [(int(row[0]), int(row[1])) for row in rows]
        return None

    def _post_signed(self, prepared: list[Any], key: WorkerKey) -> list[tuple[int, int]]:
        results: list[tuple[int, int]] = []
        with self._writing() as conn:
            signer = _Signer(conn, key)
            for index, item in enumerate(prepared):
                params = _post_params(*item)
                row = _indexed(index, len(prepared), _translated, _post_one, conn, params, signer)
                results.append((int(row[0]), int(row[1])))
        return results

    # ------------------------------------------------------------------- claims

    def claim_steps(
        self, run_id: str, worker_id: str, n: int, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> list[dict[str, Any]]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
        if _integer(n, ErrorCode.INVALID_ARGUMENT, "n") < 1:
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "n must be at least 1")
        ttl = _ttl_ms(ttl_seconds)
        key = self._signing_as(worker_id)
        if key is None:
            rows = self._write(
                "claim", run_id=run_id, worker_id=worker_id, n=min(n, 2**31 - 1), ttl_ms=ttl
            )
        elif not self._fetch("run_has_pending", run_id=run_id)[0][0]:
            rows = []  # nothing to claim: no head taken, nothing signed (schema/30_steps.sql)
        else:
            with self._writing() as conn:
                signer = _Signer(conn, key)
                rows = []
                for _ in range(n):
                    row = signer.claim(run_id, ttl)
                    if row is None:
                        break
                    rows.append(row)
        return [_leased(row, run_id, worker_id) for row in rows]

    # ---------------------------------------------------------------- completes

    def complete_step(
        self,
        run_id: str,
        step_id: int,
        worker_id: str,
        fencing_token: int,
        receipt_payload: dict[str, Any],
        outcome: str,
    ) -> int:
        item = _prepare_complete(
            run_id, step_id, worker_id, fencing_token, receipt_payload, outcome
        )
        key = self._signing_as(worker_id)
        if key is not None:
            with self._writing() as conn:
                return _Signer(conn, key).complete(item)
        run_id, step_id, worker_id, token, outcome, receipt = item
        rows = self._write(
            "complete",
            run_id=run_id,
            step_id=step_id,
            worker_id=worker_id,
            fencing_token=token,
            outcome=outcome,
            receipt_json=receipt,
        )
        return int(rows[0][0])

    def complete_and_claim(
        self,
        run_id: str,
        step_id: int,
        worker_id: str,
        fencing_token: int,
        receipt_payload: dict[str, Any],
        outcome: str,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
    ) -> dict[str, Any]:
        item = _prepare_complete(
            run_id, step_id, worker_id, fencing_token, receipt_payload, outcome
        )
        key = self._signing_as(worker_id)
        if key is not None:  # the two acts, each attested, as complete_step and claim_step
            ttl = _ttl_ms(ttl_seconds)
            with self._writing() as conn:
                signer = _Signer(conn, key)
                receipt_id = signer.complete(item)
                leased = signer.claim(run_id, ttl)
            return {
                "receipt_id": receipt_id,
                "step_id": step_id,
                "next": None if leased is None else _leased(leased, run_id, worker_id),
            }
        run_id, step_id, worker_id, token, outcome, receipt = item
        rows = self._write(
            "complete_and_claim",
            run_id=run_id,
            step_id=step_id,
            worker_id=worker_id,
            fencing_token=token,
            outcome=outcome,
            receipt_json=receipt,
            ttl_ms=_ttl_ms(ttl_seconds),
        )
        row = rows[0]
        return {
            "receipt_id": int(row[0]),
            "step_id": step_id,
            "next": _leased(row[1:], run_id, worker_id) if row[1] is not None else None,
        }

    def complete_steps(
        self, items: list[tuple[str, int, str, int, dict[str, Any], str]]
    ) -> list[int]:
        prepared = [
            _indexed(index, len(items), _prepare_complete, *item)
            for index, item in enumerate(items)
        ]
        for index, item in enumerate(prepared):
            _indexed(index, len(prepared), self._signing_as, item[2])
        if self.worker_key is not None:  # each completion attested first: one at a time
            with self._writing() as conn:
                signer = _Signer(conn, self.worker_key)
                return [
                    _indexed(index, len(prepared), _translated, signer.complete, item)
                    for index, item in enumerate(prepared)
                ]
        with self._writing() as conn:
            rows = connection.batch(conn, query("complete"), [_completion(i) for i in prepared])
        return [int(row[0]) for row in rows]

    # ----------------------------------------------------------------- requeues

    def requeue(
        self,
        run_id: str,
        step_id: int | None = None,
        *,
        worker_id: str | None = None,
        fencing_token: int | None = None,
        max_attempts: int | None = None,
    ) -> list[dict[str, Any]]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        if step_id is not None:
            _integer(step_id, ErrorCode.STEP_NOT_FOUND, "step_id")
        if (
            max_attempts is not None
            and _integer(max_attempts, ErrorCode.INVALID_ARGUMENT, "max_attempts") < 1
        ):
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "max_attempts must be at least 1")
        if worker_id is not None:
            if step_id is None or fencing_token is None:
                raise CassetteError(
                    ErrorCode.INVALID_ARGUMENT, "a release names the step and the holder's token"
                )
            _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
            _integer(fencing_token, ErrorCode.INVALID_TOKEN, "fencing_token")
            key = self._signing_as(worker_id)
            release = {
                "run_id": run_id,
                "step_id": step_id,
                "worker_id": worker_id,
                "fencing_token": fencing_token,
            }
            if key is None:
                self._write("release", **release)
            else:
                with self._writing() as conn:
                    signer = _Signer(conn, key)
                    signer.attest("release", run_id, step_id=step_id, fencing_token=fencing_token)
                    conn.execute(query("release"), release)
            return [{"step_id": step_id, "action": "released", "fencing_token": fencing_token}]
        requeue = {"run_id": run_id, "step_id": step_id, "max_attempts": max_attempts}
        if self.worker_key is None:
            rows = self._write("requeue", **requeue)
        elif step_id is None and not self._fetch("run_has_lease_due", run_id=run_id)[0][0]:
            rows = []  # no lease due: no head taken, nothing signed (schema/30_steps.sql)
        else:  # whoever requeues signs each expired lease it ends, before ending them
            with self._writing() as conn:
                signer = _Signer(conn, self.worker_key)
                expired = conn.execute(
                    query("expired_leases_of_run"),
                    {"run_id": run_id, "step_id": step_id, "now": signer.now},
                ).fetchall()
                if not expired:  # (the function names why a given step is not requeued)
                    rows = [tuple(row) for row in conn.execute(query("requeue"), requeue)]
                else:
                    rows = []
                for sid, token in expired:  # attested, then ended, one lease at a time
                    signer.attest("requeue", run_id, step_id=sid, fencing_token=token)
                    one = {**requeue, "step_id": sid}
                    rows += [tuple(row) for row in conn.execute(query("requeue"), one)]
        return [{"step_id": s, "action": a, "fencing_token": t} for s, a, t in rows]

    # -------------------------------------------------------------------- reads

    def status(self, run_id: str) -> dict[str, Any]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        steps = dict.fromkeys(STATUSES, 0)
        receipts = dict.fromkeys(OUTCOMES, 0)
        with self.read_snapshot() as conn:  # one snapshot for every count
            for state, count in conn.execute(query("steps_by_status"), {"run_id": run_id}):
                steps[state] = count
            for outcome, count in conn.execute(query("receipts_by_outcome"), {"run_id": run_id}):
                receipts[outcome] = count
            expired = conn.execute(query("expired_leases"), {"run_id": run_id}).fetchone()
            messages = conn.execute(query("messages_of_run"), {"run_id": run_id}).fetchone()
        return {
            "run_id": run_id,
            "messages": messages[0] if messages else 0,
            "steps": steps,
            "receipts": receipts,
            "expired_leases": expired[0] if expired else 0,
        }

    def get_step(self, step_id: int) -> dict[str, Any]:
        _integer(step_id, ErrorCode.STEP_NOT_FOUND, "step_id")
        rows = self._fetch("step", step_id=step_id)
        if not rows:
            raise CassetteError(ErrorCode.STEP_NOT_FOUND, f"no step {step_id}")
        row = rows[0]
        keys = (
            "step_id",
            "job_id",
            "run_id",
            "message_id",
            "ordinal",
            "status",
            "lease_owner",
            "lease_expires_at",
            "fencing_token",
        )
        return {**dict(zip(keys, row[:9], strict=False)), "payload": payloads.loads(row[9])}

    def verify_cassette(
        self, run_id: str | None = None, *, worker_keys: dict[str, PinnedKey] | None = None
    ) -> VerifyReport:
        """verify on this ledger, in its own snapshot (postgresql/verify.py), judged by
        the ledger's clock as on SQLite; with ``worker_keys``, every attestation."""
        from ..verify import VerifyOptions
        from .verify import verify_url

        options = VerifyOptions(run_id=run_id, now_ms=self.now_ms(), worker_keys=worker_keys)
        return verify_url(self.db_path, options)


def _leased(row: tuple[Any, ...], run_id: str, worker_id: str) -> dict[str, Any]:
    """A claim's lease, as MessageCassette.claim_step returns it."""
    return {
        "step_id": row[0],
        "job_id": row[1],
        "message_id": row[2],
        "ordinal": row[3],
        "payload": payloads.loads(row[4]),
        "fencing_token": row[5],
        "lease_expires_at": row[6],
        "run_id": run_id,
        "worker_id": worker_id,
    }


def _post_params(
    payload_json: str, plans: list[Any], run_id: str, source: str, key: str | None
) -> dict[str, Any]:
    """The named ``post`` query's parameters for one prepared message."""
    return {
        "run_id": run_id,
        "source": source,
        "idempotency_key": key,
        "payload_json": payload_json,
        "intents": [plan.intent for plan in plans],
        "step_counts": [len(plan.steps) for plan in plans],
        "step_payloads": [step for plan in plans for step in plan.steps],
    }


def _completion(item: _Completion) -> dict[str, Any]:
    run_id, step_id, worker_id, token, outcome, receipt = item
    return {
        "run_id": run_id,
        "step_id": step_id,
        "worker_id": worker_id,
        "fencing_token": token,
        "outcome": outcome,
        "receipt_json": receipt,
    }


def _complete(conn: psycopg.Connection[Any], item: _Completion) -> int:
    row = conn.execute(query("complete"), _completion(item)).fetchone()
    assert row is not None
    return int(row[0])


def _post_one(
    conn: psycopg.Connection[Any], params: dict[str, Any], signer: _Signer
) -> tuple[Any, ...]:
    signer.attest_post(params)
    row = conn.execute(query("post"), params).fetchone()
    assert row is not None
    return tuple(row)


def _translated(call: Callable[..., T], *args: Any) -> T:
    """One signed item of a batch, a server's refusal as a CassetteError, so that
    ``_indexed`` (which knows SQLite's errors) names its index. No savepoint per item:
    a refusal leaves the transaction to roll back whole."""
    try:
        return call(*args)
    except CassetteError:
        raise
    except Exception as exc:
        raise connection.translate(exc) from exc


class _Signer:
    """A worker key signing acts inside one transaction of a PostgreSQL ledger.

    Made first thing in the transaction: ``cassette_signer_context()`` takes the head, so
    the time it returns is the ``created_at`` of every row this transaction writes (the
    statements' ``at``), and nothing another session commits can come between a read
    below and the act it signs. Each act is attested, then made, through the worker's
    functions, the two sent together (a pipeline: one round trip while the head is
    held); the server's triggers check both (0007_worker_keys.sql).
    """

    def __init__(self, conn: psycopg.Connection[Any], key: WorkerKey) -> None:
        self.conn = conn
        self.key = key
        row = conn.execute(query("signer_context")).fetchone()
        if row is None or row[1] is None:
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the ledger has no ledger_id")
        self.now, self.ledger = int(row[0]), str(row[1])

    def attest(
        self,
        act: str,
        run_id: str,
        *,
        message_id: int | None = None,
        step_id: int | None = None,
        fencing_token: int | None = None,
        **fields: Any,
    ) -> None:
        """Sign the act and send its attestation (in a pipeline, the act may follow it
        before any answer comes back: a refusal then refuses both)."""
        signature = sign_act(
            self.key,
            act,
            ledger=self.ledger,
            run_id=run_id,
            at=self.now,
            message_id=message_id,
            step_id=step_id,
            fencing_token=fencing_token,
            **fields,
        )
        self.conn.execute(
            query("attest"),
            {
                "act": act,
                "run_id": run_id,
                "message_id": message_id,
                "step_id": step_id,
                "fencing_token": fencing_token,
                "worker_id": self.key.worker_id,
                "key_id": self.key.key_id,
                "signature": signature,
            },
        )

    def attest_post(self, params: dict[str, Any]) -> None:
        """A new message's post, under the next message_id; an idempotent repeat (which
        writes nothing) is not attested, as on SQLite."""
        key = params["idempotency_key"]
        if key is not None:
            found = self.conn.execute(
                query("message_by_key"), {"run_id": params["run_id"], "idempotency_key": key}
            ).fetchone()
            if found is not None:
                return
        row = self.conn.execute(query("next_message_id")).fetchone()
        assert row is not None
        self.attest(
            "post",
            params["run_id"],
            message_id=int(row[0]),
            source=params["source"],
            idempotency_key=key,
            payload_sha256=sha256_text(params["payload_json"]),
        )

    def claim(self, run_id: str, ttl_ms: int) -> tuple[Any, ...] | None:
        """Lease the run's next PENDING step, attested first; its row, or None."""
        found = self.conn.execute(query("next_pending"), {"run_id": run_id}).fetchone()
        if found is None:
            return None
        step_id, token = int(found[0]), int(found[1])
        with self.conn.pipeline():
            self.attest(
                "claim",
                run_id,
                step_id=step_id,
                fencing_token=token,
                lease_expires_at=self.now + ttl_ms,
            )
            claimed = self.conn.execute(
                query("claim"),
                {"run_id": run_id, "worker_id": self.key.worker_id, "n": 1, "ttl_ms": ttl_ms},
            )
        leased = claimed.fetchone()
        if leased is None or leased[0] != step_id:
            # another session holds the step's row lock (claims skip locked rows): the
            # attested step was not the one leased, so nothing is kept
            raise CassetteError(ErrorCode.BUSY, f"step {step_id} is locked by another session")
        return tuple(leased)

    def complete(self, item: _Completion) -> int:
        run_id, step_id, _, token, outcome, receipt = item
        with self.conn.pipeline():
            self.attest(
                "complete",
                run_id,
                step_id=step_id,
                fencing_token=token,
                outcome=outcome,
                receipt_sha256=sha256_text(receipt),
            )
            return _complete(self.conn, item)
