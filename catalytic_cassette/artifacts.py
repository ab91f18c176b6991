"""Content-addressed artifact files beside the database, for large arguments and results.

A file is named by the SHA-256 of its bytes, written (and fsynced) before the row that
refers to it commits, and never overwritten. Where a file lives is derived only from
the hash, under the artifacts folder: the ``path`` a reference also records is never
used to find it, and nothing under the folder is followed if it is a link
(``safe_files``).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from . import payloads, safe_files
from .errors import CassetteError, ErrorCode

DEFAULT_THRESHOLD_BYTES = 64 * 1024
_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def default_root(db_path: str) -> Path:
    path = Path(db_path)
    return path.parent / f"{path.name}.artifacts"


def file_name(ref: dict[str, Any]) -> tuple[str, int]:
    """The file name and size a reference names: its hash as 64 lowercase hex digits,
    so it can name nothing outside the folder; anything else is INVALID_ARTIFACT."""
    digest, size = ref.get("sha256"), ref.get("size")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise CassetteError(ErrorCode.INVALID_ARTIFACT, f"not an artifact hash: {digest!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise CassetteError(ErrorCode.INVALID_ARTIFACT, f"not an artifact size: {size!r}")
    return digest, size


def check_file(dir_fd: int, ref: dict[str, Any], shown: Path) -> str | None:
    """Stream one artifact and compare it with its reference: None when it matches,
    else ``artifact_missing`` or ``artifact_altered`` (a link, FIFO or device in its
    place, another size, another hash). Never reads more than the declared size + 1."""
    try:
        name, size = file_name(ref)
    except CassetteError:
        return "artifact_altered"
    if size > safe_files.ARTIFACT_MAX_BYTES:
        return "artifact_altered"
    digest = hashlib.sha256()
    read = 0
    try:
        with safe_files.open_regular(name, what="artifact", max_bytes=size, dir_fd=dir_fd) as (
            handle,
            _,
        ):
            while read <= size:
                chunk = handle.read(min(_CHUNK, size + 1 - read))
                if not chunk:
                    break
                digest.update(chunk)
                read += len(chunk)
    except CassetteError as error:
        if error.code is ErrorCode.NOT_FOUND:
            return "artifact_missing"
        if error.code in (ErrorCode.UNSAFE_PATH, ErrorCode.FILE_TOO_LARGE):
            return "artifact_altered"
        raise  # unreadable: that is not evidence of tampering
    except OSError as error:
        raise safe_files.refusal(error, shown / name, "artifact") from error
    if read != size or digest.hexdigest() != name:
        return "artifact_altered"
    return None


class ArtifactStore:
    def __init__(self, root: Path, db_dir: Path) -> None:
        self.root = root
        self.db_dir = db_dir  # only to record the (informative) relative path

    def put(self, data: bytes) -> dict[str, Any]:
        """Store bytes under their SHA-256; return the reference kept in the row."""
        if len(data) > safe_files.ARTIFACT_MAX_BYTES:
            raise CassetteError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"a value of {len(data)} bytes is over the artifact limit"
                f" of {safe_files.ARTIFACT_MAX_BYTES}",
            )
        digest = hashlib.sha256(data).hexdigest()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise safe_files.refusal(exc, self.root, "artifacts folder") from exc
        with safe_files.open_directory(self.root, what="artifacts folder") as dir_fd:
            if not self._present(dir_fd, digest, len(data)):
                try:
                    safe_files.write_new_at(
                        dir_fd, digest, data, what="artifact", shown=self.root / digest
                    )
                except CassetteError as error:
                    # the same content stored meanwhile by another writer: fine if it is
                    if not error.detail.get("exists") or not self._present(
                        dir_fd, digest, len(data)
                    ):
                        raise
        return {"sha256": digest, "size": len(data), "path": self._relative(digest)}

    def _present(self, dir_fd: int, digest: str, size: int) -> bool:
        """An existing file of this name is kept only if it is a regular file of the
        right size: never rewritten, and never silently referenced if it is not ours."""
        try:
            seen = os.stat(digest, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise safe_files.refusal(exc, self.root / digest, "artifact") from exc
        if not stat.S_ISREG(seen.st_mode) or seen.st_size != size:
            raise CassetteError(
                ErrorCode.ARTIFACT_CORRUPT,
                f"artifact {self.root / digest} exists and is not the stored value",
            )
        return True

    def get(self, ref_json: str) -> Any:
        """The JSON value an artifact reference points to, checked against its hash."""
        ref = payloads.loads_object(ref_json, "an artifact reference")
        return payloads.loads(self.read_checked(ref), f"artifact {ref.get('sha256')}")

    def read_checked(self, ref: dict[str, Any]) -> bytes:
        name, size = file_name(ref)
        shown = self.root / name
        if size > safe_files.ARTIFACT_MAX_BYTES:
            raise CassetteError(ErrorCode.ARTIFACT_CORRUPT, f"artifact {shown}: size {size}")
        try:
            with safe_files.open_directory(self.root, what="artifacts folder") as dir_fd:
                data = safe_files.read_file(name, what="artifact", max_bytes=size, dir_fd=dir_fd)
        except CassetteError as error:
            if error.code is ErrorCode.NOT_FOUND:
                raise CassetteError(
                    ErrorCode.ARTIFACT_MISSING, f"artifact {shown} is missing"
                ) from error
            if error.code is ErrorCode.FILE_TOO_LARGE:
                raise CassetteError(
                    ErrorCode.ARTIFACT_CORRUPT, f"artifact {shown} was altered"
                ) from error
            raise
        if hashlib.sha256(data).hexdigest() != name or len(data) != size:
            raise CassetteError(ErrorCode.ARTIFACT_CORRUPT, f"artifact {shown} was altered")
        return data

    def _relative(self, digest: str) -> str:
        return os.path.relpath(Path(os.path.realpath(self.root)) / digest, self.db_dir)
