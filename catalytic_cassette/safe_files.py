"""Every file the package reads or writes outside the ledger goes through here.

Files are never trusted (LAW.md, "Files are never trusted"): whoever controls a seal,
proof, key or artifact path may put a symbolic link, a FIFO, a device or a huge file
there. So: the last path component is never followed when it is a link (O_NOFOLLOW),
only regular files are read (checked with fstat on the descriptor that is then read,
so the file cannot be swapped between the check and the read), every read has a size
cap checked on the stat *and* while reading, and writes go through a temporary
created exclusively in the target's directory, then linked into place without
replacing an existing name unless the caller asks for it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from .errors import CassetteError, ErrorCode

# Size caps per kind of file, in bytes.
SEAL_MAX_BYTES = 64 * 1024  # a checkpoint with at most 100 signature lines
SEAL_SUFFIX = ".seal"  # how a seal file is named, and found in a directory
KEY_MAX_BYTES = 64 * 1024  # a PEM key is a few hundred bytes
PROOF_MAX_BYTES = 64 * 1024 * 1024  # an entry body (a 16 MiB payload, escaped) and a path
ARTIFACT_MAX_BYTES = 1024 * 1024 * 1024  # the largest artifact stored or read
# An export bundle: its entries' bodies and proofs, read whole to be checked.
BUNDLE_MAX_BYTES = 1024 * 1024 * 1024
NO_CAP = 2**63 - 1  # a ledger or a backup: SQLite reads it by pages, never whole

PUBLIC_MODE = 0o644
PRIVATE_MODE = 0o600
_LOOSE_PRIVATE_BITS = 0o077  # group or other may do anything: ssh's UNPROTECTED PRIVATE KEY

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
PathLike = str | os.PathLike[str]


def refusal(exc: OSError, path: PathLike, what: str) -> CassetteError:
    """The stable code of an OSError met while opening, reading or writing ``path``."""
    name = os.fspath(path)
    if exc.errno == errno.ENOENT:
        return CassetteError(ErrorCode.NOT_FOUND, f"no such {what}: {name}", path=name)
    if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a symbolic link
        return _unsafe(name, what, "a symbolic link, never followed")
    if exc.errno == errno.EEXIST:
        return CassetteError(
            ErrorCode.INVALID_ARGUMENT, f"{name} exists; not overwritten", path=name, exists=True
        )
    return CassetteError(
        ErrorCode.CANNOT_OPEN, f"cannot use {what} {name}: {exc.strerror or exc}", path=name
    )


def _unsafe(name: str, what: str, found: str) -> CassetteError:
    return CassetteError(
        ErrorCode.UNSAFE_PATH, f"{what} {name} is {found}, not a regular file", path=name
    )


def _kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file, not a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link, never followed"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def lexists(path: PathLike, *, dir_fd: int | None = None) -> bool:
    """Whether anything, even a dangling link, has this name."""
    try:
        os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise refusal(exc, path, "file") from exc
    return True


def is_directory(path: PathLike) -> bool:
    """A real directory, not a link to one."""
    try:
        return stat.S_ISDIR(os.stat(path, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise refusal(exc, path, "directory") from exc


@contextmanager
def open_regular(
    path: PathLike,
    *,
    what: str,
    max_bytes: int,
    dir_fd: int | None = None,
    private: bool = False,
    follow_link: bool = False,
) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """A regular file opened for reading, and its fstat, or a coded refusal.

    The name is checked with lstat first so that a FIFO or device is never opened at
    all; the descriptor's own fstat then decides (it cannot be swapped afterwards).
    O_NONBLOCK keeps an open from waiting on a FIFO swapped in between; it is cleared
    before reading. ``private``: a key, refused when group or others may access it.
    ``follow_link`` only for the ledger itself, which SQLite opens through a link too.
    """
    name = os.fspath(path)
    try:
        seen = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_link)
    except OSError as exc:
        raise refusal(exc, name, what) from exc
    if not stat.S_ISREG(seen.st_mode):
        raise _unsafe(name, what, _kind_of(seen.st_mode))
    flags = _READ_FLAGS & ~os.O_NOFOLLOW if follow_link else _READ_FLAGS
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise refusal(exc, name, what) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _unsafe(name, what, _kind_of(info.st_mode))
        if private and info.st_mode & _LOOSE_PRIVATE_BITS:
            raise CassetteError(
                ErrorCode.KEY_PERMISSIONS,
                f"private key {name} has mode {stat.S_IMODE(info.st_mode):04o}: group or"
                " others may access it; allow only its owner (chmod 600)",
                path=name,
            )
        if info.st_size > max_bytes:
            raise _too_large(name, what, max_bytes)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle, info


def check_named(
    path: PathLike, *, what: str, max_bytes: int = NO_CAP, follow_link: bool = False
) -> os.stat_result:
    """What ``open_regular`` would refuse about a name, without opening it: not there, not
    a regular file (a link unless ``follow_link``, a FIFO, a device, a directory), over
    its cap, or not readable. The CLI asks this of every path on its command line before
    any work; the read itself checks again on its descriptor."""
    name = os.fspath(path)
    try:
        seen = os.stat(path, follow_symlinks=follow_link)
    except OSError as exc:
        raise refusal(exc, name, what) from exc
    if not stat.S_ISREG(seen.st_mode):
        raise _unsafe(name, what, _kind_of(seen.st_mode))
    if seen.st_size > max_bytes:
        raise _too_large(name, what, max_bytes)
    if not os.access(path, os.R_OK, follow_symlinks=follow_link):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"{what} {name} may not be read", path=name)
    return seen


def _a_real_directory(path: PathLike, name: str, what: str) -> None:
    """Refuse unless ``path`` itself (a link not followed) is a directory."""
    try:
        seen = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        raise refusal(exc, name, what) from exc
    if not stat.S_ISDIR(seen.st_mode):
        raise CassetteError(
            ErrorCode.UNSAFE_PATH, f"{what} {name} is {_kind_of(seen.st_mode)}", path=name
        )


def check_directory(path: PathLike, *, what: str) -> None:
    """A real directory (not a link to one) that may be listed, or a coded refusal."""
    name = os.fspath(path)
    _a_real_directory(path, name, what)
    if not os.access(path, os.R_OK | os.X_OK):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"{what} {name} may not be read", path=name)


def require_regular(path: PathLike, *, what: str) -> None:
    """Refuse a name that is not a regular file itself (a link, FIFO, device)
    before handing it to something that opens by name (SQLite)."""
    try:
        seen = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        raise refusal(exc, path, what) from exc
    if not stat.S_ISREG(seen.st_mode):
        raise _unsafe(os.fspath(path), what, _kind_of(seen.st_mode))


def _too_large(name: str, what: str, max_bytes: int) -> CassetteError:
    return CassetteError(
        ErrorCode.FILE_TOO_LARGE,
        f"{what} {name} is larger than {max_bytes} bytes",
        path=name,
        limit=max_bytes,
    )


def read_limited(handle: BinaryIO, name: str, what: str, max_bytes: int) -> bytes:
    """At most ``max_bytes`` from ``handle``: the file may grow after its fstat."""
    try:
        data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise refusal(exc, name, what) from exc
    if len(data) > max_bytes:
        raise _too_large(name, what, max_bytes)
    return data


def read_file(
    path: PathLike, *, what: str, max_bytes: int, dir_fd: int | None = None, private: bool = False
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see ``open_regular``)."""
    with open_regular(path, what=what, max_bytes=max_bytes, dir_fd=dir_fd, private=private) as (
        handle,
        _,
    ):
        return read_limited(handle, os.fspath(path), what, max_bytes)


