"""Content-addressed artifact files beside the database, for large arguments and results.

A file is named by the SHA-256 of its bytes, written (and fsynced) before the row that
refers to it commits, and never overwritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from . import payloads
from .errors import CassetteError, ErrorCode

DEFAULT_THRESHOLD_BYTES = 64 * 1024


def default_root(db_path: str) -> Path:
    path = Path(db_path)
    return path.parent / f"{path.name}.artifacts"


class ArtifactStore:
    def __init__(self, root: Path, db_dir: Path) -> None:
        self.root = root
        self.db_dir = db_dir

    def put(self, data: bytes) -> dict[str, Any]:
        """Store bytes under their SHA-256; return the reference kept in the row."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.root / digest
        if not target.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                with contextlib.suppress(FileExistsError):  # never overwrite
                    os.link(temp, target)
            finally:
                os.unlink(temp)
            _fsync_dir(self.root)
        return {"sha256": digest, "size": len(data), "path": self._relative(target)}

    def get(self, ref_json: str) -> Any:
        """The JSON value an artifact reference points to, checked against its hash."""
        ref: dict[str, Any] = payloads.loads(ref_json)
        return payloads.loads(self.read_checked(ref).decode("utf-8"))

    def read_checked(self, ref: dict[str, Any]) -> bytes:
        path = self.db_dir / ref["path"]
        try:
            data: bytes = path.read_bytes()
        except FileNotFoundError:
            raise CassetteError(
                ErrorCode.ARTIFACT_MISSING, f"artifact {ref['path']} is missing"
            ) from None
        if hashlib.sha256(data).hexdigest() != ref["sha256"] or len(data) != ref["size"]:
            raise CassetteError(ErrorCode.ARTIFACT_CORRUPT, f"artifact {ref['path']} was altered")
        return data

    def _relative(self, target: Path) -> str:
        return os.path.relpath(target, self.db_dir)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
