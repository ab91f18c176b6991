"""The journaled tables as verify sees them: key, rowid column, dated column, columns."""

from __future__ import annotations

from typing import NamedTuple

from ..actions import COLUMNS as ACTION_COLUMNS


class LedgerTable(NamedTuple):
    key: str  # the journal body's "key"
    rowid: str  # the INTEGER PRIMARY KEY, read without any index
    dated_by: str  # the column holding the row's ledger time
    columns: tuple[str, ...]  # in journal-body order


TABLES: dict[str, LedgerTable] = {
    "cassette_messages": LedgerTable(
        "message_id",
        "message_id",
        "created_at",
        ("message_id", "run_id", "source", "idempotency_key", "payload_json", "created_at"),
    ),
    "cassette_jobs": LedgerTable(
        "job_id",
        "job_id",
        "created_at",
        ("job_id", "message_id", "run_id", "intent", "ordinal", "created_at"),
    ),
    "cassette_steps": LedgerTable(
        "step_id",
        "step_id",
        "created_at",
        (
            "step_id",
            "job_id",
            "run_id",
            "message_id",
            "job_ordinal",
            "ordinal",
            "status",
            "lease_owner",
            "lease_expires_at",
            "fencing_token",
            "payload_json",
            "created_at",
        ),
    ),
    "cassette_receipts": LedgerTable(
        "receipt_id",
        "receipt_id",
        "created_at",
        (
            "receipt_id",
            "step_id",
            "job_id",
            "run_id",
            "worker_id",
            "fencing_token",
            "outcome",
            "receipt_json",
            "created_at",
        ),
    ),
    "cassette_releases": LedgerTable(
        "release_id",
        "release_id",
        "created_at",
        ("release_id", "step_id", "run_id", "worker_id", "fencing_token", "created_at"),
    ),
    "cassette_actions": LedgerTable("action_id", "action_seq", "timestamp", ACTION_COLUMNS),
    "cassette_checkpoints": LedgerTable(
        "checkpoint_id",
        "checkpoint_seq",
        "created_at",
        ("checkpoint_seq", "checkpoint_id", "plan_id", "context_json", "created_at"),
    ),
    "cassette_seals": LedgerTable(
        "seal_id",
        "seal_id",
        "created_at",
        ("seal_id", "tree_size", "root_hex", "origin", "key_id", "note", "created_at"),
    ),
    "cassette_attestations": LedgerTable(
        "attestation_id",
        "attestation_id",
        "created_at",
        (
            "attestation_id",
            "act",
            "run_id",
            "message_id",
            "step_id",
            "fencing_token",
            "worker_id",
            "key_id",
            "signature",
            "created_at",
        ),
    ),
}
MUTABLE_TABLES = frozenset({"cassette_steps"})
# Tables whose ids the SQL keeps dense from 1 (their `*_dense` triggers; tests/test_shape.py
# checks this against the migrated schema).
DENSE_TABLES = (
    "cassette_messages",
    "cassette_jobs",
    "cassette_steps",
    "cassette_receipts",
    "cassette_releases",
    "cassette_actions",
    "cassette_checkpoints",
    "cassette_seals",
)

# The shape older callers know: table -> (key column, columns in journal-body order).
LEDGER_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    name: (table.key, table.columns) for name, table in TABLES.items()
}
