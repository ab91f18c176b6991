"""Consistency between rows: receipts, steps, jobs, messages and releases agree; every
checkpoint id is the hash of its context; leases still out past their expiry.

These queries may use the ledger's indexes: their findings count only when the page and
index check (PRAGMA integrity_check) found every index equal to its table.
"""

from __future__ import annotations

import hashlib
import sqlite3

from .findings import Collector, Finding, FindingKind, Severity
from .tables import DENSE_TABLES, TABLES

_CONSISTENCY: tuple[tuple[str, str, str, str], ...] = (
    (
        "committed_without_receipt",
        "cassette_steps",
        "SELECT s.step_id FROM cassette_steps s WHERE s.status = 'COMMITTED'{run_s}"
        " AND NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = s.step_id)",
        "a COMMITTED step has no receipt",
    ),
    (
        "receipt_mismatch",
        "cassette_receipts",
        "SELECT r.receipt_id FROM cassette_receipts r"
        " JOIN cassette_steps s ON s.step_id = r.step_id"
        " WHERE (s.status IS NOT 'COMMITTED' OR r.worker_id IS NOT s.lease_owner"
        " OR r.fencing_token IS NOT s.fencing_token OR r.job_id IS NOT s.job_id"
        " OR r.run_id IS NOT s.run_id){run_r}",
        "the receipt does not match its step's state, worker, token, job or run",
    ),
    (
        "orphan",
        "cassette_receipts",
        "SELECT r.receipt_id FROM cassette_receipts r WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.step_id = r.step_id){run_r}",
        "the receipt's step does not exist",
    ),
    (
        "orphan",
        "cassette_steps",
        "SELECT s.step_id FROM cassette_steps s WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_jobs j WHERE j.job_id = s.job_id AND j.message_id = s.message_id"
        " AND j.ordinal = s.job_ordinal AND j.run_id = s.run_id){run_s}",
        "the step's job does not exist or does not match",
    ),
    (
        "orphan",
        "cassette_jobs",
        "SELECT j.job_id FROM cassette_jobs j WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_messages m WHERE m.message_id = j.message_id"
        " AND m.run_id = j.run_id){run_j}",
        "the job's message does not exist or belongs to another run",
    ),
    (
        "empty_message",
        "cassette_messages",
        "SELECT m.message_id FROM cassette_messages m WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_jobs j WHERE j.message_id = m.message_id){run_m}",
        "the message has no job",
    ),
    (
        "empty_job",
        "cassette_jobs",
        "SELECT j.job_id FROM cassette_jobs j WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.job_id = j.job_id){run_j}",
        "the job has no step",
    ),
    (
        "release_mismatch",
        "cassette_releases",
        "SELECT x.release_id FROM cassette_releases x WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.step_id = x.step_id AND s.run_id = x.run_id"
        " AND s.fencing_token >= x.fencing_token){run_x}",
        "the release does not match its step",
    ),
)


def check_consistency(
    conn: sqlite3.Connection, out: Collector, run_id: str | None, now_ms: int
) -> None:
    filters = {
        alias: ("" if run_id is None else f" AND {alias[-1]}.run_id = :run")
        for alias in ("run_s", "run_r", "run_j", "run_m", "run_x")
    }
    for kind, table, query, detail in _CONSISTENCY:
        for (key,) in conn.execute(query.format(**filters), {"run": run_id}):
            out.add(Finding(FindingKind(kind), detail, None, table, key))
    expired = (
        "SELECT step_id, lease_owner, lease_expires_at FROM cassette_steps s"
        " WHERE status = 'LEASED' AND lease_expires_at <= :now" + filters["run_s"]
    )
    for step_id, owner, expires in conn.execute(expired, {"now": now_ms, "run": run_id}):
        out.add(
            Finding(
                FindingKind.LEASE_EXPIRED,
                f"lease of {owner!r} expired at {expires}; requeue it",
                None,
                "cassette_steps",
                step_id,
                severity=Severity.WARNING,
            )
        )


def check_dense_ids(conn: sqlite3.Connection, out: Collector) -> None:
    """Each dense table's ids run from 1 to its number of rows. The SQL refuses any other id
    in AFTER triggers (`*_dense`, `*_in_order`), which a connection's own TEMP trigger ending
    in RAISE(IGNORE) skips (LAW.md section 12 (a)); and the fast path pairs journal entries
    with rows by rowid, so it would take a journaled id far ahead for the next one. One row
    past the count is what makes every later honest insert fail OUT_OF_ORDER. Read from
    the table's own b-tree: no index, no statistics."""
    for table in DENSE_TABLES:
        spec = TABLES[table]
        (rows,) = conn.execute(f"SELECT count(*) FROM main.{table} NOT INDEXED").fetchone()
        beyond = (
            f"SELECT {spec.rowid}, {spec.key} FROM main.{table} NOT INDEXED"
            f" WHERE {spec.rowid} > ? ORDER BY {spec.rowid}"
        )
        for rowid, key in conn.execute(beyond, (rows,)):
            out.add(
                Finding(
                    FindingKind.ID_ORDER,
                    f"id {rowid} is beyond the dense ids 1..{rows} of the table's {rows} rows",
                    None,
                    table,
                    key,
                )
            )


def _sha256_hex(text: str | bytes | None) -> str | None:
    if text is None:
        return None
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def check_checkpoint_ids(conn: sqlite3.Connection, out: Collector) -> None:
    """checkpoint_id = 'cp-' + SHA-256 of context_json, recomputed here: the TEMP trigger
    that checks it on insert calls a function any client can register with a forged body."""
    # A private name on verify's own connection: nothing in the file can call it.
    conn.create_function("cassette_verify_sha256_hex", 1, _sha256_hex, deterministic=True)
    query = (
        "SELECT checkpoint_id FROM cassette_checkpoints NOT INDEXED"
        " WHERE checkpoint_id IS NOT 'cp-' || cassette_verify_sha256_hex(context_json)"
        " ORDER BY checkpoint_seq"
    )
    for (checkpoint_id,) in conn.execute(query):
        out.add(
            Finding(
                FindingKind.CHECKPOINT_ID,
                "checkpoint_id is not cp- and the SHA-256 of its context_json",
                None,
                "cassette_checkpoints",
                checkpoint_id,
            )
        )
