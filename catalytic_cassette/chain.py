"""CausalChain: append and query actions; sessions held in memory on request."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import dependencies, metrics, payloads, plan_archive, plans, reasoning
from .actions import (
    COLUMNS,
    COST_SCALE,
    SELECT_COLUMNS,
    Action,
    coerce_fields,
    cost_micros,
    from_row,
    stored_action,
)
from .artifacts import DEFAULT_THRESHOLD_BYTES, ArtifactStore, default_root
from .clock import Clock
from .connection import DEFAULT_BUSY_TIMEOUT_MS
from .errors import CassetteError, ErrorCode, translate
from .ledger import LedgerFile
from .reasoning import Fetch, sqlite_fetch
from .sessions import SessionWorkingSet

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from .seals import AutoSeal

_INSERTED = COLUMNS[1:]  # action_seq is the ledger's: dense, one more than the last
_TIMESTAMP = _INSERTED.index("timestamp")
_METADATA = _INSERTED.index("metadata_json")
_COST = _INSERTED.index("cost_micros")
_ROW = f"({', '.join('?' for _ in _INSERTED)})"
_INSERT = f"INSERT INTO cassette_actions ({', '.join(_INSERTED)}) VALUES {_ROW}"
# A batch goes in chunks of this many rows per INSERT: SQLite allocates and zeroes a frame
# for each trigger program once per statement and builds a constant IN list once per
# statement, so rows that share a statement share them (docs/BENCHMARKS.md, "Issue 12,
# fourth pass"). The rest of a batch goes row by row.
_CHUNK = 32
_INSERT_CHUNK = f"{_INSERT}{(', ' + _ROW) * (_CHUNK - 1)}"
# An item's validated fields (a new dict, in field order) and its INSERT parameters.
_Prepared = tuple[dict[str, Any], list[Any]]
_SUBTREE = f"""
WITH RECURSIVE tree(action_id) AS (
    SELECT action_id FROM cassette_actions WHERE action_id = ?
    UNION ALL
    SELECT a.action_id FROM cassette_actions a JOIN tree t ON a.parent_action_id = t.action_id
)
SELECT {SELECT_COLUMNS} FROM cassette_actions
 WHERE action_id IN (SELECT action_id FROM tree) ORDER BY action_seq
