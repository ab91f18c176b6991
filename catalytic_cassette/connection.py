"""Open a cassette file: settings, SQL functions, migrations, TEMP triggers."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from . import safe_files, sqlfiles
from .clock import Clock, SystemClock
from .errors import CassetteError, ErrorCode, translate
from .hashing import sha256_hex, sql_functions
from .migrate import apply_pending, current_version, schema_version
from .targets import require_file
from .temp_objects import TempSchema, refuse_foreign

SQLITE_HEADER = b"SQLite format 3\x00"
DURABILITY_ENV = "CASSETTE_DURABILITY"
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
DEFAULT_BUSY_TIMEOUT_MS = 10_000
# A writer copies the WAL back into the file once the WAL holds this many pages (SQLite's
# default is 1,000). Each copy writes every page changed since the last one once, however
# often it changed, and a ledger commit rewrites the same few B-tree tails and index pages,
# so fewer, larger checkpoints write less (docs/BENCHMARKS.md, "Issue 12"). Under
# durability normal it widens what a power loss may take (the commits since the last
# checkpoint); the WAL grows to about 16 MiB at 4 KiB pages (LAW.md, section 9).
WAL_AUTOCHECKPOINT_PAGES = 4_000
_NO_CAP = 2**63 - 1  # only the header of a ledger is read here
# SQLite result codes (and their extended forms) that say the file cannot be read now
# (locked, not permitted, an I/O failure), not that its pages or format are damaged.
_CANNOT_READ = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_CANTOPEN",
    "SQLITE_READONLY",
    "SQLITE_PERM",
    "SQLITE_AUTH",
    "SQLITE_IOERR",
    "SQLITE_NOMEM",
    "SQLITE_FULL",
    "SQLITE_NOLFS",
    "SQLITE_PROTOCOL",
    "SQLITE_INTERRUPT",
)


def resolve_durability(durability: str | None) -> str:
    value = (durability or os.environ.get(DURABILITY_ENV) or "full").lower()
    if value not in _SYNCHRONOUS:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT, f"durability must be 'full' or 'normal', not {value!r}"
        )
    return value


def _check_file(path: str) -> None:
    if path == ":memory:":
        return
    require_file(path)  # every SQLite open passes here: a URL is not a file
    # (os.path, not pathlib, here and below: pathlib's import would cost every open)
    # as pathlib reads it: "dir/" names dir, "" the current directory
    target = path.rstrip("/") or ("/" if path else ".")
    parent = os.path.dirname(target) or "."
    if not os.path.isdir(parent):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"directory does not exist: {parent}")
    if os.path.isdir(target):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"is a directory: {target}")
    if safe_files.lexists(target):
        # SQLite follows a link to the ledger itself, so the header check does too; a
        # FIFO or device there is refused without blocking (safe_files).
        with safe_files.open_regular(
            target, what="ledger", max_bytes=_NO_CAP, follow_link=True
        ) as (handle, _):
            try:
                header = handle.read(len(SQLITE_HEADER))
            except OSError as exc:
                raise safe_files.refusal(exc, path, "ledger") from exc
        if header and header != SQLITE_HEADER:
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"not a SQLite database: {target}")
    elif not os.access(parent, os.W_OK):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"directory is not writable: {parent}")


class TransactionTime:
    """The time of the write transaction under way on one connection: the later of the
    writer's clock and the ledger's latest time, read by the transaction's first
    ``ledger_now`` (every write of the package dates its transaction before it writes)
    and kept until ``write_transaction`` ends; the TEMP clock guards read it through
    ``cassette_transaction_ms()``. Before that, or for SQL run directly on a package
    connection, it is the writer's clock (LAW.md section 9a)."""

    __slots__ = ("clock", "ms", "writing")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ms: int | None = None
        self.writing = False  # inside write_transaction: only there is the time kept

    def __call__(self) -> int:
        return self.clock.now_ms() if self.ms is None else self.ms


