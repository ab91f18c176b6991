"""Stateful test: MessageCassette driven by Hypothesis against a pure-Python model.

Every call's result (ids, tokens, expiry, returned dicts) or refusal code is
predicted by the model before the call is made; after every rule the whole
database is read back and compared with the model, and the ledger's own
invariants (receipts, lease fields, tokens, journal) are checked from the rows.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette

from .backends import Ledger

pytestmark = [pytest.mark.both_backends, pytest.mark.slow]

RUNS = ("run-a", "run-b")
WORKERS = ("w1", "w2", "w3")
SOURCES = ("USER", "PLANNER", "SYSTEM", "WORKER")
OUTCOMES = ("SUCCESS", "FAILURE", "ABORTED")
KEYS = ("k0", "k1", "k2", "k3")
START_MS = 1_700_000_000_000


def canonical(value: Any) -> str:
    """The model's own canonical JSON (sorted keys, no whitespace); payloads are ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------- strategies

_text = st.text(alphabet="abcxyz019", min_size=0, max_size=3)
_small = st.integers(min_value=-2, max_value=3)
_step_payload = st.fixed_dictionaries({"s": _small}, optional={"t": _text})
_job = st.fixed_dictionaries(
    {
        "intent": st.sampled_from(["fetch", "parse", "write"]),
        "steps": st.lists(_step_payload, min_size=1, max_size=3),
    }
)
_multi_job = st.fixed_dictionaries(
    {"jobs": st.lists(_job, min_size=1, max_size=3)}, optional={"note": _text}
)
_plain = st.fixed_dictionaries({"n": _small}, optional={"tag": _text, "xs": st.lists(_small)})
PAYLOADS = st.one_of(_plain, _plain, _multi_job)
TTL_MS = st.one_of(
    st.sampled_from([1, 2, 999, 1000, 1001, 5000, 60_000]),
    st.integers(min_value=1, max_value=10_000),
)
ADVANCE_MS = st.one_of(
    st.sampled_from([0, 1, 999, 1000, 1001, 5000, 60_000]),
    st.integers(min_value=0, max_value=20_000),
)
MAX_ATTEMPTS = st.sampled_from([None, 1, 2, 3])


# ---------------------------------------------------------------------------- model


class Refusal(Exception):
    """What the model expects the cassette to refuse with."""

    def __init__(self, code: ErrorCode, index: int | None = None) -> None:
        super().__init__(code.value)
        self.code = code
        self.index = index


@dataclass
class MMessage:
    message_id: int
    run_id: str
    source: str
    key: str | None
    payload: dict[str, Any]
    created_at: int
    inserted: int  # insertion sequence: the claim order of messages
    first_job: int


@dataclass
class MStep:
    step_id: int
    job_id: int
    run_id: str
    message_id: int
    job_ordinal: int
    ordinal: int
    payload: dict[str, Any]
    created_at: int
    status: str = "PENDING"
    owner: str | None = None
    expires: int | None = None
    token: int = 0


@dataclass
class MReceipt:
    receipt_id: int
    step_id: int
    job_id: int
    run_id: str
    worker_id: str
    token: int
    outcome: str
    payload: dict[str, Any]
    created_at: int


