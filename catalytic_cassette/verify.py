"""verify: structure, the journal chain, state against history, consistency.

Reads only; streams the journal row by row, so memory stays constant.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import sqlfiles
from .actions import COLUMNS as ACTION_COLUMNS
from .anchor import UNVERIFIABLE_KINDS, Anchor, judge, open_anchor
from .artifacts import default_root
from .clock import SystemClock
from .connection import cannot_read, connect_readonly, read_transaction
from .errors import CassetteError, ErrorCode
from .hashing import SEQ_U64, ZERO_HASH
from .merkle import CompactRange
from .migrate import FORMAT, current_version, migration_digest, schema_version

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

MAX_FINDINGS_PER_KIND = 100
_MAX_SEQ = 2**64 - 1

# Every journaled table: its key column and its columns in journal-body order.
LEDGER_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cassette_messages": (
        "message_id",
        ("message_id", "run_id", "source", "idempotency_key", "payload_json", "created_at"),
    ),
    "cassette_jobs": (
        "job_id",
        ("job_id", "message_id", "run_id", "intent", "ordinal", "created_at"),
    ),
    "cassette_steps": (
        "step_id",
        (
            "step_id",
            "job_id",
            "run_id",
            "message_id",
            "job_ordinal",
            "ordinal",
            "status",
            "lease_owner",
            "lease_expires_at",
            "fencing_token",
            "payload_json",
            "created_at",
        ),
    ),
    "cassette_receipts": (
        "receipt_id",
        (
            "receipt_id",
            "step_id",
            "job_id",
            "run_id",
            "worker_id",
            "fencing_token",
            "outcome",
            "receipt_json",
            "created_at",
        ),
    ),
    "cassette_releases": (
        "release_id",
        ("release_id", "step_id", "run_id", "worker_id", "fencing_token", "created_at"),
    ),
}
LEDGER_TABLES["cassette_actions"] = ("action_id", ACTION_COLUMNS)
LEDGER_TABLES["cassette_checkpoints"] = (
    "checkpoint_id",
    ("checkpoint_seq", "checkpoint_id", "plan_id", "context_json", "created_at"),
)
LEDGER_TABLES["cassette_seals"] = (
    "seal_id",
    ("seal_id", "tree_size", "root_hex", "origin", "key_id", "note", "created_at"),
)
MUTABLE_TABLES = frozenset({"cassette_steps"})

UNANCHORED_NOTE = (
    "no anchor given: someone who can write the file and recomputes the whole chain "
    "cannot be detected by a local verify"
)


@dataclass
class Finding:
    kind: str
    detail: str
    seq: int | None = None
    table: str | None = None
    key: Any = None
    severity: str = "error"


@dataclass
class VerifyReport:
    findings: list[Finding] = field(default_factory=list)
    journal_rows: int = 0
    suppressed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    anchored: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def unverifiable(self) -> bool:
        """Something asked for could not be checked (an anchor under another key, say)."""
        return any(f.severity == "unverifiable" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "journal_rows": self.journal_rows,
            "findings": [asdict(f) for f in self.findings],
            "suppressed": self.suppressed,
            "notes": self.notes,
            "anchors": self.anchors,
            "anchored": self.anchored,
        }


class _Collector:
    def __init__(self, report: VerifyReport) -> None:
        self.report = report
        self.per_kind: Counter[str] = Counter()

    def add(self, finding: Finding) -> None:
        self.per_kind[finding.kind] += 1
        if self.per_kind[finding.kind] <= MAX_FINDINGS_PER_KIND:
            self.report.findings.append(finding)
        else:
            self.report.suppressed[finding.kind] = (
                self.per_kind[finding.kind] - MAX_FINDINGS_PER_KIND
            )


Progress = Callable[[int], None]
PROGRESS_EVERY = 10_000


def verify_connection(
    conn: sqlite3.Connection,
    *,
    run_id: str | None = None,
    now_ms: int,
    artifact_root: Path | None = None,
    public_key: Ed25519PublicKey | None = None,
    progress: Progress | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
    side: sqlite3.Connection | None = None,
) -> VerifyReport:
    """Run every check; ``progress(n)`` is told each time n more journal rows were read.

    With ``anchors`` (seal files), ``seal_key`` and ``origin`` pin who signed them and
    which ledger they name; the ledger is then checked against each of them too.

    ``side``, a second connection reading the same snapshot, lets the state and
    consistency checks, which run inside SQLite, proceed in a thread while this one
    hashes the journal and then runs the page check: sqlite3 releases the GIL while a
    statement steps. (A third thread was slower on the two-CPU machine measured.)
    """
    report = VerifyReport(notes=[] if anchors else [UNANCHORED_NOTE])
    out = _Collector(report)
    if anchors:
        if seal_key is None or origin is None:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "verifying against seals needs the pinned public key and origin",
            )
        for anchor in anchors:
            open_anchor(anchor, seal_key, origin)
    schema_intact = _check_schema(conn, out)
    sql_checks = _SqlChecks(run_id, now_ms, schema_intact)
    worker = None
    if side is not None:
        worker = threading.Thread(
            target=sql_checks.check_state, args=(side,), name="cassette-verify-state"
        )
        worker.start()
    try:
        recorded = _recorded_seals(conn) if schema_intact else []
        wanted = {size for _, size, _, _ in recorded}
        wanted.update(a.checkpoint.size for a in anchors or () if a.checkpoint is not None)
        walk = _TreeWalk(conn, out, wanted, stored_nodes=schema_intact)
        report.journal_rows = _check_chain(conn, out, progress, walk)
        walk.finish()
        if side is not None:
            sql_checks.check_pages(conn)  # the state thread takes longer than the walk
    finally:
        if worker is not None:
            worker.join()
    if side is None:
        sql_checks.run(conn)
    sql_checks.merge_into(out)
    tables_intact = schema_intact and sql_checks.pages_intact
    _check_recorded_seals(out, recorded, walk.roots, report.journal_rows, seal_key, origin)
    if anchors:
        _judge_anchors(conn, report, out, anchors, walk.roots)
    sql_checks.add_state(out)
    if tables_intact:
        if artifact_root is not None:
            _check_artifacts(conn, out, artifact_root)
        if public_key is not None:
            _check_signatures(conn, out, public_key)
    else:
        report.notes.append("tables differ from the migrations: state and consistency not checked")
    if public_key is None:
        report.notes.append("no public key given: action signatures not checked")
    return report


class _SqlChecks:
    """quick_check, state and consistency: the checks SQLite itself evaluates.

    Findings are kept apart and merged after the journal walk, so the report lists
    them in the same order whether they ran in a thread or inline. State findings
    (and errors) count only when the pages are intact, as when run one after another.
    """

    def __init__(self, run_id: str | None, now_ms: int, schema_intact: bool) -> None:
        self.run_id = run_id
        self.now_ms = now_ms
        self.schema_intact = schema_intact
        self.pages_intact = False
        self.corrupt = _Collector(VerifyReport())
        self.state = _Collector(VerifyReport())
        self.errors: dict[str, BaseException] = {}

    def run(self, conn: sqlite3.Connection) -> None:
        self.check_pages(conn)
        if self.pages_intact:
            self.check_state(conn)

    def check_pages(self, conn: sqlite3.Connection) -> None:
        try:
            self.pages_intact = _quick_check(conn, self.corrupt)
        except BaseException as exc:  # re-raised in the caller's thread by merge_into
            self.errors["pages"] = exc

    def check_state(self, conn: sqlite3.Connection) -> None:
        if not self.schema_intact:
            return
        try:
            _check_state(conn, self.state, self.run_id)
            _check_consistency(conn, self.state, self.run_id, self.now_ms)
        except BaseException as exc:
            self.errors["state"] = exc

    def merge_into(self, out: _Collector) -> None:
        if "pages" in self.errors:
            raise self.errors["pages"]
        if not self.pages_intact:
            self.state = _Collector(VerifyReport())
        elif "state" in self.errors:
            raise self.errors["state"]
        _merge(out, before=self.corrupt)

    def add_state(self, out: _Collector) -> None:
        _merge(out, after=self.state)


def _merge(
    out: _Collector, *, before: _Collector | None = None, after: _Collector | None = None
) -> None:
    """Findings of ``before``, then those already in ``out``, then those of ``after``,
    under one per-kind limit, as if one collector had seen them in that order."""
    sources = [c for c in (before, out, after) if c is not None]
    findings = [list(c.report.findings) for c in sources]
    suppressed = [dict(c.report.suppressed) for c in sources]
    out.report.findings.clear()
    out.report.suppressed.clear()
    out.per_kind.clear()
    for group in findings:
        for finding in group:
            out.add(finding)
    for extra in suppressed:
        for kind, count in extra.items():
            out.per_kind[kind] += count
            out.report.suppressed[kind] = out.per_kind[kind] - MAX_FINDINGS_PER_KIND


def verify_path(
    path: str,
    *,
    run_id: str | None = None,
    now_ms: int | None = None,
    public_key: Ed25519PublicKey | None = None,
    progress: Progress | None = None,
    anchors: list[Anchor] | None = None,
    seal_key: Ed25519PublicKey | None = None,
    origin: str | None = None,
    artifact_dir: str | Path | None = None,
) -> VerifyReport:
    """Verify a ledger file through a read-only connection (nothing is migrated or written).

    Every check reads one snapshot (a read transaction), so writers may keep working.
    Artifacts are looked up by hash in ``artifact_dir`` (default ``<file>.artifacts``).

    Raises CassetteError when the file cannot be verified at all (not a cassette, newer
    schema, locked past the busy timeout: BUSY, unreadable: CANNOT_OPEN; exit code 3);
    a file that is a cassette but whose pages or format are damaged is a finding.
    """
    conn = connect_readonly(path)
    try:
        version = schema_version(conn)
        if version == 0:
            raise CassetteError(ErrorCode.NOT_A_CASSETTE, f"{path} is an empty database")
        if version > current_version():
            raise CassetteError(
                ErrorCode.SCHEMA_TOO_NEW,
                f"schema version {version} is newer than this package ({current_version()})",
            )
        now = SystemClock().now_ms() if now_ms is None else now_ms
        with read_transaction(conn):
            sides = _same_snapshot(conn, path, 1)
            try:
                return verify_connection(
                    conn,
                    run_id=run_id,
                    now_ms=now,
                    artifact_root=Path(artifact_dir or default_root(path)),
                    public_key=public_key,
                    progress=progress,
                    anchors=anchors,
                    seal_key=seal_key,
                    origin=origin,
                    side=sides[0] if sides else None,
                )
            finally:
                for side in sides:
                    side.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        unreadable = cannot_read(exc) if isinstance(exc, sqlite3.Error) else None
        if unreadable is not None:  # locked, not permitted, I/O: cannot verify, not corrupt
            raise unreadable from exc
        report = VerifyReport(notes=[UNANCHORED_NOTE])
        report.findings.append(Finding("corrupt", f"the file cannot be read as a ledger: {exc}"))
        return report
    finally:
        conn.close()


_SNAPSHOT_RETRIES = 2


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
            side = connect_readonly(path, any_thread=True)
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
        "SELECT seq, chain_hash FROM cassette_journal ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    return tuple(row) if row is not None else ()


# ------------------------------------------------------------------ 1. structure


@lru_cache(maxsize=1)
def expected_schema() -> tuple[tuple[str, str, str, str], ...]:
    """(type, name, tbl_name, sql) of every object the migrations create."""
    from .connection import register_functions

    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        memory.execute("PRAGMA recursive_triggers = ON")
        register_functions(memory, SystemClock())
        for migration in sqlfiles.migrations():
            for statement in sqlfiles.statements(migration.sql):
                memory.execute(statement)
        return tuple(_schema_rows(memory))
    finally:
        memory.close()


def _schema_rows(conn: sqlite3.Connection) -> list[tuple[str, str, str, str]]:
    rows = conn.execute(
        "SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master"
        " WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
    ).fetchall()
    return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]


def _quick_check(conn: sqlite3.Connection, out: _Collector) -> bool:
    """SQLite's own check of every page; True when it finds nothing."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if problems == ["ok"]:
        return True
    for problem in problems[:MAX_FINDINGS_PER_KIND]:
        out.add(Finding("corrupt", str(problem)))
    return False