class CassetteConnection(sqlite3.Connection):
    """A connection whose parameters cannot escape as Python errors.

    sqlite3 raises UnicodeEncodeError for a str holding a lone surrogate (undecodable
    bytes of a command-line argument), OverflowError for an int outside 64 bits and
    ProgrammingError for an unsupported type, before SQLite sees the statement; each
    becomes INVALID_ARGUMENT here, once, for every query of the package.
    """

    transaction_time: TransactionTime | None = None
    temp_schema: TempSchema | None = None  # what the package installed: the only TEMP objects
    # Opened with lazy_temp_triggers: the TEMP triggers not installed yet, by the table
    # they are ON (``install_temp_triggers``); None once there are none left.
    temp_triggers_pending: dict[str, list[str]] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except (UnicodeEncodeError, OverflowError, sqlite3.ProgrammingError) as exc:
            raise _bad_parameter(exc) from exc

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except (UnicodeEncodeError, OverflowError, sqlite3.ProgrammingError) as exc:
            raise _bad_parameter(exc) from exc


def _bad_parameter(exc: Exception) -> Exception:
    if isinstance(exc, sqlite3.ProgrammingError) and "binding parameter" not in str(exc):
        return exc  # misuse of the connection, not a bad value: not a refusal
    if isinstance(exc, UnicodeEncodeError):
        return CassetteError(ErrorCode.INVALID_ARGUMENT, "an argument is not valid UTF-8 text")
    if isinstance(exc, OverflowError):
        return CassetteError(ErrorCode.INVALID_ARGUMENT, "an integer is outside 64 bits")
    return CassetteError(ErrorCode.INVALID_ARGUMENT, f"an argument has an unsupported type: {exc}")


class _SubtreeHash:
    """``merkle.SubtreeHash``, whose module is imported when SQL first calls the
    aggregate (a seal guard), not by every connection."""

    def __new__(cls) -> Any:
        from .merkle import SubtreeHash

        return SubtreeHash()


def register_functions(conn: sqlite3.Connection, clock: Clock) -> None:
    conn.create_function("cassette_now_ms", 0, clock.now_ms)
    pinned = TransactionTime(clock)
    if isinstance(conn, CassetteConnection):
        conn.transaction_time = pinned
    conn.create_function("cassette_transaction_ms", 0, pinned)
    for name, (arity, function) in sql_functions().items():
        conn.create_function(name, arity, function, deterministic=True)
    conn.create_function("cassette_sha256_hex", 1, sha256_hex, deterministic=True)
    conn.create_aggregate("cassette_subtree_hash", 2, _SubtreeHash)


def connect(
    path: str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    durability: str | None = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    migrate: bool = True,
    new_ledger_id: str | None = None,
    lazy_temp_triggers: bool = False,
) -> sqlite3.Connection:
    """Open (creating if needed) a cassette for reading and writing. A ledger created by
    this call takes ``new_ledger_id`` (32 hex digits) when given: a copy's, its source's.

    ``lazy_temp_triggers`` installs no TEMP trigger here: each write transaction installs
    those ON the tables it names, or all that are left when it names none
    (``install_temp_triggers``). Compiling the 15 triggers costs a one-shot command about
    2 ms, and a claim needs 2 of them. A write to a table whose TEMP triggers are absent
    (raw SQL on the connection) is refused by the file's own rules, JOURNAL_REQUIRED, as
    on a connection without the package (LAW.md section 9)."""
    path = os.fspath(path)
    sync = _SYNCHRONOUS[resolve_durability(durability)]
    _check_file(path)
    clock = clock or SystemClock()
    try:
        conn = sqlite3.connect(
            path,
            isolation_level=None,
            timeout=busy_timeout_ms / 1000,
            factory=CassetteConnection,
        )
    except sqlite3.Error as exc:
        raise translate(exc) from exc
    try:
        # Every PRAGMA is read to the end, so no statement is left open.
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}").fetchall()
        version = schema_version(conn)
        conn.execute(f"PRAGMA synchronous = {sync}").fetchall()
        conn.execute("PRAGMA foreign_keys = ON").fetchall()
        conn.execute("PRAGMA recursive_triggers = ON").fetchall()
        register_functions(conn, clock)
        latest = current_version()
        if version > latest:
            raise CassetteError(
                ErrorCode.SCHEMA_TOO_NEW,
                f"schema version {version} is newer than this package ({latest}); upgrade it",
                schema_version=version,
                supported=latest,
            )
        if version < latest:
            if not migrate:
                raise CassetteError(
                    ErrorCode.SCHEMA_OUTDATED,
                    f"schema version {version} needs migrations up to {latest}",
                    schema_version=version,
                    supported=latest,
                )
            if version == 0 and new_ledger_id is not None:
                _name_the_new_ledger(conn, new_ledger_id)
            apply_pending(conn)
            conn.create_function("randomblob", 1, None)  # the built-in again
        # After migrating, so that a failed migration leaves even the header unchanged.
        if path != ":memory:":
            _use_wal(conn, busy_timeout_ms)
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}").fetchall()
        if lazy_temp_triggers and isinstance(conn, CassetteConnection):
            conn.temp_triggers_pending = temp_triggers_by_table(sqlfiles.connection_statements())
        else:
            for statement in sqlfiles.connection_statements():
                conn.execute(statement)
        conn.temp_schema = TempSchema(conn)
    except CassetteError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise translate(exc) from exc
    return conn


