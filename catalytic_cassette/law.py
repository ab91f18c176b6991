"""The step machine, its lease effects and the receipt and release rules, as data and as
pure judgements of one revision against the row before it.

The SQL guards (``sql/sqlite/schema/cassette.sql``, ``connection.sql``, the PostgreSQL
migrations) refuse a write by these rules, in this order, with these codes; verify's
history judge (``verify/history.py``) judges every revision the journal records by the
same functions. ``tests/test_law.py`` drives the real guards of both backends with
generated revisions and requires the guard's code to be the one these functions give,
and reads the allow-list out of the guards' text: a rule changed in one place only is a
red test.

A verdict is ``None`` (lawful) or ``(code, text)``: the ``ErrorCode`` the write path
raises and what broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeGuard

from .errors import ErrorCode

Verdict = tuple[ErrorCode, str] | None
Row = Mapping[str, Any]

STATUSES: Final = ("PENDING", "LEASED", "COMMITTED")
OUTCOMES: Final = ("SUCCESS", "FAILURE", "ABORTED")
INSERTED_AS: Final = "PENDING"
# The step machine's allow-list: each lawful edge and what it does to the lease.
CLAIM: Final = "claim"  # owner and expiry set, token + 1
COMMIT: Final = "commit"  # lease fields and token kept; only with the step's receipt
REQUEUE: Final = "requeue"  # owner and expiry cleared, token kept; after expiry or a release
EDGES: Final[dict[tuple[Any, Any], str]] = {
    ("PENDING", "LEASED"): CLAIM,
    ("LEASED", "COMMITTED"): COMMIT,
    ("LEASED", "PENDING"): REQUEUE,
}
FINAL: Final = "COMMITTED"
IMMUTABLE_COLUMNS: Final = (
    "step_id",
    "job_id",
    "run_id",
    "message_id",
    "job_ordinal",
    "ordinal",
    "payload_json",
    "created_at",
)
LEASE_FIELDS: Final = ("lease_owner", "lease_expires_at", "fencing_token")
NAME_CHARS: Final = (1, 200)  # worker ids and lease owners
LEASE_CAP_MS: Final = 30 * 86_400_000


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


def _is_name(value: object) -> bool:
    return isinstance(value, str) and NAME_CHARS[0] <= len(value) <= NAME_CHARS[1]


def step_insert(row: Row) -> Verdict:
    """A step as inserted: PENDING, token 0, no lease."""
    status, token = row.get("status"), row.get("fencing_token")
    if status not in STATUSES:
        return ErrorCode.INVALID_STATUS, f"status {status!r}"
    if not _is_int(token) or token < 0:
        return ErrorCode.INVALID_TOKEN, f"token {token!r}"
    if status != INSERTED_AS:
        return ErrorCode.ILLEGAL_TRANSITION, f"a step is inserted as {status}"
    if token != 0 or row.get("lease_owner") is not None or row.get("lease_expires_at") is not None:
        return ErrorCode.LEASE_FIELDS_LOCKED, "a step is inserted with token 0 and no lease"
    return None


def step_update(
    old: Row,
    new: Row,
    *,
    receipt: bool = True,
    released: bool = False,
    now_ms: int | None = None,
) -> Verdict:
    """One revision of a step against the one before it.

    ``receipt``: the step's receipt (its token, its owner) exists, as a commit needs;
    ``released``: a release of the current token exists; ``now_ms``: the writer's
    transaction time, for the package connection's clock rules (None: not judged here;
    the history judge dates a requeue by the entries around it)."""
    old_status, status = old.get("status"), new.get("status")
    edge = EDGES.get((old_status, status)) if isinstance(status, str) else None
    if now_ms is not None:  # (the package's TEMP clock guard fires first)
        expiry = new.get("lease_expires_at")
        if edge == CLAIM and _is_int(expiry):
            if expiry <= now_ms:
                return ErrorCode.INVALID_TTL, f"the lease expires at {expiry}, not after {now_ms}"
            if expiry > now_ms + LEASE_CAP_MS:
                return ErrorCode.INVALID_TTL, f"the lease expires at {expiry}, over 30 days"
        old_expiry = old.get("lease_expires_at")
        if edge == REQUEUE and _is_int(old_expiry) and old_expiry > now_ms and not released:
            return (
                ErrorCode.LEASE_NOT_EXPIRED,
                f"requeued at {now_ms}, before the lease's expiry {old_expiry}",
            )
    if status not in STATUSES:
        return ErrorCode.INVALID_STATUS, f"status {status!r}"
    token, old_token = new.get("fencing_token"), old.get("fencing_token")
    if not _is_int(token) or token < 0:
        return ErrorCode.INVALID_TOKEN, f"token {token!r}"
    if _immutables(new) != _immutables(old):  # (the common case: equal, one comparison)
        for column in IMMUTABLE_COLUMNS:
            if _differ(new.get(column), old.get(column)):
                return ErrorCode.IMMUTABLE_FIELD, f"{column} changes"
    lease_changed = _lease(new) != _lease(old)  # (as ``_differ`` on each)
    if status == old_status and lease_changed:
        return ErrorCode.LEASE_FIELDS_LOCKED, f"lease fields change while {status}"
    if edge is None:
        return ErrorCode.ILLEGAL_TRANSITION, f"{old_status} -> {status}"
    if edge == CLAIM:
        owner, expiry = new.get("lease_owner"), new.get("lease_expires_at")
        if not _is_name(owner) or not _is_int(expiry) or token != _plus_one(old_token):
            return (
                ErrorCode.LEASE_FIELDS_LOCKED,
                f"a claim sets owner {owner!r}, expiry {expiry!r} and the token"
                f" {old_token!r} -> {token!r}",
            )
    elif edge == REQUEUE:
        if (
            new.get("lease_owner") is not None
            or new.get("lease_expires_at") is not None
            or _differ(token, old_token)
        ):
            return ErrorCode.LEASE_FIELDS_LOCKED, "a requeue clears the lease and keeps the token"
    else:
        if lease_changed:
            return ErrorCode.LEASE_FIELDS_LOCKED, "committing keeps the lease fields and the token"
        if not receipt:
            return ErrorCode.RECEIPT_REQUIRED, "COMMITTED without the step's receipt"
    return None


def _immutables(row: Row) -> tuple[Any, ...]:
    return tuple(map(row.get, IMMUTABLE_COLUMNS))


def _lease(row: Row) -> tuple[Any, ...]:
    return tuple(map(row.get, LEASE_FIELDS))


def _differ(a: object, b: object) -> bool:
    """SQL's ``IS NOT`` on the values a journal body holds (1 and 1.0 are the same)."""
    return a != b or (a is None) != (b is None)