@dataclass
class Model:
    now: int = START_MS
    messages: dict[int, MMessage] = field(default_factory=dict)
    jobs: dict[int, tuple[int, str, str, int, int]] = field(default_factory=dict)
    steps: dict[int, MStep] = field(default_factory=dict)
    receipts: dict[int, MReceipt] = field(default_factory=dict)
    releases: dict[int, tuple[int, str, str, int, int]] = field(default_factory=dict)
    journal_rows: int = 0

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _next(table: dict[int, Any]) -> int:
        return max(table, default=0) + 1

    def receipt_of(self, step_id: int) -> MReceipt | None:
        return next((r for r in self.receipts.values() if r.step_id == step_id), None)

    def claim_order(self, run_id: str) -> list[MStep]:
        pending = [s for s in self.steps.values() if s.run_id == run_id and s.status == "PENDING"]
        return sorted(
            pending,
            key=lambda s: (self.messages[s.message_id].inserted, s.job_ordinal, s.ordinal),
        )

    def _add_receipt(
        self, step: MStep, worker: str, token: int, outcome: str, payload: dict[str, Any]
    ) -> int:
        receipt_id = self._next(self.receipts)
        self.receipts[receipt_id] = MReceipt(
            receipt_id,
            step.step_id,
            step.job_id,
            step.run_id,
            worker,
            token,
            outcome,
            payload,
            self.now,
        )
        step.status = "COMMITTED"
        self.journal_rows += 2  # the receipt, and the step's COMMITTED revision
        return receipt_id

    # ---------------------------------------------------------------- operations

    def post(self, items: list[tuple[dict[str, Any], str, str, str | None]]) -> list[Any]:
        results: list[tuple[int, int]] = []
        batch = len(items) > 1
        for index, (payload, run_id, source, key) in enumerate(items):
            if key is not None:
                found = next(
                    (m for m in self.messages.values() if m.run_id == run_id and m.key == key),
                    None,
                )
                if found is not None:
                    if found.source != source or canonical(found.payload) != canonical(payload):
                        raise Refusal(ErrorCode.IDEMPOTENCY_CONFLICT, index if batch else None)
                    results.append((found.message_id, found.first_job))
                    continue
            message_id = self._next(self.messages)
            if "jobs" in payload:
                plan = [(job["intent"], job["steps"]) for job in payload["jobs"]]
            else:
                plan = [("default", [payload])]
            first_job = self._next(self.jobs)
            self.messages[message_id] = MMessage(
                message_id,
                run_id,
                source,
                key,
                payload,
                self.now,
                len(self.messages),
                first_job,
            )
            self.journal_rows += 1
            for job_ordinal, (intent, step_payloads) in enumerate(plan):
                job_id = self._next(self.jobs)
                self.jobs[job_id] = (message_id, run_id, intent, job_ordinal, self.now)
                self.journal_rows += 1
                for ordinal, step_payload in enumerate(step_payloads):
                    step_id = self._next(self.steps)
                    self.steps[step_id] = MStep(
                        step_id,
                        job_id,
                        run_id,
                        message_id,
                        job_ordinal,
                        ordinal,
                        step_payload,
                        self.now,
                    )
                    self.journal_rows += 1
            results.append((message_id, first_job))
        return results

    def claim(self, run_id: str, worker: str, n: int, ttl_ms: int) -> list[Any]:
        claimed = []
        for step in self.claim_order(run_id)[:n]:
            step.status = "LEASED"
            step.owner = worker
            step.expires = self.now + ttl_ms
            step.token += 1
            self.journal_rows += 1
            claimed.append(
                {
                    "step_id": step.step_id,
                    "job_id": step.job_id,
                    "message_id": step.message_id,
                    "ordinal": step.ordinal,
                    "payload": step.payload,
                    "fencing_token": step.token,
                    "lease_expires_at": step.expires,
                    "run_id": run_id,
                    "worker_id": worker,
                }
            )
        return claimed

    def complete(self, items: list[tuple[str, int, str, int, dict[str, Any], str]]) -> list[Any]:
        receipt_ids = []
        batch = len(items) > 1
        for index, (run_id, step_id, worker, token, payload, outcome) in enumerate(items):
            at = index if batch else None
            step = self.steps.get(step_id)
            # LAW.md 3.4, in the order the rules are listed there.
            if step is None:
                raise Refusal(ErrorCode.STEP_NOT_FOUND, at)
            if self.receipt_of(step_id) is not None:
                raise Refusal(ErrorCode.DUPLICATE_RECEIPT, at)
            expired = outcome != "ABORTED" and step.expires is not None and step.expires <= self.now
            if run_id != step.run_id:
                raise Refusal(ErrorCode.RUN_MISMATCH, at)
            if step.status != "LEASED":
                raise Refusal(ErrorCode.NOT_LEASED, at)
            if token != step.token:
                raise Refusal(ErrorCode.STALE_FENCING_TOKEN, at)
            if worker != step.owner:
                raise Refusal(ErrorCode.WRONG_WORKER, at)
            if expired:
                raise Refusal(ErrorCode.LEASE_EXPIRED, at)
            receipt_ids.append(self._add_receipt(step, worker, token, outcome, payload))
        return receipt_ids

    def requeue(self, run_id: str, step_id: int | None, max_attempts: int | None) -> list[Any]:
        if step_id is not None:
            step = self.steps.get(step_id)
            if step is None:
                raise Refusal(ErrorCode.STEP_NOT_FOUND)
            if step.run_id != run_id:
                raise Refusal(ErrorCode.RUN_MISMATCH)
            if step.status != "LEASED":
                raise Refusal(ErrorCode.NOT_LEASED)
            assert step.expires is not None
            if step.expires > self.now:
                raise Refusal(ErrorCode.LEASE_NOT_EXPIRED)
        due = sorted(
            (
                s
                for s in self.steps.values()
                if s.run_id == run_id
                and s.status == "LEASED"
                and s.expires is not None
                and s.expires <= self.now
                and (step_id is None or s.step_id == step_id)
            ),
            key=lambda s: s.step_id,
        )
        done = []
        for step in due:
            if max_attempts is not None and step.token >= max_attempts:
                assert step.owner is not None
                payload = {"reason": "max_attempts", "attempts": step.token}
                self._add_receipt(step, step.owner, step.token, "ABORTED", payload)
                done.append(
                    {"step_id": step.step_id, "action": "aborted", "fencing_token": step.token}
                )
            else:
                step.status, step.owner, step.expires = "PENDING", None, None
                self.journal_rows += 1
                done.append(
                    {"step_id": step.step_id, "action": "requeued", "fencing_token": step.token}
                )
        return done

    def release(self, run_id: str, step_id: int, worker: str, token: int) -> list[Any]:
        # LAW.md 3.1: a second release of a step with the same token is APPEND_ONLY,
        # checked (like a second receipt) before the step's state.
        if any(row[:1] + row[3:4] == (step_id, token) for row in self.releases.values()):
            raise Refusal(ErrorCode.APPEND_ONLY)
        step = self.steps.get(step_id)
        if step is None:
            raise Refusal(ErrorCode.STEP_NOT_FOUND)
        if step.run_id != run_id:
            raise Refusal(ErrorCode.RUN_MISMATCH)
        if step.status != "LEASED":
            raise Refusal(ErrorCode.NOT_LEASED)
        if token != step.token:
            raise Refusal(ErrorCode.STALE_FENCING_TOKEN)
        if worker != step.owner:
            raise Refusal(ErrorCode.WRONG_WORKER)
        release_id = self._next(self.releases)
        self.releases[release_id] = (step_id, run_id, worker, token, self.now)
        step.status, step.owner, step.expires = "PENDING", None, None
        self.journal_rows += 2  # the release, and the step's PENDING revision
        return [{"step_id": step_id, "action": "released", "fencing_token": token}]

    # -------------------------------------------------------------------- views

    def status(self, run_id: str) -> dict[str, Any]:
        steps = dict.fromkeys(("PENDING", "LEASED", "COMMITTED"), 0)
        expired = 0
        for s in self.steps.values():
            if s.run_id == run_id:
                steps[s.status] += 1
                expired += s.status == "LEASED" and s.expires is not None and s.expires <= self.now
        receipts = dict.fromkeys(OUTCOMES, 0)
        for r in self.receipts.values():
            if r.run_id == run_id:
                receipts[r.outcome] += 1
        return {
            "run_id": run_id,
            "messages": sum(m.run_id == run_id for m in self.messages.values()),
            "steps": steps,
            "receipts": receipts,
            "expired_leases": expired,
        }

    def rows(self) -> dict[str, list[tuple[Any, ...]]]:
        return {
            "messages": [
                (m.message_id, m.run_id, m.source, m.key, canonical(m.payload), m.created_at)
                for m in self.messages.values()
            ],
            "jobs": [(job_id, *job) for job_id, job in self.jobs.items()],
            "steps": [
                (
                    s.step_id,
                    s.job_id,
                    s.run_id,
                    s.message_id,
                    s.job_ordinal,
                    s.ordinal,
                    s.status,
                    s.owner,
                    s.expires,
                    s.token,
                    canonical(s.payload),
                    s.created_at,
                )
                for s in self.steps.values()
            ],
            "receipts": [
                (
                    r.receipt_id,
                    r.step_id,
                    r.job_id,
                    r.run_id,
                    r.worker_id,
                    r.token,
                    r.outcome,
                    canonical(r.payload),
                    r.created_at,
                )
                for r in self.receipts.values()
            ],
            "releases": [(release_id, *row) for release_id, row in self.releases.items()],
        }


