"""MessageCassette: the thin Python face of the message cassette tables."""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import payloads
from .connection import DEFAULT_BUSY_TIMEOUT_MS
from .errors import CassetteError, ErrorCode, translate
from .law import OUTCOMES, STATUSES
from .lease_limits import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS
from .ledger import LedgerFile

if TYPE_CHECKING:
    from .clock import Clock
    from .seals import AutoSeal
    from .verify import VerifyReport
    from .worker_keys import PinnedKey, WorkerKey  # (imported by the signed acts only)

SOURCES = ("USER", "PLANNER", "SYSTEM", "WORKER")

# A claim reads the next PENDING step, then leases it by its id: under the write lock
# (BEGIN IMMEDIATE) nothing can come between the two, and the lease gets the token read
# here plus one and the caller's expiry. One UPDATE ... RETURNING did the same, but its
# RETURNING cost more than the second statement (docs/BENCHMARKS.md, "Issue 12, second
# pass"). A signed claim's attestation names the step and token between the two.
# Parameters are positional: binding a tuple costs less than a dict of names.
_NEXT_PENDING = """
SELECT step_id, job_id, message_id, ordinal, payload_json, fencing_token + 1
  FROM cassette_steps
 WHERE run_id = ? AND status = 'PENDING'
 ORDER BY message_id, job_ordinal, ordinal LIMIT 1
"""

_CLAIM_STEP = """
UPDATE cassette_steps
   SET status = 'LEASED', lease_owner = ?, lease_expires_at = ?,
       fencing_token = fencing_token + 1
 WHERE step_id = ?
"""

# Bound as (run, worker, token, outcome, receipt, now, step).
_COMPLETE = """
INSERT INTO cassette_receipts
    (step_id, job_id, run_id, worker_id, fencing_token, outcome, receipt_json, created_at)
SELECT step_id, job_id, ?, ?, ?, ?, ?, ?
  FROM cassette_steps WHERE step_id = ?
"""

# A completion checked and encoded: (run_id, step_id, worker_id, token, outcome, receipt).
_Completion = tuple[str, int, str, int, str, str]
_MAX_NAME = payloads.MAX_NAME_LENGTH
_INT64_MIN, _INT64_MAX = payloads.INT64_MIN, payloads.INT64_MAX


def _name(value: Any, code: ErrorCode, what: str) -> str:
    # The common case first: ASCII text of the right length holds no lone surrogate, so
    # there is nothing to encode; anything else takes the full checks, with their codes.
    if type(value) is str and 0 < len(value) <= _MAX_NAME and value.isascii():
        return value
    if not isinstance(value, str) or not 1 <= len(value) <= payloads.MAX_NAME_LENGTH:
        raise CassetteError(code, f"{what} must be a string of 1-200 characters")
    return payloads.require_text(value, code, what)


def _integer(value: Any, code: ErrorCode, what: str) -> int:
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # not a bool: type is int
        return value
    return payloads.require_int64(value, code, what)


def _ttl_ms(ttl_seconds: Any) -> int:
    if type(ttl_seconds) is int and 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        return ttl_seconds * 1000  # whole seconds: what the checks below give for them
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
        raise CassetteError(
            ErrorCode.INVALID_TTL, f"ttl must be a number of seconds: {ttl_seconds!r}"
        )
    if isinstance(ttl_seconds, int) and not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise CassetteError(  # before math.isfinite, which overflows on huge ints
            ErrorCode.INVALID_TTL, f"ttl must be between 0.001 and {MAX_TTL_SECONDS} seconds"
        )
    if not math.isfinite(ttl_seconds) or not 0.001 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise CassetteError(
            ErrorCode.INVALID_TTL, f"ttl must be between 0.001 and {MAX_TTL_SECONDS} seconds"
        )
    return max(1, round(ttl_seconds * 1000))


T = TypeVar("T")
M = TypeVar("M", bound="MessageCassette")


