"""CausalChain on PostgreSQL: appends, reads, checkpoints and the plan lifecycle.

Items are checked and encoded by the SQLite class's own helpers (``actions.coerce_fields``,
``CausalChain._row``, ``plans.checkpoint_text``); each append calls the appender's
SECURITY DEFINER function (0004_actions.sql), whose triggers hold the law, date the row
with the server's time and journal it. Reads are the named queries of ``queries.sql``,
decoded by the functions the SQLite class decodes with. Signatures and suggested causes
are made as SQLite makes them, once the transaction's time is known (``_append``);
artifact files live in a folder the caller names (there is no "beside" a URL). No
SQLite code runs on a psycopg connection: what is SQLite's alone (``write()``,
``ledger_now``) raises BACKEND_UNSUPPORTED. Chosen once, when a ledger is opened with a
PostgreSQL URL (``LedgerFile.__new__``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import payloads, plan_archive, plans
from ..actions import Action, from_row
from ..artifacts import DEFAULT_THRESHOLD_BYTES, ArtifactStore
from ..chain import (
    _INSERTED,
    _METADATA,
    _TIMESTAMP,
    CausalChain,
    _check_page,
    _check_since_seq,
    _load_signing_key,
    _Prepared,
    _stored,
    _suggest_scope,
)
from ..clock import Clock
from ..connection import DEFAULT_BUSY_TIMEOUT_MS
from ..errors import CassetteError, ErrorCode
from . import connection
from .ledger import PgLedger
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..seals import AutoSeal
    from ..sessions import SessionWorkingSet


class PgCausalChain(PgLedger, CausalChain):
    """Actions and checkpoints in a PostgreSQL database."""

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
        # No folder is beside a URL: artifact files live only where the caller says.
        self._folder = _url_artifacts(artifact_dir)
        if self._folder is not None:
            self.artifacts = self._folder  # (CausalChain._store writes there)
        self.artifact_threshold = artifact_threshold
        self._sessions: dict[str, SessionWorkingSet] = {}
        self._open_ledger(
            db_path,
            clock=clock,
            durability=durability,
            busy_timeout_ms=busy_timeout_ms,
            auto_seal=auto_seal,
            read_only=read_only,
        )

    # ------------------------------------------------------------------ appends

    def append_actions(
        self, actions: Iterable[Action | dict[str, Any]], *, suggest_causes: bool | str = False
    ) -> list[Action]:
        """Append several actions in one transaction; a refused item refuses the batch,
        named by ``detail["index"]``."""
        suggest = _suggest_scope(suggest_causes)
        prepared = self._prepare(actions)
        with self._writing() as conn:
            stored = self._append(conn, prepared, suggest)
        self._joined(stored)
        return stored

    def _append(
        self, conn: psycopg.Connection[Any], prepared: list[_Prepared], suggest: str | None = None
    ) -> list[Action]:
        """``_call_append`` in the caller's transaction, each row first given what SQLite's
        ``_insert_one`` gives it: suggested causes read at the row's time, then the
        signature of the row as it will be stored. Both need the row's time before it is
        sent: the head is taken first (``cassette_append_time``, schema/10_ledger.sql),
        which fixes the transaction's time and lets nothing else commit until this one does."""
        if suggest is None and self._signing_key is None:
            return _call_append(conn, prepared)
        got = conn.execute(query("append_time")).fetchone()
        assert got is not None
        now = int(got[0])
        for _, row in prepared:
            row[_TIMESTAMP] = now
        stored = []
        for index, item in enumerate(prepared):
            row = item[1]
            if suggest is not None:
                row[_METADATA] = self._with_suggestions(self._reads, row, suggest, now)
            if self._signing_key is not None:
                row[_METADATA] = self._signed_metadata(row)
            try:
                stored.extend(_call_append(conn, [item]))
            except CassetteError as refused:
                refused.detail["index"] = index
                raise
        return stored

    def _store(self, value: Any, what: str) -> tuple[str | None, str | None]:
        """Inline JSON, or an artifact file in the folder the ledger was opened with; a
        value over the threshold without one is INVALID_ARGUMENT (nothing is written)."""
        if (
            self._folder is None
            and value is not None
            and len(payloads.dumps(value).encode("utf-8")) > self.artifact_threshold
        ):
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                f"the {what} is over the artifact threshold of {self.artifact_threshold}"
                " bytes: a PostgreSQL ledger keeps artifact files only in a folder it is"
                " given (artifact_dir, cassette --artifact-dir)",
            )
        return CausalChain._store(self, value, what)

    # -------------------------------------------------------------------- reads

    def _decode(self, row: tuple[Any, ...]) -> Action:
        return from_row(row, self._artifact_value)

    def _artifact_value(self, ref_json: str) -> Any:
        """The value an artifact reference names, found by its hash in the folder the
        ledger was opened with (``ArtifactStore.get``: checked against the hash)."""
        if self._folder is None:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT,
                "this action's value is an artifact file: open the PostgreSQL ledger with"
                " its artifacts folder (artifact_dir, cassette --artifact-dir)",
            )
        return self._folder.get(ref_json)

    def _rows(self, name: str, **params: Any) -> list[Action]:
        return [self._decode(row) for row in self._fetch(name, **params)]

    def get_action(self, action_id: str) -> Action:
        found = self._rows("action_by_id", action_id=action_id)
        if not found:
            raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")
        return found[0]

    def actions_for_plan(self, plan_id: str) -> list[Action]:
        return self._rows("actions_of_plan", value=plan_id)

    def actions_for_intent(self, intent_id: str) -> list[Action]:
        return self._rows("actions_of_intent", value=intent_id)

    def actions_for_session(self, session_id: str) -> list[Action]:
        return self._rows("actions_of_session", value=session_id)

    def actions_for_link(self, link: str, value: str) -> list[Action]:
        from ..actions import REASONING_LINKS

        if link not in REASONING_LINKS:
            raise CassetteError(
                ErrorCode.INVALID_ARGUMENT, f"link must be one of {REASONING_LINKS}"
            )
        sql = query("actions_for_link").format(link=link)
        return [self._decode(row) for row in connection.statement(self.pg, sql, {"value": value})]

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
        """Like ``CausalChain.iter_actions``; the rows are read in one statement before the
        first is returned."""
        from ..timeline import parse_time

        _check_page(limit, offset)
        params = {
            "plan_id": plan_id,
            "intent_id": intent_id,
            "session_id": session_id,
            "action_type": action_type,
            "function_name": function_name,
            "since_seq": _check_since_seq(since_seq),
            "after": None if after is None else parse_time(after),
            "before": None if before is None else parse_time(before),
            "limit": limit,
            "offset": offset,
        }
        name = "find_actions_newest_first" if newest_first else "find_actions"
        return iter(self._rows(name, **params))

    def iter_children(self, action_id: str) -> Iterator[Action]:
        self._require(action_id)
        return iter(self._rows("children", value=action_id))

    def subtree(self, action_id: str) -> list[Action]:
        self._require(action_id)
        return self._rows("subtree", action_id=action_id)

    def _require(self, action_id: str) -> None:
        if not self._fetch("action_exists", action_id=action_id):
            raise CassetteError(ErrorCode.NOT_FOUND, f"no action {action_id}")

    # ------------------------------------------------------------- reasoning
    # The logic is reasoning.py's and dependencies.py's; the reads are named queries.

    def _reads(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """A ``reasoning.Fetch``: the scope's column of a per-scope read is spliced in from
        ``dependencies.SCOPES`` (``candidates_plan`` -> ``candidates`` on plan_id)."""
        from ..dependencies import SCOPES

        base, _, scope = name.rpartition("_")
        if base in ("candidates", "scope_row") and scope in SCOPES:
            sql = query(base).format(column=SCOPES[scope])
        else:
            sql = query(name)
        return connection.statement(self.pg, sql, params)

    def build_causal_chain(self, action_id: str, max_depth: int | None = None) -> dict[str, Any]:
        from ..reasoning import causal_chain_of

        return causal_chain_of(self._reads, action_id, max_depth)

    def reconstruct_reasoning(self, action_id: str) -> dict[str, Any]:
        from ..reasoning import reasoning_of

        return reasoning_of(self._reads, action_id)

    def causality_stats(
        self, plan_id: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """The three aggregates in one snapshot, as SQLite's read transaction."""
        from ..reasoning import stats_of

        params = {"plan": plan_id, "session": session_id}
        with self.read_snapshot() as conn:
            totals = conn.execute(query("causality_totals"), params).fetchone()
            categories = conn.execute(query("causality_categories"), params).fetchall()
            lengths = conn.execute(query("causality_lengths"), params).fetchone()
        assert totals is not None and lengths is not None
        return stats_of(plan_id, session_id, tuple(totals), categories, tuple(lengths))

    def detect_dependencies(self, **options: Any) -> list[dict[str, Any]]:
        from ..dependencies import dependencies_of

        return dependencies_of(self._reads, now_ms=self.now_ms(), **options)

    def validate_causal_chain(self, action_id: str) -> dict[str, Any]:
        from ..dependencies import validate_causal_chain_of

        return validate_causal_chain_of(self._reads, action_id)

    def metrics(self, by: str) -> list[dict[str, Any]]:
        from ..metrics import grouping, metric_rows

        column, where = grouping(by)
        sql = query("metrics").format(column=column, where=where)
        with self.read_snapshot() as conn:
            return metric_rows(by, conn.execute(sql).fetchall())

    def follow(self, since_seq: int = -1, **options: Any) -> Iterator[dict[str, Any]]:
        from ..follow import follow_reader
        from .anchors import journal_reader

        return follow_reader(journal_reader(self.pg), since_seq, **options)

    def downstream(self, action_id: str) -> list[Action]:
        from ..reasoning import downstream_of

        return [self.get_action(a) for a in downstream_of(self._reads, action_id)]

    # ----------------------------------------------------------- plan lifecycle

    def plan_body(self, plan_id: str) -> dict[str, Any]:
        rows = self._fetch("plan_started", plan_id=plan_id)
        return plan_archive.body_of(plan_id, rows[0] if rows else None)

    def plan_status(self, plan_id: str) -> dict[str, Any]:
        with self.read_snapshot() as conn:  # one snapshot for every read
            steps = conn.execute(query("plan_steps"), {"plan_id": plan_id}).fetchall()
            totals = conn.execute(query("plan_totals"), {"plan_id": plan_id}).fetchone()
            state = _plan_state(conn, plan_id)
        assert totals is not None
        return plans.plan_status_of(plan_id, steps, tuple(totals), lambda: state)

    def save_checkpoint(self, plan_id: str, context: Any) -> str:
        text, checkpoint_id = self._checkpoint_text(plan_id, context)
        with self._writing() as conn:
            _save_checkpoint(conn, plan_id, text, checkpoint_id)
        return checkpoint_id

    def load_checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        rows = self._fetch("checkpoint", checkpoint_id=checkpoint_id)
        return plans.checkpoint_of(checkpoint_id, rows[0] if rows else None)

    def latest_checkpoint(self, plan_id: str) -> dict[str, Any] | None:
        with self.read_snapshot() as conn:
            found = _latest_checkpoint_id(conn, plan_id)
            if found is None:
                return None
            row = conn.execute(query("checkpoint"), {"checkpoint_id": found}).fetchone()
        return plans.checkpoint_of(found, None if row is None else tuple(row))

    def pause(self, plan_id: str, context: Any, **fields: Any) -> Action:
        """Save the context as a checkpoint and record PlanPaused referring to it, in one
        transaction: a refused pause stores no checkpoint either."""
        text, checkpoint_id = self._checkpoint_text(plan_id, context)
        metadata = {**fields.pop("metadata", {}), "checkpoint_id": checkpoint_id}
        with self._writing() as conn:
            intent = fields.pop("intent_id", _intent_of(conn, plan_id))
            prepared = self._prepare(
                [
                    {
                        "plan_id": plan_id,
                        "intent_id": intent,
                        "action_type": "PlanPaused",
                        "function_name": fields.pop("function_name", "pause"),
                        "parent_action_id": _plan_started_id(conn, plan_id),
                        "metadata": metadata,
                        **fields,
                    }
                ]
            )
            _save_checkpoint(conn, plan_id, text, checkpoint_id)
            stored = self._append(conn, prepared)
        self._joined(stored)
        return stored[0]

    def resume(
        self, plan_id: str, checkpoint_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Record PlanResumed (parent: PlanStarted; metadata: the checkpoint) and return
        the stored context. Refused with PLAN_NOT_PAUSED unless the plan is paused."""
        with self._writing() as conn:
            if plans.PLAN_STATES[_plan_state_type(conn, plan_id)] != "paused":
                raise CassetteError(ErrorCode.PLAN_NOT_PAUSED, f"plan {plan_id} is not paused")
            chosen = checkpoint_id or _latest_checkpoint_id(conn, plan_id)
            if chosen is None:
                raise CassetteError(ErrorCode.NOT_FOUND, f"plan {plan_id} has no checkpoint")
            row = conn.execute(query("checkpoint"), {"checkpoint_id": chosen}).fetchone()
            checkpoint = plans.checkpoint_of(chosen, None if row is None else tuple(row))
            if checkpoint["plan_id"] != plan_id:
                raise CassetteError(
                    ErrorCode.NOT_FOUND, f"{chosen} is not a checkpoint of {plan_id}"
                )
            prepared = self._prepare(
                [
                    {
                        "plan_id": plan_id,
                        "intent_id": _intent_of(conn, plan_id),
                        "action_type": "PlanResumed",
                        "function_name": "resume",
                        "parent_action_id": _plan_started_id(conn, plan_id),
                        **fields,
                        "metadata": {**fields.get("metadata", {}), "checkpoint_id": chosen},
                    }
                ]
            )
            stored = self._append(conn, prepared)
        self._joined(stored)
        return {"action": stored[0], "checkpoint_id": chosen, "context": checkpoint["context"]}


def _url_artifacts(artifact_dir: str | os.PathLike[str] | None) -> ArtifactStore | None:
    """The artifacts folder of a URL ledger, or None without one. A reference records
    the file as ``<folder name>/<sha256>``: informative only, as on SQLite (readers find
    a file by its hash in the folder they are given)."""
    if artifact_dir is None:
        return None
    root = Path(artifact_dir).absolute()
    return ArtifactStore(root, Path(os.path.realpath(root)).parent)


def _call_append(conn: psycopg.Connection[Any], prepared: list[_Prepared]) -> list[Action]:
    """Insert prepared actions in the caller's transaction, one call each (pipelined); a
    refusal names its item (``detail["index"]``) and leaves the transaction to roll back."""
    batch = []
    for index, (_fields, row) in enumerate(prepared):
        params = dict(zip(_INSERTED, row, strict=True))
        del params["timestamp"]  # the server's
        if any(isinstance(v, str) and "\x00" in v for v in params.values()):
            error = CassetteError(
                ErrorCode.BACKEND_UNSUPPORTED,
                "PostgreSQL text cannot hold U+0000 (NUL) outside JSON, where it is escaped",
            )
            error.detail["index"] = index
            raise error
        batch.append(params)
    stored = []
    answers = connection.batch(conn, query("append_action"), batch, index_one=True)
    for (fields, row), got in zip(prepared, answers, strict=True):
        seq, timestamp = int(got[0]), int(got[1])
        if row[_TIMESTAMP] is not None and row[_TIMESTAMP] != timestamp:
            # (cannot happen: the transaction's time is fixed once the head is taken)
            raise CassetteError(
                ErrorCode.DATABASE_ERROR, "the server dated the action other than it said"
            )
        row[_TIMESTAMP] = timestamp
        stored.append(_stored(fields, row, seq, timestamp))
    return stored


def _save_checkpoint(
    conn: psycopg.Connection[Any], plan_id: str, text: str, checkpoint_id: str
) -> None:
    conn.execute(
        query("save_checkpoint"),
        {"checkpoint_id": checkpoint_id, "plan_id": plan_id, "context_json": text},
    )


def _plan_state_type(conn: psycopg.Connection[Any], plan_id: str) -> str | None:
    row = conn.execute(query("plan_state"), {"plan_id": plan_id}).fetchone()
    return None if row is None else str(row[0])


def _plan_state(conn: psycopg.Connection[Any], plan_id: str) -> str:
    return plans.PLAN_STATES[_plan_state_type(conn, plan_id)]


def _plan_started_id(conn: psycopg.Connection[Any], plan_id: str) -> str | None:
    row = conn.execute(query("plan_started"), {"plan_id": plan_id}).fetchone()
    return None if row is None else str(row[0])


def _intent_of(conn: psycopg.Connection[Any], plan_id: str) -> str:
    row = conn.execute(query("plan_intent"), {"plan_id": plan_id}).fetchone()
    if row is None:
        raise CassetteError(ErrorCode.PLAN_NOT_STARTED, f"plan {plan_id} has no actions")
    return str(row[0])


def _latest_checkpoint_id(conn: psycopg.Connection[Any], plan_id: str) -> str | None:
    """The checkpoint of the plan's last pause, else the plan's newest checkpoint
    (``plans.latest_checkpoint_id``); the pauses' metadata is read here, not by the server."""
    for (metadata_json,) in conn.execute(query("plan_pauses"), {"plan_id": plan_id}):
        found = payloads.loads_object(metadata_json, "the metadata of a pause").get("checkpoint_id")
        if found is not None:
            return str(found)
    row = conn.execute(query("plan_newest_checkpoint"), {"plan_id": plan_id}).fetchone()
    return None if row is None else str(row[0])
