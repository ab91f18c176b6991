"""verify for a PostgreSQL ledger: the same checks, findings and report as on SQLite.

Nothing the database could fake is trusted. Everything is read in one REPEATABLE READ
READ ONLY transaction (one snapshot: a writer committing meanwhile changes nothing this
run sees), through plain SELECTs on the tables and on pg_catalog (``verify.sql``), with
index scans turned off (every table is read from its heap), row-level security off (a
policy that would hide a row makes the read fail instead), ``FROM ONLY`` (no child
table's rows), and search_path ``pg_catalog`` (no function or operator of the ledger's
schema is called). No ledger function, view or stored hash is used: every hash is
computed here.

1. **Structure** (``catalog.py``): the catalog's description of the ledger equals the
   one the migrations make (``catalog-<major>.json``, made on the server's PostgreSQL
   major; on a major with none, an UNVERIFIABLE ``schema_unchecked``): tables, columns,
   constraints, indexes, triggers and whether they fire (``trigger_disabled``),
   functions with their source and SECURITY DEFINER settings, grants, rules, policies,
   inheritance, event triggers, the settings of the database and of the cassette_* roles;
   who owns the ledger and who may act as its roles (``ownership.py``).
2. **Chain** (``verify/chain.py``, the SQLite verifier's own walk): the journal streamed
   in seq order from a server-side cursor, constant memory; every leaf and link hash
   recomputed; the head row (``cassette_head``) is there, once (``journal_head``);
   recorded seals match the roots rebuilt from the bodies.
3-5. **State, consistency, time**: the journal and the tables are copied, as read, into
   a private SQLite database in a temporary directory (on disk: memory stays bounded),
   and the SQLite verifier's own checks run on it (``verify/state.py``,
   ``consistency.py``, ``timeline.py``): replay, both directions, every column; one
   receipt per committed step; dense ids; time. Only the check of the table name and
   key stored beside each body is this backend's: PostgreSQL stores the key as its JSON
   text.
6. **Artifact files** (``verify/artifacts.py``), with an artifacts folder: each file an
   action refers to, found by its hash, exists and hashes to its reference.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..clock import SystemClock
from ..errors import CassetteError, ErrorCode
from ..hashing import ZERO_HASH
from ..verify.artifacts import check_artifacts
from ..verify.chain import TreeWalk, walk_entries
from ..verify.consistency import check_checkpoint_ids, check_consistency, check_dense_ids
from ..verify.findings import Collector, Finding, FindingKind, Severity, VerifyReport
from ..verify.history import check_history
from ..verify.inserts import check_inserts
from ..verify.options import Level, VerifyOptions
from ..verify.schema import check_ledger_id, meta_is_a_cassettes
from ..verify.seals import UNANCHORED_NOTE, check_recorded_seals, judge_anchors, recorded_seals
from ..verify.signatures import check_signatures, check_worker_signatures
from ..verify.state import check_state
from ..verify.tables import TABLES
from ..verify.timeline import check_time
from . import catalog, connection, ownership, sqlfiles
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg

# Journal entries per round trip of the server-side cursor (memory: one batch).
BATCH = 4096


def verify_url(url: str, options: VerifyOptions | None = None, /, **overrides: Any) -> VerifyReport:
    """Verify the PostgreSQL ledger at ``url`` (``verify_path`` sends a URL here).

    Raises CassetteError when the ledger cannot be verified at all (unreachable:
    CANNOT_OPEN, not a ledger, a newer schema; exit code 3); a tampered ledger gives
    findings."""
    options = replace(options or VerifyOptions(), **overrides)
    import psycopg

    conn = connection.open_connection(
        url, autocommit=False, application_name="catalytic-cassette-verify"
    )
    try:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(query("verify_settings"))  # (the first statement: takes the snapshot)
        # what it vouches for survives a crash: its commit flushes past all it sees
        connection.flush_at_commit(conn)
        report = _verify(conn, options)
        conn.commit()  # (read only: writes nothing but the flush's message)
        return report
    except psycopg.Error as exc:
        raise connection.translate(exc) from exc
    finally:
        conn.close()  # (rolls back: nothing was written)


def _verify(conn: psycopg.Connection[Any], options: VerifyOptions) -> VerifyReport:
    # A ledger's migrations and journal make a ledger, whatever else was done to it (a
    # missing head is tampering, reported below, not "not a cassette").
    found = {row[0] for row in conn.execute(query("verify_has_ledger"))}
    if not {"cassette_migrations", "cassette_journal"} <= found:
        raise CassetteError(ErrorCode.NOT_A_CASSETTE, "the database holds no ledger")
    recorded = [(int(v), str(n)) for v, n in conn.execute(query("verify_migrations"))]
    connection.require_released(recorded)
    shipped = [(m.version, m.name) for m in sqlfiles.migrations()]
    version = max((v for v, _ in recorded), default=0)
    latest = len(shipped)
    if version > latest:
        raise CassetteError(
            ErrorCode.SCHEMA_TOO_NEW,
            f"schema version {version} is newer than this package ({latest})",
        )
    now_ms = options.now_ms if options.now_ms is not None else SystemClock().now_ms()
    anchors = options.anchors
    report = VerifyReport(level=options.level.value, notes=[] if anchors else [UNANCHORED_NOTE])
    out = Collector(report)
    if anchors:
        from ..anchor import open_anchor

        if options.seal_key is None or options.origin is None:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "verifying against seals needs the pinned public key and origin",
            )
        for anchor in anchors:
            open_anchor(anchor, options.seal_key, options.origin)
    major = catalog.server_major(conn)
    intact = _check_structure(conn, out, recorded, shipped, major)
    ownership.check_ownership(conn, out)
    ownership.check_memberships(conn, out)
    full = options.level is Level.FULL
    with tempfile.TemporaryDirectory(prefix="cassette-verify-") as private:
        mirror = Mirror(Path(private) / "mirror.db", journal=full or bool(anchors), major=major)
        try:
            tables = _tables_present(conn) if full and intact else []
            seals: list[tuple[int, int, str, str]] = []
            if full and intact:  # the ledger's identity, and the seals it records
                if "cassette_seals" in tables:
                    mirror.copy_table(conn, "cassette_seals")
                    seals = recorded_seals(mirror.conn)
                _check_meta(conn, mirror.conn, out)
            wanted = {size for _, size, _, _ in seals}
            wanted.update(a.checkpoint.size for a in anchors or () if a.checkpoint is not None)
            walk = TreeWalk(mirror.conn, out, wanted, stored_nodes=False) if wanted else None
            journal = conn.cursor(name="cassette_verify_journal")
            journal.execute(query("verify_journal"))
            report.journal_rows = walk_entries(
                mirror.entries(journal), out, options.progress, walk, 0, ZERO_HASH, None
            )
            journal.close()
            if walk is not None:
                walk.finish()
            heads = _check_head(conn, out, "cassette_head" in found)
            roots = walk.roots if walk is not None else {}
            if seals:
                check_recorded_seals(
                    out, seals, roots, report.journal_rows, options.seal_key, options.origin
                )
            if anchors:  # (reads the copied journal)
                judge_anchors(mirror.conn, report, out, anchors, roots)
            if not full:
                report.notes.append(
                    "quick level: the stored tree, state, consistency and time not checked"
                )
                return report
            if intact:
                for table in tables:
                    if table != "cassette_seals":  # (copied above)
                        mirror.copy_table(conn, table)
                mirror.commit()
                out.merge(_check_rows(mirror.conn, options, now_ms))
                _check_head_time(heads, mirror.conn, out, tables)
                if options.public_key is not None:
                    check_signatures(mirror.conn, out, options.public_key)
                if options.worker_keys is not None:
                    mirror.shape_for_worker_keys(conn)
                    check_worker_signatures(mirror.conn, out, options.worker_keys)
                _check_artifact_files(mirror.conn, out, report, options.artifact_root)
            else:
                report.notes.append(
                    "tables differ from the migrations: state and consistency not checked"
                )
        finally:
            mirror.close()
    if options.public_key is None:
        report.notes.append("no public key given: action signatures not checked")
    return report


def _check_artifact_files(
    mirror: sqlite3.Connection, out: Collector, report: VerifyReport, root: Path | None
) -> None:
    """The artifact files the actions refer to, in the folder the caller names (a URL
    has no folder beside it); without one, a note says they were not checked."""
    if root is not None:
        check_artifacts(mirror, out, root)
        return
    referred = mirror.execute(
        "SELECT 1 FROM cassette_actions WHERE arguments_artifact IS NOT NULL"
        " OR result_artifact IS NOT NULL LIMIT 1"
    ).fetchone()
    if referred is not None:
        report.notes.append("no artifacts folder given: artifact files not checked")


def _check_structure(
    conn: psycopg.Connection[Any],
    out: Collector,
    recorded: list[tuple[int, str]],
    shipped: list[tuple[int, str]],
    major: int,
) -> bool:
    """Check 1: the recorded migrations and the catalog against the package's snapshot
    for the server's major version. On a major without one the catalog is not compared
    (its definitions may print differently: any difference could be the server's words,
    not tampering): an UNVERIFIABLE finding says so (exit 3), and the other checks run."""
    version = max((v for v, _ in recorded), default=0)
    latest = len(shipped)
    if recorded != shipped[: len(recorded)]:
        out.add(
            Finding(
                FindingKind.SCHEMA_CHANGED,
                "cassette_migrations differs from the shipped migrations",
                table="cassette_migrations",
            )
        )
    if version != latest:
        out.add(Finding(FindingKind.SCHEMA_VERSION, f"schema version {version}, expected {latest}"))
        return False
    reference = catalog.reference(major)
    if reference is None:
        shipped_for = ", ".join(str(m) for m in catalog.shipped_majors())
        out.add(
            Finding(
                FindingKind.SCHEMA_UNCHECKED,
                f"this package has no catalog snapshot made on PostgreSQL {major} (only on"
                f" {shipped_for}): tables, triggers, functions, grants and settings were not"
                " compared with what the migrations make",
                severity=Severity.UNVERIFIABLE,
            )
        )
        return True
    if reference["version"] != latest:
        raise CassetteError(
            ErrorCode.DATABASE_ERROR,
            f"the package's {catalog.snapshot_path(major).name} describes schema"
            f" {reference['version']}, its migrations make {latest}: regenerate it"
            " (postgresql/catalog.py)",
        )
    return catalog.compare(reference["objects"], catalog.describe(conn), out)


def _check_meta(conn: psycopg.Connection[Any], mirror: sqlite3.Connection, out: Collector) -> None:
    """cassette_meta is a ledger's (format, a ledger_id of 32 hex digits), and its
    ledger_id the one the seals under the default origin name (``verify/schema.py``)."""
    meta = [(str(k), str(v)) for k, v in conn.execute(query("verify_meta"))]
    if not meta_is_a_cassettes(meta):
        out.add(
            Finding(
                FindingKind.SCHEMA_CHANGED,
                "cassette_meta differs from a cassette's",
                table="cassette_meta",
            )
        )
    check_ledger_id(mirror, out, dict(meta))


def _check_head(
    conn: psycopg.Connection[Any], out: Collector, exists: bool
) -> list[tuple[Any, ...]]:
    """The head is one row; its rows as read. It holds the chain's lock and the ledger's
    clock, not the journal's end (schema/10_ledger.sql: the journal's last entry is that,
    read by the guard); its time is checked with the rows' (``_check_head_time``)."""
    heads = conn.execute(query("verify_head")).fetchall() if exists else []
    if len(heads) != 1:
        out.add(
            Finding(
                FindingKind.JOURNAL_HEAD,
                f"cassette_head holds {len(heads)} rows, the ledger's one",
                table="cassette_head",
            )
        )
    return heads