def _made(inserted: sqlite3.Cursor) -> int:
    """The id of the row an INSERT of one row made: its rowid, which the inserts of its
    triggers do not change. Cheaper than RETURNING (docs/BENCHMARKS.md, "Issue 12,
    second pass"); after an INSERT that made no row it would be stale, so check first."""
    made = inserted.lastrowid
    if made is None:  # pragma: no cover - sqlite3 sets it after every INSERT
        raise CassetteError(ErrorCode.DATABASE_ERROR, "the INSERT reported no row id")
    return made


def _indexed(index: int, count: int, call: Callable[..., T], *args: Any) -> T:
    """Run one item of a batch; a refusal names the item's index when there are several."""
    try:
        return call(*args)
    except sqlite3.Error as exc:
        error = translate(exc)
        if count > 1:
            error.detail["index"] = index
        raise error from exc
    except CassetteError as error:
        if count > 1:
            error.detail["index"] = index
        raise


def _prepare_complete(
    run_id: str, step_id: int, worker_id: str, token: int, receipt: dict[str, Any], outcome: str
) -> _Completion:
    _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
    _integer(step_id, ErrorCode.STEP_NOT_FOUND, "step_id")
    _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
    _integer(token, ErrorCode.INVALID_TOKEN, "fencing_token")
    if outcome not in OUTCOMES:
        raise CassetteError(
            ErrorCode.INVALID_OUTCOME, f"outcome must be one of {', '.join(OUTCOMES)}"
        )
    return (
        run_id,
        step_id,
        worker_id,
        token,
        outcome,
        payloads.encode_object(receipt, "receipt"),
    )


def _lease(row: tuple[Any, ...], expires: int, run_id: str, worker_id: str) -> dict[str, Any]:
    """What a claim returns for one leased row of ``_NEXT_PENDING``."""
    return {
        "step_id": row[0],
        "job_id": row[1],
        "message_id": row[2],
        "ordinal": row[3],
        "payload": payloads.loads(row[4]),
        "fencing_token": row[5],
        "lease_expires_at": expires,
        "run_id": run_id,
        "worker_id": worker_id,
    }


# The tables each hot write writes (directly or through the file's triggers: a receipt
# commits its step), for ``LedgerFile.write``: with a worker key, also the attestations.
_POST_WRITES = ("cassette_messages", "cassette_jobs", "cassette_steps")
_CLAIM_WRITES = ("cassette_steps",)
_COMPLETE_WRITES = ("cassette_receipts", "cassette_steps")