def temp_triggers_by_table(statements: tuple[str, ...]) -> dict[str, list[str]]:
    """The TEMP triggers' statements grouped by the table each is ON, in their order (a
    table's triggers fire in the order they were created)."""
    grouped: dict[str, list[str]] = {}
    for statement in statements:
        on = _TRIGGER_ON.search(statement)
        if on is None:
            raise RuntimeError(f"a connection statement on no table: {statement[:80]!r}")
        grouped.setdefault(on.group(1), []).append(statement)
    return grouped


# (a statement may begin with its comment)
_TRIGGER_ON = re.compile(r"^CREATE TEMP TRIGGER \w+ [^\n]*?\bON main\.(\w+)\b", re.MULTILINE)


def install_temp_triggers(conn: sqlite3.Connection, tables: Iterable[str] | None) -> None:
    """Install the pending TEMP triggers ON ``tables`` (all pending ones for None) on a
    connection opened with ``lazy_temp_triggers``, after checking that its TEMP schema is
    still the one the package installed; they then belong to what the check expects."""
    installed = getattr(conn, "temp_schema", None)
    if installed is None:
        return  # not a package connection
    refuse_foreign(conn, installed)
    pending = getattr(conn, "temp_triggers_pending", None)
    if not pending:
        return
    chosen = list(pending) if tables is None else [t for t in tables if t in pending]
    if not chosen:
        return
    try:
        for table in chosen:
            for statement in pending[table]:
                conn.execute(statement)
            del pending[table]
    except sqlite3.Error as exc:
        raise translate(exc) from exc
    finally:
        installed.taken(conn)  # what is installed now, even after a failure half-way
    if not pending and isinstance(conn, CassetteConnection):
        conn.temp_triggers_pending = None


def _name_the_new_ledger(conn: sqlite3.Connection, ledger_id: str) -> None:
    """The baseline names a new ledger with ``randomblob(16)``; during this connection's
    migrations that call returns ``ledger_id`` instead (SQLite looks an application
    function up before its own built-in; ``connect`` removes it after migrating)."""
    chosen = bytes.fromhex(ledger_id)
    if len(chosen) != 16 or chosen.hex() != ledger_id:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "a ledger_id is 32 lowercase hex digits")
    conn.create_function("randomblob", 1, lambda n: chosen if n == 16 else os.urandom(n))


