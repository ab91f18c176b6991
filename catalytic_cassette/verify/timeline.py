"""Time along the journal: dates never run backwards, none lies in the verifier's future,
large forward jumps are pointed out, and every lease fits the 30-day cap.

The writer's clock is trusted input (LAW.md, "Time"). The SQL refuses a date earlier
than the ledger's latest time; what a forged clock can still do is date forward, which
this check reports. A claim records no time of its own, so its lease is judged against
the dated entries around it: the claim happened no earlier than the last date before it
and no later than the first date after it (or the verifier's now).
"""

from __future__ import annotations

import sqlite3

from .findings import Collector, Finding, FindingKind, Severity
from .options import LEASE_CAP_MS

# Every dated entry (an INSERT: its created_at or timestamp) and every claim (an UPDATE to
# LEASED: its lease expiry), in seq order. Read once, judged while streaming.
_ENTRIES = """
SELECT seq, tbl, k, t, lease FROM (
    SELECT seq, json_extract(body, '$.table') AS tbl, json_extract(body, '$.key') AS k,
           CASE WHEN json_extract(body, '$.op') IS 'INSERT'
                THEN coalesce(json_extract(body, '$.row.created_at'),
                              json_extract(body, '$.row.timestamp')) END AS t,
           CASE WHEN json_extract(body, '$.op') IS 'UPDATE'
                 AND json_extract(body, '$.row.status') IS 'LEASED'
                THEN json_extract(body, '$.row.lease_expires_at') END AS lease
    FROM main.cassette_journal NOT INDEXED WHERE json_valid(body) ORDER BY seq)
WHERE t IS NOT NULL OR lease IS NOT NULL
"""


def check_time(
    conn: sqlite3.Connection, out: Collector, now_ms: int, skew_ms: int, jump_ms: int
) -> None:
    judge = TimeJudge(out, now_ms, skew_ms, jump_ms)
    for seq, table, key, t, lease in conn.execute(_ENTRIES):
        if lease is not None:
            judge.claimed(seq, table, key, lease)
        if t is not None:
            judge.dated(seq, table, key, t)
    judge.finish()


class TimeJudge:
    """Judges the dated entries and claims of a journal fed in seq order, as they come."""

    def __init__(self, out: Collector, now_ms: int, skew_ms: int, jump_ms: int) -> None:
        self.out = out
        self.now_ms = now_ms
        self.skew_ms = skew_ms
        self.jump_ms = jump_ms
        self.latest: int | None = None  # the ledger's time so far: the latest date seen
        self.waiting: list[tuple[int, str, object, object, int | None]] = []  # claims since

    def claimed(self, seq: int, table: str, key: object, lease: object) -> None:
        self.waiting.append((seq, table, key, lease, self.latest))

    def dated(self, seq: int, table: str, key: object, t: object) -> None:
        latest = self.latest
        if self.waiting:
            after = t if isinstance(t, int) else None  # the first date after a claim bounds it
            for claim in self.waiting:
                _judge_lease(self.out, *claim, after, self.now_ms)
            self.waiting.clear()
        if (
            isinstance(t, int)
            and latest is not None
            and latest <= t <= latest + self.jump_ms
            and t <= self.now_ms + self.skew_ms
        ):
            self.latest = t  # the common case, nothing to report
            return
        _judge_date(self.out, seq, table, key, t, latest, self.now_ms, self.skew_ms, self.jump_ms)
        if isinstance(t, int) and (latest is None or t > latest):
            self.latest = t

    def finish(self) -> None:
        for claim in self.waiting:
            _judge_lease(self.out, *claim, None, self.now_ms)
        self.waiting.clear()


def _judge_date(
    out: Collector,
    seq: int,
    table: str,
    key: object,
    t: object,
    before: int | None,
    now_ms: int,
    skew_ms: int,
    jump_ms: int,
) -> None:
    if not isinstance(t, int):
        out.add(
            Finding(
                FindingKind.TIME_BACKWARDS,
                f"the entry's time {t!r} is not an integer",
                seq,
                table,
                key,
            )
        )
        return
    if before is not None and t < before:
        out.add(
            Finding(
                FindingKind.TIME_BACKWARDS,
                f"dated {t}, before the ledger's latest time {before}",
                seq,
                table,
                key,
            )
        )
    if t > now_ms + skew_ms:
        out.add(
            Finding(
                FindingKind.TIME_IN_FUTURE,
                f"dated {t}, {t - now_ms} ms after the verifier's clock",
                seq,
                table,
                key,
            )
        )
    if before is not None and t - before > jump_ms:
        out.add(
            Finding(
                FindingKind.TIME_JUMP,
                f"dated {t - before} ms after the entry before it (bound {jump_ms} ms)",
                seq,
                table,
                key,
                Severity.WARNING,
            )
        )


def _judge_lease(
    out: Collector,
    seq: int,
    table: str,
    key: object,
    lease: object,
    before: int | None,
    after: int | None,
    now_ms: int,
) -> None:
    if not isinstance(lease, int):
        out.add(
            Finding(
                FindingKind.LEASE_OVER_CAP,
                f"lease expiry {lease!r} is not an integer",
                seq,
                table,
                key,
            )
        )
        return
    if before is not None and lease <= before:
        out.add(
            Finding(
                FindingKind.LEASE_BORN_EXPIRED,
                f"the lease expires at {lease}, no later than the ledger's time {before}",
                seq,
                table,
                key,
            )
        )
    latest_claim = after if after is not None else now_ms
    if lease > latest_claim + LEASE_CAP_MS:
        out.add(
            Finding(
                FindingKind.LEASE_OVER_CAP,
                f"the lease expires at {lease}, more than 30 days after the claim"
                f" (which happened no later than {latest_claim})",
                seq,
                table,
                key,
            )
        )
