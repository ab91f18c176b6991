"""Self-verifying bundles: a session's or a plan's journal entries as JSON lines, each
with its RFC 9162 inclusion proof, and the signed seal they are proven under. Checking
one needs only the file, the pinned public key and origin: no database.

Line 1 is the header {"format", "scope", "entries", "seal"}; each further line is
{"seq", "body", "proof": [hex, ...]}. A bundle proves that each entry it holds is in
the sealed ledger; it cannot prove that it holds every entry of the scope (a writer of
the bundle could leave one out), and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from . import merkle
from .errors import CassetteError, ErrorCode
from .note import Checkpoint, NoteError, open_note, parse_note
from .proofs import SCOPES, chosen_seal

if TYPE_CHECKING:
    import sqlite3

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .proofs import ProofSource, Signer

FORMAT = "catalytic-cassette/bundle@v1"


def export_lines(
    conn: sqlite3.Connection, scope: str, value: str, seal_note: bytes | None = None
) -> Iterator[bytes]:
    """``bundle_lines`` of a SQLite ledger."""
    from .proofs import SqliteProofSource

    return bundle_lines(SqliteProofSource(conn), scope, value, seal_note)


def bundle_lines(
    source: ProofSource,
    scope: str,
    value: str,
    seal_note: bytes | None = None,
    signer: Signer | None = None,
) -> Iterator[bytes]:
    """The bundle's lines (without newlines), read in one snapshot of either backend.

    Without ``seal_note`` the newest recorded seal is used (with ``signer``, the newest
    whose signature verifies under that key and origin); every entry of the scope
    must lie under it (else NOT_FOUND: seal first). The lines depend only on the journal
    and the seal, so two ledgers with the same journal give the same bytes.
    """
    if scope not in SCOPES:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, f"scope must be one of {sorted(SCOPES)}")
    with source.snapshot():
        note = seal_note if seal_note is not None else chosen_seal(source, -1, signer)
        if note is None:
            signed = "" if signer is None else " signed by the given key"
            raise CassetteError(
                ErrorCode.NOT_FOUND, f"the ledger has no seal{signed}: run `cassette seal`"
            )
        checkpoint = Checkpoint.from_text(parse_note(note).text)
        entries = source.action_entries(scope, value)
        if not entries:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no actions with {scope} {value}")
        if entries[-1][0] >= checkpoint.size:
            raise CassetteError(
                ErrorCode.NOT_FOUND,
                f"entry {entries[-1][0]} is after the seal of size {checkpoint.size}:"
                " run `cassette seal` first",
            )
        tree = source.tree()
        lines = [
            orjson.dumps(
                {
                    "format": FORMAT,
                    "scope": {scope: value},
                    "entries": len(entries),
                    "seal": note.decode("utf-8"),
                }
            )
        ]
        for seq, body in entries:
            path = tree.inclusion_proof(seq, checkpoint.size)
            if not merkle.verify_inclusion(
                seq,
                checkpoint.size,
                merkle.leaf_hash(body.encode("utf-8")),
                path,
                checkpoint.root,
            ):
                raise CassetteError(
                    ErrorCode.SEAL_MISMATCH,
                    f"the ledger does not prove entry {seq} under the seal: run verify --against",
                    seq=seq,
                )
            lines.append(orjson.dumps({"seq": seq, "body": body, "proof": [h.hex() for h in path]}))
    yield from lines


def verify_bundle(data: bytes, public_key: Ed25519PublicKey, origin: str) -> dict[str, Any]:
    """Check a bundle offline. ``ok`` only if the seal opens under the pinned key and
    origin, the header's count matches, and every entry is a distinct, ascending seq of
    the stated scope with a valid inclusion proof under the sealed root."""
    problems: list[dict[str, Any]] = []
    lines = data.splitlines()
    try:
        header = orjson.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError("not a bundle")
        ((scope, value),) = header["scope"].items()
        if scope not in SCOPES:
            raise ValueError("unknown scope")
        checkpoint = Checkpoint.from_text(
            open_note(header["seal"].encode("utf-8"), origin, public_key)
        )
    except NoteError as error:
        return {"ok": False, "problem": error.kind, "message": error.message, "problems": []}
    except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as error:
        return {"ok": False, "problem": "malformed", "message": str(error), "problems": []}
    if checkpoint.origin != origin:
        return {
            "ok": False,
            "problem": "wrong_origin",
            "message": checkpoint.origin,
            "problems": [],
        }
    last = -1
    for number, line in enumerate(lines[1:], start=2):
        problem = _check_line(line, checkpoint, scope, value, last)
        if isinstance(problem, str):
            problems.append({"line": number, "problem": problem})
        else:
            last = problem
    if header.get("entries") != len(lines) - 1:
        problems.append({"line": 1, "problem": "the header's entry count does not match"})
    return {
        "ok": not problems,
        "problem": None if not problems else "bad_entry",
        "scope": {scope: value},
        "entries": len(lines) - 1,
        "size": checkpoint.size,
        "root": checkpoint.root.hex(),
        "problems": problems,
        "note": "proves each entry is in the sealed ledger, not that none was left out",
    }


def _check_line(
    line: bytes, checkpoint: Checkpoint, scope: str, value: str, last: int
) -> int | str:
    """The entry's seq when it holds, else what is wrong with it."""
    try:
        item = orjson.loads(line)
        seq, body, proof = item["seq"], item["body"], [bytes.fromhex(h) for h in item["proof"]]
        if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(body, str):
            return "malformed entry"
        recorded = orjson.loads(body)
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return "malformed entry"
    if seq <= last:
        return "entries out of order or repeated"
    row = recorded.get("row") if isinstance(recorded, dict) else None
    if not isinstance(row, dict) or recorded.get("table") != "cassette_actions":
        return "the entry is not an action"
    if row.get(scope) != value:
        return f"the entry is not an action of {scope} {value}"
    if not merkle.verify_inclusion(
        seq, checkpoint.size, merkle.leaf_hash(body.encode("utf-8")), proof, checkpoint.root
    ):
        return "the inclusion proof does not hold under the sealed root"
    return seq
