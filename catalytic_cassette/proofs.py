"""Portable proofs: an entry's inclusion under a seal (c2sp.org/tlog-proof, with the
entry's body as its extra data) and the consistency of two seals (RFC 9162 2.1.4).

Building reads the ledger; checking needs only the proof file, the pinned public key
and origin: no database.
"""

from __future__ import annotations

import base64
import binascii
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from . import merkle
from .connection import read_transaction
from .errors import CassetteError, ErrorCode
from .note import Checkpoint, NoteError, TlogProof, open_note, parse_note
from .tree import StoredTree

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

CONSISTENCY_FORMAT = "catalytic-cassette/consistency-proof@v1"
# the columns a bundle or a scoped proof may select by (never a caller's text)
SCOPES = {"session_id", "plan_id"}


def _checkpoint_of(note: bytes) -> Checkpoint:
    return Checkpoint.from_text(parse_note(note).text)


class ProofTree(Protocol):
    """The RFC 9162 tree of a ledger's journal (``tree.StoredTree`` on SQLite, a tree
    rebuilt from the bodies on PostgreSQL)."""

    def size(self) -> int: ...

    def root(self, size: int) -> bytes: ...

    def inclusion_proof(self, index: int, size: int) -> list[bytes]: ...

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]: ...


class ProofSource(Protocol):
    """What a proof is built from, in one snapshot of one ledger (either backend)."""

    def snapshot(self) -> AbstractContextManager[object]: ...

    def entry_body(self, seq: int) -> bytes | None: ...

    def receipt_seq(self, receipt_id: int) -> int | None: ...

    def seal_notes(self, seq: int) -> Iterator[bytes]:
        """The notes of the recorded seals that cover entry ``seq`` (every seal for -1),
        newest first."""
        ...

    def action_entries(self, scope: str, value: str) -> list[tuple[int, str]]:
        """(seq, body) of the journal entries of the actions whose ``scope`` column
        (``SCOPES``, never a caller's text) is ``value``, in seq order."""
        ...

    def tree(self) -> ProofTree: ...


class SqliteProofSource:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def snapshot(self) -> AbstractContextManager[object]:
        return read_transaction(self.conn)

    def entry_body(self, seq: int) -> bytes | None:
        row = self.conn.execute(
            "SELECT body FROM cassette_journal WHERE seq = ?", (seq,)
        ).fetchone()
        return None if row is None else str(row[0]).encode("utf-8")

    def receipt_seq(self, receipt_id: int) -> int | None:
        row = self.conn.execute(
            "SELECT min(seq) FROM cassette_journal WHERE tbl = 'cassette_receipts' AND row_key = ?",
            (receipt_id,),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def seal_notes(self, seq: int) -> Iterator[bytes]:
        for (note,) in self.conn.execute(
            "SELECT note FROM cassette_seals WHERE tree_size > ? ORDER BY seal_id DESC", (seq,)
        ).fetchall():  # (all read here: no statement left open in the snapshot)
            yield str(note).encode("utf-8")

    def action_entries(self, scope: str, value: str) -> list[tuple[int, str]]:
        rows = self.conn.execute(
            "SELECT j.seq, j.body FROM cassette_actions a JOIN cassette_journal j"
            "  ON j.tbl = 'cassette_actions' AND j.row_key = a.action_id"
            f" WHERE a.{scope_column(scope)} = ? ORDER BY j.seq",
            (value,),
        ).fetchall()
        return [(int(seq), str(body)) for seq, body in rows]

    def tree(self) -> ProofTree:
        return StoredTree(self.conn)


def scope_column(scope: str) -> str:
    """A bundle's scope column, checked against the fixed set before it is spliced."""
    if scope not in SCOPES:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"scope must be one of {sorted(SCOPES)}")
    return scope


def prove_inclusion(conn: sqlite3.Connection, seq: int, seal_note: bytes | None) -> TlogProof:
    """``inclusion_proof`` of a SQLite ledger."""
    return inclusion_proof(SqliteProofSource(conn), seq, seal_note)


def prove_consistency(
    conn: sqlite3.Connection, old_note: bytes, new_note: bytes | None
) -> dict[str, Any]:
    """``consistency_proof`` of a SQLite ledger."""
    return consistency_proof(SqliteProofSource(conn), old_note, new_note)


