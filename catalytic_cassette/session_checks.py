"""The checks of one session, shared by both backends (``session_verify`` opens a file,
``postgresql.sessions`` a server): its actions, their journal entries (the body, the leaf
hash and the chain link to the entry before), causes in time, archived plan hashes,
signatures, and (with anchors) each entry's inclusion under a seal kept elsewhere.

The checks read through a ``reasoning.Fetch`` of named statements and a
``proofs.ProofTree``, so one copy of them serves both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from . import merkle
from .actions import COLUMNS
from .anchor import Anchor, open_anchor
from .errors import CassetteError, ErrorCode
from .hashing import ZERO_HASH, chain_hash, leaf_hash, sha256_hex
from .payloads import loads_object
from .reasoning import Fetch

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .proofs import ProofTree


@dataclass
class SessionReport:
    session_id: str
    actions: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unverifiable: bool = False

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, kind: str, action_id: str | None, detail: str, seq: int | None = None) -> None:
        self.findings.append({"kind": kind, "action_id": action_id, "seq": seq, "detail": detail})

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "ok": self.ok,
            "unverifiable": self.unverifiable,
            "actions": self.actions,
            "findings": self.findings,
            "anchors": self.anchors,
            "notes": self.notes,
        }


def verify_session_of(
    fetch: Fetch,
    tree_of: Callable[[], ProofTree],
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
) -> SessionReport:
    """One session's checks through any backend's reads, all in the caller's snapshot;
    ``tree_of`` gives the ledger's Merkle tree (only read with anchors)."""
    report = SessionReport(session_id)
    rows = fetch("session_actions", {"session_id": session_id})
    if not rows:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no actions in session {session_id}")
    report.actions = len(rows)
    entries: list[tuple[str, int, bytes]] = []  # (action_id, seq, body) of sound entries
    for values in rows:
        row = dict(zip(COLUMNS, values, strict=True))
        found = _check_entry(fetch, report, row)
        if found is not None:
            entries.append((row["action_id"], *found))
        _check_cause(fetch, report, row)
        _check_plan_hash(report, row)
        if public_key is not None:
            from .signing import check

            problem = check(public_key, row)
            if problem is not None:
                report.add(problem, row["action_id"], "the action's signature does not hold")
    if anchors is not None:
        if seal_key is None or origin is None:
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "anchors need a public key and origin")
        _check_anchors(tree_of, report, entries, anchors, seal_key, origin)
    return report


def _check_entry(
    fetch: Fetch, report: SessionReport, row: dict[str, Any]
) -> tuple[int, bytes] | None:
    """The action's one journal entry: its body records this row, its hashes hold."""
    action_id = row["action_id"]
    found = fetch("session_entries", {"action_id": action_id})
    if not found:
        report.add("unjournaled", action_id, "no journal entry records this action")
        return None
    if len(found) > 1:
        report.add("extra_revision", action_id, f"{len(found)} journal entries record it")
    seq, body, stored_leaf, stored_chain = found[0]
    encoded = str(body).encode("utf-8")
    try:
        recorded = orjson.loads(encoded)
    except orjson.JSONDecodeError:
        recorded = None  # a body that is not JSON records nothing: row_changed
    if (
        not isinstance(recorded, dict)
        or recorded.get("op") != "INSERT"
        or not _same_row(recorded.get("row"), row)
    ):
        report.add("row_changed", action_id, "the row differs from its journal entry", seq)
    leaf = leaf_hash(encoded)
    if leaf != stored_leaf:
        report.add("leaf_hash", action_id, "the entry's leaf hash is not SHA-256 of its body", seq)
        return None
    before = fetch("chain_hash_at", {"seq": seq - 1})
    prev = ZERO_HASH if seq == 0 else (before[0][0] if before else None)
    if prev is None or chain_hash(seq, prev, leaf) != stored_chain:
        report.add("chain_hash", action_id, "the entry does not link to the one before", seq)
    return seq, encoded


def _same_row(recorded: Any, row: dict[str, Any]) -> bool:
    """Equal column by column; a column added by a later migration (absent from an
    older entry) must still be NULL in the row."""
    if not isinstance(recorded, dict) or not recorded.keys() <= row.keys():
        return False
    return all(recorded.get(k, None) == v for k, v in row.items())


def _check_cause(fetch: Fetch, report: SessionReport, row: dict[str, Any]) -> None:
    if row["caused_by"] is None:
        return
    found = fetch("session_cause_time", {"action_id": row["caused_by"]})
    cause = found[0] if found else None
    if cause is None:
        report.add("cause_missing", row["action_id"], f"no cause {row['caused_by']}")
    elif cause[0] > row["timestamp"]:
        report.add(
            "cause_after_effect",
            row["action_id"],
            f"cause {row['caused_by']} at {cause[0]} is later than the effect"
            f" at {row['timestamp']}",
        )


def _check_plan_hash(report: SessionReport, row: dict[str, Any]) -> None:
    try:
        metadata = loads_object(row["metadata_json"], "the metadata")
    except CassetteError as error:  # edited by hand
        report.add("corrupt", row["action_id"], error.message)
        return
    body = metadata.get("plan_body")
    if isinstance(body, str) and metadata.get("plan_hash") != sha256_hex(body):
        report.add("plan_hash", row["action_id"], "plan_hash is not the SHA-256 of plan_body")


def _check_anchors(
    tree_of: Callable[[], ProofTree],
    report: SessionReport,
    entries: list[tuple[str, int, bytes]],
    anchors: list[Anchor],
    seal_key: Ed25519PublicKey,
    origin: str,
) -> None:
    """Each entry under the newest seal that opens: an RFC 9162 inclusion proof from the
    stored tree, checked against the sealed root (so a forged tree cannot pass)."""
    opened = []
    for anchor in anchors:
        open_anchor(anchor, seal_key, origin)
        if anchor.checkpoint is None:
            report.anchors.append(anchor.to_dict())
            if anchor.problem == "bad_signature":
                report.add("bad_signature", None, f"{anchor.path}: {anchor.detail}")
            else:
                report.unverifiable = True
        else:
            opened.append(anchor)
    if not opened:
        return
    newest = max(opened, key=lambda a: a.checkpoint.size)  # type: ignore[union-attr]
    checkpoint = newest.checkpoint
    assert checkpoint is not None
    tree = tree_of()
    if checkpoint.size > tree.size():
        newest.status = "truncated"
        report.add("truncated", None, f"the seal covers {checkpoint.size} entries")
        report.anchors.append(newest.to_dict())
        return
    covered = 0
    for action_id, seq, body in entries:
        if seq >= checkpoint.size:
            continue
        covered += 1
        try:
            path = tree.inclusion_proof(seq, checkpoint.size)
        except CassetteError as error:
            report.add("not_included", action_id, error.message, seq)
            continue
        if not merkle.verify_inclusion(
            seq, checkpoint.size, leaf_hash(body), path, checkpoint.root
        ):
            report.add("not_included", action_id, "the entry is not under the sealed root", seq)
    newest.status = (
        "holds" if not any(f["kind"] == "not_included" for f in report.findings) else "forked"
    )
    report.anchors.append(newest.to_dict())
    after = len(entries) - covered
    report.notes.append(
        f"{covered} of the session's entries are proven under the seal of size"
        f" {checkpoint.size}; {after} come after it and are protected only by the local chain"
    )
