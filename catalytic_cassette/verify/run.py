"""One verify run: which checks, on which connection, in which thread, in what order.

The journal walk (Python hashing, and state and time streamed beside it) runs on the
caller's connection; the pages-and-indexes check, table by table, runs in a thread on a
second read-only connection that sees the same snapshot (sqlite3 releases the GIL while a
statement steps), and the caller's connection takes the tables left once its walk is
done. Findings are merged in one fixed order either way.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..anchor import open_anchor
from ..clock import SystemClock
from ..connection import cannot_read, connect_readonly, read_transaction
from ..errors import CassetteError, ErrorCode
from ..migrate import current_version, refuse_unreleased, schema_version
from .artifacts import check_artifacts
from .chain import TreeWalk, check_chain
from .consistency import check_checkpoint_ids, check_consistency, check_dense_ids
from .findings import MAX_FINDINGS_PER_KIND, Collector, Finding, FindingKind, VerifyReport
from .history import check_history
from .inserts import broken_inserts, check_inserts
from .options import Level, VerifyOptions
from .schema import check_schema, looks_like_a_ledger, recorded_version
from .seals import UNANCHORED_NOTE, check_recorded_seals, judge_anchors, recorded_seals
from .signatures import check_signatures, check_worker_signatures
from .state import check_state
from .stream import RowsCheck, StateStream
from .timeline import check_time


def verify_connection(
    conn: sqlite3.Connection,
    options: VerifyOptions | None = None,
    *,
    side: sqlite3.Connection | None = None,
    sides: Sequence[sqlite3.Connection] = (),
    path: str | None = None,
) -> VerifyReport:
    """Run every check ``options`` asks for on an open connection.

    ``side`` (or several, ``sides``), more connections reading the same snapshot, let the
    pages-and-indexes check proceed in threads while this one walks the journal. ``path``,
    the file ``conn`` reads, lets the quick level hash part of a long journal in another
    process.
    """
    options = options or VerifyOptions()
    now_ms = options.now_ms if options.now_ms is not None else SystemClock().now_ms()
    anchors = options.anchors
    report = VerifyReport(level=options.level.value, notes=[] if anchors else [UNANCHORED_NOTE])
    out = Collector(report)
    if anchors:
        if options.seal_key is None or options.origin is None:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "verifying against seals needs the pinned public key and origin",
            )
        for anchor in anchors:
            open_anchor(anchor, options.seal_key, options.origin)
    schema_intact = check_schema(conn, out)
    if options.level is Level.QUICK:
        return _quick(conn, report, out, options, path)
    checks = _SqlChecks(options, now_ms, schema_intact, _tables_to_check(conn))
    workers = [
        threading.Thread(target=checks.work, args=(other,), name="cassette-verify")
        for other in ([side] if side is not None else []) + list(sides)
    ]
    for worker in workers:
        worker.start()
    try:
        recorded = recorded_seals(conn) if schema_intact else []
        wanted = {size for _, size, _, _ in recorded}
        wanted.update(a.checkpoint.size for a in anchors or () if a.checkpoint is not None)
        walk = TreeWalk(conn, out, wanted, stored_nodes=schema_intact)
        stream = (
            StateStream(
                conn,
                now_ms,
                options.clock_skew_ms,
                options.max_time_jump_ms,
                defer=checks.defer(conn) if workers else None,
                shares=1 + len(workers),
            )
            if schema_intact and options.run_id is None
            else None
        )
        see = stream.see if stream is not None else None
        report.journal_rows = check_chain(conn, out, options.progress, walk, see=see)
        walk.finish()
        if stream is not None:
            stream.end_walk()
        checks.walk_done()
        checks.work(conn)  # what no other thread has started
        checks.wait_for_rows_checks()  # (the last ones, run by another thread)
        checks.check_rows(conn, stream)
    finally:
        checks.walk_done()  # (whatever happened: the other threads stop waiting for more)
        for worker in workers:
            worker.join()
    checks.raise_errors()
    out.merge_before(checks.pages)
    check_recorded_seals(
        out, recorded, walk.roots, report.journal_rows, options.seal_key, options.origin
    )
    if anchors:
        judge_anchors(conn, report, out, anchors, walk.roots)
    out.merge(checks.rows)
    tables_intact = schema_intact and checks.pages_intact
    if tables_intact:
        if options.artifact_root is not None:
            checks.artifacts_into(out)
        if options.public_key is not None:
            check_signatures(conn, out, options.public_key)
        if options.worker_keys is not None:
            check_worker_signatures(conn, out, options.worker_keys)
    else:
        report.notes.append(
            "tables or indexes differ from the migrations: state and consistency not checked"
        )
    if options.public_key is None:
        report.notes.append("no public key given: action signatures not checked")
    return report


def _quick(
    conn: sqlite3.Connection,
    report: VerifyReport,
    out: Collector,
    options: VerifyOptions,
    path: str | None,
) -> VerifyReport:
    """Header, schema and the chain; the tree only when anchors need its roots."""
    anchors = options.anchors
    walk = None
    if anchors:
        wanted = {a.checkpoint.size for a in anchors if a.checkpoint is not None}
        walk = TreeWalk(conn, out, wanted, stored_nodes=False)
    if walk is None and path is not None:
        report.journal_rows = _check_chain_in_parts(conn, path, out, options)
    else:
        report.journal_rows = check_chain(conn, out, options.progress, walk)
    if anchors and walk is not None:
        judge_anchors(conn, report, out, anchors, walk.roots)
    report.notes.append(
        "quick level: pages, indexes, the stored tree, state, consistency and time not checked"
    )
    return report


# A journal this long is hashed in two processes at the quick level (Python's hashing of
# short bodies holds the GIL, so a thread would not help); shorter, a process costs more
# to start than it saves.
PARALLEL_FROM_ROWS = 200_000


def _check_chain_in_parts(
    conn: sqlite3.Connection, path: str, out: Collector, options: VerifyOptions
) -> int:
    """The chain, the second half hashed by a child process reading the same file.

    The journal is append-only, so the child sees the same entries below the head read
    here even if writers append meanwhile. If the child fails, this process checks its
    half too: the answer never depends on it.
    """
    head = conn.execute(
        "SELECT seq FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    size = int(head[0]) + 1 if head is not None and isinstance(head[0], int) else 0
    if size < PARALLEL_FROM_ROWS or (os.cpu_count() or 1) < 2:
        return check_chain(conn, out, options.progress, None)
    middle = size // 2
    # The child imports this very package, wherever it was imported from.
    package_root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "catalytic_cassette.verify.part", path, str(middle), str(size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        check_chain(conn, out, options.progress, None, stop=middle)
        output, _ = child.communicate()
    except BaseException:
        child.kill()
        child.wait()
        raise
    if child.returncode != 0:
        return check_chain(conn, out, options.progress, None, start=middle, stop=size)
    answer = orjson.loads(output)
    part = Collector()
    for found in answer["findings"]:
        part.add(Finding(**found))
    part.report.suppressed.update(answer["suppressed"])  # merge counts them in
    out.merge(part)
    if options.progress is not None:
        options.progress(size - middle)
    return int(answer["end"])


class _SqlChecks:
    """What SQLite evaluates: the file (pages and indexes, table by table) and the walk's
    body comparisons (``RowsCheck``) on every connection, the rows (state, consistency,
    checkpoint ids, time) on the first after its journal walk.

    Row and time findings count only when every page and index is intact: an index that
    differs from its table would make their answers meaningless.
    """

    # Body comparisons waiting for a connection, at most (beyond, the walk runs them
    # itself): memory stays bounded whatever the journal's length.
    MAX_WAITING = 64

    def __init__(
        self, options: VerifyOptions, now_ms: int, schema_intact: bool, tables: list[str]
    ) -> None:
        self.options = options
        self.now_ms = now_ms
        self.schema_intact = schema_intact
        self.pages = Collector()
        self.rows = Collector()
        self.time = Collector()
        self.lawful = Collector()  # history (``history.py``)
        self.errors: dict[str, BaseException] = {}
        # The file is checked table by table (each with its indexes), largest first, by
        # whichever connection is free: the other threads from the start, the walk's
        # once its walk is done; the walk's body comparisons queue behind the tables, so
        # the threads stay busy until the end and finish together.
        self._tables = tables
        self._work: collections.deque[str | RowsCheck | _Artifacts | _Inserts] = collections.deque(
            tables
        )
        # The artifact files are checked by whoever is free too (they count only if the
        # pages and indexes are intact, and come after the rows' findings).
        root = options.artifact_root
        self._artifacts = _Artifacts(root) if schema_intact and root is not None else None
        if self._artifacts is not None:
            self._work.append(self._artifacts)
        # The insert rules over the final tables (``inserts.py``), by whoever is free
        # first: their result is read once the walk is over.
        self._inserts = _Inserts(options.run_id) if schema_intact else None
        if self._inserts is not None:
            self._work.appendleft(self._inserts)
        self._waiting = 0  # body comparisons in ``_work``
        self._walking = True
        self._cond = threading.Condition()
        self._found: dict[str, Collector] = {}
        self._checking = 0  # body comparisons being run

    def defer(self, conn: sqlite3.Connection) -> Callable[[RowsCheck], None]:
        """Where the walk on ``conn`` hands its body comparisons."""

        def take(check: RowsCheck) -> None:
            with self._cond:
                if self._waiting < self.MAX_WAITING and "file" not in self.errors:
                    self._work.append(check)
                    self._waiting += 1
                    self._cond.notify()
                    return
            check.run(conn)

        return take

    def walk_done(self) -> None:
        with self._cond:
            self._walking = False
            self._cond.notify_all()

    def work(self, conn: sqlite3.Connection) -> None:
        """Run pieces until none is left (every connection calls this; the other threads
        wait for more while the walk goes on)."""
        cond = self._cond
        while True:
            with cond:
                while not self._work and self._walking and "file" not in self.errors:
                    cond.wait()
                if not self._work or "file" in self.errors:
                    return
                piece = self._work.popleft()
                if isinstance(piece, RowsCheck):
                    self._waiting -= 1
                    self._checking += 1
            try:
                if isinstance(piece, str):
                    found = Collector()
                    _integrity_check(conn, found, piece)
                    self._found[piece] = found
                else:
                    piece.run(conn)
            except BaseException as exc:  # re-raised in the caller's thread
                with cond:
                    self.errors.setdefault("file", exc)
            finally:
                if isinstance(piece, RowsCheck):
                    with cond:
                        self._checking -= 1
                        cond.notify_all()

    def wait_for_rows_checks(self) -> None:
        """Until no body comparison is queued or running (call once the walk is over)."""
        with self._cond:
            while (self._waiting or self._checking) and "file" not in self.errors:
                self._cond.wait()

    @property
    def pages_intact(self) -> bool:
        return len(self._found) == len(self._tables) and not any(
            c.report.findings for c in self._found.values()
        )

    def check_rows(self, conn: sqlite3.Connection, stream: StateStream | None) -> None:
        """State and time: from the walk's stream when it held, else by a full replay."""
        if not self.schema_intact:
            return
        options = self.options
        try:
            if stream is not None and stream.finish():
                self.rows, self.time, self.lawful = stream.rows, stream.time, stream.lawful
            else:
                check_state(conn, self.rows, options.run_id)
                check_history(
                    conn, self.lawful, self.now_ms, options.clock_skew_ms, run_id=options.run_id
                )
                check_time(
                    conn, self.time, self.now_ms, options.clock_skew_ms, options.max_time_jump_ms
                )
            broken = None
            if self._inserts is not None:
                self._inserts.done.wait()  # (taken by now: the walk's thread drains the work)
                if self._inserts.error is not None:
                    raise self._inserts.error
                broken = self._inserts.broken
            check_inserts(conn, self.lawful, self.time, options.run_id, broken)
            check_consistency(conn, self.rows, options.run_id, self.now_ms)
            check_checkpoint_ids(conn, self.rows)
            check_dense_ids(conn, self.rows)
        except BaseException as exc:
            self.errors["rows"] = exc

    def artifacts_into(self, out: Collector) -> None:
        """The artifact files' findings (or what checking them raised), where the check
        would have run."""
        if self._artifacts is None:
            return
        if self._artifacts.error is not None:
            raise self._artifacts.error
        out.merge(self._artifacts.found)

    def raise_errors(self) -> None:
        if "file" in self.errors:
            raise self.errors["file"]
        for table in self._tables:  # findings in one order, whoever found them
            self.pages.merge(self._found[table])
        if not self.pages_intact:
            self.rows, self.time, self.lawful = Collector(), Collector(), Collector()
        elif "rows" in self.errors:
            raise self.errors["rows"]
        self.rows.merge(self.lawful, self.time)


