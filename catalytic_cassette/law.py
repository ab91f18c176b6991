"""The step machine, its lease effects and the receipt and release rules, as data and as
pure judgements of one revision against the row before it.

The SQL guards (``sql/sqlite/schema/30_steps.sql``, its TEMP section, the PostgreSQL
migrations) refuse a write by these rules, in this order, with these codes; verify's
history judge (``verify/history.py``) judges every revision the journal records by the
same functions. ``tests/test_law.py`` drives the real guards of both backends with
generated revisions and requires the guard's code to be the one these functions give,
and reads the allow-list out of the guards' text: a rule changed in one place only is a
red test.

A verdict is ``None`` (lawful) or ``(code, text)``: the ``ErrorCode`` the write path
raises and what broke.

The inserts of the append-only tables (dense ids, readable JSON, references, the plan
lifecycle) are here too, as SQL conditions on a row and the rows of lower id
(``INSERT_RULES``, ``DENSE``), which ``verify/inserts.py`` runs over the final tables;
``tests/test_law_inserts.py`` holds them equal to the guards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeGuard

from .errors import ErrorCode
from .lease_limits import MAX_TTL_SECONDS

Verdict = tuple[ErrorCode, str] | None
Row = Mapping[str, Any]

STATUSES: Final = ("PENDING", "LEASED", "COMMITTED")
OUTCOMES: Final = ("SUCCESS", "FAILURE", "ABORTED")
INSERTED_AS: Final = "PENDING"
# The step machine's allow-list: each lawful edge and what it does to the lease.
CLAIM: Final = "claim"  # owner and expiry set, token + 1
COMMIT: Final = "commit"  # lease fields and token kept; only with the step's receipt
REQUEUE: Final = "requeue"  # owner and expiry cleared, token kept; after expiry or a release
EDGES: Final[dict[tuple[Any, Any], str]] = {
    ("PENDING", "LEASED"): CLAIM,
    ("LEASED", "COMMITTED"): COMMIT,
    ("LEASED", "PENDING"): REQUEUE,
}
FINAL: Final = "COMMITTED"
IMMUTABLE_COLUMNS: Final = (
    "step_id",
    "job_id",
    "run_id",
    "message_id",
    "job_ordinal",
    "ordinal",
    "payload_json",
    "created_at",
)
LEASE_FIELDS: Final = ("lease_owner", "lease_expires_at", "fencing_token")
NAME_CHARS: Final = (1, 200)  # worker ids and lease owners
LEASE_CAP_MS: Final = MAX_TTL_SECONDS * 1000


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


def _is_name(value: object) -> bool:
    return isinstance(value, str) and NAME_CHARS[0] <= len(value) <= NAME_CHARS[1]


def step_insert(row: Row) -> Verdict:
    """A step as inserted: PENDING, token 0, no lease."""
    status, token = row.get("status"), row.get("fencing_token")
    if status not in STATUSES:
        return ErrorCode.INVALID_STATUS, f"status {status!r}"
    if not _is_int(token) or token < 0:
        return ErrorCode.INVALID_TOKEN, f"token {token!r}"
    if status != INSERTED_AS:
        return ErrorCode.ILLEGAL_TRANSITION, f"a step is inserted as {status}"
    if token != 0 or row.get("lease_owner") is not None or row.get("lease_expires_at") is not None:
        return ErrorCode.LEASE_FIELDS_LOCKED, "a step is inserted with token 0 and no lease"
    return None


def step_update(
    old: Row,
    new: Row,
    *,
    receipt: bool = True,
    released: bool = False,
    now_ms: int | None = None,
) -> Verdict:
    """One revision of a step against the one before it.

    ``receipt``: the step's receipt (its token, its owner) exists, as a commit needs;
    ``released``: a release of the current token exists; ``now_ms``: the writer's
    transaction time, for the package connection's clock rules (None: not judged here;
    the history judge dates a requeue by the entries around it)."""
    old_status, status = old.get("status"), new.get("status")
    edge = EDGES.get((old_status, status)) if isinstance(status, str) else None
    if now_ms is not None:  # (the package's TEMP clock guard fires first)
        expiry = new.get("lease_expires_at")
        if edge == CLAIM and _is_int(expiry):
            if expiry <= now_ms:
                return ErrorCode.INVALID_TTL, f"the lease expires at {expiry}, not after {now_ms}"
            if expiry > now_ms + LEASE_CAP_MS:
                return ErrorCode.INVALID_TTL, f"the lease expires at {expiry}, over 30 days"
        old_expiry = old.get("lease_expires_at")
        if edge == REQUEUE and _is_int(old_expiry) and old_expiry > now_ms and not released:
            return (
                ErrorCode.LEASE_NOT_EXPIRED,
                f"requeued at {now_ms}, before the lease's expiry {old_expiry}",
            )
    if status not in STATUSES:
        return ErrorCode.INVALID_STATUS, f"status {status!r}"
    token, old_token = new.get("fencing_token"), old.get("fencing_token")
    if not _is_int(token) or token < 0:
        return ErrorCode.INVALID_TOKEN, f"token {token!r}"
    if _immutables(new) != _immutables(old):  # (the common case: equal, one comparison)
        for column in IMMUTABLE_COLUMNS:
            if _differ(new.get(column), old.get(column)):
                return ErrorCode.IMMUTABLE_FIELD, f"{column} changes"
    lease_changed = _lease(new) != _lease(old)  # (as ``_differ`` on each)
    if status == old_status and lease_changed:
        return ErrorCode.LEASE_FIELDS_LOCKED, f"lease fields change while {status}"
    if edge is None:
        return ErrorCode.ILLEGAL_TRANSITION, f"{old_status} -> {status}"
    if edge == CLAIM:
        owner, expiry = new.get("lease_owner"), new.get("lease_expires_at")
        if not _is_name(owner) or not _is_int(expiry) or token != _plus_one(old_token):
            return (
                ErrorCode.LEASE_FIELDS_LOCKED,
                f"a claim sets owner {owner!r}, expiry {expiry!r} and the token"
                f" {old_token!r} -> {token!r}",
            )
    elif edge == REQUEUE:
        if (
            new.get("lease_owner") is not None
            or new.get("lease_expires_at") is not None
            or _differ(token, old_token)
        ):
            return ErrorCode.LEASE_FIELDS_LOCKED, "a requeue clears the lease and keeps the token"
    else:
        if lease_changed:
            return ErrorCode.LEASE_FIELDS_LOCKED, "committing keeps the lease fields and the token"
        if not receipt:
            return ErrorCode.RECEIPT_REQUIRED, "COMMITTED without the step's receipt"
    return None


def _immutables(row: Row) -> tuple[Any, ...]:
    return tuple(map(row.get, IMMUTABLE_COLUMNS))


def _lease(row: Row) -> tuple[Any, ...]:
    return tuple(map(row.get, LEASE_FIELDS))


def _differ(a: object, b: object) -> bool:
    """SQL's ``IS NOT`` on the values a journal body holds (1 and 1.0 are the same)."""
    return a != b or (a is None) != (b is None)


