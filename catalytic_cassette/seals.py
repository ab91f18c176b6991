"""Seals: signed checkpoints of the journal's Merkle tree, recorded in the ledger and
written to files kept elsewhere (LAW.md, "Seals").

A seal of size n is a c2sp.org/tlog-checkpoint (origin, n, root of the first n entries)
in a c2sp.org/signed-note, signed with Ed25519 under the key name equal to the origin.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import safe_files, tree
from .connection import ledger_time, read_transaction, write_transaction
from .errors import CassetteError, ErrorCode
from .note import Checkpoint, sign_note
from .safe_files import SEAL_SUFFIX
from .targets import names_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from .verify.findings import Collector

ORIGIN_PREFIX = "catalytic-cassette/ledger/"
_ORIGIN = re.compile(r"[^\s+]{1,200}")
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Seal:
    seal_id: int
    tree_size: int
    root: bytes
    origin: str
    key_id: str
    note: bytes
    created_at: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "seal_id": self.seal_id,
            "tree_size": self.tree_size,
            "root": self.root.hex(),
            "origin": self.origin,
            "key_id": self.key_id,
            "note": self.note.decode("utf-8"),
            "created_at": self.created_at,
        }

    def file_name(self) -> str:
        return f"{_UNSAFE_IN_NAME.sub('_', self.origin)}-{self.tree_size:020d}{SEAL_SUFFIX}"


def check_origin(origin: str) -> str:
    """An origin doubles as the signing key's name: 1-200 characters, no space or '+'."""
    if not _ORIGIN.fullmatch(origin):
        raise CassetteError(
            ErrorCode.INVALID_SEAL,
            "an origin is 1-200 characters without whitespace or '+'",
            origin=origin,
        )
    return origin


def default_origin(conn: sqlite3.Connection) -> str:
    """``catalytic-cassette/ledger/<ledger_id>``: what this ledger calls itself."""
    row = conn.execute("SELECT value FROM cassette_meta WHERE key = 'ledger_id'").fetchone()
    if row is None:
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the ledger has no ledger_id")
    return ORIGIN_PREFIX + str(row[0])


def record_seal(
    conn: sqlite3.Connection,
    private_key: Ed25519PrivateKey,
    *,
    now_ms: int,
    origin: str | None,
    size: int | None = None,
    before_commit: Callable[[Seal], object] | None = None,
) -> Seal:
    """Sign the head (or the first ``size`` entries) and record it, in one transaction.

    The seal covers the entries before its own journal entry. The database checks
    that the sealed root is the root of the stored tree at that size.
    ``before_commit`` (writing the seal file) runs inside the transaction: if it
    raises, the seal is not recorded, so a refused ``cassette seal`` changes nothing.
    """
    from .note import ed25519_key_id

    ahead = _check_ahead(conn, private_key, origin, size)
    judged = _judge_ahead(conn, private_key, origin, size, now_ms)
    with write_transaction(conn):
        chosen = _origin(conn, origin)
        have = tree.size(conn)
        size = have if size is None else size
        if size == 0:
            raise CassetteError(ErrorCode.INVALID_SEAL, "the ledger is empty: nothing to seal")
        if not 0 < size <= have:
            raise CassetteError(
                ErrorCode.INVALID_SEAL, f"cannot seal {size} entries of a ledger of {have}"
            )
        tree.heal(conn)  # what a connection kept from being stored (LAW.md section 8a)
        root = _checked_root(conn, private_key, chosen, size, ahead)
        now_ms = max(now_ms, ledger_time(conn))
        checked = _checkpoint(conn, tree.StoredTree(conn), private_key, chosen, size)
        if judged is not None and checked <= judged <= size:
            checked = judged  # (lawful up to there, judged before the lock)
        require_lawful(_judged_since(conn, checked, size, now_ms), checked)
        note = sign_note(Checkpoint(chosen, size, root).to_text(), chosen, private_key)
        key_id = ed25519_key_id(chosen, private_key.public_key()).hex()
        seal_id = int(
            conn.execute("SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals").fetchone()[0]
        )
        conn.execute(
            "INSERT INTO cassette_seals (seal_id, tree_size, root_hex, origin, key_id, note,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (seal_id, size, root.hex(), chosen, key_id, note.decode("utf-8"), now_ms),
        )
        sealed = Seal(seal_id, size, root, chosen, key_id, note, now_ms)
        if before_commit is not None:
            before_commit(sealed)
    return sealed