class _Inserts:
    """The insert rules as a piece of work: the broken rows, or what the check raised."""

    def __init__(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.broken: list[tuple[str, Any, ErrorCode, str]] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self, conn: sqlite3.Connection) -> None:
        try:
            self.broken = broken_inserts(conn, self.run_id)
        except BaseException as exc:  # re-raised where the rows are checked
            self.error = exc
        finally:
            self.done.set()


class _Artifacts:
    """The artifact files as a piece of work: findings, or what the check raised."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.found = Collector()
        self.error: BaseException | None = None

    def run(self, conn: sqlite3.Connection) -> None:
        if self.root is None:
            return
        try:
            check_artifacts(conn, self.found, self.root)
        except BaseException as exc:  # raised where the check counts (intact pages)
            self.error = exc


def _integrity_check(conn: sqlite3.Connection, out: Collector, table: str) -> None:
    """SQLite's full check of one table: its pages, and every entry of each of its indexes
    against the table row (quick_check would skip the indexes)."""
    problems = [str(row[0]) for row in conn.execute(f"PRAGMA integrity_check({_quoted(table)})")][
        :MAX_FINDINGS_PER_KIND
    ]
    if problems == ["ok"]:
        return
    for problem in problems:
        kind = FindingKind.INDEX_MISMATCH if "index" in problem else FindingKind.CORRUPT
        out.add(Finding(kind, problem))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# Checked first, as they take longest: the rest follow in name order.
_LARGEST_FIRST = ("cassette_actions", "cassette_journal", "cassette_steps", "cassette_tree_nodes")


def _tables_to_check(conn: sqlite3.Connection) -> list[str]:
    """Every table of the file, SQLite's own included, whatever the schema check said
    about it (read without an index: sqlite_master has none)."""
    names = sorted(
        {"sqlite_master"}
        | {
            str(row[0])
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if isinstance(row[0], str)
        }
    )
    first = [t for t in _LARGEST_FIRST if t in names]
    return first + [t for t in names if t not in first]


def verify_path(
    path: str, options: VerifyOptions | None = None, /, **overrides: Any
) -> VerifyReport:
    """Verify a ledger file through a read-only connection (nothing is migrated or written);
    a ``postgresql://`` URL is verified by ``postgresql.verify.verify_url``.

    ``overrides`` replace fields of ``options`` (``verify_path(p, run_id="r1")``). Every
    check reads one snapshot (a read transaction), so writers may keep working.

    Raises CassetteError when the file cannot be verified at all (not a ledger, newer
    schema, locked past the busy timeout: BUSY, unreadable: CANNOT_OPEN; exit code 3);
    a ledger whose pages or format are damaged, or that was tampered with, gives findings.
    """
    from dataclasses import replace

    from ..artifacts import default_root
    from ..backends import server_verify

    on_server = server_verify(path)
    if on_server is not None:  # a PostgreSQL ledger: its own reads, the same checks
        return on_server(path, options, **overrides)
    options = replace(options or VerifyOptions(), **overrides)
    if options.artifact_root is None:  # artifacts are looked up by hash in <file>.artifacts
        options = replace(options, artifact_root=Path(default_root(path)))
    conn = _for_verify(connect_readonly(path))
    try:
        # A ledger's tables with a changed header are a tampered ledger, not a foreign file.
        version = recorded_version(conn) if looks_like_a_ledger(conn) else schema_version(conn)
        if version == 0:
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"{path} is an empty database")
        if version > current_version():
            raise CassetteError(
                ErrorCode.SCHEMA_TOO_NEW,
                f"schema version {version} is newer than this package ({current_version()})",
            )
        refuse_unreleased(
            conn.execute(
                "SELECT version, name, sha256 FROM cassette_migrations NOT INDEXED"
                " WHERE version = 1"
            ).fetchall()
        )
        with read_transaction(conn):
            sides = (
                _same_snapshot(conn, path, _side_connections())
                if options.level is Level.FULL
                else ()
            )
            try:
                return verify_connection(conn, options, sides=sides, path=path)
            finally:
                for side in sides:
                    side.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        unreadable = cannot_read(exc) if isinstance(exc, sqlite3.Error) else None
        if unreadable is not None:  # locked, not permitted, I/O: cannot verify, not corrupt
            raise unreadable from exc
        return _unreadable(f"the file cannot be read as a ledger: {exc}")
    except (ValueError, TypeError, RecursionError) as exc:
        # A value of a type or shape the schema forbids, stored by someone who bypassed it
        # (writable_schema, a table without STRICT): a finding, never a traceback.
        return _unreadable(f"a stored value breaks the schema's types or shapes: {exc!r}")
    finally:
        conn.close()


# Verify reads every page, and integrity_check looks each row up in every index: through
# a memory map SQLite reads pages without a system call each (measured at 200,000
# actions: integrity_check 1.6 s -> 1.2 s). SQLite clamps this to its build's maximum.
# A file truncated by someone else while mapped can kill the process (SIGBUS): a crash,
# never a pass (LAW.md, "Denial of service").
VERIFY_MMAP_BYTES = 1 << 40


def _for_verify(conn: sqlite3.Connection) -> sqlite3.Connection:
    with contextlib.suppress(sqlite3.Error):  # damage: the checks meet it and report it
        conn.execute(f"PRAGMA mmap_size = {VERIFY_MMAP_BYTES}").fetchall()
    return conn


def _unreadable(detail: str) -> VerifyReport:
    report = VerifyReport(notes=[UNANCHORED_NOTE])
    report.findings.append(Finding(FindingKind.CORRUPT, detail))
    return report


_SNAPSHOT_RETRIES = 2


def _side_connections() -> int:
    """One per core beside the walk's, at most three: the largest tables (actions, then
    the journal) each take one, and the walk is about as long as the largest."""
    return max(1, min((os.cpu_count() or 2) - 1, 3))


def _same_snapshot(
    conn: sqlite3.Connection, path: str, count: int
) -> tuple[sqlite3.Connection, ...]:
    """Up to ``count`` more read-only connections, each in a read transaction that sees
    what ``conn`` sees.

    Every ledger change appends to the journal, so two snapshots with the same journal
    head hold the same ledger. SQLite cannot share a snapshot between connections from
    Python; when writers keep moving the head (or the file is too damaged to tell),
    fewer or none are returned, and ``conn`` runs the remaining checks itself.
    """
    try:
        head = _journal_head(conn)
    except sqlite3.Error:
        return ()
    sides: list[sqlite3.Connection] = []
    for _ in range(count + _SNAPSHOT_RETRIES):
        if len(sides) == count:
            break
        try:
            side = _for_verify(connect_readonly(path, any_thread=True))
        except CassetteError:  # locked meanwhile: the first connection checks alone
            break
        try:
            side.execute("BEGIN")
            if _journal_head(side) == head:
                sides.append(side)
                continue
        except sqlite3.Error:
            pass
        side.close()
    return tuple(sides)


def _journal_head(conn: sqlite3.Connection) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT seq, chain_hash FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    return tuple(row) if row is not None else ()