def _plus_one(token: object) -> object:
    return token + 1 if _is_int(token) else None


def receipt(step: Row | None, row: Row, *, has_receipt: bool, now_ms: int | None) -> Verdict:
    """A receipt against its step as it stands (``None``: no such step). ``now_ms``: the
    receipt's transaction time (its ``created_at``), for the expiry rule."""
    worker, outcome = row.get("worker_id"), row.get("outcome")
    if not _is_name(worker):
        return ErrorCode.INVALID_WORKER, f"worker {worker!r}"
    if outcome not in OUTCOMES:
        return ErrorCode.INVALID_OUTCOME, f"outcome {outcome!r}"
    step_id = row.get("step_id")
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {step_id!r}"
    if has_receipt:
        return ErrorCode.DUPLICATE_RECEIPT, f"step {step_id} has its receipt"
    closes = _closes(step, row, "completes")
    if closes is not None:
        return closes
    expiry = step.get("lease_expires_at")
    if outcome != "ABORTED" and now_ms is not None and _is_int(expiry) and expiry <= now_ms:
        return (
            ErrorCode.LEASE_EXPIRED,
            f"{outcome} receipt dated {now_ms} at or after the lease's expiry {expiry}",
        )
    return None


def release(step: Row | None, row: Row, *, released_before: bool) -> Verdict:
    """A release against its step as it stands; ``released_before``: this step and token
    were released already."""
    worker = row.get("worker_id")
    if not _is_name(worker):
        return ErrorCode.INVALID_WORKER, f"worker {worker!r}"
    if released_before:
        return ErrorCode.APPEND_ONLY, "a release of this step with this token exists"
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {row.get('step_id')!r}"
    return _closes(step, row, "releases", job=False)


