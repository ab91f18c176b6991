"""What verify reports: typed finding kinds, severities, the report, and the collector."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

MAX_FINDINGS_PER_KIND = 100


class Severity(str, Enum):
    """ERROR: the ledger is tampered or inconsistent (exit 1). WARNING: worth a look,
    not a failure (exit 0). UNVERIFIABLE: something asked for could not be checked
    (exit 3)."""

    ERROR = "error"
    WARNING = "warning"
    UNVERIFIABLE = "unverifiable"

    def __str__(self) -> str:
        return self.value


class FindingKind(str, Enum):
    """Every kind of finding, grouped by the check that reports it (LAW.md lists them)."""

    # the file: header, schema objects, recorded migrations and meta, pages and indexes
    HEADER = "header"
    SCHEMA_VERSION = "schema_version"
    SCHEMA_CHANGED = "schema_changed"
    SCHEMA_MISSING = "schema_missing"
    SCHEMA_EXTRA = "schema_extra"
    PLANNER_STATISTICS = "planner_statistics"
    CORRUPT = "corrupt"
    INDEX_MISMATCH = "index_mismatch"
    # PostgreSQL only: a ledger trigger that does not fire (ALTER TABLE ... DISABLE
    # TRIGGER), a head row missing or doubled (the chain's lock and the ledger's clock), and a
    # catalog not compared (no snapshot made on the server's major version)
    TRIGGER_DISABLED = "trigger_disabled"
    JOURNAL_HEAD = "journal_head"
    SCHEMA_UNCHECKED = "schema_unchecked"
    # the chain
    JOURNAL_GAP = "journal_gap"
    LEAF_HASH = "leaf_hash"
    CHAIN_HASH = "chain_hash"
    TREE_NODE = "tree_node"
    # state against history
    UNJOURNALED_ROW = "unjournaled_row"
    STATE_MISMATCH = "state_mismatch"
    ROW_MISSING = "row_missing"
    JOURNAL_DUPLICATE = "journal_duplicate"
    REPLAY_ORDER = "replay_order"
    JOURNAL_UNKNOWN_TABLE = "journal_unknown_table"
    JOURNAL_COLUMNS = "journal_columns"
    # consistency between rows
    COMMITTED_WITHOUT_RECEIPT = "committed_without_receipt"
    RECEIPT_MISMATCH = "receipt_mismatch"
    ORPHAN = "orphan"
    EMPTY_MESSAGE = "empty_message"
    EMPTY_JOB = "empty_job"
    RELEASE_MISMATCH = "release_mismatch"
    CHECKPOINT_ID = "checkpoint_id"
    ID_ORDER = "id_order"
    LEASE_EXPIRED = "lease_expired"
    # history: every revision a lawful step from the one before it
    UNLAWFUL_HISTORY = "unlawful_history"
    # time
    TIME_BACKWARDS = "time_backwards"
    TIME_IN_FUTURE = "time_in_future"
    TIME_JUMP = "time_jump"
    LEASE_OVER_CAP = "lease_over_cap"
    LEASE_BORN_EXPIRED = "lease_born_expired"
    # seals and anchors
    SEAL_MISMATCH = "seal_mismatch"
    TRUNCATED = "truncated"
    FORKED = "forked"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    WRONG_ORIGIN = "wrong_origin"
    MALFORMED_SEAL = "malformed_seal"
    # artifacts and action signatures
    ARTIFACT_MISSING = "artifact_missing"
    ARTIFACT_ALTERED = "artifact_altered"
    UNSIGNED_ACTION = "unsigned_action"
    # worker attestations (--worker-keys)
    FOREIGN_KEY = "foreign_key"
    ATTESTATION_MISMATCH = "attestation_mismatch"
    UNSIGNED_ENTRY = "unsigned_entry"

    def __str__(self) -> str:
        return self.value


@dataclass
class Finding:
    kind: FindingKind
    detail: str
    seq: int | None = None
    table: str | None = None
    key: Any = None
    severity: Severity = Severity.ERROR

    def __post_init__(self) -> None:
        self.kind = FindingKind(self.kind)
        self.severity = Severity(self.severity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "detail": self.detail,
            "seq": self.seq,
            "table": self.table,
            "key": self.key,
            "severity": self.severity.value,
        }


@dataclass
class VerifyReport:
    findings: list[Finding] = field(default_factory=list)
    journal_rows: int = 0
    level: str = "full"
    suppressed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    anchored: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def unverifiable(self) -> bool:
        """Something asked for could not be checked (an anchor under another key, say)."""
        return any(f.severity is Severity.UNVERIFIABLE for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "level": self.level,
            "journal_rows": self.journal_rows,
            "findings": [f.to_dict() for f in self.findings],
            "suppressed": self.suppressed,
            "notes": self.notes,
            "anchors": self.anchors,
            "anchored": self.anchored,
        }


class Collector:
    """Findings under a per-kind limit; the rest are counted in ``suppressed``."""

    def __init__(self, report: VerifyReport | None = None) -> None:
        self.report = report if report is not None else VerifyReport()
        self.per_kind: Counter[str] = Counter()

    def add(self, finding: Finding) -> None:
        kind = finding.kind.value
        self.per_kind[kind] += 1
        if self.per_kind[kind] <= MAX_FINDINGS_PER_KIND:
            self.report.findings.append(finding)
        else:
            self.report.suppressed[kind] = self.per_kind[kind] - MAX_FINDINGS_PER_KIND

    def merge_before(self, source: Collector) -> None:
        """Put the findings of ``source`` before those already collected."""
        mine = Collector()
        mine.merge(self)
        self.report.findings.clear()
        self.report.suppressed.clear()
        self.per_kind.clear()
        self.merge(source, mine)

    def merge(self, *sources: Collector) -> None:
        """Append the findings of ``sources`` in order, under this collector's limits."""
        for source in sources:
            for finding in source.report.findings:
                self.add(finding)
            for kind, count in source.report.suppressed.items():
                self.per_kind[kind] += count
                self.report.suppressed[kind] = self.per_kind[kind] - MAX_FINDINGS_PER_KIND