def _plus_one(token: object) -> object:
    return token + 1 if _is_int(token) else None


def receipt(step: Row | None, row: Row, *, has_receipt: bool, now_ms: int | None) -> Verdict:
    """A receipt against its step as it stands (``None``: no such step). ``now_ms``: the
    receipt's transaction time (its ``created_at``), for the expiry rule."""
    worker, outcome = row.get("worker_id"), row.get("outcome")
    if not _is_name(worker):
        return ErrorCode.INVALID_WORKER, f"worker {worker!r}"
    if outcome not in OUTCOMES:
        return ErrorCode.INVALID_OUTCOME, f"outcome {outcome!r}"
    step_id = row.get("step_id")
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {step_id!r}"
    if has_receipt:
        return ErrorCode.DUPLICATE_RECEIPT, f"step {step_id} has its receipt"
    closes = _closes(step, row, "completes")
    if closes is not None:
        return closes
    expiry = step.get("lease_expires_at")
    if outcome != "ABORTED" and now_ms is not None and _is_int(expiry) and expiry <= now_ms:
        return (
            ErrorCode.LEASE_EXPIRED,
            f"{outcome} receipt dated {now_ms} at or after the lease's expiry {expiry}",
        )
    return None


def release(step: Row | None, row: Row, *, released_before: bool) -> Verdict:
    """A release against its step as it stands; ``released_before``: this step and token
    were released already."""
    worker = row.get("worker_id")
    if not _is_name(worker):
        return ErrorCode.INVALID_WORKER, f"worker {worker!r}"
    if released_before:
        return ErrorCode.APPEND_ONLY, "a release of this step with this token exists"
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {row.get('step_id')!r}"
    return _closes(step, row, "releases", job=False)


