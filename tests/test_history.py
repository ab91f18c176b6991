"""Verify's history judge (verify/history.py): each rule of the write path, lawful and
unlawful, as journal entries fed in seq order; the finding names the first unlawful seq of
each key and the rule's code."""

from __future__ import annotations

from typing import Any

import pytest

from catalytic_cassette.verify.findings import Collector, FindingKind
from catalytic_cassette.verify.history import HistoryJudge

T0 = 1_700_000_000_000
EXPIRY = T0 + 60_000
SKEW = 300_000


def step(status: str = "PENDING", token: int = 0, owner: str | None = None, **more: Any) -> Any:
    row = {
        "step_id": 1,
        "job_id": 1,
        "run_id": "r",
        "message_id": 1,
        "job_ordinal": 0,
        "ordinal": 0,
        "status": status,
        "lease_owner": owner,
        "lease_expires_at": EXPIRY if owner is not None else None,
        "fencing_token": token,
        "payload_json": "{}",
        "created_at": T0,
    }
    row.update(more)
    return ("cassette_steps", "UPDATE", row["step_id"], row)


def inserted(**more: Any) -> Any:
    table, _, key, row = step(**more)
    return (table, "INSERT", key, row)


def claim(token: int = 1, owner: str = "w", **more: Any) -> Any:
    return step("LEASED", token, owner, **more)


def requeue(token: int = 1) -> Any:
    return step("PENDING", token)


def commit(token: int = 1, owner: str = "w", **more: Any) -> Any:
    return step("COMMITTED", token, owner, **more)


def receipt(
    receipt_id: int = 1, token: int = 1, worker: str = "w", outcome: str = "SUCCESS", **more: Any
) -> Any:
    row = {
        "receipt_id": receipt_id,
        "step_id": 1,
        "job_id": 1,
        "run_id": "r",
        "worker_id": worker,
        "fencing_token": token,
        "outcome": outcome,
        "receipt_json": "{}",
        "created_at": T0 + 1_000,
    }
    row.update(more)
    return ("cassette_receipts", "INSERT", receipt_id, row)


def release(release_id: int = 1, token: int = 1, worker: str = "w", **more: Any) -> Any:
    row = {
        "release_id": release_id,
        "step_id": 1,
        "run_id": "r",
        "worker_id": worker,
        "fencing_token": token,
        "created_at": T0 + 1_000,
    }
    row.update(more)
    return ("cassette_releases", "INSERT", release_id, row)


def attest(n: int, act: str, token: int, worker: str = "w", key: str = "k1", **more: Any) -> Any:
    row = {
        "attestation_id": n,
        "act": act,
        "run_id": "r",
        "message_id": None,
        "step_id": 1,
        "fencing_token": token,
        "worker_id": worker,
        "key_id": key,
        "signature": "s",
        "created_at": T0 + 500,
    }
    row.update(more)
    return ("cassette_attestations", "INSERT", n, row)


def dated(t: int) -> Any:
    """An entry of a table the judge takes only the date of (a message)."""
    return ("date", t)


def judge(entries: list[Any], now_ms: int = T0 + 10 * 60_000) -> list[tuple[int, Any, str]]:
    out = Collector()
    history = HistoryJudge(out, now_ms, SKEW)
    for seq, entry in enumerate(entries):
        if entry[0] == "date":
            history.dated(seq, entry[1])
        else:
            history.entry(seq, *entry)
    history.finish()
    assert all(f.kind is FindingKind.UNLAWFUL_HISTORY for f in out.report.findings)
    return [(f.seq, f.table, f.detail.split(":")[0]) for f in out.report.findings]  # type: ignore[misc]


S, R, L, A = "cassette_steps", "cassette_receipts", "cassette_releases", "cassette_attestations"

