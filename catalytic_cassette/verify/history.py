"""History is lawful: every revision the journal records of a step, a receipt, a release
or an attestation judged against the state of its step just before it, by the rules the
write path enforces (``catalytic_cassette.law``, the one place those rules live as data).

The other checks prove that the journal is whole and that the tables equal its last image
of each row; this one proves that each image was a lawful step from the one before. So an
unlawful revision that reached the journal (a client's TEMP trigger dropping the row change
after the journal entry was written, a trigger planted and dropped again, a PostgreSQL
owner switching a rule trigger off inside one transaction) is reported even once an honest
write has overwritten the row.

What is judged, per entry, in seq order:
- a step's insert (PENDING, token 0, no lease) and every update (``law.step_update``: the
  allow-list, immutable columns, lease fields per edge);
- a step is COMMITTED only by the entry right after its receipt's (the receipt's AFTER
  trigger writes it), with the receipt's token and worker; a receipt is followed by it;
- a release returns its step to PENDING in the entry right after it; a requeue not so
  preceded records no time of its own (``copy`` dates it at the lease's expiry), so the
  first dated entry after it, if earlier than that expiry by more than the clock skew
  allowed, shows it came early (LEASE_NOT_EXPIRED); with none after it, the verifier's
  clock stands in;
- a receipt and a release close the lease they name (``law.receipt``, ``law.release``);
  a SUCCESS or FAILURE receipt is dated before its lease's expiry (exact: the write path
  compares with the receipt's own transaction time, its ``created_at``);
- attestations of acts on steps (``law.attestation``) and the signed-lease rule
  (``law.signed_end``);
- ids of steps, receipts, releases and attestations dense, in journal order.

Memory: the last revision of each live (not COMMITTED) step, its attestations, and the
findings (one per key at most). A COMMITTED step is final: an update of a step id already
inserted and no longer live is an update of a COMMITTED step.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from .. import law
from ..errors import ErrorCode
from .findings import Collector, Finding, FindingKind

STEPS = "cassette_steps"
RECEIPTS = "cassette_receipts"
RELEASES = "cassette_releases"
ATTESTATIONS = "cassette_attestations"
JUDGED = (STEPS, RECEIPTS, RELEASES, ATTESTATIONS)
_IDS = {
    STEPS: "step_id",
    RECEIPTS: "receipt_id",
    RELEASES: "release_id",
    ATTESTATIONS: "attestation_id",
}
# Body prefixes of the judged entries, as the journaling triggers write them.
PREFIXES = tuple(orjson.dumps({"table": t})[:-1] + b"," for t in JUDGED)
_COMMITTED: dict[str, Any] = {"status": law.FINAL}
MAX_KEYS = 10_000  # keys with a finding held at once; beyond, counted only

# What the judge reads about a step it has not seen (a seal judges only the entries since
# its last checkpoint): its latest row before, and the attestations of it.
Before = Callable[[int], tuple[dict[str, Any] | None, list[law.Attested]]]


class HistoryJudge:
    """Fed the judged entries in seq order (``entry``) and the dates of every other
    insert (``dated``); ``finish`` puts the findings, first seq per key, in ``out``."""

    def __init__(
        self,
        out: Collector,
        now_ms: int,
        skew_ms: int,
        *,
        before: Before | None = None,
        last_ids: dict[str, int] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.out = out
        self.run_id = run_id  # report only this run's rows (every entry is judged)
        self._run: Any = None  # the run of the entry being judged
        self.now_ms = now_ms
        self.skew_ms = skew_ms
        self._before = before
        self._steps: dict[int, dict[str, Any]] = {}  # live steps: their last revision
        self._acts: dict[Any, list[law.Attested]] = {}  # live steps' attestations
        self._receipted: set[Any] = set()  # live steps with a receipt (an unlawful one)
        self._released: dict[Any, set[Any]] = {}  # live steps: tokens released
        # Judging from a checkpoint (``before``): the first step inserted after it, and the
        # steps of before it met and COMMITTED since (at most the steps live at it).
        self._first_step: int | None = None
        self._closed: set[int] = set()
        self._last = dict.fromkeys(JUDGED, 0) if last_ids is None else dict(last_ids)
        # (kind, seq, table, key, step_id, token, worker, run): the entry after ``seq`` must
        # be this step's COMMITTED ("commit") or PENDING ("release") revision
        self._awaiting: tuple[str, int, str, Any, Any, Any, Any, Any] | None = None
        self.requeues: list[tuple[int, Any, int, Any]] = []  # (seq, step, expiry, run)
        self._found: dict[tuple[str, Any], Finding] = {}
        self._dropped = 0

    # -- feeding

    def body(self, seq: int, body: bytes | str) -> None:
        """A judged entry's body (an unreadable one is the other checks' to name)."""
        try:
            entry = orjson.loads(body)
            table, op, key, row = entry["table"], entry["op"], entry["key"], entry["row"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if isinstance(row, dict) and isinstance(table, str):
            self.entry(seq, table, op, key, row)

    def dated(self, seq: int, t: object) -> None:
        """The date of an insert the judge is not otherwise fed: settles the requeues
        before it."""
        if self.requeues and type(t) is int:
            current = self._run
            for rseq, step_id, expiry, run in self.requeues:
                self._run = run
                if t < expiry - self.skew_ms:
                    self._report(
                        rseq,
                        STEPS,
                        step_id,
                        ErrorCode.LEASE_NOT_EXPIRED,
                        f"requeued before the lease's expiry {expiry}: entry {seq} is dated {t}",
                    )
            self.requeues.clear()
            self._run = current

    def entry(self, seq: int, table: str, op: object, key: Any, row: dict[str, Any]) -> None:
        awaited = self._settle(seq, table, op, key, row)
        self._run = row.get("run_id")
        if op == "INSERT":
            if self.requeues:
                self.dated(seq, row.get("created_at"))
            if table in _IDS:
                self._dense(seq, table, key)
        if table == STEPS:
            if op == "INSERT":
                self._step_insert(seq, key, row)
            elif op == "UPDATE":
                self._step_update(seq, key, row, awaited)
        elif op != "INSERT":
            self._report(seq, table, key, ErrorCode.APPEND_ONLY, f"an {op} of {table}")
        elif table == RECEIPTS:
            self._receipt(seq, key, row)
        elif table == RELEASES:
            self._release(seq, key, row)
        elif table == ATTESTATIONS:
            self._attestation(seq, key, row)

    def finish(self) -> None:
        if self._awaiting is not None:
            self._unfollowed(*self._awaiting)
            self._awaiting = None
        for rseq, step_id, expiry, run in self.requeues:
            self._run = run
            if expiry > self.now_ms + self.skew_ms:
                self._report(
                    rseq,
                    STEPS,
                    step_id,
                    ErrorCode.LEASE_NOT_EXPIRED,
                    f"requeued before the lease's expiry {expiry}, which is after the"
                    f" verifier's clock {self.now_ms}, and no entry is dated after it",
                )
        self.requeues.clear()
        for finding in sorted(self._found.values(), key=lambda f: f.seq or 0):
            self.out.add(finding)
        if self._dropped:
            kind = FindingKind.UNLAWFUL_HISTORY.value
            self.out.per_kind[kind] += self._dropped
            self.out.report.suppressed[kind] = self.out.report.suppressed.get(kind, 0) + (
                self._dropped
            )
        self._found.clear()

    @property
    def lawful(self) -> bool:
        return not self._found and not self._dropped

    # -- the rules

    def _settle(
        self, seq: int, table: str, op: object, key: Any, row: dict[str, Any]
    ) -> tuple[str, Any, Any] | None:
        """The awaited revision, if this entry is it: (kind, token, worker) of the receipt
        or release right before."""
        awaiting = self._awaiting
        if awaiting is None:
            return None
        self._awaiting = None
        kind, at, _, _, step_id, token, worker, _ = awaiting
        wanted = "COMMITTED" if kind == "commit" else "PENDING"
        if (
            seq == at + 1
            and table == STEPS
            and op == "UPDATE"
            and key == step_id
            and row.get("status") == wanted
        ):
            return kind, token, worker
        self._unfollowed(*awaiting)
        return None

    def _unfollowed(
        self, kind: str, seq: int, table: str, key: Any, step_id: Any, _t: Any, _w: Any, run: Any
    ) -> None:
        self._run = run
        if kind == "commit":
            code, what = ErrorCode.RECEIPT_REQUIRED, "COMMITTED"
        else:
            code, what = ErrorCode.NOT_LEASED, "PENDING"
        self._report(
            seq,
            table,
            key,
            code,
            f"the next entry is not step {step_id!r} going {what}, as the row's trigger writes it",
        )

    def _dense(self, seq: int, table: str, key: Any) -> None:
        last = self._last.get(table)
        if last is None:  # (judging from a checkpoint: the first id is taken as given)
            self._last[table] = key if type(key) is int else 0
            return
        if type(key) is int:
            self._last[table] = max(last, key)
        if key != last + 1:
            self._report(
                seq,
                table,
                key,
                ErrorCode.OUT_OF_ORDER,
                f"{_IDS[table]} {key!r} after {last}: ids are dense",
            )

    def _step_insert(self, seq: int, key: Any, row: dict[str, Any]) -> None:
        verdict = law.step_insert(row)
        if verdict is not None:
            self._report(seq, STEPS, key, *verdict)
        if type(key) is int and self._first_step is None:
            self._first_step = key
        if type(key) is int and row.get("status") != law.FINAL:
            self._steps[key] = row

    def _step(self, step_id: Any) -> dict[str, Any] | None:
        """The step as it stands: its last revision, COMMITTED (final, no longer held), or
        None (never inserted)."""
        if type(step_id) is not int:
            return None
        step = self._steps.get(step_id)
        if step is not None:
            return step
        if step_id in self._closed:
            return _COMMITTED
        first = self._first_step
        if self._before is None or (first is not None and step_id >= first):
            return _COMMITTED if 0 < step_id <= self._last.get(STEPS, 0) else None
        row, acts = self._before(step_id)  # (a step of before the window, met first)
        if row is None:
            return None
        if row.get("status") == law.FINAL:
            self._closed.add(step_id)
            return _COMMITTED
        self._steps[step_id] = row
        self._acts[step_id] = acts
        return row

    def _step_update(
        self, seq: int, key: Any, row: dict[str, Any], awaited: tuple[str, Any, Any] | None
    ) -> None:
        old = self._step(key)
        if old is None:
            return  # an update before the insert: the state check's replay_order
        if old is _COMMITTED:
            self._report(
                seq, STEPS, key, ErrorCode.ILLEGAL_TRANSITION, f"COMMITTED -> {row.get('status')}"
            )
            self._apply(key, row)  # (judged on from what the journal says)
            return
        token, owner = old.get("fencing_token"), old.get("lease_owner")
        receipt = awaited is not None and awaited[0] == "commit" and awaited[1:] == (token, owner)
        released = awaited is not None and awaited[0] == "release" and awaited[1] == token
        verdict = law.step_update(old, row, receipt=receipt, released=released)
        edge = law.EDGES.get((old.get("status"), row.get("status")))
        if verdict is None and edge == law.REQUEUE and not released:
            verdict = law.signed_end(old, self._acts.get(key, []), "requeue")
            expiry = old.get("lease_expires_at")
            if type(expiry) is int:
                self.requeues.append((seq, key, expiry, self._run))
        if verdict is not None:
            self._report(seq, STEPS, key, *verdict)
        self._apply(key, row)

    def _apply(self, key: int, row: dict[str, Any]) -> None:
        if row.get("status") == law.FINAL:
            self._steps.pop(key, None)
            self._acts.pop(key, None)
            self._receipted.discard(key)
            self._released.pop(key, None)
            first = self._first_step
            if self._before is not None and (first is None or key < first):
                self._closed.add(key)  # (not to be read from before the window again)
        else:
            self._steps[key] = row

    def _receipt(self, seq: int, key: Any, row: dict[str, Any]) -> None:
        step_id = row.get("step_id")
        step = self._step(step_id)
        live = step is not None and step is not _COMMITTED
        at = row.get("created_at")
        verdict = law.receipt(
            step,
            row,
            has_receipt=step is _COMMITTED or step_id in self._receipted,
            now_ms=at if type(at) is int else None,
        )
        if verdict is None and step is not None:
            verdict = law.signed_end(
                step,
                self._acts.get(step_id, []),
                "complete",
                aborted=row.get("outcome") == "ABORTED",
            )
        if verdict is not None:
            self._report(seq, RECEIPTS, key, *verdict)
        if live:
            self._receipted.add(step_id)
            token, worker = row.get("fencing_token"), row.get("worker_id")
            self._awaiting = ("commit", seq, RECEIPTS, key, step_id, token, worker, self._run)

    def _release(self, seq: int, key: Any, row: dict[str, Any]) -> None:
        step_id = row.get("step_id")
        step = self._step(step_id)
        live = step is not None and step is not _COMMITTED
        token = row.get("fencing_token")
        tokens = self._released.get(step_id, set()) if live else set()
        verdict = law.release(step, row, released_before=token in tokens)
        if verdict is None and step is not None:
            verdict = law.signed_end(step, self._acts.get(step_id, []), "release")
        if verdict is not None:
            self._report(seq, RELEASES, key, *verdict)
        if live:
            self._released.setdefault(step_id, set()).add(token)
            self._awaiting = ("release", seq, RELEASES, key, step_id, token, None, self._run)

    def _attestation(self, seq: int, key: Any, row: dict[str, Any]) -> None:
        act = row.get("act")
        if act not in law.STEP_ACTS:
            return
        step_id = row.get("step_id")
        step = self._step(step_id)
        at = row.get("created_at")
        verdict = law.attestation(step, row, now_ms=at if type(at) is int else None)
        if verdict is not None:
            self._report(seq, ATTESTATIONS, key, *verdict)
        if step is not None and step is not _COMMITTED:
            self._acts.setdefault(step_id, []).append(
                (act, row.get("fencing_token"), row.get("worker_id"), row.get("key_id"))
            )

    def _report(self, seq: int, table: str, key: Any, code: ErrorCode, text: str) -> None:
        if self.run_id is not None and self._run != self.run_id:
            return
        held = self._found.get((table, _hashable(key)))
        if held is not None and held.seq is not None and held.seq <= seq:
            return
        if held is None and len(self._found) >= MAX_KEYS:
            self._dropped += 1
            return
        self._found[(table, _hashable(key))] = Finding(
            FindingKind.UNLAWFUL_HISTORY, f"{code.value}: {text}", seq, table, key
        )


def _hashable(key: Any) -> Any:
    return key if isinstance(key, (int, str, type(None))) else repr(key)


def is_judged(body: bytes) -> bool:
    return body.startswith(PREFIXES)


# Every entry, with the date of an insert of a table the judge is not fed (its time is
# read only while a requeue waits for one: see ``dated``).
_JOURNAL = (
    "SELECT seq, CAST(body AS BLOB) FROM main.cassette_journal NOT INDEXED{where} ORDER BY seq"
)


def check_history(
    conn: sqlite3.Connection,
    out: Collector,
    now_ms: int,
    skew_ms: int,
    *,
    start: int = 0,
    stop: int | None = None,
    before: Before | None = None,
    last_ids: dict[str, int] | None = None,
    run_id: str | None = None,
) -> bool:
    """Judge the journal's entries from ``start`` on (every entry: one scan of the journal
    by rowid); True when lawful. With ``run_id``, only that run's rows are reported."""
    judge = HistoryJudge(out, now_ms, skew_ms, before=before, last_ids=last_ids, run_id=run_id)
    bounds = ([f"seq >= {int(start)}"] if start else []) + (
        [f"seq < {int(stop)}"] if stop is not None else []
    )
    where = " WHERE " + " AND ".join(bounds) if bounds else ""
    cursor = conn.execute(_JOURNAL.format(where=where))
    for rows in iter(lambda: cursor.fetchmany(1024), []):
        feed(judge, rows)
    judge.finish()
    return judge.lawful