def _check_head_time(
    heads: list[tuple[Any, ...]], mirror: sqlite3.Connection, out: Collector, tables: list[str]
) -> None:
    """The head keeps the ledger's time (SQLite derives it from the rows): the floor of
    the next write's date, so never before the newest row's. A head moved back would let
    the next write be dated before the rows already there; said now, not after it.
    ``heads``: the head's rows as ``_check_head`` read them (one snapshot)."""
    if len(heads) != 1:
        return  # (_check_head names a missing or doubled head)
    newest = max(
        (
            int(row[0])
            for table in tables
            for row in mirror.execute(f"SELECT max({TABLES[table].dated_by}) FROM {table}")
            if isinstance(row[0], int)
        ),
        default=None,
    )
    head_time = heads[0][0]
    if newest is not None and (not isinstance(head_time, int) or head_time < newest):
        out.add(
            Finding(
                FindingKind.TIME_BACKWARDS,
                f"the head's time {head_time} is before the newest row's, {newest}",
                table="cassette_head",
            )
        )


def _tables_present(conn: psycopg.Connection[Any]) -> list[str]:
    """The journaled tables this ledger has (the catalog check found them as shipped)."""
    names = {str(row[0]) for row in conn.execute(query("catalog_relations")) if row[1] == "r"}
    return [table for table in TABLES if table in names]