LAWFUL: dict[str, list[Any]] = {
    "claim, receipt, commit": [inserted(), claim(), receipt(), commit()],
    "a release requeues, the next claim takes token + 1": [
        inserted(),
        claim(),
        release(),
        requeue(),
        claim(2, "x"),
        receipt(token=2, worker="x"),
        commit(2, "x"),
    ],
    "a requeue after expiry, dated after it": [
        inserted(),
        claim(),
        requeue(),
        dated(EXPIRY + 5),
        claim(2),
    ],
    "a requeue dated a little early, within the clock skew": [
        inserted(),
        claim(),
        requeue(),
        dated(EXPIRY - SKEW + 1),
    ],
    "an ABORTED receipt after expiry": [
        inserted(),
        claim(),
        receipt(outcome="ABORTED", created_at=EXPIRY + 1),
        commit(),
    ],
    "a SUCCESS receipt one ms before expiry": [
        inserted(),
        claim(),
        receipt(created_at=EXPIRY - 1),
        commit(),
    ],
    "signed: claim, complete under the same key": [
        inserted(),
        attest(1, "claim", 1),
        claim(),
        attest(2, "complete", 1),
        receipt(),
        commit(),
    ],
    "signed: release attested": [
        inserted(),
        attest(1, "claim", 1),
        claim(),
        attest(2, "release", 1),
        release(),
        requeue(),
    ],
    "signed: requeue attested after expiry, then ABORTED": [
        inserted(),
        attest(1, "claim", 1),
        claim(),
        attest(2, "requeue", 1, worker="z", created_at=EXPIRY),
        receipt(outcome="ABORTED", created_at=EXPIRY),
        commit(),
    ],
}


@pytest.mark.parametrize("entries", list(LAWFUL.values()), ids=list(LAWFUL))
def test_a_lawful_history_has_no_finding(entries: list[Any]) -> None:
    assert judge(entries) == []


UNLAWFUL: dict[str, tuple[list[Any], list[tuple[int, str, str]]]] = {
    "inserted LEASED": ([inserted(status="LEASED")], [(0, S, "ILLEGAL_TRANSITION")]),
    "inserted with a token": ([inserted(fencing_token=3)], [(0, S, "LEASE_FIELDS_LOCKED")]),
    "an unknown status": ([inserted(), step("DONE")], [(1, S, "INVALID_STATUS")]),
    "PENDING to COMMITTED": ([inserted(), commit(0, "w")], [(1, S, "ILLEGAL_TRANSITION")]),
    "COMMITTED to PENDING, then on": (
        [inserted(), claim(), receipt(), commit(), requeue(), claim(2)],
        [(4, S, "ILLEGAL_TRANSITION")],
    ),
    "a status written to itself": ([inserted(), step()], [(1, S, "ILLEGAL_TRANSITION")]),
    "a payload rewritten": (
        [inserted(), claim(payload_json='{"x":1}')],
        [(1, S, "IMMUTABLE_FIELD")],
    ),
    "a claim that keeps the token": ([inserted(), claim(0)], [(1, S, "LEASE_FIELDS_LOCKED")]),
    "a claim that skips a token": ([inserted(), claim(2)], [(1, S, "LEASE_FIELDS_LOCKED")]),
    "a claim without an owner": (
        [inserted(), step("LEASED", 1, None)],
        [(1, S, "LEASE_FIELDS_LOCKED")],
    ),
    "an owner of 201 characters": (
        [inserted(), claim(owner="w" * 201)],
        [(1, S, "LEASE_FIELDS_LOCKED")],
    ),
    "the lease passed to another worker": (
        [inserted(), claim(), claim(1, "x")],
        [(2, S, "LEASE_FIELDS_LOCKED")],
    ),
    "a requeue that keeps the owner": (
        [inserted(), claim(), step("PENDING", 1, "w")],
        [(2, S, "LEASE_FIELDS_LOCKED")],
    ),
    "a commit that changes the token": (
        [inserted(), claim(), receipt(), commit(2)],
        [(3, S, "LEASE_FIELDS_LOCKED")],
    ),
    "COMMITTED without a receipt": ([inserted(), claim(), commit()], [(2, S, "RECEIPT_REQUIRED")]),
    "a receipt not followed by its commit": (
        [inserted(), claim(), receipt(), dated(T0 + 2_000)],
        [(2, R, "RECEIPT_REQUIRED")],
    ),
    "a receipt of a PENDING step": (
        [inserted(), receipt(token=0)],
        [(1, R, "NOT_LEASED")],
    ),
    "a receipt with a stale token": (
        [inserted(), claim(), receipt(token=0), commit()],
        [(2, R, "STALE_FENCING_TOKEN"), (3, S, "RECEIPT_REQUIRED")],
    ),
    "a receipt by another worker": (
        [inserted(), claim(), receipt(worker="x"), commit()],
        [(2, R, "WRONG_WORKER"), (3, S, "RECEIPT_REQUIRED")],
    ),
    "a receipt of another run": (
        [inserted(), claim(), receipt(run_id="s"), commit()],
        [(2, R, "RUN_MISMATCH")],
    ),
    "a SUCCESS receipt at expiry": (
        [inserted(), claim(), receipt(created_at=EXPIRY), commit()],
        [(2, R, "LEASE_EXPIRED")],
    ),
    "a second receipt": (
        [inserted(), claim(), receipt(), commit(), receipt(2)],
        [(4, R, "DUPLICATE_RECEIPT")],
    ),
    "a receipt of no step": ([receipt(step_id=9)], [(0, R, "STEP_NOT_FOUND")]),
    "a release by another worker": (
        [inserted(), claim(), release(worker="x"), requeue()],
        [(2, L, "WRONG_WORKER")],
    ),
    "a release not followed by the requeue": (
        [inserted(), claim(), release(), dated(T0 + 2_000)],
        [(2, L, "NOT_LEASED")],
    ),
    "a requeue before expiry, shown by the next date": (
        [inserted(), claim(), requeue(), dated(EXPIRY - SKEW - 1)],
        [(2, S, "LEASE_NOT_EXPIRED")],
    ),
    "signed: a receipt without the complete attestation": (
        [inserted(), attest(1, "claim", 1), claim(), receipt(), commit()],
        [(3, R, "SIGNATURE_REQUIRED")],
    ),
    "signed: a complete attested under another key": (
        [inserted(), attest(1, "claim", 1), claim(), attest(2, "complete", 1, key="k2"), receipt()],
        [(4, R, "SIGNATURE_REQUIRED")],
    ),
    "signed: an unattested requeue": (
        [inserted(), attest(1, "claim", 1), claim(), requeue(), dated(EXPIRY)],
        [(3, S, "SIGNATURE_REQUIRED")],
    ),
    "a requeue attested before expiry": (
        [inserted(), claim(), attest(1, "requeue", 1, created_at=EXPIRY - 1)],
        [(2, A, "LEASE_NOT_EXPIRED")],
    ),
    "a claim attested with a stale token": (
        [inserted(), attest(1, "claim", 0)],
        [(1, A, "STALE_FENCING_TOKEN")],
    ),
    "step ids not dense": (
        [inserted(), inserted(step_id=3)],
        [(1, S, "OUT_OF_ORDER")],
    ),
    "an update of a receipt": (
        [inserted(), claim(), receipt(), commit(), ("cassette_receipts", "UPDATE", 1, {})],
        [(4, R, "APPEND_ONLY")],
    ),
}