class MessageCassette(LedgerFile):
    """Messages -> jobs -> steps -> receipts in one SQLite file.

    Every method is one ``BEGIN IMMEDIATE`` transaction; the database triggers
    are the authority, Python only checks earlier for a clearer message.

    With ``worker_key`` every post, claim, release, completion and requeue made through
    this cassette carries that worker's signed attestation (LAW.md, "Worker keys"), and
    claims, completions and releases are made only in that worker's name.
    """

    @classmethod
    def _postgresql_class(cls: type[M]) -> type[M]:
        if cls is not MessageCassette:  # a subclass is not served by PostgreSQL's
            return super()._postgresql_class()
        from .postgresql.cassette import PgMessageCassette

        return cast("type[M]", PgMessageCassette)

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
        lazy_temp_triggers: bool = False,
    ) -> None:
        self.worker_key = worker_key
        super().__init__(
            db_path,
            clock=clock,
            durability=durability,
            busy_timeout_ms=busy_timeout_ms,
            auto_seal=auto_seal,
            read_only=read_only,
            lazy_temp_triggers=lazy_temp_triggers,
        )

    def _writes(self, tables: tuple[str, ...]) -> tuple[str, ...]:
        """The tables a write transaction writes: ``tables``, and the attestations when
        this cassette signs (``write``: a connection opened with lazy_temp_triggers
        installs their TEMP triggers only)."""
        return tables if self.worker_key is None else (*tables, "cassette_attestations")

    def _signing_as(self, worker_id: str) -> WorkerKey | None:
        """The worker key, refusing to act signed in another worker's name."""
        key = self.worker_key
        if key is not None and worker_id != key.worker_id:
            raise CassetteError(
                ErrorCode.WRONG_WORKER,
                f"this cassette signs as {key.worker_id!r}, not {worker_id!r}",
            )
        return key

    # ----------------------------------------------------------------- posts

    def post_message(
        self,
        payload: dict[str, Any],
        run_id: str,
        source: str,
        idempotency_key: str | None = None,
    ) -> tuple[int, int]:
        """Record a message and the jobs and steps it declares; return (message_id, job_id).

        The same (run_id, idempotency_key) with the same payload and source
        returns the first post's ids and writes nothing.
        """
        return self.post_messages([(payload, run_id, source, idempotency_key)])[0]

    def post_messages(
        self, items: list[tuple[dict[str, Any], str, str, str | None]]
    ) -> list[tuple[int, int]]:
        """Post several messages in one transaction; a refused item refuses the batch."""
        prepared = [
            _indexed(index, len(items), self._prepare_post, *item)
            for index, item in enumerate(items)
        ]
        results: list[tuple[int, int]] = []
        with self.write(self._writes(_POST_WRITES)) as conn:
            now = self.ledger_now(conn)
            for index, item in enumerate(prepared):
                results.append(_indexed(index, len(prepared), self._insert_post, conn, now, *item))
        return results

    @staticmethod
    def _prepare_post(
        payload: dict[str, Any], run_id: str, source: str, idempotency_key: str | None
    ) -> tuple[str, list[payloads.JobPlan], str, str, str | None]:
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        if source not in SOURCES:
            raise CassetteError(
                ErrorCode.INVALID_SOURCE, f"source must be one of {', '.join(SOURCES)}"
            )
        if idempotency_key is not None:
            _name(idempotency_key, ErrorCode.INVALID_IDEMPOTENCY_KEY, "idempotency_key")
        payload_json = payloads.encode_object(payload)
        return (
            payload_json,
            payloads.plan_jobs(payload, payload_json),
            run_id,
            source,
            idempotency_key,
        )

    def _insert_post(
        self,
        conn: sqlite3.Connection,
        now: int,
        payload_json: str,
        plans: list[payloads.JobPlan],
        run_id: str,
        source: str,
        key: str | None,
    ) -> tuple[int, int]:
        if key is not None:
            found = conn.execute(
                "SELECT message_id, source, payload_json FROM cassette_messages"
                " WHERE run_id = ? AND idempotency_key = ?",
                (run_id, key),
            ).fetchone()
            if found is not None:
                if found[1] != source or found[2] != payload_json:
                    raise CassetteError(
                        ErrorCode.IDEMPOTENCY_CONFLICT,
                        "this run_id and idempotency_key were posted with another payload"
                        " or source",
                        message_id=found[0],
                    )
                job = conn.execute(
                    "SELECT job_id FROM cassette_jobs WHERE message_id = ?"
                    " ORDER BY ordinal LIMIT 1",
                    (found[0],),
                ).fetchone()
                return int(found[0]), int(job[0])
        next_id = None
        if self.worker_key is not None:  # the attestation names the message before it exists
            next_id = conn.execute(
                "SELECT coalesce(max(message_id), 0) + 1 FROM cassette_messages"
            ).fetchone()[0]
            from .worker_keys import attest, sha256_text

            attest(
                conn,
                self.worker_key,
                "post",
                run_id=run_id,
                at=now,
                message_id=next_id,
                source=source,
                idempotency_key=key,
                payload_sha256=sha256_text(payload_json),
            )
        message_id = _made(
            conn.execute(
                "INSERT INTO cassette_messages"
                " (message_id, run_id, source, idempotency_key, payload_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (next_id, run_id, source, key, payload_json, now),
            )
        )
        first_job = 0
        for job_ordinal, plan in enumerate(plans):
            job_id = _made(
                conn.execute(
                    "INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (message_id, run_id, plan.intent, job_ordinal, now),
                )
            )
            if job_ordinal == 0:
                first_job = job_id
            conn.executemany(
                "INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal,"
                " status, fencing_token, payload_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, 'PENDING', 0, ?, ?)",
                [
                    (job_id, run_id, message_id, job_ordinal, ordinal, step_json, now)
                    for ordinal, step_json in enumerate(plan.steps)
                ],
            )
        return int(message_id), int(first_job)

    # ---------------------------------------------------------------- claims

    def claim_step(
        self, run_id: str, worker_id: str, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> dict[str, Any]:
        """Lease the next PENDING step of the run; NO_PENDING_STEPS when there is none."""
        claimed = self.claim_steps(run_id, worker_id, 1, ttl_seconds)
        if not claimed:
            raise CassetteError(ErrorCode.NO_PENDING_STEPS, f"run {run_id!r} has no pending step")
        return claimed[0]

    def claim_steps(
        self, run_id: str, worker_id: str, n: int, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> list[dict[str, Any]]:
        """Lease up to n steps in claim order in one transaction, each with its own token."""
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
        if _integer(n, ErrorCode.INVALID_ARGUMENT, "n") < 1:
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "n must be at least 1")
        ttl = _ttl_ms(ttl_seconds)
        signer = self._signing_as(worker_id)
        leased: list[tuple[Any, ...]] = []
        with self.write(self._writes(_CLAIM_WRITES)) as conn:
            now = self.ledger_now(conn)
            expires = now + ttl
            for _ in range(n):
                row = self._claim_next(conn, run_id, worker_id, now, expires, signer)
                if row is None:
                    break
                leased.append(row)
        # decoded after the commit: the write lock is held no longer than needed
        return [_lease(row, expires, run_id, worker_id) for row in leased]

    @staticmethod
    def _claim_next(
        conn: sqlite3.Connection,
        run_id: str,
        worker_id: str,
        now: int,
        expires: int,
        signer: WorkerKey | None,
    ) -> tuple[Any, ...] | None:
        """Lease the run's next PENDING step inside the caller's transaction; its row, or
        None when no step is pending."""
        row: tuple[Any, ...] | None = conn.execute(_NEXT_PENDING, (run_id,)).fetchone()
        if row is None:
            return None
        if signer is not None:  # the attestation names the lease before it exists
            from .worker_keys import attest

            attest(
                conn,
                signer,
                "claim",
                run_id=run_id,
                at=now,
                step_id=row[0],
                fencing_token=row[5],
                lease_expires_at=expires,
            )
        conn.execute(_CLAIM_STEP, (worker_id, expires, row[0]))
        return row

    # ------------------------------------------------------------- completes

    def complete_step(
        self,
        run_id: str,
        step_id: int,
        worker_id: str,
        fencing_token: int,
        receipt_payload: dict[str, Any],
        outcome: str,
    ) -> int:
        """Insert the step's one receipt (which commits it); return the receipt_id."""
        item = _prepare_complete(
            run_id, step_id, worker_id, fencing_token, receipt_payload, outcome
        )
        self._signing_as(worker_id)
        with self.write(self._writes(_COMPLETE_WRITES)) as conn:
            return self._insert_receipt(conn, item, self.ledger_now(conn))

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
        """Complete a leased step and lease this worker's next step, in one transaction.

        The receipt is written as ``complete_step`` writes it, then the run's next PENDING
        step is leased as ``claim_step`` leases it (claim order, its own token, an expiry
        ``ttl_seconds`` after the same "now"). Returns ``{"receipt_id", "step_id", "next"}``
        where ``next`` is the new lease as ``claim_step`` returns it, or None when no step
        of the run is pending. Arguments are checked before the transaction, the
        completion's as ``complete_step`` checks them, then the ttl. A refused call writes
        nothing: a refused completion raises what ``complete_step`` would, and should the
        claim be refused, the receipt is undone with it. With a worker key, both acts carry
        their attestations, as the two calls would.
        """
        item = _prepare_complete(
            run_id, step_id, worker_id, fencing_token, receipt_payload, outcome
        )
        signer = self._signing_as(worker_id)
        ttl = _ttl_ms(ttl_seconds)
        with self.write(self._writes(_COMPLETE_WRITES)) as conn:
            now = self.ledger_now(conn)
            receipt_id = self._insert_receipt(conn, item, now)
            expires = now + ttl
            row = self._claim_next(conn, run_id, worker_id, now, expires, signer)
        return {
            "receipt_id": receipt_id,
            "step_id": step_id,
            "next": None if row is None else _lease(row, expires, run_id, worker_id),
        }

    def complete_steps(
        self, items: list[tuple[str, int, str, int, dict[str, Any], str]]
    ) -> list[int]:
        """Complete several steps in one transaction; a refused item refuses the batch."""
        prepared = [
            _indexed(index, len(items), _prepare_complete, *item)
            for index, item in enumerate(items)
        ]
        for index, item in enumerate(prepared):
            _indexed(index, len(prepared), self._signing_as, item[2])
        receipt_ids: list[int] = []
        with self.write(self._writes(_COMPLETE_WRITES)) as conn:
            now = self.ledger_now(conn)
            for index, item in enumerate(prepared):
                receipt_ids.append(
                    _indexed(index, len(prepared), self._insert_receipt, conn, item, now)
                )
        return receipt_ids

    def _insert_receipt(self, conn: sqlite3.Connection, item: _Completion, now: int) -> int:
        run_id, step_id, worker_id, token, outcome, receipt = item
        if self.worker_key is not None:
            from .worker_keys import attest, sha256_text

            attest(
                conn,
                self.worker_key,
                "complete",
                run_id=run_id,
                at=now,
                step_id=step_id,
                fencing_token=token,
                outcome=outcome,
                receipt_sha256=sha256_text(receipt),
            )
        try:
            inserted = conn.execute(
                _COMPLETE, (run_id, worker_id, token, outcome, receipt, now, step_id)
            )
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        if inserted.rowcount == 0:
            raise CassetteError(ErrorCode.STEP_NOT_FOUND, f"no step {step_id}")
        return _made(inserted)

    # -------------------------------------------------------------- requeues

    def requeue(
        self,
        run_id: str,
        step_id: int | None = None,
        *,
        worker_id: str | None = None,
        fencing_token: int | None = None,
        max_attempts: int | None = None,
    ) -> list[dict[str, Any]]:
        """Return expired leases of the run (or one step) to PENDING.

        With ``worker_id`` and ``fencing_token`` the lease holder releases its
        own step before expiry. With ``max_attempts`` a step whose token has
        reached it is closed with an ABORTED receipt instead of requeued.
        """
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
            return [self._release(run_id, step_id, worker_id, fencing_token)]
        with self.write() as conn:
            now = self.ledger_now(conn)
            if step_id is not None:
                self._check_requeueable(conn, run_id, step_id, now)
            rows = conn.execute(
                "SELECT step_id, job_id, lease_owner, fencing_token FROM cassette_steps"
                " WHERE run_id = ? AND status = 'LEASED' AND lease_expires_at <= ?"
                " AND (? IS NULL OR step_id = ?) ORDER BY step_id",
                (run_id, now, step_id, step_id),
            ).fetchall()
            done = []
            for sid, job_id, owner, token in rows:
                if self.worker_key is not None:  # whoever requeues signs it, after expiry
                    from .worker_keys import attest

                    attest(
                        conn,
                        self.worker_key,
                        "requeue",
                        run_id=run_id,
                        at=now,
                        step_id=sid,
                        fencing_token=token,
                    )
                if max_attempts is not None and token >= max_attempts:
                    conn.execute(
                        "INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id,"
                        " fencing_token, outcome, receipt_json, created_at)"
                        " VALUES (?, ?, ?, ?, ?, 'ABORTED', ?, ?)",
                        (
                            sid,
                            job_id,
                            run_id,
                            owner,
                            token,
                            payloads.dumps({"reason": "max_attempts", "attempts": token}),
                            now,
                        ),
                    )
                    done.append({"step_id": sid, "action": "aborted", "fencing_token": token})
                else:
                    conn.execute(
                        "UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL,"
                        " lease_expires_at = NULL WHERE step_id = ?",
                        (sid,),
                    )
                    done.append({"step_id": sid, "action": "requeued", "fencing_token": token})
        return done

    @staticmethod
    def _check_requeueable(conn: sqlite3.Connection, run_id: str, step_id: int, now: int) -> None:
        row = conn.execute(
            "SELECT run_id, status, lease_expires_at FROM cassette_steps WHERE step_id = ?",
            (step_id,),
        ).fetchone()
        if row is None:
            raise CassetteError(ErrorCode.STEP_NOT_FOUND, f"no step {step_id}")
        if row[0] != run_id:
            raise CassetteError(ErrorCode.RUN_MISMATCH, f"step {step_id} belongs to another run")
        if row[1] != "LEASED":
            raise CassetteError(ErrorCode.NOT_LEASED, f"step {step_id} is {row[1]}")
        if row[2] > now:
            raise CassetteError(
                ErrorCode.LEASE_NOT_EXPIRED, f"step {step_id}'s lease expires at {row[2]}"
            )

    def _release(self, run_id: str, step_id: int, worker_id: str, token: int) -> dict[str, Any]:
        _name(worker_id, ErrorCode.INVALID_WORKER, "worker_id")
        _integer(token, ErrorCode.INVALID_TOKEN, "fencing_token")
        signer = self._signing_as(worker_id)
        with self.write() as conn:
            now = self.ledger_now(conn)
            if signer is not None:
                from .worker_keys import attest

                attest(
                    conn,
                    signer,
                    "release",
                    run_id=run_id,
                    at=now,
                    step_id=step_id,
                    fencing_token=token,
                )
            conn.execute(
                "INSERT INTO cassette_releases"
                " (step_id, run_id, worker_id, fencing_token, created_at) VALUES (?, ?, ?, ?, ?)",
                (step_id, run_id, worker_id, token, now),
            )
        return {"step_id": step_id, "action": "released", "fencing_token": token}

    # ----------------------------------------------------------------- reads

    def status(self, run_id: str) -> dict[str, Any]:
        """Counts of steps by state, receipts by outcome, and expired leases."""
        _name(run_id, ErrorCode.INVALID_RUN_ID, "run_id")
        conn = self.conn
        now = self.now_ms()
        steps = dict.fromkeys(STATUSES, 0)
        for status, count in conn.execute(
            "SELECT status, count(*) FROM cassette_steps WHERE run_id = ? GROUP BY status",
            (run_id,),
        ):
            steps[status] = count
        receipts = dict.fromkeys(OUTCOMES, 0)
        for outcome, count in conn.execute(
            "SELECT outcome, count(*) FROM cassette_receipts WHERE run_id = ? GROUP BY outcome",
            (run_id,),
        ):
            receipts[outcome] = count
        expired = conn.execute(
            "SELECT count(*) FROM cassette_steps"
            " WHERE run_id = ? AND status = 'LEASED' AND lease_expires_at <= ?",
            (run_id, now),
        ).fetchone()[0]
        messages = conn.execute(
            "SELECT count(*) FROM cassette_messages WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        return {
            "run_id": run_id,
            "messages": messages,
            "steps": steps,
            "receipts": receipts,
            "expired_leases": expired,
        }

    def get_step(self, step_id: int) -> dict[str, Any]:
        _integer(step_id, ErrorCode.STEP_NOT_FOUND, "step_id")
        row = self.conn.execute(
            "SELECT step_id, job_id, run_id, message_id, ordinal, status, lease_owner,"
            " lease_expires_at, fencing_token, payload_json FROM cassette_steps WHERE step_id = ?",
            (step_id,),
        ).fetchone()
        if row is None:
            raise CassetteError(ErrorCode.STEP_NOT_FOUND, f"no step {step_id}")
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
        """Check structure, the journal chain, state against history and consistency;
        with ``worker_keys`` (``worker_keys.load_pinned_keys(DIR)``), every attestation."""
        from .verify import VerifyOptions, verify_connection

        options = VerifyOptions(run_id=run_id, now_ms=self.now_ms(), worker_keys=worker_keys)
        try:
            return verify_connection(self.conn, options)
        except sqlite3.Error as exc:  # a malformed page met mid-walk: a coded refusal
            raise translate(exc) from exc
