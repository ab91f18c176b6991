"""MessageCassette on PostgreSQL: the same methods, arguments, results and codes.

Arguments are checked and encoded by the SQLite class's own helpers; each method is one
transaction calling the worker's SECURITY DEFINER functions (0002_roles.sql), so the
server's triggers hold the law and date every row. Chosen once, when a ledger is opened
with a PostgreSQL URL (``LedgerFile.__new__``); nothing here branches on the backend.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import payloads
from ..cassette import (
    OUTCOMES,
    STATUSES,
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
from ..lease_limits import DEFAULT_TTL_SECONDS
from . import connection
from .ledger import PgLedger, unsupported
from .sqlfiles import query

if TYPE_CHECKING:
    from ..seals import AutoSeal
    from ..verify import VerifyReport
    from ..worker_keys import PinnedKey, WorkerKey


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
    ) -> None:
        if worker_key is not None:
            unsupported("signing with a worker key")
        self.worker_key = None
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
        batch = [
            {
                "run_id": run_id,
                "source": source,
                "idempotency_key": key,
                "payload_json": payload_json,
                "intents": [plan.intent for plan in plans],
                "step_counts": [len(plan.steps) for plan in plans],
                "step_payloads": [step for plan in plans for step in plan.steps],
            }
            for payload_json, plans, run_id, source, key in prepared
        ]
        # No savepoint per item: the batch is refused whole, and past 64 subtransactions
        # every PostgreSQL visibility check slows (batches of 1,000 posted at 172
        # messages/s with one savepoint each).
        with connection.transaction(self.pg) as conn:
            rows = connection.batch(conn, query("post"), batch)
        return [(int(row[0]), int(row[1])) for row in rows]

    # ------------------------------------------------------------------- claims

    def claim_steps(
        self, run_id: str, worker_id: str, n: int, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> list[dict[str, Any]]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
        if _integer(n, ErrorCode.INVALID_ARGUMENT, "n") < 1:
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "n must be at least 1")
        ttl = _ttl_ms(ttl_seconds)
        rows = self._fetch(
            "claim", run_id=run_id, worker_id=worker_id, n=min(n, 2**31 - 1), ttl_ms=ttl
        )
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
        run_id, step_id, worker_id, token, outcome, receipt = item
        rows = self._fetch(
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
        run_id, step_id, worker_id, token, outcome, receipt = item
        rows = self._fetch(
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
        with connection.transaction(self.pg) as conn:
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
            self._fetch(
                "release",
                run_id=run_id,
                step_id=step_id,
                worker_id=worker_id,
                fencing_token=fencing_token,
            )
            return [{"step_id": step_id, "action": "released", "fencing_token": fencing_token}]
        rows = self._fetch("requeue", run_id=run_id, step_id=step_id, max_attempts=max_attempts)
        return [{"step_id": s, "action": a, "fencing_token": t} for s, a, t in rows]

    # -------------------------------------------------------------------- reads

    def status(self, run_id: str) -> dict[str, Any]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        steps = dict.fromkeys(STATUSES, 0)
        receipts = dict.fromkeys(OUTCOMES, 0)
        with connection.transaction(self.pg) as conn:  # one snapshot for every count
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
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
        the ledger's clock as on SQLite; worker keys are not ported (BACKEND_UNSUPPORTED)."""
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
