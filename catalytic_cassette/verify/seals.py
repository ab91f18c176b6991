"""Seals: every seal recorded in the ledger, and the seal files given as anchors, against
the roots recomputed from the journal (never the stored tree)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ..anchor import UNVERIFIABLE_KINDS, Anchor, judge
from .findings import Collector, Finding, FindingKind, Severity, VerifyReport

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

UNANCHORED_NOTE = (
    "no anchor given: someone who can write the file and recomputes the whole chain "
    "cannot be detected by a local verify"
)


def recorded_seals(conn: sqlite3.Connection) -> list[tuple[int, int, str, str]]:
    rows = conn.execute(
        "SELECT seal_id, tree_size, root_hex, note FROM cassette_seals NOT INDEXED ORDER BY seal_id"
    ).fetchall()
    return [(int(a), int(b), str(c), str(d)) for a, b, c, d in rows]


def check_recorded_seals(
    out: Collector,
    recorded: list[tuple[int, int, str, str]],
    roots: dict[int, bytes],
    journal_size: int,
    seal_key: Ed25519PublicKey | None,
    origin: str | None,
) -> None:
    """Every seal recorded in the ledger matches the recomputed root of its size and
    its own note; with a pinned key and origin, its signature too."""
    from ..note import Checkpoint, NoteError, open_note, parse_note

    for seal_id, size, root_hex, note in recorded:
        problem = None
        if size > journal_size:
            problem = f"sealed size {size} is beyond the journal's {journal_size} entries"
        elif roots.get(size, b"").hex() != root_hex:
            problem = f"sealed root is not the recomputed root of the first {size} entries"
        else:
            try:
                text = parse_note(note.encode("utf-8")).text
                if seal_key is not None and origin is not None:
                    text = open_note(note.encode("utf-8"), origin, seal_key)
                checkpoint = Checkpoint.from_text(text)
                if (checkpoint.size, checkpoint.root.hex()) != (size, root_hex):
                    problem = "the seal's note does not match its size and root"
            except NoteError as error:
                if error.kind != "unknown_key":  # sealed under another key or origin
                    problem = f"the seal's note does not verify: {error.message}"
        if problem is not None:
            out.add(Finding(FindingKind.SEAL_MISMATCH, problem, None, "cassette_seals", seal_id))


def judge_anchors(
    conn: sqlite3.Connection,
    report: VerifyReport,
    out: Collector,
    anchors: list[Anchor],
    roots: dict[int, bytes],
) -> None:
    def journal_entry(seq: int) -> tuple[str | None, bytes | None]:
        row = conn.execute(
            "SELECT body, leaf_hash FROM cassette_journal NOT INDEXED WHERE seq = ?", (seq,)
        ).fetchone()
        return (str(row[0]), bytes(row[1])) if row else (None, None)

    judge(anchors, roots, report.journal_rows, journal_entry)
    for anchor in anchors:
        report.anchors.append(anchor.to_dict())
        if anchor.status == "holds":
            continue
        severity = Severity.UNVERIFIABLE if anchor.status in UNVERIFIABLE_KINDS else Severity.ERROR
        size = anchor.checkpoint.size if anchor.checkpoint else None
        out.add(
            Finding(
                FindingKind(anchor.status),
                f"{anchor.path}: {anchor.detail}",
                size,
                None,
                None,
                severity,
            )
        )
        if anchor.evidence:
            report.anchors[-1]["evidence"] = anchor.evidence
    holding = [a.checkpoint for a in anchors if a.status == "holds" and a.checkpoint]
    if holding:
        newest = max(holding, key=lambda cp: cp.size)
        after = report.journal_rows - newest.size
        report.anchored = {
            "newest_holding_size": newest.size,
            "newest_holding_root": newest.root.hex(),
            "entries_after_anchor": after,
        }
        report.notes.append(
            f"{after} journal entries after the newest anchor (size {newest.size}) are"
            " protected only by the local chain"
        )
    else:
        report.notes.append("no anchor holds: " + UNANCHORED_NOTE)
