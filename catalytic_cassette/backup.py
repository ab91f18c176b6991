"""Backups that cannot lie: an online snapshot, verified, sealed beside it; a restore
that refuses a copy which fails verify or does not match its seal exactly.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import safe_files
from .anchor import load_anchors
from .backends import restore_by_copy, snapshot_replays_journal
from .connection import connect_readonly
from .errors import CassetteError, ErrorCode
from .ledger import snapshot_into
from .redaction import shown
from .seals import check_origin, require_ledger, write_seal_file
from .tree import StoredTree
from .verify import Progress, VerifyReport, verify_path

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from .clock import Clock

SEAL_BESIDE = ".seal"


def seal_path_for(backup: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(backup) + SEAL_BESIDE)


def _refuse_existing(path: Path) -> None:
    for candidate in (path, Path(f"{path}-wal"), seal_path_for(path)):
        if safe_files.lexists(candidate):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, f"{candidate} exists; a backup never overwrites"
            )
    if not path.parent.is_dir():
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"directory does not exist: {path.parent}")


def _copy(source: sqlite3.Connection, dest: Path) -> None:
    _export(lambda partial: snapshot_into(source, partial), dest)


def _export(fill: Callable[[Path], None], dest: Path) -> None:
    """A ledger file written by ``fill`` into a private directory, synced, then linked to
    DEST.

    SQLite opens files by name and follows links, so the copy is made in a directory
    created exclusively for it (mode 0700, a random name) beside DEST, where nobody
    else can plant a link; it is then linked to DEST, which fails if DEST exists.
    """
    try:
        made = tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        private = Path(made)
    except OSError as exc:
        raise safe_files.refusal(exc, dest.parent, "backup directory") from exc
    partial = private / "copy.db"
    try:
        fill(partial)
        with safe_files.open_regular(partial, what="backup", max_bytes=2**63 - 1) as (handle, _):
            os.fsync(handle.fileno())
        try:
            os.link(partial, dest)
        except OSError as exc:
            raise safe_files.refusal(exc, dest, "backup") from exc
        safe_files.fsync_directory(dest.parent)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _failed(report: VerifyReport, what: str) -> CassetteError:
    kinds = sorted({f.kind for f in report.findings if f.severity != "warning"})
    return CassetteError(
        ErrorCode.VERIFY_FAILED,
        f"{what}: {', '.join(kinds) or 'verify did not pass'}",
        findings=[f.__dict__ for f in report.findings[:20]],
    )


def backup(
    source_path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    private_key: Ed25519PrivateKey,
    *,
    origin: str | None = None,
    clock: Clock | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Snapshot ``source_path`` to ``dest``, verify the copy, seal it, write DEST.seal.

    ``progress`` is called with journal entries as the copy is verified (the long part).

    The seal is recorded in the source ledger (the copy stays byte-for-byte the
    snapshot) and its root checked against the copy's before the seal file is written.
    On any failure the copy and its seal are removed.
    """
    from .cassette import MessageCassette

    require_ledger(source_path)
    target = Path(dest)
    _refuse_existing(target)
    if origin is not None:
        check_origin(origin)
    seal_file = seal_path_for(target)
    created: list[Path] = []  # removed on failure: only what this call wrote
    # The backend is chosen here, by the open: a file is snapshotted with SQLite's backup,
    # a PostgreSQL ledger exported by a copy into a new file (one snapshot of its journal).
    source = MessageCassette(source_path, clock=clock)
    try:
        if snapshot_replays_journal(source_path):
            # The export below replays the journal, so the copy holds the journal's rows,
            # not a row changed behind its back: the copy's verify cannot see such a
            # change, the server's ledger must pass its own first (a SQLite snapshot is
            # the file's bytes, and its verify sees everything).
            found = verify_path(os.fspath(source_path), progress=progress)
            if not found.ok:
                raise _failed(found, "the ledger does not verify")
        _export(source.export_snapshot, target)
        created.append(target)
        report = verify_path(str(target), progress=progress)
        if not report.ok:
            raise _failed(report, "the copy does not verify")
        seal = source.seal(private_key, origin=origin, size=report.journal_rows)
        chosen = seal.origin
        # The verify above compared the copy's stored tree with a rebuild from its
        # bodies, so its stored root is the copy's true root: O(log n), no second pass.
        copy = connect_readonly(target)
        try:
            copy_root = StoredTree(copy).root(report.journal_rows)
        finally:
            copy.close()
        if copy_root != seal.root:
            raise CassetteError(
                ErrorCode.VERIFY_FAILED, "the copy's root is not the root its seal signed"
            )
        write_seal_file(seal, seal_file)
    except BaseException:
        for path in created:
            path.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    return {
        "backup": str(target),
        "seal": str(seal_file),
        "entries": report.journal_rows,
        "root": seal.root.hex(),
        "origin": chosen,
    }


def restore(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    public_key: Ed25519PublicKey,
    origin: str,
    *,
    seal: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Copy a backup to ``dest`` only if it verifies and is exactly what its seal signed:
    the pinned key signed it, under the pinned origin, at the backup's full size."""
    backup_path = Path(source)
    if not safe_files.lexists(backup_path):
        raise CassetteError(ErrorCode.NOT_FOUND, f"no such backup: {backup_path}")
    safe_files.require_regular(backup_path, what="backup")
    seal_file = Path(seal) if seal is not None else seal_path_for(backup_path)
    target = Path(dest)
    # restore never overwrites: a database must hold no journal entry yet (checked there)
    into_database = restore_by_copy(dest)
    if not into_database:
        if safe_files.lexists(target) or safe_files.lexists(f"{target}-wal"):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, f"{target} exists; restore never overwrites"
            )
        if not target.parent.is_dir():
            raise CassetteError(ErrorCode.CANNOT_OPEN, f"directory does not exist: {target.parent}")
    anchors = load_anchors(seal_file)
    report = verify_path(
        str(backup_path), anchors=anchors, seal_key=public_key, origin=origin, progress=progress
    )
    if report.unverifiable:
        error = _failed(report, "the backup's seal cannot be checked with this key and origin")
        error.detail["unverifiable"] = True
        raise error
    if not report.ok:
        raise _failed(report, "the backup fails verify")
    sealed = max(a.checkpoint.size for a in anchors if a.checkpoint is not None)
    if sealed != report.journal_rows:
        raise CassetteError(
            ErrorCode.VERIFY_FAILED,
            f"the backup has {report.journal_rows} entries, its seal {sealed}: it was changed",
        )
    if into_database:  # a PostgreSQL ledger is filled by a copy, through its own law
        from .copying import copy_ledger

        copy_ledger(str(backup_path), os.fspath(dest))
        return {
            "restored": shown(os.fspath(dest)),
            "entries": report.journal_rows,
            "origin": origin,
        }
    reader = connect_readonly(backup_path)
    try:
        _copy(reader, target)
    finally:
        reader.close()
    return {"restored": str(target), "entries": report.journal_rows, "origin": origin}