def receipt_entry(conn: sqlite3.Connection, receipt_id: int) -> int:
    """``receipt_seq`` of a SQLite ledger."""
    return receipt_seq(SqliteProofSource(conn), receipt_id)


Signer = tuple["Ed25519PublicKey", str]  # a pinned seal key and the origin it signs


def newest_signed(notes: Iterable[bytes], signer: Signer) -> bytes | None:
    """The first of ``notes`` whose signature verifies under the pinned key and origin:
    a seal row anyone could have inserted is never taken for the signer's."""
    public_key, origin = signer
    for note in notes:
        try:
            open_note(note, origin, public_key)
        except NoteError:
            continue
        return note
    return None


def chosen_seal(source: ProofSource, seq: int, signer: Signer | None) -> bytes | None:
    """The newest recorded seal covering entry ``seq`` (-1: any), or with ``signer`` the
    newest whose signature verifies under it."""
    notes = source.seal_notes(seq)
    return next(notes, None) if signer is None else newest_signed(notes, signer)


def inclusion_proof(
    source: ProofSource, seq: int, seal_note: bytes | None, signer: Signer | None = None
) -> TlogProof:
    """The proof that journal entry ``seq`` is in the tree a seal signed.

    Without ``seal_note`` the newest recorded seal that covers the entry is used (with
    ``signer``, the newest whose signature verifies under that key and origin). The
    proof is checked against the seal's root before it is returned, so a damaged
    stored tree or a seal of another ledger is refused here, not by the auditor.
    """
    with source.snapshot():
        note = seal_note if seal_note is not None else chosen_seal(source, seq, signer)
        if note is None:
            signed = "" if signer is None else " signed by the given key"
            raise CassetteError(
                ErrorCode.NOT_FOUND,
                f"no recorded seal{signed} covers entry {seq}: run `cassette seal` first or"
                " pass --seal",
                seq=seq,
            )
        checkpoint = _checkpoint_of(note)
        body = source.entry_body(seq)
        if body is None:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no journal entry {seq}", seq=seq)
        if not 0 <= seq < checkpoint.size:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                f"entry {seq} is not covered by a seal of {checkpoint.size} entries",
            )
        path = source.tree().inclusion_proof(seq, checkpoint.size)
    if not merkle.verify_inclusion(
        seq, checkpoint.size, merkle.leaf_hash(body), path, checkpoint.root
    ):
        raise CassetteError(
            ErrorCode.SEAL_MISMATCH,
            "the ledger does not prove this entry under the seal's root: the seal names"
            " another ledger, or this one changed since (run cassette verify --against)",
            seq=seq,
        )
    return TlogProof(seq, tuple(path), note, body)


def receipt_seq(source: ProofSource, receipt_id: int) -> int:
    """The journal seq of the entry that committed a receipt."""
    seq = source.receipt_seq(receipt_id)
    if seq is None:
        raise CassetteError(ErrorCode.NOT_FOUND, f"no receipt {receipt_id}", receipt_id=receipt_id)
    return seq


def consistency_proof(
    source: ProofSource, old_note: bytes, new_note: bytes | None
) -> dict[str, Any]:
    """RFC 9162 consistency from an old seal to a newer one, or to the current head
    (then the new root is the ledger's own, unsigned)."""
    old = _checkpoint_of(old_note)
    with source.snapshot():
        tree = source.tree()
        if new_note is not None:
            new = _checkpoint_of(new_note)
            new_size, new_root = new.size, new.root
        else:
            new_size = tree.size()
            new_root = tree.root(new_size)
        proof = tree.consistency_proof(old.size, new_size)
    if not merkle.verify_consistency(old.size, new_size, old.root, new_root, proof):
        raise CassetteError(
            ErrorCode.SEAL_MISMATCH,
            "the ledger does not prove the old seal consistent with the new head",
            old_size=old.size,
            new_size=new_size,
        )
    return {
        "format": CONSISTENCY_FORMAT,
        "old_size": old.size,
        "new_size": new_size,
        "old_root": old.root.hex(),
        "new_root": new_root.hex(),
        "proof": [base64.b64encode(h).decode("ascii") for h in proof],
        "old_seal": old_note.decode("utf-8"),
        "new_seal": new_note.decode("utf-8") if new_note is not None else None,
    }


