"""Verify against anchors: seals kept outside the ledger, checked with a pinned key and
origin (DESIGN.md 5 item 5; LAW.md, "Anchored verify").

The verifier never trusts an identity the ledger reports about itself: the public key
and the origin come from the caller. The roots it compares are recomputed from the
journal bodies while verify streams them, never read from the stored tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import safe_files
from .errors import CassetteError, ErrorCode
from .note import Checkpoint, NoteError, open_note
from .safe_files import SEAL_SUFFIX

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# How an anchor's own check ended, before the ledger is compared with it.
UNVERIFIABLE_KINDS = frozenset({"unknown_key", "wrong_origin", "malformed_seal"})


@dataclass
class Anchor:
    """One seal file as read, and what opening it with the pinned key and origin gave."""

    path: str
    data: bytes
    checkpoint: Checkpoint | None = None
    problem: str | None = None  # bad_signature, unknown_key, wrong_origin, malformed_seal
    detail: str = ""
    status: str = "unchecked"  # then: holds, truncated, forked, or the problem
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "path": self.path,
            "status": self.status,
            "origin": cp.origin if cp else None,
            "size": cp.size if cp else None,
            "root": cp.root.hex() if cp else None,
            "detail": self.detail,
        }


def load_anchors(path: str | Path) -> list[Anchor]:
    """A seal file, or every ``*.seal`` file of a directory, read through ``safe_files``.

    A ``*.seal`` entry that is not a regular file (a link, a FIFO, a device) is not
    opened and makes the whole set unreadable (UNSAFE_PATH: cannot verify), rather than
    being skipped, which would let whoever controls the directory hide a seal quietly.
    """
    source = Path(path)
    if safe_files.is_directory(source):
        return _load_directory(source)
    return [Anchor(str(source), _read_seal(source))]


def _load_directory(source: Path) -> list[Anchor]:
    with safe_files.open_directory(source, what="seal directory") as dir_fd:
        names, others = safe_files.list_directory(dir_fd, SEAL_SUFFIX)
        if others:
            name, found = others[0]
            raise CassetteError(
                ErrorCode.UNSAFE_PATH,
                f"seal file {source / name} is {found}, not a regular file; not opened",
                path=str(source / name),
            )
        if not names:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no {SEAL_SUFFIX} files in {source}")
        return [Anchor(str(source / name), _read_seal(name, dir_fd)) for name in names]


def _read_seal(name: str | Path, dir_fd: int | None = None) -> bytes:
    return safe_files.read_file(
        name, what="seal file", max_bytes=safe_files.SEAL_MAX_BYTES, dir_fd=dir_fd
    )


def open_anchor(anchor: Anchor, public_key: Ed25519PublicKey, origin: str) -> None:
    """Check the seal's signature under the pinned (origin, key); set checkpoint or problem."""
    try:
        text = open_note(anchor.data, origin, public_key)
        checkpoint = Checkpoint.from_text(text)
    except NoteError as error:
        anchor.problem = "malformed_seal" if error.kind == "malformed" else error.kind
        anchor.detail = error.message
        anchor.status = anchor.problem
        if error.kind == "unknown_key":
            anchor.detail = f"not signed by the pinned key under the name {origin!r}"
        return
    if checkpoint.origin != origin:
        anchor.problem = anchor.status = "wrong_origin"
        anchor.detail = f"the seal names origin {checkpoint.origin!r}, the pinned one is {origin!r}"
        return
    anchor.checkpoint = checkpoint


def judge(
    anchors: list[Anchor], roots: dict[int, bytes], journal_size: int, journal_entry: Any
) -> None:
    """Compare each opened anchor with the roots recomputed at its size.

    ``journal_entry(seq)`` returns ``(body, leaf_hash)`` of an entry, for the evidence of
    a fork that the seals narrow down to one entry.
    """
    opened = sorted(
        (a for a in anchors if a.checkpoint is not None),
        key=lambda a: a.checkpoint.size,  # type: ignore[union-attr]
    )
    for anchor in opened:
        cp = anchor.checkpoint
        assert cp is not None
        if cp.size > journal_size:
            anchor.status = "truncated"
            anchor.detail = f"the seal covers {cp.size} entries, the ledger has {journal_size}"
        elif roots.get(cp.size) != cp.root:
            anchor.status = "forked"
            recomputed = roots.get(cp.size)
            anchor.detail = "the ledger's first entries do not have the sealed root"
            anchor.evidence = _fork_evidence(anchor, recomputed, opened, journal_entry)
        else:
            anchor.status = "holds"


def _fork_evidence(
    anchor: Anchor, recomputed: bytes | None, opened: list[Anchor], journal_entry: Any
) -> dict[str, Any]:
    """What someone else can re-check: the signed seal, the root recomputed from the
    ledger, and where the first differing entry lies. Smaller seals that still hold
    bound it from below; with a seal one entry larger than one that holds, it is exact.
    """
    cp = anchor.checkpoint
    assert cp is not None
    lower = max(
        (a.checkpoint.size for a in opened if a.status == "holds" and a.checkpoint),
        default=0,
    )
    evidence: dict[str, Any] = {
        "seal": anchor.data.decode("utf-8", "replace"),
        "seal_path": anchor.path,
        "size": cp.size,
        "sealed_root": cp.root.hex(),
        "recomputed_root": recomputed.hex() if recomputed else None,
        "first_differing_entry": {"at_least": lower, "below": cp.size},
    }
    if cp.size - lower == 1:
        body, leaf = journal_entry(lower)
        evidence["first_differing_entry"].update(
            {"seq": lower, "body": body, "leaf_hash": leaf.hex() if leaf else None}
        )
    return evidence