def _use_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Switch the file to WAL unless it is already.

    While another connection holds the write lock of a file still in rollback mode (two
    processes opening a new ledger at once), SQLite answers the switch with BUSY without
    calling the busy handler; so wait here, up to the busy timeout, as for any lock.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchall()[0][0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if translate(exc).code is not ErrorCode.BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def connect_readonly(
    path: str | os.PathLike[str], *, any_thread: bool = False, busy_timeout_ms: int | None = None
) -> sqlite3.Connection:
    """Open an existing SQLite file for reading only: no migration, no TEMP triggers.

    The caller checks what the file holds (``migrate.schema_version``). ``any_thread``
    lets another thread use the connection (one thread at a time). A first read waits
    up to the busy timeout for a writer holding the file exclusively, then refuses with
    BUSY; in a read-only directory, where SQLite cannot create the WAL index, the file
    is opened ``immutable`` when no -wal file exists (nobody can write it there), and
    refused (CANNOT_OPEN) when one does. A damaged file is returned as it is: reading
    it raises, and the caller reports the damage.
    """
    path = os.fspath(path)
    _check_file(path)
    if not os.path.exists(path):
        raise CassetteError(ErrorCode.CANNOT_OPEN, f"no such file: {path}")
    timeout = DEFAULT_BUSY_TIMEOUT_MS if busy_timeout_ms is None else busy_timeout_ms
    uri = _file_uri(os.path.realpath(path))
    conn = _open_readonly(uri + "?mode=ro", any_thread, timeout)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except UnicodeDecodeError:
        return conn  # damage (a mangled message from SQLite): as below
    except sqlite3.Error as exc:
        error = cannot_read(exc)
        if error is None:
            return conn  # damage: the caller's own reads meet it and report it
        conn.close()
        if not _only_the_directory_is_read_only(path, exc):
            raise error from exc
        return _open_readonly(uri + "?mode=ro&immutable=1", any_thread, timeout)
    return conn


_URI_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/")


def _file_uri(absolute: str) -> str:
    """``pathlib.Path(absolute).as_uri()``: file:// and the path's bytes, each one
    percent-encoded but the unreserved ones and "/" (as urllib's quote_from_bytes)."""
    encoded = os.fsencode(absolute)
    return "file://" + "".join(chr(b) if b in _URI_SAFE else f"%{b:02X}" for b in encoded)


def _open_readonly(uri: str, any_thread: bool, timeout_ms: int) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(
            uri,
            uri=True,
            isolation_level=None,
            check_same_thread=not any_thread,
            timeout=timeout_ms / 1000,
            factory=CassetteConnection,
        )
    except sqlite3.Error as exc:
        raise translate(exc) from exc
    conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}").fetchall()
    return conn


def ledger_time(conn: sqlite3.Connection) -> int:
    """The latest time the ledger has recorded (0 for an empty ledger)."""
    return int(conn.execute("SELECT ms FROM cassette_ledger_time").fetchone()[0])


def ledger_now(conn: sqlite3.Connection, clock: Clock) -> int:
    """The time to date a write with: the later of the clock and the ledger's latest time.

    Read inside the write transaction, so it is never earlier than anything committed;
    someone else's future date is carried forward instead of refusing the honest writer.
    The first call inside a write transaction fixes it for the rest of that transaction,
    so every row is dated alike and the clock guards judge leases by the same time.
    """
    pinned = getattr(conn, "transaction_time", None)
    if pinned is None or not pinned.writing:
        return max(clock.now_ms(), ledger_time(conn))
    if pinned.ms is None:
        pinned.ms = max(clock.now_ms(), ledger_time(conn))
    return int(pinned.ms)


def _pin(conn: sqlite3.Connection, writing: bool) -> None:
    """A write transaction begins (the time is kept from its first ``ledger_now``) or
    ends (it is forgotten)."""
    pinned = getattr(conn, "transaction_time", None)
    if pinned is not None:
        pinned.ms = None
        pinned.writing = writing


def _only_the_directory_is_read_only(path: str, exc: sqlite3.Error) -> bool:
    """SQLite could not create the -shm (or -wal) beside the file, nobody can write in
    that directory, and no -wal holds commits the file alone lacks: then reading the
    file as immutable sees exactly the ledger."""
    name = getattr(exc, "sqlite_errorname", "")
    return (
        name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))
        and not os.path.lexists(path + "-wal")
        and not os.access(os.path.dirname(os.path.realpath(path)), os.W_OK)
    )


def cannot_read(exc: sqlite3.Error) -> CassetteError | None:
    """For an error met while reading a ledger: a refusal meaning "cannot verify"
    (BUSY, CANNOT_OPEN) when the file could not be read now, None when it is damage."""
    name = getattr(exc, "sqlite_errorname", "")
    if not name.startswith(_CANNOT_READ):
        return None
    error = translate(exc)
    if error.code not in (ErrorCode.BUSY, ErrorCode.CANNOT_OPEN):
        error = CassetteError(ErrorCode.CANNOT_OPEN, f"cannot read the ledger now: {exc}")
    error.detail["unverifiable"] = True  # the CLI exits 3: nothing was checked
    return error