def _closes(step: Row, row: Row, verb: str, *, job: bool = True) -> Verdict:
    """A receipt or release names the lease it closes: same run (and job), LEASED, the
    current token, by its owner."""
    if _differ(row.get("run_id"), step.get("run_id")):
        return ErrorCode.RUN_MISMATCH, "the step belongs to another run"
    if job and _differ(row.get("job_id"), step.get("job_id")):
        return ErrorCode.REFERENCE_MISMATCH, "the step belongs to another job"
    if step.get("status") != "LEASED":
        return ErrorCode.NOT_LEASED, f"the step is {step.get('status')}"
    if _differ(row.get("fencing_token"), step.get("fencing_token")):
        return (
            ErrorCode.STALE_FENCING_TOKEN,
            f"token {row.get('fencing_token')!r}, the step's is {step.get('fencing_token')!r}",
        )
    if _differ(row.get("worker_id"), step.get("lease_owner")):
        return (
            ErrorCode.WRONG_WORKER,
            f"{row.get('worker_id')!r} {verb} a lease of {step.get('lease_owner')!r}",
        )
    return None


# (act, fencing_token, worker_id, key_id): a worker's attested act on one step.
Attested = tuple[str, Any, Any, Any]
STEP_ACTS: Final = ("claim", "release", "complete", "requeue")


def attestation(step: Row | None, row: Row, *, now_ms: int | None) -> Verdict:
    """An attestation of an act on a step, against the step as it stands (section 6b);
    ``now_ms``: its transaction time (its ``created_at``), for a requeue's expiry."""
    act, token = row.get("act"), row.get("fencing_token")
    if act not in STEP_ACTS:
        return None  # (a post names a message, not a step)
    if not _is_name(row.get("worker_id")):
        return ErrorCode.INVALID_WORKER, f"worker {row.get('worker_id')!r}"
    if step is None:
        return ErrorCode.STEP_NOT_FOUND, f"step {row.get('step_id')!r}"
    if _differ(row.get("run_id"), step.get("run_id")):
        return ErrorCode.RUN_MISMATCH, "the step belongs to another run"
    status = step.get("status")
    if act == "claim":
        if status != "PENDING":
            return ErrorCode.INVALID_ATTESTATION, f"a claim attested for a {status} step"
        if _differ(token, _plus_one(step.get("fencing_token"))):
            return ErrorCode.STALE_FENCING_TOKEN, f"a claim attested with token {token!r}"
        return None
    if status != "LEASED":
        return ErrorCode.NOT_LEASED, f"a {act} attested for a {status} step"
    if _differ(token, step.get("fencing_token")):
        return ErrorCode.STALE_FENCING_TOKEN, f"a {act} attested with token {token!r}"
    if act != "requeue" and _differ(row.get("worker_id"), step.get("lease_owner")):
        return ErrorCode.WRONG_WORKER, f"a {act} attested by {row.get('worker_id')!r}"
    expiry = step.get("lease_expires_at")
    if act == "requeue" and now_ms is not None and _is_int(expiry) and expiry > now_ms:
        return (
            ErrorCode.LEASE_NOT_EXPIRED,
            f"a requeue attested at {now_ms}, before the lease's expiry {expiry}",
        )
    return None