JOURNALED = tuple(
    f"cassette_{name}" for name in ("messages", "jobs", "steps", "receipts", "releases")
)

_DB_ROWS = {
    "messages": "SELECT message_id, run_id, source, idempotency_key, payload_json, created_at"
    " FROM cassette_messages ORDER BY message_id",
    "jobs": "SELECT job_id, message_id, run_id, intent, ordinal, created_at"
    " FROM cassette_jobs ORDER BY job_id",
    "steps": "SELECT step_id, job_id, run_id, message_id, job_ordinal, ordinal, status,"
    " lease_owner, lease_expires_at, fencing_token, payload_json, created_at"
    " FROM cassette_steps ORDER BY step_id",
    "receipts": "SELECT receipt_id, step_id, job_id, run_id, worker_id, fencing_token, outcome,"
    " receipt_json, created_at FROM cassette_receipts ORDER BY receipt_id",
    "releases": "SELECT release_id, step_id, run_id, worker_id, fencing_token, created_at"
    " FROM cassette_releases ORDER BY release_id",
}


def db_rows(cassette: MessageCassette) -> dict[str, list[tuple[Any, ...]]]:
    return {name: cassette.conn.execute(sql).fetchall() for name, sql in _DB_ROWS.items()}


# -------------------------------------------------------------------- state machine


class CassetteMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmpdir = Path(tempfile.mkdtemp(prefix="cassette-sm-"))
        self.path = self.tmpdir / "ledger.db"
        self.clock = ManualClock(START_MS)
        self.cassette = MessageCassette(self.path, clock=self.clock)
        self.model = Model()
        self.seen_tokens: dict[int, int] = {}

    # ---------------------------------------------------------------- plumbing

    def expect(self, action: Callable[[Model], Any], call: Callable[[], Any]) -> Any:
        """Run the model on a copy, then the cassette; the two must agree exactly.

        The model copy is kept only when the call succeeded: a refusal changes nothing.
        """
        trial = copy.deepcopy(self.model)
        try:
            expected = action(trial)
        except Refusal as refusal:
            try:
                got = call()
            except CassetteError as error:
                assert error.code is refusal.code, (error.code, refusal.code, error.message)
                assert error.detail.get("index") == refusal.index, error.detail
                return refusal
            raise AssertionError(
                f"expected {refusal.code.value}, the cassette returned {got!r}"
            ) from None
        try:
            got = call()
        except CassetteError as error:
            raise AssertionError(
                f"expected {expected!r}, the cassette refused with {error.code.value}:"
                f" {error.message}"
            ) from error
        assert got == expected
        self.model = trial
        return got

    def leased(self) -> list[int]:
        return sorted(s.step_id for s in self.model.steps.values() if s.status == "LEASED")

    def draw_step_id(self, data: st.DataObject) -> int:
        """Mostly a LEASED step (where the interesting rules are), else any or a missing one."""
        known = sorted(self.model.steps)
        missing = st.integers(len(known) + 1, len(known) + 3)
        choices = [st.sampled_from(known)] * 2 + [missing] if known else [missing]
        if self.leased():
            choices = [st.sampled_from(self.leased())] * 5 + choices
        return data.draw(st.one_of(choices), label="step_id")

    def draw_credentials(self, data: st.DataObject, step_id: int) -> tuple[str, str, int]:
        """(run, worker, token): the holder's, or deliberately off in one way, or random."""
        step = self.model.steps.get(step_id)
        variant = data.draw(
            st.sampled_from(["holder", "holder", "stale", "ahead", "other_worker", "other_run"]),
            label="variant",
        )
        if step is None:
            variant = "random"
        if variant == "random":
            return (
                data.draw(st.sampled_from(RUNS)),
                data.draw(st.sampled_from(WORKERS)),
                data.draw(st.integers(0, 4)),
            )
        assert step is not None
        run, token = step.run_id, step.token
        worker = step.owner or data.draw(st.sampled_from(WORKERS), label="worker")
        if variant == "stale":
            token = data.draw(st.integers(0, max(step.token - 1, 0)), label="stale_token")
        elif variant == "ahead":
            token = step.token + 1
        elif variant == "other_worker":
            worker = data.draw(st.sampled_from([w for w in WORKERS if w != worker]))
        elif variant == "other_run":
            run = next(r for r in RUNS if r != step.run_id)
        return run, worker, token

    # ------------------------------------------------------------------- posts

    @initialize(
        items=st.lists(
            st.tuples(
                PAYLOADS,
                st.sampled_from(RUNS),
                st.sampled_from(SOURCES),
                st.one_of(st.none(), st.sampled_from(KEYS)),
            ),
            min_size=2,
            max_size=5,
        ),
        workers=st.lists(st.sampled_from(WORKERS), max_size=3),
    )
    def seed_ledger(self, items: list[Any], workers: list[str]) -> None:
        """Start each example with some messages (one at a time) and a few leases."""
        for payload, run, source, key in items:
            self.post_message(payload, run, source, key)
        for worker in workers:
            self.claim_steps(RUNS[0], worker, 1, 2000)

    @rule(
        payload=PAYLOADS,
        run=st.sampled_from(RUNS),
        source=st.sampled_from(SOURCES),
        key=st.one_of(st.none(), st.sampled_from(KEYS)),
    )
    def post_message(self, payload: dict[str, Any], run: str, source: str, key: str | None) -> None:
        self.expect(
            lambda m: m.post([(payload, run, source, key)])[0],
            lambda: self.cassette.post_message(payload, run, source, key),
        )

    @precondition(lambda self: any(m.key for m in self.model.messages.values()))
    @rule(data=st.data())
    def repost_key(self, data: st.DataObject) -> None:
        """The same key again: same payload and source -> same ids, anything else -> conflict."""
        keyed = sorted(m.message_id for m in self.model.messages.values() if m.key)
        first = self.model.messages[data.draw(st.sampled_from(keyed), label="message")]
        payload, source = copy.deepcopy(first.payload), first.source
        change = data.draw(st.sampled_from(["same", "same", "payload", "source"]), label="change")
        if change == "payload":
            payload = {**payload, "changed": data.draw(_small)}
        elif change == "source":
            source = data.draw(st.sampled_from([s for s in SOURCES if s != first.source]))
        result = self.expect(
            lambda m: m.post([(payload, first.run_id, source, first.key)])[0],
            lambda: self.cassette.post_message(payload, first.run_id, source, first.key),
        )
        if change == "same":
            assert result == (first.message_id, first.first_job)
        else:
            assert isinstance(result, Refusal)
            assert result.code is ErrorCode.IDEMPOTENCY_CONFLICT

    @rule(
        items=st.lists(
            st.tuples(
                PAYLOADS,
                st.sampled_from(RUNS),
                st.sampled_from(SOURCES[:2]),
                st.one_of(st.none(), st.sampled_from(KEYS)),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def post_messages(self, items: list[tuple[dict[str, Any], str, str, str | None]]) -> None:
        self.expect(lambda m: m.post(items), lambda: self.cassette.post_messages(items))

    # ------------------------------------------------------------------ claims

    @rule(run=st.sampled_from(RUNS), worker=st.sampled_from(WORKERS), ttl_ms=TTL_MS)
    def claim_step(self, run: str, worker: str, ttl_ms: int) -> None:
        predicted = self.model.claim_order(run)

        def model_claim(m: Model) -> Any:
            claimed = m.claim(run, worker, 1, ttl_ms)
            if not claimed:
                raise Refusal(ErrorCode.NO_PENDING_STEPS)
            return claimed[0]

        got = self.expect(model_claim, lambda: self.cassette.claim_step(run, worker, ttl_ms / 1000))
        if predicted:
            # Deterministic claim order: oldest message, then job ordinal, then step ordinal.
            assert got["step_id"] == predicted[0].step_id

    @rule(
        run=st.sampled_from(RUNS),
        worker=st.sampled_from(WORKERS),
        n=st.integers(1, 4),
        ttl_ms=TTL_MS,
    )
    def claim_steps(self, run: str, worker: str, n: int, ttl_ms: int) -> None:
        self.expect(
            lambda m: m.claim(run, worker, n, ttl_ms),
            lambda: self.cassette.claim_steps(run, worker, n, ttl_ms / 1000),
        )

    # --------------------------------------------------------------- completes

    @precondition(lambda self: bool(self.model.steps))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), note=_small)
    def complete_step(self, data: st.DataObject, outcome: str, note: int) -> None:
        step_id = self.draw_step_id(data)
        run, worker, token = self.draw_credentials(data, step_id)
        receipt = {"note": note}
        self.expect(
            lambda m: m.complete([(run, step_id, worker, token, receipt, outcome)])[0],
            lambda: self.cassette.complete_step(run, step_id, worker, token, receipt, outcome),
        )

    @precondition(lambda self: bool(self.leased()))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def complete_as_holder(self, data: st.DataObject, outcome: str) -> None:
        """The true holder completes: committed, or LEASE_EXPIRED unless ABORTED after expiry."""
        step = self.model.steps[data.draw(st.sampled_from(self.leased()), label="step_id")]
        assert step.owner is not None and step.expires is not None
        expired = step.expires <= self.model.now
        item = (step.run_id, step.step_id, step.owner, step.token, {"holder": True}, outcome)
        result = self.expect(
            lambda m: m.complete([item])[0], lambda: self.cassette.complete_step(*item)
        )
        if expired and outcome != "ABORTED":
            assert isinstance(result, Refusal) and result.code is ErrorCode.LEASE_EXPIRED
        else:
            assert self.model.steps[step.step_id].status == "COMMITTED"

    @precondition(lambda self: bool(self.model.steps))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), note=_small, ttl_ms=TTL_MS)
    def complete_and_claim(self, data: st.DataObject, outcome: str, note: int, ttl_ms: int) -> None:
        """The fused worker call: the model completes, then claims (one step of the same
        run for the same worker); a refused completion changes nothing."""
        step_id = self.draw_step_id(data)
        run, worker, token = self.draw_credentials(data, step_id)
        item = (run, step_id, worker, token, {"fused": note}, outcome)
        self.expect(
            lambda m: self.model_fused(m, item, ttl_ms),
            lambda: self.cassette.complete_and_claim(*item, ttl_ms / 1000),
        )

    @precondition(lambda self: bool(self.leased()))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), ttl_ms=TTL_MS)
    def complete_and_claim_as_holder(self, data: st.DataObject, outcome: str, ttl_ms: int) -> None:
        step = self.model.steps[data.draw(st.sampled_from(self.leased()), label="step_id")]
        assert step.owner is not None
        item = (step.run_id, step.step_id, step.owner, step.token, {"holder": True}, outcome)
        predicted = self.model.claim_order(step.run_id)
        result = self.expect(
            lambda m: self.model_fused(m, item, ttl_ms),
            lambda: self.cassette.complete_and_claim(*item, ttl_ms / 1000),
        )
        if isinstance(result, dict) and predicted:
            assert result["next"]["step_id"] == predicted[0].step_id  # claim order

    @staticmethod
    def model_fused(
        m: Model, item: tuple[str, int, str, int, dict[str, Any], str], ttl_ms: int
    ) -> dict[str, Any]:
        receipt_id = m.complete([item])[0]
        claimed = m.claim(item[0], item[2], 1, ttl_ms)
        return {
            "receipt_id": receipt_id,
            "step_id": item[1],
            "next": claimed[0] if claimed else None,
        }

    @precondition(lambda self: bool(self.leased()))
    @rule(data=st.data())
    def release_as_holder(self, data: st.DataObject) -> None:
        """The holder gives its step back, expired or not; the step is claimable again."""
        step = self.model.steps[data.draw(st.sampled_from(self.leased()), label="step_id")]
        assert step.owner is not None
        self.expect(
            lambda m: m.release(step.run_id, step.step_id, step.owner or "", step.token),
            lambda: self.cassette.requeue(
                step.run_id, step.step_id, worker_id=step.owner, fencing_token=step.token
            ),
        )
        assert self.model.steps[step.step_id].status == "PENDING"

    @precondition(lambda self: bool(self.model.steps))
    @rule(data=st.data())
    def complete_steps(self, data: st.DataObject) -> None:
        """A batch is all or nothing; a refusal names the index of the refused item."""
        items = []
        for _ in range(data.draw(st.integers(1, 3), label="batch")):
            step_id = self.draw_step_id(data)
            run, worker, token = self.draw_credentials(data, step_id)
            outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
            items.append((run, step_id, worker, token, {"batch": True}, outcome))
        self.expect(lambda m: m.complete(items), lambda: self.cassette.complete_steps(items))

    # ---------------------------------------------------------------- requeues

    @rule(run=st.sampled_from(RUNS), max_attempts=MAX_ATTEMPTS)
    def requeue_expired(self, run: str, max_attempts: int | None) -> None:
        self.expect(
            lambda m: m.requeue(run, None, max_attempts),
            lambda: self.cassette.requeue(run, max_attempts=max_attempts),
        )

    @precondition(lambda self: bool(self.model.steps))
    @rule(data=st.data(), max_attempts=MAX_ATTEMPTS)
    def requeue_one(self, data: st.DataObject, max_attempts: int | None) -> None:
        step_id = self.draw_step_id(data)
        step = self.model.steps.get(step_id)
        run = step.run_id if step is not None else RUNS[0]
        if data.draw(st.integers(0, 5), label="other_run") == 0:
            run = next(r for r in RUNS if r != run)
        self.expect(
            lambda m: m.requeue(run, step_id, max_attempts),
            lambda: self.cassette.requeue(run, step_id, max_attempts=max_attempts),
        )

    @precondition(lambda self: bool(self.model.steps))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        step_id = self.draw_step_id(data)
        run, worker, token = self.draw_credentials(data, step_id)
        self.expect(
            lambda m: m.release(run, step_id, worker, token),
            lambda: self.cassette.requeue(run, step_id, worker_id=worker, fencing_token=token),
        )

    # ------------------------------------------------------------------- clock

    @rule(ms=ADVANCE_MS)
    def advance_clock(self, ms: int) -> None:
        self.model.now = self.clock.advance(ms)

    @precondition(lambda self: any(s.status == "LEASED" for s in self.model.steps.values()))
    @rule(data=st.data())
    def advance_to_an_expiry(self, data: st.DataObject) -> None:
        """Jump to exactly a lease's expiry (expired at expires_at) or 1 ms before it."""
        expiries = sorted(
            s.expires
            for s in self.model.steps.values()
            if s.status == "LEASED" and s.expires is not None and s.expires > self.model.now
        )
        if not expiries:
            return
        target = data.draw(st.sampled_from(expiries)) - data.draw(st.sampled_from([0, 1]))
        self.model.now = self.clock.advance(max(0, target - self.model.now))

    @rule()
    def reopen(self) -> None:
        """A new connection sees exactly what the old one committed."""
        self.cassette.close()
        self.cassette = MessageCassette(self.path, clock=self.clock)

    @precondition(lambda self: bool(self.leased()))
    @rule(extra=st.sampled_from([0, 1, 1000]))
    def expire_every_lease(self, extra: int) -> None:
        """Move past the last lease's expiry: every holder is now late."""
        last = max(self.model.steps[step_id].expires or 0 for step_id in self.leased())
        self.model.now = self.clock.advance(max(0, last - self.model.now) + extra)

    # ---------------------------------------------------------- bad arguments

    @rule(data=st.data())
    def refused_arguments(self, data: st.DataObject) -> None:
        """Malformed calls are refused with their code and change nothing."""
        c = self.cassette
        cases: list[tuple[ErrorCode, Callable[[], Any]]] = [
            (ErrorCode.INVALID_TTL, lambda: c.claim_step(RUNS[0], "w1", 0)),
            (ErrorCode.INVALID_TTL, lambda: c.claim_step(RUNS[0], "w1", -5)),
            (ErrorCode.INVALID_TTL, lambda: c.claim_step(RUNS[0], "w1", float("nan"))),
            (ErrorCode.INVALID_TTL, lambda: c.claim_step(RUNS[0], "w1", 31 * 24 * 3600)),
            (ErrorCode.INVALID_TTL, lambda: c.claim_step(RUNS[0], "w1", True)),
            (ErrorCode.INVALID_ARGUMENT, lambda: c.claim_steps(RUNS[0], "w1", 0)),
            (ErrorCode.INVALID_WORKER, lambda: c.claim_step(RUNS[0], "")),
            (ErrorCode.INVALID_RUN_ID, lambda: c.claim_step("", "w1")),
            (ErrorCode.INVALID_SOURCE, lambda: c.post_message({"n": 1}, RUNS[0], "BOT")),
            (ErrorCode.INVALID_IDEMPOTENCY_KEY, lambda: c.post_message({}, RUNS[0], "USER", "")),
            (ErrorCode.INVALID_PAYLOAD, lambda: c.post_message({"jobs": []}, RUNS[0], "USER")),
            (
                ErrorCode.INVALID_PAYLOAD,
                lambda: c.post_message({"jobs": [{"intent": "i", "steps": []}]}, RUNS[0], "USER"),
            ),
            (ErrorCode.INVALID_OUTCOME, lambda: c.complete_step(RUNS[0], 1, "w1", 1, {}, "DONE")),
            (
                ErrorCode.INVALID_TTL,
                lambda: c.complete_and_claim(RUNS[0], 1, "w1", 1, {}, "SUCCESS", 0),
            ),
            (
                ErrorCode.INVALID_OUTCOME,
                lambda: c.complete_and_claim(RUNS[0], 1, "w1", 1, {}, "DONE", 0),
            ),
            (
                ErrorCode.INVALID_TOKEN,
                lambda: c.complete_step(RUNS[0], 1, "w1", "1", {}, "SUCCESS"),
            ),
            (ErrorCode.INVALID_ARGUMENT, lambda: c.requeue(RUNS[0], 1, worker_id="w1")),
            (
                ErrorCode.INVALID_ARGUMENT,
                lambda: c.requeue(RUNS[0], worker_id="w1", fencing_token=1),
            ),
            (ErrorCode.INVALID_ARGUMENT, lambda: c.requeue(RUNS[0], max_attempts=0)),
        ]
        code, call = data.draw(st.sampled_from(cases), label="case")
        try:
            got = call()
        except CassetteError as error:
            assert error.code is code, (error.code, code)
        else:
            raise AssertionError(f"expected {code.value}, got {got!r}")

    # -------------------------------------------------------------- invariants

    @invariant()
    def no_open_transaction(self) -> None:
        assert not self.cassette.conn.in_transaction

    @invariant()
    def database_equals_model(self) -> None:
        assert db_rows(self.cassette) == self.model.rows()
        for run in RUNS:
            assert self.cassette.status(run) == self.model.status(run)
        journal = self.cassette.conn.execute(
            "SELECT count(*) FROM cassette_journal WHERE tbl IN (?, ?, ?, ?, ?)", JOURNALED
        ).fetchone()
        assert journal[0] == self.model.journal_rows  # refusals and re-posts write nothing

    @invariant()
    def ledger_rules_hold(self) -> None:
        """Checked from the rows alone, independently of the model."""
        conn = self.cassette.conn
        receipts: dict[int, list[tuple[str, int]]] = {}
        for step_id, worker, token in conn.execute(
            "SELECT step_id, worker_id, fencing_token FROM cassette_receipts"
        ):
            receipts.setdefault(step_id, []).append((worker, token))
        steps = conn.execute(
            "SELECT step_id, status, lease_owner, lease_expires_at, fencing_token"
            " FROM cassette_steps"
        ).fetchall()
        for step_id, status, owner, expires, token in steps:
            if status == "COMMITTED":
                assert receipts.get(step_id) == [(owner, token)], step_id
            else:
                assert step_id not in receipts, step_id
            if status == "PENDING":
                assert owner is None and expires is None, step_id
            if status == "LEASED":
                assert owner is not None and expires is not None, step_id
            assert token >= self.seen_tokens.get(step_id, 0), "a fencing token went down"
            self.seen_tokens[step_id] = token
        assert set(receipts) <= {row[0] for row in steps}

    @invariant()
    def journal_tokens_only_grow(self) -> None:
        last: dict[int, tuple[str, int]] = {}
        for key, status, token in self.cassette.conn.execute(
            "SELECT row_key, json_extract(body, '$.row.status'),"
            " json_extract(body, '$.row.fencing_token') FROM cassette_journal"
            " WHERE tbl = 'cassette_steps' ORDER BY seq"
        ):
            if key not in last:
                assert (status, token) == ("PENDING", 0)
            else:
                before, previous = last[key]
                if status == "LEASED":  # a claim: from PENDING, one more than before
                    assert (before, token) == ("PENDING", previous + 1)
                else:  # requeue, release, commit: from LEASED, the token is kept
                    assert (before, token) == ("LEASED", previous)
            last[key] = (status, token)

    @invariant()
    def verifies(self) -> None:
        report = self.cassette.verify_cassette()
        assert report.ok, report.errors

    def teardown(self) -> None:
        # Only cleanup: an assertion here would hide the failing rule's own error.
        self.cassette.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


CassetteMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCassetteStateMachine = pytest.mark.sqlite_only(
    reason="the model predicts every lease expiry to the millisecond on a clock that stands"
    " still; a PostgreSQL ledger's clock runs on (tests/test_postgres_differential.py holds"
    " PostgreSQL to SQLite under Hypothesis instead)"
)(CassetteMachine.TestCase)


def test_expired_receipt_for_another_run_is_run_mismatch(backend: Ledger) -> None:
    """LAW.md 3.4: the run is checked before expiry (the receipt clock guard compares run_id)."""
    clock = backend.clock
    with backend.open() as cassette:
        cassette.post_message({"n": 1}, "run-a", "USER")
        cassette.post_message({"n": 2}, "run-b", "USER")
        held = cassette.claim_step("run-a", "w1", 1)
        clock.advance(1000)
        try:
            cassette.complete_step(
                "run-b", held["step_id"], "w1", held["fencing_token"], {}, "SUCCESS"
            )
        except CassetteError as error:
            assert error.code is ErrorCode.RUN_MISMATCH, error.code
        else:
            raise AssertionError("a receipt naming another run was accepted")