def connect_reader(
    path: str | os.PathLike[str], *, clock: Clock | None = None
) -> sqlite3.Connection:
    """Open an existing, current cassette for reading only: never creates, migrates or
    writes the file (a missing ledger is CANNOT_OPEN, an old one SCHEMA_OUTDATED)."""
    conn = connect_readonly(path)
    try:
        version = schema_version(conn)
        latest = current_version()
        if version == 0:
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"not a cassette ledger: {path}")
        if version > latest:
            raise CassetteError(
                ErrorCode.SCHEMA_TOO_NEW,
                f"schema version {version} is newer than this package ({latest}); upgrade it",
            )
        if version < latest:
            raise CassetteError(
                ErrorCode.SCHEMA_OUTDATED, f"schema version {version}: run `cassette migrate` first"
            )
        register_functions(conn, clock or SystemClock())
    except sqlite3.Error as exc:
        conn.close()
        raise translate(exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


class write_transaction:  # lower case: it is used as a function, `with write_transaction(conn)`
    """BEGIN IMMEDIATE ... COMMIT; any exception rolls back and is translated.

    ``after`` runs once the COMMIT returned (the automatic seal of ``LedgerFile.write``).
    ``tables`` names the tables the transaction writes, for a connection opened with
    ``lazy_temp_triggers`` (None: every table); other connections ignore it.
    A class rather than a ``@contextmanager`` generator: every write of the package enters
    one, and a generator's two layers cost about 2 us per transaction (docs/BENCHMARKS.md,
    "Issue 12, third pass").
    """

    __slots__ = ("_after", "_conn", "_tables")

    def __init__(
        self,
        conn: sqlite3.Connection,
        after: Callable[[], object] | None = None,
        tables: Iterable[str] | None = None,
    ) -> None:
        self._conn = conn
        self._after = after
        self._tables = tables

    def __enter__(self) -> sqlite3.Connection:
        conn = self._conn
        installed = getattr(conn, "temp_schema", None)
        if installed is not None:
            pending = getattr(conn, "temp_triggers_pending", None)
            tables = self._tables
            if pending and (tables is None or any(table in pending for table in tables)):
                install_temp_triggers(conn, tables)  # (it checks the TEMP schema first)
            else:
                refuse_foreign(conn, installed)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _busy_or_translate(conn, exc) from exc
        _pin(conn, writing=True)
        return conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        try:
            if exc is not None:
                _roll_back(conn, exc)
                return
            try:
                conn.execute("COMMIT")
            except BaseException as failed:
                _roll_back(conn, failed)
                raise
        finally:
            _pin(conn, writing=False)  # the transaction's time ends with it
        if self._after is not None:
            self._after()


def _roll_back(conn: sqlite3.Connection, exc: BaseException) -> None:
    """Undo the open transaction; a sqlite3 error becomes its CassetteError (raised from
    it), anything else is left for the caller to re-raise."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    if isinstance(exc, sqlite3.Error):
        raise _busy_or_translate(conn, exc) from exc


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A deferred read transaction: several SELECTs see one snapshot (WAL)."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _busy_or_translate(conn: sqlite3.Connection, exc: sqlite3.Error) -> CassetteError:
    error = translate(exc)
    if error.code is ErrorCode.BUSY:
        waited = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        error.detail["waited_ms"] = waited
    return error


def pending_versions(path: str) -> list[int]:
    """Versions a file still needs, read without changing it; all of them for a new file."""
    if path == ":memory:" or not os.path.exists(path):
        return [m.version for m in sqlfiles.migrations()]
    conn = connect_readonly(path)
    try:
        version = schema_version(conn)
    finally:
        conn.close()
    latest = current_version()
    if version > latest:
        raise CassetteError(
            ErrorCode.SCHEMA_TOO_NEW,
            f"schema version {version} is newer than this package ({latest})",
        )
    return list(range(version + 1, latest + 1))