"""


K = TypeVar("K", bound="CausalChain")


class CausalChain(LedgerFile):
    """Actions linked by execution parent, in the same file and journal as the cassette.

    Opening loads nothing into memory; ``load_session`` builds a working set of one
    session's actions, and appends to a loaded session join it once committed.
    """

    @classmethod
    def _postgresql_class(cls: type[K]) -> type[K]:
        if cls is not CausalChain:  # a subclass is not served by PostgreSQL's
            return super()._postgresql_class()
        from .postgresql.chain import PgCausalChain

        return cast("type[K]", PgCausalChain)

    def __init__(
        self,
        db_path: str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
        durability: str | None = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        signing_key: Ed25519PrivateKey | str | os.PathLike[str] | None = None,
        artifact_threshold: int = DEFAULT_THRESHOLD_BYTES,
        artifact_dir: str | os.PathLike[str] | None = None,
        auto_seal: AutoSeal | None = None,
        read_only: bool = False,
    ) -> None:
        self._signing_key = _load_signing_key(signing_key)  # before opening: nothing to leak
        super().__init__(
            db_path,
            clock=clock,
            durability=durability,
            busy_timeout_ms=busy_timeout_ms,
            auto_seal=auto_seal,
            read_only=read_only,
        )
        db_dir = Path(self.db_path).resolve().parent
        root = Path(artifact_dir) if artifact_dir is not None else default_root(self.db_path)
        self.artifacts = ArtifactStore(root.absolute(), db_dir)  # a link there is refused
        self.artifact_threshold = artifact_threshold
        self._sessions: dict[str, SessionWorkingSet] = {}

    # --------------------------------------------------------------- appends

    def append_action(
        self, action: Action | dict[str, Any], *, suggest_causes: bool | str = False
    ) -> Action:
        """Append one action; return it as stored (with timestamp and action_seq).

        ``suggest_causes`` (True: by plan; or "plan", "session", "intent") records what
        ``detect_dependencies`` proposes in ``metadata.suggested_causes``, never as
        ``caused_by``.
        """
        return self.append_actions([action], suggest_causes=suggest_causes)[0]

    def append_actions(
        self, actions: Iterable[Action | dict[str, Any]], *, suggest_causes: bool | str = False
    ) -> list[Action]:
        """Append several actions in one transaction; a refused item refuses the batch."""
        suggest = _suggest_scope(suggest_causes)
        prepared = self._prepare(actions)
        with self.write() as conn:
            stored = self._insert(conn, prepared, suggest)
        self._joined(stored)
        return stored

    def _prepare(self, actions: Iterable[Action | dict[str, Any]]) -> list[_Prepared]:
        """Validate and encode every item; artifacts are written here, before any commit."""
        prepared = []
        for index, value in enumerate(actions):
            try:
                fields = coerce_fields(value)
                prepared.append((fields, self._row(fields)))
            except CassetteError as refused:
                refused.detail["index"] = index
                raise
        return prepared

    def _insert(
        self,
        conn: sqlite3.Connection,
        prepared: list[_Prepared],
        suggest: str | None = None,
    ) -> list[Action]:
        """Insert prepared actions inside the caller's transaction."""
        now = self.ledger_now(conn)
        for _, row in prepared:
            row[_TIMESTAMP] = now
        if suggest is None and self._signing_key is None and len(prepared) > 1:
            seqs = _insert_together(conn, [row for _, row in prepared])
        else:
            seqs = [
                self._insert_one(conn, index, row, suggest, now)
                for index, (_, row) in enumerate(prepared)
            ]
        return [
            _stored(fields, row, seq, now)
            for (fields, row), seq in zip(prepared, seqs, strict=True)
        ]

    def _insert_one(
        self, conn: sqlite3.Connection, index: int, row: list[Any], suggest: str | None, now: int
    ) -> int:
        """One row by its own statement: what suggested causes (which read the rows
        inserted before this one) and signatures (which sign the row) need."""
        if suggest is not None:
            fetch = sqlite_fetch(conn, dependencies.SQLITE_READS)
            row[_METADATA] = self._with_suggestions(fetch, row, suggest, now)
        if self._signing_key is not None:
            row[_METADATA] = self._signed_metadata(row)
        try:
            seq = conn.execute(_INSERT, row).lastrowid  # cheaper than RETURNING action_seq
        except sqlite3.Error as exc:
            error = translate(exc)
            error.detail["index"] = index
            raise error from exc
        assert seq is not None  # sqlite3 sets it after every INSERT
        return seq

    def _joined(self, stored: list[Action]) -> None:
        """Committed actions join their loaded session's working set."""
        for action in stored:
            if action.session_id in self._sessions:
                self._sessions[action.session_id].add(action)

    @staticmethod
    def _with_suggestions(fetch: Fetch, row: list[Any], scope: str, now: int) -> str:
        """The row's metadata with the suggested causes, read through ``fetch`` in the
        write transaction (so they are exactly the actions committed before this one)."""
        metadata: dict[str, Any] = payloads.loads(row[_METADATA])
        value = row[_INSERTED.index(dependencies.SCOPES[scope])]
        found = [] if value is None else dependencies.candidates_of(fetch, scope, value, at_ms=now)
        metadata["suggested_causes"] = [
            {"action_id": c["action_id"], "reason": c["reason"][:500]} for c in found
        ]
        return payloads.dumps(metadata)

    def _row(self, fields: dict[str, Any]) -> list[Any]:
        """The INSERT's parameters in ``_INSERTED`` order, each JSON encoded once; the
        timestamp is set in the write transaction."""
        arguments_json, arguments_artifact = self._store(fields["arguments"], "arguments")
        result_json, result_artifact = self._store(fields["result"], "result")
        return [
            fields["action_id"],
            fields["parent_action_id"],
            fields["plan_id"],
            fields["intent_id"],
            fields["session_id"],
            fields["action_type"],
            fields["function_name"],
            arguments_json,
            arguments_artifact,
            result_json,
            result_artifact,
            int(fields["success"]),
            fields["error_message"],
            cost_micros(fields["cost"]),
            fields["duration_ms"],
            None,  # timestamp
            payloads.dumps(plan_archive.with_plan_hash(fields["action_type"], fields["metadata"])),
            fields["caused_by"],
            fields["rationale"],
            fields["category"],
        ]

    def _store(self, value: Any, what: str) -> tuple[str | None, str | None]:
        if value is None:
            return None, None
        text = payloads.dumps(value)
        encoded = text.encode("utf-8")
        if len(encoded) <= self.artifact_threshold:
            return text, None
        return None, payloads.dumps(self.artifacts.put(encoded))

    def _signed_metadata(self, row: list[Any]) -> str:
        """The row's metadata with the signature of the row as it will be stored."""
        from .signing import sign

        assert self._signing_key is not None
        signature, signer = sign(
            self._signing_key, {"action_seq": None, **dict(zip(_INSERTED, row, strict=True))}
        )
        metadata: dict[str, Any] = payloads.loads(row[_METADATA])
        return payloads.dumps({**metadata, "signature": signature, "key_id": signer})

    # ----------------------------------------------------------------- reads

    def _decode(self, row: tuple[Any, ...]) -> Action:
        return from_row(row, self.artifacts.get)

    def _select(
        self,
        where: str,
        params: tuple[Any, ...],
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[Action]:
        return list(self._stream(where, params, limit, 0, newest_first))

    def _stream(
        self,
        where: str,
        params: tuple[Any, ...],
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
    ) -> Iterator[Action]:
        """Rows decoded one at a time as SQLite returns them; the checks run on the call."""
        order = "action_seq DESC" if newest_first else "action_seq"
        sql = f"SELECT {SELECT_COLUMNS} FROM cassette_actions WHERE {where} ORDER BY {order}"
        _check_page(limit, offset)
        if limit is not None or offset:
            sql += f" LIMIT {-1 if limit is None else int(limit)} OFFSET {int(offset)}"
        cursor = self.conn.execute(sql, params)
        return (self._decode(row) for row in cursor)

    def get_action(self, action_id: str) -> Action:
        found = self._select("action_id = ?", (action_id,))
        if not found:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")
        return found[0]

    def actions_for_plan(self, plan_id: str) -> list[Action]:
        return self._select("plan_id = ?", (plan_id,))

    def actions_for_intent(self, intent_id: str) -> list[Action]:
        return self._select("intent_id = ?", (intent_id,))

    def actions_for_session(self, session_id: str) -> list[Action]:
        return self._select("session_id = ?", (session_id,))

    def actions_for_link(self, link: str, value: str) -> list[Action]:
        """Actions whose metadata names this reasoning link (e.g. constitutional_rule_id)."""
        from .actions import REASONING_LINKS

        if link not in REASONING_LINKS:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, f"link must be one of {REASONING_LINKS}"
            )
        expr = f"json_extract(metadata_json, '$.{link}')"
        return self._select(f"{expr} = ? AND {expr} IS NOT NULL", (value,))

    def find_actions(
        self,
        *,
        plan_id: str | None = None,
        intent_id: str | None = None,
        session_id: str | None = None,
        action_type: str | None = None,
        limit: int | None = None,
        function_name: str | None = None,
        since_seq: int | None = None,
        after: str | int | None = None,
        before: str | int | None = None,
        newest_first: bool = False,
    ) -> list[Action]:
        """Matching actions in insertion order (``newest_first``: the reverse).

        ``since_seq``: action_seq greater than it; ``after``/``before``: timestamp in
        ``[after, before)``, each ISO 8601 or epoch ms (timeline.parse_time).
        """
        return list(
            self.iter_actions(
                plan_id=plan_id,
                intent_id=intent_id,
                session_id=session_id,
                action_type=action_type,
                limit=limit,
                function_name=function_name,
                since_seq=since_seq,
                after=after,
                before=before,
                newest_first=newest_first,
            )
        )

    def iter_actions(
        self,
        *,
        plan_id: str | None = None,
        intent_id: str | None = None,
        session_id: str | None = None,
        action_type: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        function_name: str | None = None,
        since_seq: int | None = None,
        after: str | int | None = None,
        before: str | int | None = None,
        newest_first: bool = False,
    ) -> Iterator[Action]:
        """Like ``find_actions``, one action at a time, in constant memory: read it
        before the next call on this ledger (it holds the query open)."""
        from .timeline import parse_time

        clauses: list[str] = ["1"]
        params: list[Any] = []
        for column, value in (
            ("plan_id", plan_id),
            ("intent_id", intent_id),
            ("session_id", session_id),
            ("action_type", action_type),
            ("function_name", function_name),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if _check_since_seq(since_seq) is not None:
            clauses.append("action_seq > ?")
            params.append(since_seq)
        for operator, when in ((">=", after), ("<", before)):
            if when is not None:
                clauses.append(f"timestamp {operator} ?")
                params.append(parse_time(when))
        return self._stream(" AND ".join(clauses), tuple(params), limit, offset, newest_first)

    def latest(
        self,
        plan_id: str | None = None,
        session_id: str | None = None,
        intent_id: str | None = None,
    ) -> Action | None:
        """The newest action (by action_seq) of a plan, session or intent, or of the
        whole ledger; None when there is none."""
        found = self.find_actions(
            plan_id=plan_id,
            session_id=session_id,
            intent_id=intent_id,
            limit=1,
            newest_first=True,
        )
        return found[0] if found else None

    def get_children(self, action_id: str) -> list[Action]:
        return list(self.iter_children(action_id))

    def iter_children(self, action_id: str) -> Iterator[Action]:
        """Like ``get_children``, one action at a time, in constant memory."""
        self._require(action_id)
        return self._stream("parent_action_id = ?", (action_id,))

    def get_parent(self, action_id: str) -> Action | None:
        action = self.get_action(action_id)
        if action.parent_action_id is None:
            return None
        return self.get_action(action.parent_action_id)

    def subtree(self, action_id: str) -> list[Action]:
        """The action and all its descendants, in insertion order, in one recursive query."""
        self._require(action_id)
        return [self._decode(row) for row in self.conn.execute(_SUBTREE, (action_id,))]

    def _require(self, action_id: str) -> None:
        row = self.conn.execute(
            "SELECT 1 FROM cassette_actions WHERE action_id = ?", (action_id,)
        ).fetchone()
        if row is None:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")

    # ------------------------------------------------------------- reasoning

    def build_causal_chain(self, action_id: str, max_depth: int | None = None) -> dict[str, Any]:
        """Root cause first, down to the action; each entry has depth, category, summary."""
        return reasoning.build_causal_chain(self.conn, action_id, max_depth)

    def reconstruct_reasoning(self, action_id: str) -> dict[str, Any]:
        return reasoning.reconstruct_reasoning(self.conn, action_id)

    def causality_stats(
        self, plan_id: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        return reasoning.causality_stats(self.conn, plan_id, session_id)

    def detect_dependencies(self, **query: Any) -> list[dict[str, Any]]:
        """Candidate causes, newest first, each with its reason (dependencies module)."""
        return dependencies.detect_dependencies(self.conn, now_ms=self.now_ms(), **query)

    def validate_causal_chain(self, action_id: str) -> dict[str, Any]:
        """Does every cause up this action's chain exist and precede its effect in time?"""
        return dependencies.validate_causal_chain(self.conn, action_id)

    def metrics(self, by: str) -> list[dict[str, Any]]:
        """Count, failures, failure rate, durations (total, p50, p95) and cost per group."""
        return metrics.metrics(self.conn, by)

    def follow(self, since_seq: int = -1, **options: Any) -> Iterator[dict[str, Any]]:
        """Journal entries after ``since_seq`` as they commit (follow module)."""
        from .follow import follow

        return follow(self.conn, since_seq, **options)

    def plan_body(self, plan_id: str) -> dict[str, Any]:
        """The body archived on the plan's PlanStarted, its hash checked on read."""
        return plan_archive.plan_body(self.conn, plan_id)

    def downstream(self, action_id: str) -> list[Action]:
        """Every action caused, directly or transitively, by this one."""
        found = reasoning.downstream(self.conn, action_id)
        return [self.get_action(a) for a in found]

    # ---------------------------------------------------------- plan lifecycle

    def plan_status(self, plan_id: str) -> dict[str, Any]:
        return plans.plan_status(self.conn, plan_id)

    def save_checkpoint(self, plan_id: str, context: Any) -> str:
        """Store the context immutably; the id is cp- + SHA-256 of the stored bytes.

        Saving the same context of the same plan again returns the same id.
        """
        text, checkpoint_id = self._checkpoint_text(plan_id, context)
        with self.write() as conn:
            self._store_checkpoint(conn, plan_id, text, checkpoint_id)
        return checkpoint_id

    @staticmethod
    def _checkpoint_text(plan_id: str, context: Any) -> tuple[str, str]:
        if not isinstance(plan_id, str) or not 1 <= len(plan_id) <= 200:
            raise CassetteError(ErrorCode.INVALID_PLAN_ID, "plan_id must be 1-200 characters")
        text = plans.checkpoint_text(plan_id, context)
        if len(text.encode("utf-8")) > payloads.MAX_PAYLOAD_BYTES:
            raise CassetteError(ErrorCode.PAYLOAD_TOO_LARGE, "the context is over 16 MiB")
        return text, plans.checkpoint_id_for(text)

    def _store_checkpoint(
        self, conn: sqlite3.Connection, plan_id: str, text: str, checkpoint_id: str
    ) -> None:
        exists = conn.execute(
            "SELECT context_json FROM cassette_checkpoints WHERE checkpoint_id = ?",
            (checkpoint_id,),
        ).fetchone()
        if exists is not None and exists[0] != text:
            # Someone stored other content under this id (a forged hash function): refuse
            # rather than report success for a checkpoint that would not load.
            raise CassetteError(
                ErrorCode.CHECKPOINT_MISMATCH,
                f"{checkpoint_id} holds another context than its id names (verify: checkpoint_id)",
            )
        if exists is None:
            conn.execute(
                "INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json,"
                " created_at) VALUES (?, ?, ?, ?)",
                (checkpoint_id, plan_id, text, self.ledger_now(conn)),
            )

    def load_checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        return plans.load_checkpoint(self.conn, checkpoint_id)

    def latest_checkpoint(self, plan_id: str) -> dict[str, Any] | None:
        found = plans.latest_checkpoint_id(self.conn, plan_id)
        return None if found is None else plans.load_checkpoint(self.conn, found)

    def pause(self, plan_id: str, context: Any, **fields: Any) -> Action:
        """Save the context as a checkpoint and record PlanPaused referring to it, in one
        transaction: a refused pause stores no checkpoint either."""
        text, checkpoint_id = self._checkpoint_text(plan_id, context)
        metadata = {**fields.pop("metadata", {}), "checkpoint_id": checkpoint_id}
        prepared = self._prepare(
            [
                {
                    "plan_id": plan_id,
                    "intent_id": fields.pop("intent_id", self._intent_of(plan_id)),
                    "action_type": "PlanPaused",
                    "function_name": fields.pop("function_name", "pause"),
                    "parent_action_id": plans.plan_started_id(self.conn, plan_id),
                    "metadata": metadata,
                    **fields,
                }
            ]
        )
        with self.write() as conn:
            self._store_checkpoint(conn, plan_id, text, checkpoint_id)
            stored = self._insert(conn, prepared)
        self._joined(stored)
        return stored[0]

    def resume(
        self, plan_id: str, checkpoint_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Record PlanResumed (parent: PlanStarted; metadata: the checkpoint) and return
        the stored context. Refused with PLAN_NOT_PAUSED unless the plan is paused."""
        if plans.plan_state(self.conn, plan_id) != "paused":
            raise CassetteError(ErrorCode.PLAN_NOT_PAUSED, f"plan {plan_id} is not paused")
        chosen = checkpoint_id or plans.latest_checkpoint_id(self.conn, plan_id)
        if chosen is None:
            raise CassetteError(ErrorCode.NOT_FOUND, f"plan {plan_id} has no checkpoint")
        checkpoint = plans.load_checkpoint(self.conn, chosen)
        if checkpoint["plan_id"] != plan_id:
            raise CassetteError(ErrorCode.NOT_FOUND, f"{chosen} is not a checkpoint of {plan_id}")
        resumed = self.append_action(
            {
                "plan_id": plan_id,
                "intent_id": self._intent_of(plan_id),
                "action_type": "PlanResumed",
                "function_name": "resume",
                "parent_action_id": plans.plan_started_id(self.conn, plan_id),
                **fields,
                "metadata": {**fields.get("metadata", {}), "checkpoint_id": chosen},
            }
        )
        return {"action": resumed, "checkpoint_id": chosen, "context": checkpoint["context"]}

    def _intent_of(self, plan_id: str) -> str:
        row = self.conn.execute(
            "SELECT intent_id FROM cassette_actions WHERE plan_id = ? ORDER BY action_seq LIMIT 1",
            (plan_id,),
        ).fetchone()
        if row is None:
            raise CassetteError(ErrorCode.PLAN_NOT_STARTED, f"plan {plan_id} has no actions")
        return str(row[0])

    # -------------------------------------------------------------- sessions

    def load_session(self, session_id: str) -> SessionWorkingSet:
        """Read one session's actions into an indexed in-memory working set."""
        working = SessionWorkingSet(session_id, self.actions_for_session(session_id))
        self._sessions[session_id] = working
        return working

    def unload_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def loaded_sessions(self) -> tuple[str, ...]:
        return tuple(self._sessions)


def _insert_together(conn: sqlite3.Connection, rows: list[list[Any]]) -> list[int]:
    """Insert the rows, ``_CHUNK`` to a statement, the rest by one prepared statement
    (``executemany``); return their seqs.

    SQLite gives a row inserted without its INTEGER PRIMARY KEY one more than the
    largest (and the dense-ids rule, in each table's ``_rules`` trigger, refuses any
    other), so the rows get the seqs after the last one. A refused row leaves the rows
    before it in the open transaction (a refused chunk statement undoes its own rows
    first, so its rows are tried again one by one): how many there are is its index, as
    the row-by-row path reports it.
    """
    last = conn.execute("SELECT coalesce(max(action_seq), 0) FROM cassette_actions").fetchone()[0]
    whole = len(rows) - len(rows) % _CHUNK
    try:
        for start in range(0, whole, _CHUNK):
            chunk = rows[start : start + _CHUNK]
            try:
                conn.execute(_INSERT_CHUNK, [value for row in chunk for value in row])
            except sqlite3.Error as exc:
                if not conn.in_transaction:
                    raise
                conn.executemany(_INSERT, chunk)  # to name the row: raises, counted below
                refused = translate(exc)  # pragma: no cover - they cannot pass one by one
                refused.detail["index"] = start  # pragma: no cover
                raise refused from exc  # pragma: no cover
        conn.executemany(_INSERT, rows[whole:])
    except sqlite3.Error as exc:
        error = translate(exc)
        if conn.in_transaction:  # else SQLite rolled it all back (a full disk): unknown
            error.detail["index"] = conn.execute(
                "SELECT count(*) FROM cassette_actions WHERE action_seq > ?", (last,)
            ).fetchone()[0]
        raise error from exc
    return list(range(last + 1, last + 1 + len(rows)))


def _stored(fields: dict[str, Any], row: list[Any], seq: int, timestamp: int) -> Action:
    """The action as stored: an item's fields with what its row and the ledger set."""
    fields["cost"] = row[_COST] / COST_SCALE
    fields["timestamp"] = timestamp
    fields["metadata"] = payloads.loads(row[_METADATA])
    fields["action_seq"] = seq
    return stored_action(fields)


def _check_page(limit: int | None, offset: int) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "limit must be a positive integer")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "offset must be a non-negative integer")


def _check_since_seq(since_seq: int | None) -> int | None:
    if since_seq is not None and (isinstance(since_seq, bool) or not isinstance(since_seq, int)):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "since_seq must be an integer")
    return since_seq


def _suggest_scope(value: bool | str) -> str | None:
    if value is False:
        return None
    if value is True:
        return "plan"
    if isinstance(value, str) and value in dependencies.SCOPES:
        return value
    raise CassetteError(
        ErrorCode.INVALID_ARGUMENT, "suggest_causes is a bool or one of plan, session, intent"
    )


def _load_signing_key(
    key: Ed25519PrivateKey | str | os.PathLike[str] | None,
) -> Ed25519PrivateKey | None:
    if key is None:
        return None
    if isinstance(key, (str, os.PathLike)):
        from .signing import load_private

        return load_private(key)
    return key