def signed_end(step: Row, acts: list[Attested], ending: str, *, aborted: bool = False) -> Verdict:
    """A lease whose claim was attested by its owner ends only by that worker's attested
    act under the same key (a receipt: ``complete``; a release: ``release``) or an
    attested requeue (a requeue; an ABORTED receipt). ``ending``: "complete", "release"
    or "requeue"; ``acts``: what is attested for the step."""
    token, owner = step.get("fencing_token"), step.get("lease_owner")
    claimed = [k for act, t, w, k in acts if act == "claim" and t == token and w == owner]
    if not claimed:
        return None
    key = claimed[0]
    requeue = any(act == "requeue" and t == token for act, t, _, _ in acts)
    if ending == "requeue":
        lawful = requeue
    else:
        lawful = any(a == ending and t == token and w == owner and k == key for a, t, w, k in acts)
        lawful = lawful or (ending == "complete" and aborted and requeue)
    if lawful:
        return None
    return (
        ErrorCode.SIGNATURE_REQUIRED,
        f"a lease claimed signed by {owner!r} ends by an unattested {ending}",
    )


# -- inserts of the append-only tables, judged over the final tables
#
# Append-only rows never change and the tables equal the journal's last image of each
# row (the state check), so a rule that compares a row only with rows of lower id holds
# of the final tables exactly when it held at each insert: it is judged by SQL over them
# (``verify/inserts.py``), each broken row mapped to its insert's journal seq.

# Readable JSON (LAW section 3 rule 12), as the SQL guards write it for each JSON column
# (``{c}``: the column): only text that could hold a number beyond a 64-bit integer or a
# finite double, a nesting beyond 1024 or a lone surrogate pays for the full check.
# ``tests/test_law.py`` finds both texts in the guards for every column in JSON_COLUMNS.
READABLE_PREFILTER: Final = (
    "{c} GLOB '*[0-9][eE]*' OR {c} GLOB '*" + "[0-9]" * 19 + "*'"
    " OR length({c}) > 2048 OR instr(lower({c}), '\\ud') > 0"
)
UNREADABLE: Final = (
    "json_valid({c}) AND ("
    " (length({c}) > 2048"
    " AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || {c}"
    " || replace(hex(zeroblob(975)), '00', ']') || ']'))"
    " OR EXISTS ("
    " SELECT 1 FROM json_tree({c})"
    " WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)"
    " OR (type = 'integer' AND typeof(atom) IS NOT 'integer')"
    " OR (instr(lower({c}), '\\ud') > 0 AND ("
    " (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))"
    " OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343)"
    " || ']*'))))))"
)
JSON_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "cassette_messages": ("payload_json",),
    "cassette_steps": ("payload_json",),
    "cassette_receipts": ("receipt_json",),
    "cassette_checkpoints": ("context_json",),
    "cassette_actions": (
        "arguments_json",
        "result_json",
        "metadata_json",
        "arguments_artifact",
        "result_artifact",
    ),
}
# Tables judged here whose ids are dense, in journal order: (table, id column). (Steps,
# receipts, releases and attestations are judged entry by entry in ``verify/history.py``.)
DENSE: Final = (
    ("cassette_messages", "message_id"),
    ("cassette_jobs", "job_id"),
    ("cassette_actions", "action_seq"),
    ("cassette_checkpoints", "checkpoint_seq"),
)
LIFECYCLE: Final = ("PlanStarted", "PlanPaused", "PlanResumed", "PlanCompleted", "PlanAborted")
STEP_EVENTS: Final = ("PlanStepCompleted", "PlanStepFailed", "PlanStepRetrying")
RUNNING_ONLY: Final = ("PlanPaused", "PlanCompleted", "PlanStepStarted", *STEP_EVENTS)