def _check_rows(mirror: sqlite3.Connection, options: VerifyOptions, now_ms: int) -> Collector:
    """Checks 3-5 on the private copy, as ``verify.run`` runs them on a ledger file:
    state (a full replay), consistency, checkpoint ids, dense ids; then time."""
    rows, lawful, time = Collector(), Collector(), Collector()
    check_state(mirror, rows, options.run_id, check_journal_columns)
    check_history(mirror, lawful, now_ms, options.clock_skew_ms, run_id=options.run_id)
    check_time(mirror, time, now_ms, options.clock_skew_ms, options.max_time_jump_ms)
    check_inserts(mirror, lawful, time, options.run_id)
    check_consistency(mirror, rows, options.run_id, now_ms)
    check_checkpoint_ids(mirror, rows)
    check_dense_ids(mirror, rows)
    rows.merge(lawful, time)
    return rows


def check_journal_columns(conn: sqlite3.Connection, out: Collector) -> None:
    """The table name and key PostgreSQL stores beside each body (read by the by-row
    index) are the body's: the key as SQLite's generated column holds it (0004's
    ``cassette_journal_append``): the decimal digits of an integer key, a string key's
    text unquoted (an action_id)."""
    rows = conn.execute(
        "SELECT seq, tbl, row_key FROM main.cassette_journal NOT INDEXED WHERE json_valid(body)"
        " AND (tbl IS NOT json_extract(body, '$.table') OR row_key IS NOT"
        " CASE json_type(body, '$.key')"
        "  WHEN 'integer' THEN CAST(json_extract(body, '$.key') AS TEXT)"
        "  WHEN 'text' THEN json_extract(body, '$.key') END) ORDER BY seq"
    )
    for seq, tbl, key in rows:
        out.add(
            Finding(
                FindingKind.JOURNAL_COLUMNS,
                "the table or key stored beside the body is not the body's",
                seq,
                tbl,
                key,
            )
        )