def _judged_since(conn: sqlite3.Connection, start: int, size: int, now_ms: int) -> Collector:
    """What verify's history check finds in the entries ``start <= seq < size``."""
    from .verify.findings import Collector
    from .verify.history import check_since
    from .verify.options import VerifyOptions

    found = Collector()
    check_since(conn, found, start, size, now_ms, VerifyOptions().clock_skew_ms)
    return found


def require_lawful(found: Collector, checked_from: int) -> None:
    """UNLAWFUL_HISTORY (nothing signed) when verify's history check (``verify/history.py``)
    found anything: a seal signs only a history every revision of which the law allows."""
    findings = found.report.findings
    if not findings and not found.report.suppressed:
        return
    first = f" (entry {findings[0].seq}: {findings[0].detail})" if findings else ""
    raise CassetteError(
        ErrorCode.UNLAWFUL_HISTORY,
        f"the history since the last seal is not lawful{first}: nothing was signed;"
        " `cassette verify` names every unlawful revision",
        checked_from=checked_from,
        findings=[f.to_dict() for f in findings[:10]],
    )


RESTORE_ADVICE = (
    "nothing was signed. Stored tree nodes are append-only, so no package call can repair"
    " them: restore the ledger from a backup that verifies (cassette restore), then"
    " re-apply what was written after that backup; `cassette verify` names every broken entry"
    " and node"
)


# A walk longer than this many entries (8 walk blocks) is done before the seal takes the
# write lock (in a read snapshot, other writers going on), and only what follows it inside.
AHEAD_MIN_ENTRIES = 8 * 4096


def _check_ahead(
    conn: sqlite3.Connection, private_key: Ed25519PrivateKey, origin: str | None, size: int | None
) -> tuple[int, bytes] | None:
    """Before the write lock: when the walk from the key's checkpoint would be long, walk
    it in a read snapshot up to the last walk block (``TreeWalk.BLOCK``) of the size to
    seal, and return that size with the root recomputed from the bodies; None otherwise.
    A first seal of a large ledger so holds the lock for at most one block and what was
    written since (``_checked_root`` takes this pair as a checkpoint once the stored tree
    still gives its root). TREE_BROKEN if the walk finds the tree is not the bodies'."""
    with read_transaction(conn):
        chosen = _origin(conn, origin)
        have = tree.size(conn)
        sealing = have if size is None else size
        if not 0 < sealing <= have or tree.missing_nodes(conn, have):
            return None  # refused, or healed, under the lock
        target = _walk_start(sealing)
        stored = tree.StoredTree(conn)
        start = _walk_start(_checkpoint(conn, stored, private_key, chosen, sealing))
        if target - start < AHEAD_MIN_ENTRIES:
            return None
        recomputed = _walk(conn, stored, start, target)
    return target, recomputed


def _judge_ahead(
    conn: sqlite3.Connection,
    private_key: Ed25519PrivateKey,
    origin: str | None,
    size: int | None,
    now_ms: int,
) -> int | None:
    """Before the write lock: when the history to judge since the key's checkpoint is
    long, judge it in a read snapshot (other writers going on) and return the size judged
    lawful up to (UNLAWFUL_HISTORY otherwise); None when it is short. The entries below it
    never change, so the seal then judges only what follows, under the lock."""
    with read_transaction(conn):
        chosen = _origin(conn, origin)
        have = tree.size(conn)
        sealing = have if size is None else size
        if not 0 < sealing <= have:
            return None  # refused under the lock, with its reason
        start = _checkpoint(conn, tree.StoredTree(conn), private_key, chosen, sealing)
        if sealing - start < AHEAD_MIN_ENTRIES:
            return None
        require_lawful(_judged_since(conn, start, sealing, now_ms), start)
    return sealing


def _origin(conn: sqlite3.Connection, origin: str | None) -> str:
    return check_origin(origin if origin is not None else default_origin(conn))


def _walk_start(entries: int) -> int:
    """The last boundary of verify's walk blocks (``TreeWalk.BLOCK``) at or before it."""
    from .verify.chain import TreeWalk

    return entries - entries % TreeWalk.BLOCK