def _closes(step: Row, row: Row, verb: str, *, job: bool = True) -> Verdict:
    """A receipt or release names the lease it closes: same run (and job), LEASED, the
    current token, by its owner."""
    if _differ(row.get("run_id"), step.get("run_id")):
        return ErrorCode.RUN_MISMATCH, "the step belongs to another run"
    if job and _differ(row.get("job_id"), step.get("job_id")):
        return ErrorCode.REFERENCE_MISMATCH, "the step belongs to another job"
    if step.get("status") != "LEASED":
        return ErrorCode.NOT_LEASED, f"the step is {step.get('status')}"
    if _differ(row.get("fencing_token"), step.get("fencing_token")):
        return (
            ErrorCode.STALE_FENCING_TOKEN,
            f"token {row.get('fencing_token')!r}, the step's is {step.get('fencing_token')!r}",
        )
    if _differ(row.get("worker_id"), step.get("lease_owner")):
        return (
            ErrorCode.WRONG_WORKER,
            f"{row.get('worker_id')!r} {verb} a lease of {step.get('lease_owner')!r}",
        )
    return None


# (act, fencing_token, worker_id, key_id): a worker's attested act on one step.
Attested = tuple[str, Any, Any, Any]
STEP_ACTS: Final = ("claim", "release", "complete", "requeue")


def attestation(step: Row | None, row: Row, *, now_ms: int | None) -> Verdict:
    """An attestation of an act on a step, against the step as it stands (section 6b);
    ``now_ms``: its transaction time (its ``created_at``), for a requeue's expiry."""
    act, token = row.get("act"), row.get("fencing_token")
    if act not in STEP_ACTS:
        return None  # (a post names a message, not a step)
    if not _is_name(row.get("worker_id")):
        return ErrorCode.INVALID_WORKER, f"worker {row.get('worker_id')!r}"
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {row.get('step_id')!r}"
    if _differ(row.get("run_id"), step.get("run_id")):
        return ErrorCode.RUN_MISMATCH, "the step belongs to another run"
    status = step.get("status")
    if act == "claim":
        if status != "PENDING":
            return ErrorCode.INVALID_ATTESTATION, f"a claim attested for a {status} step"
        if _differ(token, _plus_one(step.get("fencing_token"))):
            return ErrorCode.STALE_FENCING_TOKEN, f"a claim attested with token {token!r}"
        return None
    if status != "LEASED":
        return ErrorCode.NOT_LEASED, f"a {act} attested for a {status} step"
    if _differ(token, step.get("fencing_token")):
        return ErrorCode.STALE_FENCING_TOKEN, f"a {act} attested with token {token!r}"
    if act != "requeue" and _differ(row.get("worker_id"), step.get("lease_owner")):
        return ErrorCode.WRONG_WORKER, f"a {act} attested by {row.get('worker_id')!r}"
    expiry = step.get("lease_expires_at")
    if act == "requeue" and now_ms is not None and _is_int(expiry) and expiry > now_ms:
        return (
            ErrorCode.LEASE_NOT_EXPIRED,
            f"a requeue attested at {now_ms}, before the lease's expiry {expiry}",
        )
    return None


def signed_end(step: Row, acts: list[Attested], ending: str, *, aborted: bool = False) -> Verdict:
    """A lease whose claim was attested by its owner ends only by that worker's attested
    act under the same key (a receipt: ``complete``; a release: ``release``) or an
    attested requeue (a requeue; an ABORTED receipt). ``ending``: "complete", "release"
    or "requeue"; ``acts``: what is attested for the step."""
    token, owner = step.get("fencing_token"), step.get("lease_owner")
    claimed = [k for act, t, w, k in acts if act == "claim" and t == token and w == owner]
    if not claimed:
        return None
    key = claimed[0]
    requeue = any(act == "requeue" and t == token for act, t, _, _ in acts)
    if ending == "requeue":
        lawful = requeue
    else:
        lawful = any(a == ending and t == token and w == owner and k == key for a, t, w, k in acts)
        lawful = lawful or (ending == "complete" and aborted and requeue)
    if lawful:
        return None
    return (
        ErrorCode.SIGNATURE_REQUIRED,
        f"a lease claimed signed by {owner!r} ends by an unattested {ending}",
    )