def feed(judge: HistoryJudge, rows: Iterable[tuple[Any, Any]]) -> None:
    """(seq, body) pairs in seq order, every entry of the journal."""
    for seq, body in rows:
        if not isinstance(body, bytes):
            body = str(body).encode("utf-8")
        if body.startswith(PREFIXES):
            judge.body(seq, body)
        elif judge.requeues and body.startswith(b'{"table":'):
            try:
                row = orjson.loads(body).get("row", {})
                date = row.get("created_at", row.get("timestamp"))
            except (orjson.JSONDecodeError, AttributeError):
                continue
            judge.dated(seq, date)


def check_since(
    conn: sqlite3.Connection, out: Collector, start: int, stop: int, now_ms: int, skew_ms: int
) -> bool:
    """Judge the entries ``start <= seq < stop`` of a SQLite ledger, each step first met
    there taken as its latest revision before ``start`` and the attestations of it
    journaled before (read through the journal's by-row index: for the package's own
    write, a seal, inside its transaction); True when lawful."""

    def before(step_id: int) -> tuple[dict[str, Any] | None, list[law.Attested]]:
        found = conn.execute(
            "SELECT CAST(body AS BLOB) FROM cassette_journal WHERE tbl = 'cassette_steps'"
            " AND row_key = ? AND seq < ? ORDER BY seq DESC LIMIT 1",
            (step_id, start),
        ).fetchone()
        row = None
        if found is not None:
            with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                row = orjson.loads(found[0])["row"]
        acts = [
            (str(act), token, worker, key)
            for act, token, worker, key in conn.execute(
                "SELECT a.act, a.fencing_token, a.worker_id, a.key_id"
                " FROM cassette_attestations AS a WHERE a.step_id = ? AND EXISTS (SELECT 1"
                " FROM cassette_journal AS j WHERE j.tbl = 'cassette_attestations'"
                " AND j.row_key = a.attestation_id AND j.seq < ?) ORDER BY a.attestation_id",
                (step_id, start),
            )
        ]
        return (row if isinstance(row, dict) else None), acts

    return check_history(
        conn, out, now_ms, skew_ms, start=start, stop=stop, before=before, last_ids={}
    )