def _walk(conn: sqlite3.Connection, stored: tree.StoredTree, start: int, size: int) -> bytes:
    """The root of the first ``size`` entries recomputed from the bodies from ``start`` on
    (the stored nodes before it taken as checked), after every entry and stored node the
    walk reaches was found as the bodies make them; TREE_BROKEN otherwise."""
    from .verify.chain import check_tree_from

    edge = [
        (level, stored.subtree(level, (start >> (level + 1)) << 1))
        for level in range(start.bit_length() - 1, -1, -1)
        if start >> level & 1
    ]
    found, recomputed = check_tree_from(conn, start, size, edge)
    root = stored.root(size)
    findings = found.report.findings
    # (size == start only when the checkpoint is this very size: its root was just checked)
    if findings or (size > start and recomputed != root):
        first = findings[0].detail if findings else "the stored root is not the bodies' root"
        raise CassetteError(
            ErrorCode.TREE_BROKEN,
            f"the stored tree is not the hash of the journal's entries ({first}): "
            + RESTORE_ADVICE,
            size=size,
            checked_from=start,
            findings=[f.to_dict() for f in findings[:10]],  # verify names them all
        )
    return root


def _checked_root(
    conn: sqlite3.Connection,
    private_key: Ed25519PrivateKey,
    origin: str,
    size: int,
    ahead: tuple[int, bytes] | None = None,
) -> bytes:
    """The stored tree's root of the first ``size`` entries, once what it reads is checked
    against the journal's bodies (LAW.md section 12 (b)); TREE_BROKEN otherwise.

    The stored nodes up to the newest checkpoint of at most ``size`` entries are taken as
    checked: a seal of this ledger that this key signed for this origin, whose root the
    stored tree still gives (a seal row alone is no checkpoint: anyone whose functions
    satisfy the seal guard can insert one, but only the key's holder can sign it, and the
    package signs only what it checked), or ``ahead``, the size and root that
    ``_check_ahead`` recomputed from the bodies before the lock, if the stored tree still
    gives that root (the stored nodes the edge below reads are the ones that root reads).
    From that checkpoint's last ``TreeWalk.BLOCK`` boundary on, every entry up to ``size``
    and every stored node of the complete blocks there are recomputed from the bodies by
    verify's own walk: ``O(size - checkpoint + 4096)`` hashes, or the whole journal when
    there is no checkpoint."""
    stored = tree.StoredTree(conn)
    checked = _checkpoint(conn, stored, private_key, origin, size)
    if ahead is not None and checked < ahead[0] <= size:
        if stored.root(ahead[0]) != ahead[1]:
            raise CassetteError(
                ErrorCode.TREE_BROKEN,
                f"the stored tree changed while its first {ahead[0]} entries were checked: "
                + RESTORE_ADVICE,
                size=size,
                checked_from=0,
            )
        checked = ahead[0]
    return _walk(conn, stored, _walk_start(checked), size)


def _checkpoint(
    conn: sqlite3.Connection,
    stored: tree.StoredTree,
    private_key: Ed25519PrivateKey,
    origin: str,
    size: int,
) -> int:
    """The size of the largest checkpoint of at most ``size`` entries (see
    ``_checked_root``), 0 if none. A seal row whose note this key did not sign is passed
    over whatever its columns say; a signed root that the stored tree no longer gives is
    TREE_BROKEN (the tree changed under a seal this key signed)."""
    from .note import Checkpoint, NoteError, ed25519_key_id, open_note

    public = private_key.public_key()
    rows = conn.execute(
        "SELECT CAST(note AS BLOB) FROM cassette_seals"  # (bytes: any text, even not UTF-8)
        " WHERE key_id = ? AND origin = ? AND tree_size <= ?"
        " ORDER BY tree_size DESC, seal_id DESC",
        (ed25519_key_id(origin, public).hex(), origin, size),
    )
    for (note,) in rows:
        if not isinstance(note, bytes):
            continue
        try:
            signed = Checkpoint.from_text(open_note(bytes(note), origin, public))
        except NoteError:
            continue  # not this key's signature: no checkpoint
        if signed.origin != origin or not 0 < signed.size <= size:
            continue
        if stored.root(signed.size) != signed.root:
            raise CassetteError(
                ErrorCode.TREE_BROKEN,
                f"the stored tree no longer gives the root this key signed at size"
                f" {signed.size}: " + RESTORE_ADVICE,
                size=size,
                sealed_size=signed.size,
            )
        return signed.size
    return 0


def require_ledger(path: str | os.PathLike[str]) -> None:
    """Sealing or backing up a file that does not exist must not create it. (A
    PostgreSQL URL names a database, whose ledger the open checks.)"""
    if not names_file(path):
        return
    if os.fspath(path) != ":memory:" and not Path(path).is_file():
        raise CassetteError(ErrorCode.NOT_FOUND, f"no such ledger: {os.fspath(path)}")


