"""Worker keys: signed statements that prove which worker posted, claimed, released,
completed or requeued (LAW.md, "Worker keys").

Writing: ``sign_act`` signs the statement of an act (both backends); ``attest`` inserts
it into a SQLite ledger's ``cassette_attestations`` before the act's own row, in the
caller's transaction (on PostgreSQL, postgresql/cassette.py calls ``cassette_attest``);
the SQL then refuses to end a signed lease without its worker's attested act.
Checking: ``check_worker_keys`` rebuilds every statement from the rows it attests and
checks its signature against the keys pinned in a directory, one ``<worker_id>.pub``
per worker; it also names the entries of pinned workers that carry no attestation. It
reads a SQLite database: a ledger file, or verify's private copy of a PostgreSQL one.
The Ed25519 machinery (key files, key ids) is signing.py's.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from . import safe_files, signing
from .errors import CassetteError, ErrorCode, translate

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

STATEMENT_DOMAIN = b"catalytic-cassette/worker/v1\n"
ACTS = ("post", "claim", "release", "complete", "requeue")
PUBLIC_KEY_SUFFIX = ".pub"
MAX_PUBLIC_KEY_BYTES = 4096
MAX_WORKER_ID_LENGTH = 200


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """The signed bytes: the domain line, then the statement as sorted-key compact JSON."""
    return STATEMENT_DOMAIN + orjson.dumps(statement, option=orjson.OPT_SORT_KEYS)


def statement(
    act: str, *, ledger: str, run_id: str, worker_id: str, at: int, **fields: Any
) -> dict[str, Any]:
    """What a worker signs for one act: who, where (ledger and run), when, and the act's
    own fields (a step and token, or a message; see LAW.md for each act's fields)."""
    return {
        "act": act,
        "ledger": ledger,
        "run_id": run_id,
        "worker_id": worker_id,
        "at": at,
        **fields,
    }


@dataclass(frozen=True)
class WorkerKey:
    """A worker's identity and the private key that proves it."""

    worker_id: str
    private: Ed25519PrivateKey

    @classmethod
    def load(cls, worker_id: str, path: str | os.PathLike[str]) -> WorkerKey:
        if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= MAX_WORKER_ID_LENGTH:
            raise CassetteError(ErrorCode.INVALID_WORKER, "worker_id is a string of 1-200 chars")
        return cls(worker_id, signing.load_private(path))

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def key_id(self) -> str:
        return signing.key_id(self.public)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def ledger_id(conn: sqlite3.Connection) -> str:
    row = conn.execute("SELECT value FROM cassette_meta WHERE key = 'ledger_id'").fetchone()
    if row is None:
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the ledger has no ledger_id")
    return str(row[0])


def sign_act(
    key: WorkerKey,
    act: str,
    *,
    ledger: str,
    run_id: str,
    at: int,
    message_id: int | None = None,
    step_id: int | None = None,
    fencing_token: int | None = None,
    **fields: Any,
) -> str:
    """The act's statement signed by ``key``: the signature in base64, as stored.

    The signature is checked against the key's public half first (BAD_SIGNATURE), so a
    faulty signer cannot leave an attestation verify would reject. Both backends sign
    through here; only where the row goes differs.
    """
    named: dict[str, Any] = (
        {"message_id": message_id}
        if act == "post"
        else {"step_id": step_id, "fencing_token": fencing_token}
    )
    signed = statement_bytes(
        statement(
            act, ledger=ledger, run_id=run_id, worker_id=key.worker_id, at=at, **named, **fields
        )
    )
    signature = key.sign(signed)
    if not _valid(key.public, signature, signed):
        raise CassetteError(
            ErrorCode.BAD_SIGNATURE, f"the {act} statement's signature does not verify"
        )
    return base64.b64encode(signature).decode("ascii")


def attest(
    conn: sqlite3.Connection,
    key: WorkerKey,
    act: str,
    *,
    run_id: str,
    at: int,
    message_id: int | None = None,
    step_id: int | None = None,
    fencing_token: int | None = None,
    **fields: Any,
) -> None:
    """Sign the act's statement and record it, inside the caller's write transaction."""
    signature = sign_act(
        key,
        act,
        ledger=ledger_id(conn),
        run_id=run_id,
        at=at,
        message_id=message_id,
        step_id=step_id,
        fencing_token=fencing_token,
        **fields,
    )
    try:
        conn.execute(
            "INSERT INTO cassette_attestations (attestation_id, act, run_id, message_id,"
            " step_id, fencing_token, worker_id, key_id, signature, created_at)"
            " SELECT coalesce(max(attestation_id), 0) + 1, ?, ?, ?, ?, ?, ?, ?, ?, ?"
            " FROM cassette_attestations",
            (
                act,
                run_id,
                message_id,
                step_id,
                fencing_token,
                key.worker_id,
                key.key_id,
                signature,
                at,
            ),
        )
    except sqlite3.Error as exc:
        raise translate(exc) from exc


def _valid(public: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(signature, message)
    except InvalidSignature:
        return False
    return True


# ---------------------------------------------------------------------- checking


@dataclass(frozen=True)
class PinnedKey:
    worker_id: str
    public: Ed25519PublicKey
    key_id: str


def load_pinned_keys(directory: str | os.PathLike[str]) -> dict[str, PinnedKey]:
    """The keys pinned in DIR: every ``<worker_id>.pub`` (PEM) names its worker.

    Only regular files are read, never through a symbolic link, and at most 4 KiB each;
    anything else named ``*.pub``, or a DIR that is itself a link, is a KEY_ERROR.
    """
    path = Path(directory)
    if path.is_symlink() or not path.is_dir():
        raise CassetteError(ErrorCode.KEY_ERROR, f"{path} is not a directory of public keys")
    pinned: dict[str, PinnedKey] = {}
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.name.endswith(PUBLIC_KEY_SUFFIX):
                continue
            worker_id = entry.name[: -len(PUBLIC_KEY_SUFFIX)]
            if not 1 <= len(worker_id) <= MAX_WORKER_ID_LENGTH:
                raise CassetteError(ErrorCode.KEY_ERROR, f"{entry.path}: no worker id in the name")
            public = signing.public_from_pem(_read_regular(entry.path), entry.path)
            pinned[worker_id] = PinnedKey(worker_id, public, signing.key_id(public))
    if not pinned:
        raise CassetteError(ErrorCode.KEY_ERROR, f"{path} holds no *.pub worker key")
    return pinned


def _read_regular(path: str) -> bytes:
    """A pinned key's bytes through ``safe_files`` (a regular file, no link, capped)."""
    try:
        return safe_files.read_file(path, what="public key", max_bytes=MAX_PUBLIC_KEY_BYTES)
    except CassetteError as error:  # every reason a pinned key is unusable: KEY_ERROR
        raise CassetteError(ErrorCode.KEY_ERROR, error.message) from error


@dataclass(frozen=True)
class WorkerKeyFinding:
    kind: str  # unsigned_entry, unknown_key, foreign_key, bad_signature, attestation_mismatch
    table: str
    key: Any
    worker_id: str
    key_id: str | None
    detail: str


_ATTESTATIONS = (
    "SELECT attestation_id, act, run_id, message_id, step_id, fencing_token, worker_id,"
    " key_id, signature, created_at FROM cassette_attestations ORDER BY attestation_id"
)
# The LEASED revision of a step at a token: the claim, as the journal recorded it.
_CLAIMED = (
    "SELECT json_extract(body, '$.row.lease_owner'), json_extract(body, '$.row.run_id'),"
    " json_extract(body, '$.row.lease_expires_at') FROM cassette_journal"
    " WHERE tbl = 'cassette_steps' AND row_key = ?"
    " AND json_extract(body, '$.row.status') = 'LEASED'"
    " AND json_extract(body, '$.row.fencing_token') = ? ORDER BY seq LIMIT 1"
)


def check_worker_keys(
    conn: sqlite3.Connection, pinned: dict[str, PinnedKey]
) -> list[WorkerKeyFinding]:
    """Every attestation against the pinned keys and the rows it attests, then every
    claim, release, requeue and receipt of a pinned worker for its attestation."""
    findings: list[WorkerKeyFinding] = []
    ledger = ledger_id(conn)
    for row in conn.execute(_ATTESTATIONS).fetchall():
        found = _check_attestation(conn, ledger, pinned, *row)
        if found is not None:
            findings.append(found)
    findings.extend(_unsigned(conn, pinned))
    return findings


def _check_attestation(
    conn: sqlite3.Connection,
    ledger: str,
    pinned: dict[str, PinnedKey],
    attestation_id: int,
    act: str,
    run_id: str,
    message_id: int | None,
    step_id: int | None,
    token: int | None,
    worker_id: str,
    key_id: str,
    signature: str,
    created_at: int,
) -> WorkerKeyFinding | None:
    def finding(kind: str, detail: str) -> WorkerKeyFinding:
        return WorkerKeyFinding(
            kind, "cassette_attestations", attestation_id, worker_id, key_id, detail
        )

    pin = pinned.get(worker_id)
    if pin is None:
        return finding("unknown_key", f"no key is pinned for worker {worker_id!r}")
    if key_id != pin.key_id:
        return finding("foreign_key", f"signed by key {key_id}, not {worker_id!r}'s {pin.key_id}")
    fields = _attested_fields(conn, act, run_id, message_id, step_id, token, worker_id, created_at)
    if fields is None:
        return finding("attestation_mismatch", f"no {act} in the ledger matches this attestation")
    signed = statement_bytes(
        statement(act, ledger=ledger, run_id=run_id, worker_id=worker_id, at=created_at, **fields)
    )
    try:
        raw = base64.b64decode(signature, validate=True)
    except ValueError:
        raw = b""
    if not _valid(pin.public, raw, signed):
        return finding("bad_signature", f"the signature does not match the {act} it attests")
    return None


def _attested_fields(
    conn: sqlite3.Connection,
    act: str,
    run_id: str,
    message_id: int | None,
    step_id: int | None,
    token: int | None,
    worker_id: str,
    created_at: int,
) -> dict[str, Any] | None:
    """The act's own statement fields, read from the row the act wrote; None if none."""
    if act == "post":
        row = conn.execute(
            "SELECT source, idempotency_key, payload_json FROM cassette_messages"
            " WHERE message_id = ? AND run_id = ?",
            (message_id, run_id),
        ).fetchone()
        if row is None:
            return None
        return {
            "message_id": message_id,
            "source": row[0],
            "idempotency_key": row[1],
            "payload_sha256": sha256_text(row[2]),
        }
    named = {"step_id": step_id, "fencing_token": token}
    claimed = conn.execute(_CLAIMED, (step_id, token)).fetchone()
    if claimed is None or claimed[1] != run_id:
        return None
    owner, _, expires = claimed
    if act == "claim":
        return {**named, "lease_expires_at": expires} if owner == worker_id else None
    if act == "requeue":  # anyone may requeue, but only a lease that had expired
        return named if isinstance(expires, int) and expires <= created_at else None
    if act == "release":
        row = conn.execute(
            "SELECT 1 FROM cassette_releases WHERE step_id = ? AND fencing_token = ?"
            " AND worker_id = ? AND run_id = ?",
            (step_id, token, worker_id, run_id),
        ).fetchone()
        return named if row is not None else None
    if act == "complete":
        row = conn.execute(
            "SELECT outcome, receipt_json FROM cassette_receipts WHERE step_id = ?"
            " AND fencing_token = ? AND worker_id = ? AND run_id = ?",
            (step_id, token, worker_id, run_id),
        ).fetchone()
        if row is None:
            return None
        return {**named, "outcome": row[0], "receipt_sha256": sha256_text(row[1])}
    return None


def _attested(
    conn: sqlite3.Connection, act: str, step_id: int, token: int, worker_id: str | None
) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cassette_attestations WHERE step_id = ? AND fencing_token = ?"
        " AND act = ? AND (? IS NULL OR worker_id = ?) LIMIT 1",
        (step_id, token, act, worker_id, worker_id),
    ).fetchone()
    return row is not None


def _unsigned(conn: sqlite3.Connection, pinned: dict[str, PinnedKey]) -> list[WorkerKeyFinding]:
    """Entries a pinned worker made (or that ended its lease) without an attestation."""
    found: list[WorkerKeyFinding] = []

    def add(table: str, key: Any, worker: str, detail: str) -> None:
        found.append(WorkerKeyFinding("unsigned_entry", table, key, worker, None, detail))

    # Claims and requeues, from the journal: each LEASED or PENDING revision of a step
    # after its insert. A requeue is a PENDING revision; its lease's owner is the claim's.
    revisions = conn.execute(
        "SELECT row_key, json_extract(body, '$.row.status'),"
        " json_extract(body, '$.row.fencing_token'), json_extract(body, '$.row.lease_owner')"
        " FROM cassette_journal WHERE tbl = 'cassette_steps'"
        " AND json_extract(body, '$.op') = 'UPDATE'"
        " AND json_extract(body, '$.row.status') IN ('LEASED', 'PENDING') ORDER BY seq"
    ).fetchall()
    for step_id, status, token, owner in revisions:
        if status == "LEASED":
            if owner in pinned and not _attested(conn, "claim", step_id, token, owner):
                add("cassette_steps", step_id, owner, f"claim with token {token} is not signed")
            continue
        claimed = conn.execute(_CLAIMED, (step_id, token)).fetchone()
        holder = claimed[0] if claimed is not None else None
        released = conn.execute(
            "SELECT 1 FROM cassette_releases WHERE step_id = ? AND fencing_token = ?",
            (step_id, token),
        ).fetchone()
        if (
            holder in pinned
            and released is None
            and not _attested(conn, "requeue", step_id, token, None)
        ):
            add("cassette_steps", step_id, holder, f"requeue at token {token} is not signed")
    for release_id, step_id, token, worker in conn.execute(
        "SELECT release_id, step_id, fencing_token, worker_id FROM cassette_releases"
        " ORDER BY release_id"
    ).fetchall():
        if worker in pinned and not _attested(conn, "release", step_id, token, worker):
            add("cassette_releases", release_id, worker, "release is not signed")
    for receipt_id, step_id, token, worker, outcome in conn.execute(
        "SELECT receipt_id, step_id, fencing_token, worker_id, outcome FROM cassette_receipts"
        " ORDER BY receipt_id"
    ).fetchall():
        if worker not in pinned or _attested(conn, "complete", step_id, token, worker):
            continue
        if outcome == "ABORTED" and _attested(conn, "requeue", step_id, token, None):
            continue
        add("cassette_receipts", receipt_id, worker, "receipt is not signed")
    return found