class Mirror:
    """A private SQLite database holding what was read from the ledger, as read: the
    journal (seq, body, leaf hash, stored table name and key) and every journaled table
    with the columns of its journal body, for the SQLite verifier's checks. Written by
    this process only, in a directory only it knows; never the ledger."""

    def __init__(self, path: Path, *, journal: bool, major: int) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.keep_journal = journal
        self.conn.execute("PRAGMA journal_mode = OFF")
        self.conn.execute("PRAGMA synchronous = OFF")
        self.conn.execute("BEGIN")
        self.conn.execute(
            "CREATE TABLE cassette_journal (seq INTEGER PRIMARY KEY, body, leaf_hash, tbl, row_key)"
        )
        layout = catalog.column_types(major)
        for name, spec in TABLES.items():
            # Each column with the affinity of its type on the server (bigint: INTEGER,
            # text: TEXT), which keeps every value as read and lets the lookups below use
            # their indexes; a table this ledger lacks stays empty.
            types = {
                column: _AFFINITY.get(server_type, "")
                for column, server_type in layout.get(name, {}).items()
            }
            columns = ", ".join(
                f"{c} INTEGER PRIMARY KEY" if c == spec.rowid else f"{c} {types.get(c, '')}"
                for c in spec.columns
            )
            self.conn.execute(f"CREATE TABLE {name} ({columns})")

    def entries(self, cursor: psycopg.ServerCursor[Any]) -> Iterator[list[tuple[Any, ...]]]:
        """The journal's rows from ``cursor`` in batches, copied here as they pass."""
        insert = (
            "INSERT OR IGNORE INTO cassette_journal (seq, body, leaf_hash, tbl, row_key)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        while rows := cursor.fetchmany(BATCH):
            if self.keep_journal:
                self.conn.executemany(insert, [(r[0], r[1], r[2], r[4], r[5]) for r in rows])
            yield rows

    def copy_table(self, conn: psycopg.Connection[Any], table: str) -> None:
        """Every row of ``table`` (plain SELECT, streamed), here."""
        from psycopg import sql

        spec = TABLES[table]
        select = sql.SQL(query("verify_table_rows")).format(
            columns=sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns),
            table=sql.Identifier(table),
        )
        insert = (
            f"INSERT OR IGNORE INTO {table} ({', '.join(spec.columns)})"
            f" VALUES ({', '.join('?' for _ in spec.columns)})"
        )
        with conn.cursor(name=f"cassette_verify_{table}") as cursor:
            cursor.execute(select)
            while rows := cursor.fetchmany(BATCH):
                self.conn.executemany(insert, rows)

    def commit(self) -> None:
        """The copy is complete: indexes for the consistency rules' lookups, and commit."""
        if self.conn.in_transaction:
            for table, column in _LOOKUPS:
                self.conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {table}_by_{column} ON {table} ({column})"
                )
            self.conn.execute("COMMIT")

    def shape_for_worker_keys(self, conn: psycopg.Connection[Any]) -> None:
        """What ``worker_keys.check_worker_keys`` reads besides the copied tables, in
        TEMP tables of this copy (they shadow the main ones for that check, which runs
        last): the ledger's cassette_meta as read in the snapshot (not journaled, so not
        copied), and the journal with its table name and key taken from each body as
        SQLite's generated columns take them (PostgreSQL stores the key as its JSON text,
        which ``check_journal_columns`` compared with the body already)."""
        self.conn.execute("CREATE TEMP TABLE cassette_meta (key TEXT PRIMARY KEY, value TEXT)")
        self.conn.executemany(
            "INSERT OR IGNORE INTO temp.cassette_meta (key, value) VALUES (?, ?)",
            [(str(k), str(v)) for k, v in conn.execute(query("verify_meta"))],
        )
        self.conn.execute(
            "CREATE TEMP TABLE cassette_journal (seq INTEGER PRIMARY KEY, body TEXT, tbl TEXT,"
            " row_key)"
        )
        self.conn.execute(
            "INSERT INTO temp.cassette_journal (seq, body, tbl, row_key)"
            " SELECT seq, body, json_extract(body, '$.table'), json_extract(body, '$.key')"
            " FROM main.cassette_journal WHERE json_valid(body) ORDER BY seq"
        )
        self.conn.execute(
            "CREATE INDEX temp.cassette_journal_by_row ON cassette_journal (tbl, row_key, seq)"
        )

    def close(self) -> None:
        self.conn.close()


# SQLite's type affinity for a server column type (the catalog's format_type).
_AFFINITY = {"bigint": "INTEGER", "integer": "INTEGER", "text": "TEXT"}
# The lookups check_consistency makes by a column that is not the table's rowid.
# (and check_worker_keys makes, per attestation, receipt and release, by step)
_LOOKUPS = (
    ("cassette_jobs", "message_id"),
    ("cassette_steps", "job_id"),
    ("cassette_receipts", "step_id"),
    ("cassette_releases", "step_id"),
    ("cassette_attestations", "step_id"),
)