def _check_schema(conn: sqlite3.Connection, out: _Collector) -> bool:
    """Report every schema difference; True when the tables themselves are intact."""
    ok = True
    version = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()[0]
    if version != current_version():
        ok = False
        out.add(
            Finding("schema_version", f"schema version {version}, expected {current_version()}")
        )
    shipped = [(m.version, m.name, migration_digest(m.sql)) for m in sqlfiles.migrations()]
    recorded = conn.execute(
        "SELECT version, name, sha256 FROM cassette_migrations ORDER BY version"
    ).fetchall()
    if [tuple(row) for row in recorded] != shipped[: len(recorded)]:
        out.add(
            Finding(
                "schema_changed",
                "cassette_migrations differs from the shipped migrations",
                table="cassette_migrations",
            )
        )
    meta = conn.execute("SELECT key, value FROM cassette_meta ORDER BY key").fetchall()
    if not _meta_is_a_cassettes([(str(k), str(v)) for k, v in meta]):
        out.add(
            Finding(
                "schema_changed", "cassette_meta differs from a cassette's", table="cassette_meta"
            )
        )
    expected = {(row[0], row[1]): row for row in expected_schema()}
    actual = {(row[0], row[1]): row for row in _schema_rows(conn)}
    for key, row in expected.items():
        if key not in actual:
            ok = ok and row[0] != "table"
            out.add(Finding("schema_missing", f"{row[0]} {row[1]} is missing", table=row[2]))
        elif actual[key] != row:
            ok = ok and row[0] != "table"
            out.add(Finding("schema_changed", f"{row[0]} {row[1]} was changed", table=row[2]))
    for key, row in actual.items():
        if key not in expected:
            out.add(
                Finding(
                    "schema_extra", f"{row[0]} {row[1]} is not part of the schema", table=row[2]
                )
            )
    return ok