def _sql_list(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


# The latest lifecycle action of t's plan before t.
_LAST_LIFECYCLE = (
    "(SELECT l.action_type FROM main.cassette_actions AS l"
    " WHERE l.plan_id = t.plan_id AND l.action_seq < t.action_seq"
    f" AND l.action_type IN {_sql_list(LIFECYCLE)} ORDER BY l.action_seq DESC LIMIT 1)"
)


class InsertRule:
    """Rules of an append-only table's insert, judged in one query: the rows of ``table``
    (alias ``t``, joined with ``join``, narrowed by ``scope``) for which a case's
    condition holds break the first such case's rule. Each condition reads ``t`` and rows
    of lower id only.

    ``gate``, when given, is a condition over a block of the table's rows (aggregates of
    ``t``, no join) that holds for every block holding a row that ``scope`` holds for: a
    necessary condition, for speed only (the rows of a block it holds for are judged one by
    one, as without it)."""

    __slots__ = ("cases", "gate", "join", "scope", "table")

    def __init__(
        self,
        table: str,
        cases: tuple[tuple[ErrorCode, str, str], ...],
        *,
        join: str = "",
        scope: str = "",
        gate: str = "",
    ) -> None:
        self.table, self.cases, self.join, self.scope = table, cases, join, scope
        self.gate = gate


def _readable_rules() -> list[InsertRule]:
    rules = []
    for table, columns in JSON_COLUMNS.items():
        cases = []
        for column in columns:
            c = f"t.{column}"
            cases.append(
                (
                    ErrorCode.INVALID_PAYLOAD,
                    f"{column} is JSON the API cannot read back",
                    f"({READABLE_PREFILTER.format(c=c)}) AND {UNREADABLE.format(c=c)}",
                )
            )
        # Verify's scope: the guards' prefilter term by term, each behind a cheap gate it
        # implies, for speed over whole tables (a digit followed by e/E needs an e/E; 19
        # digits in a row a length of 19; '\\ud' in lower case a backslash-u or -U).
        prefilter = " OR ".join(
            f"((instr({c}, 'e') OR instr({c}, 'E')) AND {c} GLOB '*[0-9][eE]*')"
            f" OR (length({c}) >= 19 AND ({_NINETEEN_DIGITS.format(c=c)}))"
            f" OR length({c}) > 2048"
            f" OR ((instr({c}, '\\u') OR instr({c}, '\\U')) AND instr(lower({c}), '\\ud') > 0)"
            for c in (f"t.{column}" for column in columns)
        )
        gate = _readable_gate(columns)
        if table == "cassette_actions":  # (one scan of the table for both)
            cases.insert(0, _CHECKPOINT_NAMED)  # (the guards refuse it first)
            prefilter += f" OR ({_CHECKPOINT_SCOPE})"
            gate += f" OR coalesce({_CHECKPOINT_GATE}, 0)"
        rules.append(InsertRule(table, tuple(cases), scope=prefilter, gate=gate))
    return rules


def _readable_gate(columns: tuple[str, ...]) -> str:
    """The scope's terms over a block of rows. The longest text of the block, then, column
    by column, the block's texts joined by spaces: a row's text is a run of the joined
    text, its characters aligned as in the row's text alone (a space is one whole
    character), so the joined text holds every digit-then-e/E, 19 digits in a row and
    backslash that a row's text holds, as long as GLOB, which stops at a NUL, reads it to
    its end (a NUL opens the block). Literal-led patterns as in the scope, each called once
    per block instead of once per row."""
    longest = ", ".join(f"coalesce(length(t.{c}), 0)" for c in columns)
    longest = f"max({longest})" if len(columns) > 1 else longest
    terms = [f"coalesce(max({longest}) > 2048, 0)"]
    for column in columns:
        x = f"group_concat(t.{column}, ' ')"
        digit_e = " OR ".join(f"{x} GLOB '*{d}[eE]*'" for d in "0123456789")
        terms.append(
            f"coalesce({x} GLOB '*\\*' OR instr({x}, char(0))"
            f" OR (({x} GLOB '*e*' OR {x} GLOB '*E*') AND ({digit_e}))"
            f" OR {_NINETEEN_DIGITS.format(c=x)}, 0)"
        )
    return " OR ".join(terms)


# 19 digits in a row, as ten patterns that each begin with a literal (SQLite skips to its
# occurrences; a pattern beginning with a class is tried at every character).
_NINETEEN_DIGITS = " OR ".join(f"{{c}} GLOB '*{d}{'[0-9]' * 18}*'" for d in "0123456789")
_CHECKPOINT_NAMED = (
    ErrorCode.REFERENCE_MISSING,
    "metadata.checkpoint_id names no checkpoint of this plan",
    "instr(t.metadata_json, 'checkpoint_id') > 0 AND json_valid(t.metadata_json)"
    " AND json_extract(t.metadata_json, '$.checkpoint_id') IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM main.cassette_checkpoints AS k"
    " WHERE k.checkpoint_id = json_extract(t.metadata_json, '$.checkpoint_id')"
    " AND k.plan_id = t.plan_id)",
)
_CHECKPOINT_SCOPE = "instr(t.metadata_json, 'checkpoint_id') > 0"
_CHECKPOINT_GATE = "instr(group_concat(t.metadata_json, ' '), 'checkpoint_id') > 0"


INSERT_RULES: Final[tuple[InsertRule, ...]] = (
    *_readable_rules(),
    InsertRule(
        "cassette_jobs",
        (
            (ErrorCode.REFERENCE_MISSING, "the job's message does not exist", "m.rowid IS NULL"),
            (
                ErrorCode.RUN_MISMATCH,
                "a job's run_id must equal its message's run_id",
                "t.run_id IS NOT m.run_id",
            ),
        ),
        join="LEFT JOIN main.cassette_messages AS m ON m.message_id = t.message_id",
    ),
    InsertRule(
        "cassette_steps",
        (
            (ErrorCode.REFERENCE_MISSING, "the step's job does not exist", "j.rowid IS NULL"),
            (
                ErrorCode.RUN_MISMATCH,
                "a step's run_id must equal its job's run_id",
                "t.run_id IS NOT j.run_id",
            ),
            (
                ErrorCode.REFERENCE_MISMATCH,
                "a step's message_id and job_ordinal must equal its job's",
                "t.message_id IS NOT j.message_id OR t.job_ordinal IS NOT j.ordinal",
            ),
        ),
        join="LEFT JOIN main.cassette_jobs AS j ON j.job_id = t.job_id",
    ),
    InsertRule(
        "cassette_actions",
        (
            (
                ErrorCode.REFERENCE_MISSING,
                "the parent action does not exist before it",
                "p.action_seq IS NULL OR p.action_seq > t.action_seq",
            ),
        ),
        join="LEFT JOIN main.cassette_actions AS p ON p.action_id = t.parent_action_id",
        scope="t.parent_action_id IS NOT NULL",
    ),
    # The causes (LAW section 6c), read through the covering indexes by_parent and by_cause
    # (an id's unique index holds its action_seq). A cause dated after its effect
    # (CAUSE_AFTER_EFFECT) needs a date before the ledger's time, once the cause is an
    # earlier action: the time check's TIME_BACKWARDS at the effect names it.
    InsertRule(
        "cassette_actions",
        (
            (
                ErrorCode.REFERENCE_MISSING,
                "the parent action does not exist before it",
                "NOT EXISTS (SELECT 1 FROM main.cassette_actions AS p"
                " WHERE p.action_id = t.parent_action_id AND p.action_seq < t.action_seq)",
            ),
        ),
        scope="t.parent_action_id IS NOT NULL",
    ),
    InsertRule(
        "cassette_actions",
        (
            (
                ErrorCode.REFERENCE_MISSING,
                "the cause (caused_by) does not exist before it",
                "NOT EXISTS (SELECT 1 FROM main.cassette_actions AS c"
                " WHERE c.action_id = t.caused_by AND c.action_seq < t.action_seq)",
            ),
        ),
        scope="t.caused_by IS NOT NULL",
    ),
    # The plan lifecycle (LAW section 6a), as cassette_actions_plan_finished and
    # cassette_actions_lifecycle_guard refuse it: read from the plans that finished, and
    # from the lifecycle and step actions.
    InsertRule(
        "cassette_actions",
        ((ErrorCode.PLAN_FINISHED, "the plan has completed or aborted", "1"),),
        join="JOIN main.cassette_actions AS f ON f.plan_id = t.plan_id"
        " AND f.action_seq < t.action_seq",
        scope="f.action_type IN ('PlanCompleted', 'PlanAborted')",
    ),
    InsertRule(
        "cassette_actions",
        (
            (
                ErrorCode.PLAN_ALREADY_STARTED,
                "a plan starts once",
                f"t.action_type = 'PlanStarted' AND {_LAST_LIFECYCLE} IS NOT NULL",
            ),
            (
                ErrorCode.PLAN_NOT_STARTED,
                "the first lifecycle action of a plan is PlanStarted",
                f"t.action_type IS NOT 'PlanStarted' AND {_LAST_LIFECYCLE} IS NULL",
            ),
            (
                ErrorCode.PLAN_NOT_PAUSED,
                "PlanResumed only while the plan is paused",
                f"t.action_type = 'PlanResumed' AND {_LAST_LIFECYCLE} IS NOT 'PlanPaused'",
            ),
            (
                ErrorCode.PLAN_NOT_RUNNING,
                "the plan is paused",
                f"t.action_type IN {_sql_list(RUNNING_ONLY)} AND {_LAST_LIFECYCLE} = 'PlanPaused'",
            ),
            (
                ErrorCode.STEP_NOT_STARTED,
                "a step event's parent is the PlanStepStarted of its step in this plan",
                f"t.action_type IN {_sql_list(STEP_EVENTS)} AND NOT EXISTS (SELECT 1"
                " FROM main.cassette_actions AS s WHERE s.action_id = t.parent_action_id"
                " AND s.action_type = 'PlanStepStarted' AND s.plan_id = t.plan_id"
                " AND s.action_seq < t.action_seq)",
            ),
            (
                ErrorCode.STEP_FINISHED,
                "the step has already completed or failed",
                f"t.action_type IN {_sql_list(STEP_EVENTS)} AND EXISTS (SELECT 1"
                " FROM main.cassette_actions AS e"
                " WHERE e.parent_action_id = t.parent_action_id"
                " AND e.action_seq < t.action_seq"
                " AND e.action_type IN ('PlanStepCompleted', 'PlanStepFailed'))",
            ),
            (
                ErrorCode.RETRIES_EXHAUSTED,
                "the step declared fewer retries (metadata retries.max)",
                "t.action_type = 'PlanStepRetrying' AND (SELECT count(*)"
                " FROM main.cassette_actions AS e"
                " WHERE e.parent_action_id = t.parent_action_id"
                " AND e.action_seq < t.action_seq AND e.action_type = 'PlanStepRetrying')"
                " >= coalesce((SELECT json_extract(s.metadata_json, '$.retries.max')"
                " FROM main.cassette_actions AS s WHERE s.action_id = t.parent_action_id), 0)",
            ),
            (
                ErrorCode.INVALID_POLICY,
                "retries.max and timeout_ms are non-negative integers",
                "t.action_type = 'PlanStepStarted' AND json_valid(t.metadata_json)"
                " AND ((json_type(t.metadata_json, '$.retries') IS NOT NULL"
                " AND (json_type(t.metadata_json, '$.retries.max') IS NOT 'integer'"
                " OR json_extract(t.metadata_json, '$.retries.max') < 0))"
                " OR (json_type(t.metadata_json, '$.timeout_ms') IS NOT NULL"
                " AND (json_type(t.metadata_json, '$.timeout_ms') IS NOT 'integer'"
                " OR json_extract(t.metadata_json, '$.timeout_ms') < 0)))",
            ),
        ),
        scope=f"t.action_type IN {_sql_list((*LIFECYCLE, 'PlanStepStarted', *STEP_EVENTS))}",
    ),
)