@dataclass(frozen=True)
class ProofCheck:
    ok: bool
    kind: str  # "inclusion" or "consistency"
    problem: str | None  # bad_signature, unknown_key, malformed, wrong_origin, bad_proof
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "kind": self.kind, "problem": self.problem, **self.detail}


class _WrongOrigin(Exception):
    pass


def _open_checkpoint(note: bytes, origin: str, key: Ed25519PublicKey) -> Checkpoint:
    checkpoint = Checkpoint.from_text(open_note(note, origin, key))
    if checkpoint.origin != origin:
        raise _WrongOrigin(f"the seal names origin {checkpoint.origin!r}, not {origin!r}")
    return checkpoint


def check_proof_file(data: bytes, origin: str, key: Ed25519PublicKey) -> ProofCheck:
    """Check an inclusion or consistency proof offline, under the pinned origin and key."""
    kind = "consistency" if data.lstrip().startswith(b"{") else "inclusion"
    try:
        if kind == "inclusion":
            return _check_inclusion(data, origin, key)
        return _check_consistency(data, origin, key)
    except NoteError as error:
        return ProofCheck(False, kind, error.kind, {"message": error.message})
    except _WrongOrigin as error:
        return ProofCheck(False, kind, "wrong_origin", {"message": str(error)})


def _check_inclusion(data: bytes, origin: str, key: Ed25519PublicKey) -> ProofCheck:
    proof = TlogProof.from_bytes(data)
    checkpoint = _open_checkpoint(proof.checkpoint, origin, key)
    detail: dict[str, Any] = {
        "index": proof.index,
        "size": checkpoint.size,
        "root": checkpoint.root.hex(),
        "origin": checkpoint.origin,
    }
    if proof.extra is None:
        return ProofCheck(False, "inclusion", "malformed", {**detail, "message": "no entry body"})
    ok = merkle.verify_inclusion(
        proof.index, checkpoint.size, merkle.leaf_hash(proof.extra), proof.path, checkpoint.root
    )
    detail["entry"] = proof.extra.decode("utf-8", "replace")
    return ProofCheck(ok, "inclusion", None if ok else "bad_proof", detail)


def _canonical_base64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("a proof hash is a base64 string")
    decoded = base64.b64decode(text, validate=True)
    if base64.b64encode(decoded).decode("ascii") != text:
        raise ValueError(f"not canonical base64: {text!r}")
    return decoded


def _canonical_hex(text: object) -> bytes:
    if not isinstance(text, str) or len(text) != 64 or text != text.lower():
        raise ValueError(f"a root is 64 lowercase hex digits, not {text!r}")
    return bytes.fromhex(text)


def _canonical_size(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a size is a non-negative integer, not {value!r}")
    return value


def _check_consistency(data: bytes, origin: str, key: Ed25519PublicKey) -> ProofCheck:
    try:
        doc = orjson.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != CONSISTENCY_FORMAT:
            raise ValueError("unknown format")
        proof = [_canonical_base64(h) for h in doc["proof"]]
        old_note = str(doc["old_seal"]).encode("utf-8")
        new_note = doc["new_seal"]
        old_size, old_root = _canonical_size(doc["old_size"]), _canonical_hex(doc["old_root"])
        new_size, new_root = _canonical_size(doc["new_size"]), _canonical_hex(doc["new_root"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, binascii.Error) as exc:
        return ProofCheck(False, "consistency", "malformed", {"message": str(exc)})
    old = _open_checkpoint(old_note, origin, key)
    if (old.size, old.root) != (old_size, old_root):
        return ProofCheck(
            False, "consistency", "malformed", {"message": "old seal and old head differ"}
        )
    signed_new = new_note is not None
    if signed_new:
        new = _open_checkpoint(str(new_note).encode("utf-8"), origin, key)
        if (new.size, new.root) != (new_size, new_root):
            return ProofCheck(
                False, "consistency", "malformed", {"message": "new seal and new head differ"}
            )
    ok = merkle.verify_consistency(old.size, new_size, old.root, new_root, proof)
    detail = {
        "old_size": old.size,
        "new_size": new_size,
        "new_head_signed": signed_new,
        "origin": old.origin,
    }
    return ProofCheck(ok, "consistency", None if ok else "bad_proof", detail)