def _meta_is_a_cassettes(meta: list[tuple[str, str]]) -> bool:
    """('format', FORMAT), and from 0004 on a ledger_id of 32 lowercase hex digits."""
    expected_keys = ["format", "ledger_id"] if current_version() >= 4 else ["format"]
    if [key for key, _ in meta] != expected_keys or meta[0][1] != FORMAT:
        return False
    return all(
        len(value) == 32 and all(c in "0123456789abcdef" for c in value)
        for key, value in meta
        if key == "ledger_id"
    )


# ---------------------------------------------------------------------- 2. chain


def _check_chain(
    conn: sqlite3.Connection, out: _Collector, progress: Progress | None, walk: _TreeWalk
) -> int:
    """Stream the journal in seq order; each entry is checked against its predecessor only."""
    conn.text_factory = bytes  # hash the stored bytes; a tampered body need not be UTF-8
    try:
        return _walk_chain(conn, out, progress, walk)
    finally:
        conn.text_factory = str


def _walk_chain(
    conn: sqlite3.Connection, out: _Collector, progress: Progress | None, walk: _TreeWalk
) -> int:
    # The loop runs once per journal row: hashing is inlined (same formulas as
    # hashing.leaf_hash and hashing.chain_hash) and rows arrive in batches.
    sha256, pack = hashlib.sha256, SEQ_U64.pack
    expected_seq = 0
    read = 0
    prev = ZERO_HASH
    cursor = conn.execute(
        "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal ORDER BY seq"
    )
    while rows := cursor.fetchmany(1024):
        for seq, body, leaf, chain in rows:
            if seq != expected_seq:
                out.add(
                    Finding("journal_gap", f"expected seq {expected_seq}, found {seq}", seq=seq)
                )
                expected_seq = seq
            if not isinstance(body, bytes):
                body = str(body).encode("utf-8")
            recomputed = sha256(b"\x00" + body).digest()
            walk.add(seq, recomputed)
            if leaf != recomputed:
                table, key = _body_identity(body)
                out.add(Finding("leaf_hash", "leaf_hash does not match the body", seq, table, key))
            link = (
                sha256(b"\x02" + pack(seq) + prev + leaf).digest()
                if isinstance(leaf, bytes) and 0 <= seq <= _MAX_SEQ
                else None
            )
            if chain != link:
                table, key = _body_identity(body)
                out.add(
                    Finding(
                        "chain_hash",
                        "chain_hash does not link to the previous entry",
                        seq,
                        table,
                        key,
                    )
                )
            prev = chain if isinstance(chain, bytes) else b""
            expected_seq += 1
        if progress is not None:
            before, read = read, read + len(rows)
            for _ in range(read // PROGRESS_EVERY - before // PROGRESS_EVERY):
                progress(PROGRESS_EVERY)
    if progress is not None and read % PROGRESS_EVERY:
        progress(read % PROGRESS_EVERY)
    return expected_seq


class _TreeWalk:
    """Rebuilds the Merkle tree from the recomputed leaves while the chain is walked.

    Compares every stored node as it completes (the nodes table is read in its key
    order, which is completion order) and keeps the root at each wanted size. Memory is
    O(log n) plus one root per wanted size.
    """

    def __init__(
        self, conn: sqlite3.Connection, out: _Collector, wanted: set[int], *, stored_nodes: bool
    ) -> None:
        self.out = out
        self.wanted = wanted
        self.range = CompactRange()
        self.roots: dict[int, bytes] = {0: self.range.root()} if 0 in wanted else {}
        self._stored = (
            conn.execute(
                "SELECT leaf_end, level, hash FROM cassette_tree_nodes ORDER BY leaf_end, level"
            )
            if stored_nodes
            else None
        )
        self._next: tuple[int, int, bytes] | None = None
        self._advance()

    def _advance(self) -> None:
        row = next(self._stored, None) if self._stored is not None else None
        self._next = (int(row[0]), int(row[1]), row[2]) if row is not None else None

    def add(self, seq: int, leaf: bytes) -> None:
        for level, value in self.range.append(leaf):
            self._compare(seq, level, value)
        if self.range.size in self.wanted:
            self.roots[self.range.size] = self.range.root()

    def _compare(self, leaf_end: int, level: int, value: bytes) -> None:
        if self._stored is None:
            return
        while self._next is not None and self._next[:2] < (leaf_end, level):
            self._extra(*self._next)
            self._advance()
        if self._next is None or self._next[:2] != (leaf_end, level):
            self.out.add(
                Finding(
                    "tree_node",
                    f"the stored tree has no node at level {level} ending at entry {leaf_end}",
                    leaf_end,
                    "cassette_tree_nodes",
                    [leaf_end, level],
                )
            )
            return
        if self._next[2] != value:
            self.out.add(
                Finding(
                    "tree_node",
                    f"the stored node at level {level} ending at entry {leaf_end} is not the"
                    " hash of the journal's leaves",
                    leaf_end,
                    "cassette_tree_nodes",
                    [leaf_end, level],
                )
            )
        self._advance()

    def _extra(self, leaf_end: int, level: int, _hash: bytes) -> None:
        self.out.add(
            Finding(
                "tree_node",
                f"the stored tree has a node at level {level} ending at entry {leaf_end}"
                " that the journal does not complete",
                leaf_end,
                "cassette_tree_nodes",
                [leaf_end, level],
            )
        )

    def finish(self) -> None:
        while self._next is not None:
            self._extra(*self._next)
            self._advance()


def _recorded_seals(conn: sqlite3.Connection) -> list[tuple[int, int, str, str]]:
    rows = conn.execute(
        "SELECT seal_id, tree_size, root_hex, note FROM cassette_seals ORDER BY seal_id"
    ).fetchall()
    return [(int(a), int(b), str(c), str(d)) for a, b, c, d in rows]


def _check_recorded_seals(
    out: _Collector,
    recorded: list[tuple[int, int, str, str]],
    roots: dict[int, bytes],
    journal_size: int,
    seal_key: Ed25519PublicKey | None,
    origin: str | None,
) -> None:
    """Every seal recorded in the ledger matches the recomputed root of its size and
    its own note; with a pinned key and origin, its signature too."""
    from .note import Checkpoint, NoteError, open_note, parse_note

    for seal_id, size, root_hex, note in recorded:
        problem = None
        if size > journal_size:
            problem = f"sealed size {size} is beyond the journal's {journal_size} entries"
        elif roots.get(size, b"").hex() != root_hex:
            problem = f"sealed root is not the recomputed root of the first {size} entries"
        else:
            try:
                text = parse_note(note.encode("utf-8")).text
                if seal_key is not None and origin is not None:
                    text = open_note(note.encode("utf-8"), origin, seal_key)
                checkpoint = Checkpoint.from_text(text)
                if (checkpoint.size, checkpoint.root.hex()) != (size, root_hex):
                    problem = "the seal's note does not match its size and root"
            except NoteError as error:
                if error.kind != "unknown_key":  # sealed under another key or origin
                    problem = f"the seal's note does not verify: {error.message}"
        if problem is not None:
            out.add(Finding("seal_mismatch", problem, None, "cassette_seals", seal_id))


def _judge_anchors(
    conn: sqlite3.Connection,
    report: VerifyReport,
    out: _Collector,
    anchors: list[Anchor],
    roots: dict[int, bytes],
) -> None:
    def journal_entry(seq: int) -> tuple[str | None, bytes | None]:
        row = conn.execute(
            "SELECT body, leaf_hash FROM cassette_journal WHERE seq = ?", (seq,)
        ).fetchone()
        return (str(row[0]), bytes(row[1])) if row else (None, None)

    judge(anchors, roots, report.journal_rows, journal_entry)
    for anchor in anchors:
        report.anchors.append(anchor.to_dict())
        if anchor.status == "holds":
            continue
        severity = "unverifiable" if anchor.status in UNVERIFIABLE_KINDS else "error"
        size = anchor.checkpoint.size if anchor.checkpoint else None
        finding = Finding(anchor.status, f"{anchor.path}: {anchor.detail}", size, None, None)
        finding.severity = severity
        out.add(finding)
        if anchor.evidence:
            report.anchors[-1]["evidence"] = anchor.evidence
    holding = [a.checkpoint for a in anchors if a.status == "holds" and a.checkpoint]
    if holding:
        newest = max(holding, key=lambda cp: cp.size)
        after = report.journal_rows - newest.size
        report.anchored = {
            "newest_holding_size": newest.size,
            "newest_holding_root": newest.root.hex(),
            "entries_after_anchor": after,
        }
        report.notes.append(
            f"{after} journal entries after the newest anchor (size {newest.size}) are"
            " protected only by the local chain"
        )
    else:
        report.notes.append("no anchor holds: " + UNANCHORED_NOTE)


def _body_identity(body: Any) -> tuple[str | None, Any]:
    from .payloads import loads

    try:
        parsed = loads(body)
        return parsed.get("table"), parsed.get("key")
    except Exception:  # a tampered body may not even be JSON
        return None, None


# ---------------------------------------------------------------------- 3. state


def _state_query(
    table: str, key: str, columns: Iterable[str], run_filter: str, ops: tuple[str, ...]
) -> str:
    """The rows that differ from their latest journal revision (or have none).

    The fast path renders the body the journaling trigger would write for the row and
    compares it with the stored body, byte for byte, inside SQLite. Only when the text
    differs (possibly because another SQLite version escaped a string differently) are
    the columns compared one by one as values, which is what decides. Matching rows
    never reach Python.
    """
    columns = list(columns)
    rendered = "json_object(" + ", ".join(f"'{c}', t.{c}" for c in columns) + ")"
    bodies = " OR ".join(
        f"l.body = json_object('table', '{table}', 'op', '{op}', 'key', t.{key}, 'row', {rendered})"
        for op in ops
    )
    by_value = " AND ".join(f"json_extract(l.body, '$.row.{c}') IS t.{c}" for c in columns)
    latest = (
        f"SELECT seq FROM cassette_journal j WHERE j.tbl = '{table}' AND j.row_key = +t.{key}"
        " ORDER BY seq DESC LIMIT 1"
    )
    return (
        f"SELECT t.{key}, l.seq FROM {table} t"
        f" LEFT JOIN cassette_journal l ON l.seq = ({latest})"
        f" WHERE (l.seq IS NULL OR NOT ({bodies}) AND NOT coalesce(CASE WHEN json_valid(l.body)"
        f" THEN json_extract(l.body, '$.key') IS t.{key} AND {by_value} END, 0)){run_filter}"
    )


def _check_state(conn: sqlite3.Connection, out: _Collector, run_id: str | None) -> None:
    for table, (key, columns) in LEDGER_TABLES.items():
        if run_id is not None and "run_id" not in columns:
            continue  # a run-scoped verify covers the tables that belong to runs
        run_filter = "" if run_id is None else " AND t.run_id = :run"
        ops = ("INSERT", "UPDATE") if table in MUTABLE_TABLES else ("INSERT",)
        query = _state_query(table, key, columns, run_filter, ops)
        for row_key, seq in conn.execute(query, {"run": run_id}):
            if seq is None:
                out.add(
                    Finding("unjournaled_row", "row has no journal entry", None, table, row_key)
                )
            else:
                out.add(
                    Finding(
                        "state_mismatch",
                        "row differs from its latest journal entry",
                        seq,
                        table,
                        row_key,
                    )
                )
        if table not in MUTABLE_TABLES:
            dup = (
                f"SELECT row_key, max(seq), count(*) FROM cassette_journal WHERE tbl = '{table}'"
                " GROUP BY row_key HAVING count(*) > 1"
            )
            for row_key, seq, count in conn.execute(dup):
                out.add(
                    Finding(
                        "journal_duplicate",
                        f"{count} journal entries for an append-only row",
                        seq,
                        table,
                        row_key,
                    )
                )
        missing = (
            f"SELECT j.row_key, max(j.seq) FROM cassette_journal j WHERE j.tbl = '{table}'"
            f" AND NOT EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = j.row_key)"
            f" GROUP BY j.row_key"
        )
        for row_key, seq in conn.execute(missing):
            if run_id is None or _journal_run(conn, seq) == run_id:
                out.add(
                    Finding(
                        "row_missing",
                        "journaled row is missing from its table",
                        seq,
                        table,
                        row_key,
                    )
                )
    unknown = (
        "SELECT seq, tbl FROM cassette_journal WHERE tbl IS NULL OR tbl NOT IN ("
        + ", ".join(f"'{t}'" for t in LEDGER_TABLES)
        + ")"
    )
    for seq, tbl in conn.execute(unknown):
        out.add(Finding("journal_unknown_table", f"journal entry names table {tbl!r}", seq, tbl))


def _journal_run(conn: sqlite3.Connection, seq: int) -> Any:
    return conn.execute(
        "SELECT json_extract(body, '$.row.run_id') FROM cassette_journal WHERE seq = ?", (seq,)
    ).fetchone()[0]


# ---------------------------------------------------------------- 4. consistency

_CONSISTENCY: tuple[tuple[str, str, str, str], ...] = (
    (
        "committed_without_receipt",
        "cassette_steps",
        "SELECT s.step_id FROM cassette_steps s WHERE s.status = 'COMMITTED'{run_s}"
        " AND NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = s.step_id)",
        "a COMMITTED step has no receipt",
    ),
    (
        "receipt_mismatch",
        "cassette_receipts",
        "SELECT r.receipt_id FROM cassette_receipts r"
        " JOIN cassette_steps s ON s.step_id = r.step_id"
        " WHERE (s.status IS NOT 'COMMITTED' OR r.worker_id IS NOT s.lease_owner"
        " OR r.fencing_token IS NOT s.fencing_token OR r.job_id IS NOT s.job_id"
        " OR r.run_id IS NOT s.run_id){run_r}",
        "the receipt does not match its step's state, worker, token, job or run",
    ),
    (
        "orphan",
        "cassette_receipts",
        "SELECT r.receipt_id FROM cassette_receipts r WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.step_id = r.step_id){run_r}",
        "the receipt's step does not exist",
    ),
    (
        "orphan",
        "cassette_steps",
        "SELECT s.step_id FROM cassette_steps s WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_jobs j WHERE j.job_id = s.job_id AND j.message_id = s.message_id"
        " AND j.ordinal = s.job_ordinal AND j.run_id = s.run_id){run_s}",
        "the step's job does not exist or does not match",
    ),
    (
        "orphan",
        "cassette_jobs",
        "SELECT j.job_id FROM cassette_jobs j WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_messages m WHERE m.message_id = j.message_id"
        " AND m.run_id = j.run_id){run_j}",
        "the job's message does not exist or belongs to another run",
    ),
    (
        "empty_message",
        "cassette_messages",
        "SELECT m.message_id FROM cassette_messages m WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_jobs j WHERE j.message_id = m.message_id){run_m}",
        "the message has no job",
    ),
    (
        "empty_job",
        "cassette_jobs",
        "SELECT j.job_id FROM cassette_jobs j WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.job_id = j.job_id){run_j}",
        "the job has no step",
    ),
    (
        "release_mismatch",
        "cassette_releases",
        "SELECT x.release_id FROM cassette_releases x WHERE NOT EXISTS"
        " (SELECT 1 FROM cassette_steps s WHERE s.step_id = x.step_id AND s.run_id = x.run_id"
        " AND s.fencing_token >= x.fencing_token){run_x}",
        "the release does not match its step",
    ),
)


def _check_consistency(
    conn: sqlite3.Connection, out: _Collector, run_id: str | None, now_ms: int
) -> None:
    filters = {
        alias: ("" if run_id is None else f" AND {alias[-1]}.run_id = :run")
        for alias in ("run_s", "run_r", "run_j", "run_m", "run_x")
    }
    for kind, table, query, detail in _CONSISTENCY:
        for (key,) in conn.execute(query.format(**filters), {"run": run_id}):
            out.add(Finding(kind, detail, None, table, key))
    expired = (
        "SELECT step_id, lease_owner, lease_expires_at FROM cassette_steps s"
        " WHERE status = 'LEASED' AND lease_expires_at <= :now" + filters["run_s"]
    )
    for step_id, owner, expires in conn.execute(expired, {"now": now_ms, "run": run_id}):
        out.add(
            Finding(
                "lease_expired",
                f"lease of {owner!r} expired at {expires}; requeue it",
                None,
                "cassette_steps",
                step_id,
                severity="warning",
            )
        )


# -------------------------------------------------------- artifacts and signatures


def _check_artifacts(conn: sqlite3.Connection, out: _Collector, artifact_root: Path) -> None:
    """Each referenced artifact, found by its hash under the artifacts folder only."""
    from contextlib import ExitStack

    from .artifacts import check_file
    from .payloads import loads
    from .safe_files import lexists, open_directory

    query = (
        "SELECT action_id, arguments_artifact, result_artifact FROM cassette_actions"
        " WHERE arguments_artifact IS NOT NULL OR result_artifact IS NOT NULL ORDER BY action_seq"
    )
    details = {"artifact_missing": "is missing", "artifact_altered": "was altered"}
    with ExitStack() as stack:
        dir_fd: int | None = None
        if lexists(artifact_root):  # absent: every artifact is missing
            dir_fd = stack.enter_context(open_directory(artifact_root, what="artifacts folder"))
        for action_id, *refs in conn.execute(query):
            for ref_json in refs:
                if ref_json is None:
                    continue
                ref = loads(ref_json)
                problem = (
                    "artifact_missing"
                    if dir_fd is None
                    else check_file(dir_fd, ref if isinstance(ref, dict) else {}, artifact_root)
                )
                if problem is not None:
                    out.add(
                        Finding(
                            problem,
                            f"artifact {ref.get('sha256') if isinstance(ref, dict) else ref}"
                            f" {details[problem]}",
                            None,
                            "cassette_actions",
                            action_id,
                        )
                    )


def _check_signatures(
    conn: sqlite3.Connection, out: _Collector, public_key: Ed25519PublicKey
) -> None:
    from .actions import COLUMNS, SELECT_COLUMNS
    from .signing import check

    details = {
        "unsigned_action": "the action carries no signature",
        "unknown_key": "the action was signed by another key",
        "bad_signature": "the signature does not match the action",
    }
    query = f"SELECT {SELECT_COLUMNS} FROM cassette_actions ORDER BY action_seq"
    for row in conn.execute(query):
        values = dict(zip(COLUMNS, row, strict=True))
        problem = check(public_key, values)
        if problem is not None:
            out.add(
                Finding(problem, details[problem], None, "cassette_actions", values["action_id"])
            )