@contextmanager
def open_directory(path: PathLike, *, what: str, follow: bool = False) -> Iterator[int]:
    """A descriptor of a directory; entries opened relative to it stay in it even if
    the path is renamed or replaced meanwhile.

    A directory named as such (a seal directory, the artifacts folder) must not be a
    link to one. ``follow``: the directory is only the parent of a named file, an
    intermediate path component, which is the caller's to choose.
    """
    name = os.fspath(path)
    if not follow:
        _a_real_directory(path, name, what)
    try:
        fd = os.open(path, _DIR_FLAGS if not follow else _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise CassetteError(
                ErrorCode.CANNOT_OPEN, f"directory does not exist: {name}", path=name
            ) from exc
        raise refusal(exc, name, what) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def list_directory(dir_fd: int, suffix: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Names ending in ``suffix`` in the directory, sorted, without following links:
    (regular files, [(name, what it is instead)])."""
    regular: list[str] = []
    other: list[tuple[str, str]] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if not entry.name.endswith(suffix):
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISREG(mode):
                regular.append(entry.name)
            else:
                other.append((entry.name, _kind_of(mode)))
    return sorted(regular), sorted(other)


def write_new(
    path: PathLike, data: bytes, *, what: str, private: bool = False, replace: bool = False
) -> None:
    """Write ``data`` to ``path`` whole or not at all, never through a link.

    The bytes go to a temporary created exclusively (O_EXCL, O_NOFOLLOW, a random name)
    in the same directory, are fsynced, then linked to the final name, which fails if
    anything has that name (unless ``replace``: then renamed over it; a link there is
    replaced, not followed). Keys are created mode 0600, the rest 0644 (less the umask).
    """
    from pathlib import Path  # (not at import: every ledger open imports this module)

    target = Path(path)
    with open_directory(target.parent, what="directory", follow=True) as dir_fd:
        write_new_at(
            dir_fd, target.name, data, what=what, private=private, replace=replace, shown=target
        )


def write_new_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    what: str,
    private: bool = False,
    replace: bool = False,
    shown: PathLike | None = None,
) -> None:
    """``write_new`` of the entry ``name`` of an open directory (``shown`` in messages)."""
    label = shown if shown is not None else name
    temp = _write_temporary(dir_fd, name, data, what, private, label)
    try:
        if replace:
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        raise refusal(exc, label, what) from exc
    finally:
        _remove_quietly(temp, dir_fd)
    _fsync(dir_fd, label, what)


def _write_temporary(
    dir_fd: int, name: str, data: bytes, what: str, private: bool, label: PathLike
) -> str:
    temp = f".{name}.{os.urandom(8).hex()}.partial"  # secrets.token_hex's own source
    mode = PRIVATE_MODE if private else PUBLIC_MODE
    try:
        fd = os.open(temp, _CREATE_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise refusal(exc, f"{os.fspath(label)} (temporary {temp})", what) from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        _remove_quietly(temp, dir_fd)
        raise refusal(exc, label, what) from exc
    return temp


def _remove_quietly(name: str, dir_fd: int) -> None:
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _fsync(fd: int, path: PathLike, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise refusal(exc, path, what) from exc


def fsync_directory(path: PathLike) -> None:
    """Make a directory's new names durable."""
    with open_directory(path, what="directory", follow=True) as fd:
        _fsync(fd, path, "directory")