def latest_seal(conn: sqlite3.Connection) -> Seal | None:
    row = conn.execute(
        "SELECT seal_id, tree_size, root_hex, origin, key_id, note, created_at"
        " FROM cassette_seals ORDER BY seal_id DESC LIMIT 1"
    ).fetchone()
    return None if row is None else seal_of_row(tuple(row))


def seal_of_row(row: tuple[Any, ...]) -> Seal:
    """A cassette_seals row (seal_id, tree_size, root_hex, origin, key_id, note,
    created_at), of either backend."""
    return Seal(
        int(row[0]),
        int(row[1]),
        bytes.fromhex(row[2]),
        str(row[3]),
        str(row[4]),
        str(row[5]).encode("utf-8"),
        int(row[6]),
    )


def write_seal_file(seal: Seal, out: str | os.PathLike[str]) -> Path:
    """Write the seal's note to ``out`` (a file, or a real directory to put it in).

    Never overwrites a different seal: the same seal again is a no-op (Ed25519
    signatures are deterministic), anything else at the path is refused, and so is a
    link, FIFO or device there (``safe_files``: written through an exclusive temporary).
    """
    target = Path(out)
    if safe_files.is_directory(target):
        target = target / seal.file_name()
    if safe_files.lexists(target):
        return _same_seal_or_refuse(seal, target)
    try:
        safe_files.write_new(target, seal.note, what="seal file")
    except CassetteError as error:
        if not error.detail.get("exists"):
            raise
        return _same_seal_or_refuse(seal, target)  # written meanwhile by someone else
    return target


def _same_seal_or_refuse(seal: Seal, target: Path) -> Path:
    held = safe_files.read_file(target, what="seal file", max_bytes=safe_files.SEAL_MAX_BYTES)
    if held != seal.note:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT, f"{target} exists and holds another seal; not overwritten"
        )
    return target


class SealedLedger(Protocol):
    """What an automatic seal needs of an open ledger, on either backend (``LedgerFile``,
    ``postgresql.ledger.PgLedger``)."""

    def journal_size(self) -> int: ...

    def latest_seal(self) -> Seal | None: ...

    def seal(
        self,
        private_key: Ed25519PrivateKey,
        *,
        origin: str | None = None,
        size: int | None = None,
        before_commit: Callable[[Seal], object] | None = None,
    ) -> Seal: ...


class AutoSeal:
    """Seal every ``every`` journal entries, and on close, into ``directory``.

    A seal never seals only the previous seal's own journal entry, so closing right
    after an automatic seal writes nothing new. The ledger calls ``after_write`` once a
    write committed and ``at_close`` when it is closed.
    """

    def __init__(
        self,
        key: Ed25519PrivateKey | str | os.PathLike[str],
        directory: str | os.PathLike[str],
        *,
        every: int = 10_000,
        origin: str | None = None,
    ) -> None:
        from .signing import load_private

        if every < 1:
            raise CassetteError(ErrorCode.INVALID_ARGUMENT, "seal every N entries needs N >= 1")
        self.key = load_private(key) if isinstance(key, (str, os.PathLike)) else key
        self.directory = Path(directory)
        if not safe_files.is_directory(self.directory):
            raise CassetteError(
                ErrorCode.CANNOT_OPEN,
                f"seal directory does not exist or is a link: {self.directory}",
            )
        self.every = every
        self.origin = origin
        self._sealed: int | None = None  # journal size when the last seal was recorded

    def _last_sealed(self, ledger: SealedLedger) -> int:
        if self._sealed is None:
            last = ledger.latest_seal()
            self._sealed = 0 if last is None else last.tree_size + 1
        return self._sealed

    def after_write(self, ledger: SealedLedger) -> Seal | None:
        if ledger.journal_size() - self._last_sealed(ledger) < self.every:
            return None
        return self.seal(ledger)

    def at_close(self, ledger: SealedLedger) -> Seal | None:
        if ledger.journal_size() <= self._last_sealed(ledger):
            return None
        return self.seal(ledger)

    def seal(self, ledger: SealedLedger) -> Seal:
        seal = ledger.seal(self.key, origin=self.origin)
        self._sealed = seal.tree_size + 1
        write_seal_file(seal, self.directory)
        return seal