@pytest.mark.parametrize(("entries", "expected"), list(UNLAWFUL.values()), ids=list(UNLAWFUL))
def test_an_unlawful_revision_is_named_by_its_first_seq_and_code(
    entries: list[Any], expected: list[tuple[int, str, str]]
) -> None:
    assert judge(entries) == expected


def test_a_requeue_with_nothing_dated_after_is_judged_by_the_verifiers_clock() -> None:
    entries = [inserted(), claim(lease_expires_at=T0 + 3_600_000), requeue()]
    assert judge(entries, now_ms=T0) == [(2, S, "LEASE_NOT_EXPIRED")]
    assert judge(entries, now_ms=T0 + 3_600_000) == []


def test_only_the_first_unlawful_revision_of_a_key_is_reported_and_others_still_are() -> None:
    entries = [
        inserted(),
        inserted(step_id=2),
        commit(0, "w"),  # step 1: PENDING -> COMMITTED
        step("PENDING", 0),  # step 1 again: COMMITTED -> PENDING (not reported: same key)
        claim(step_id=2, fencing_token=5),  # step 2's own lie
    ]
    assert judge(entries) == [(2, S, "ILLEGAL_TRANSITION"), (4, S, "LEASE_FIELDS_LOCKED")]


def test_a_late_finding_of_an_earlier_seq_replaces_a_later_one_of_the_same_key() -> None:
    entries = [
        inserted(),
        claim(lease_expires_at=T0 + 3_600_000),
        requeue(),  # early: shown only by the date at seq 4
        step("LEASED", 1, "w"),  # token kept on a claim: unlawful at seq 3
        dated(T0 + 1_000),
    ]
    assert judge(entries) == [(2, S, "LEASE_NOT_EXPIRED")]
