"""The stable codes, and the one place where sqlite3 errors become CassetteError (the
PostgreSQL backend's psycopg errors: ``postgresql/connection.translate``)."""

from __future__ import annotations

import re
import sqlite3
from enum import Enum
from typing import Any

from .redaction import redact


class ErrorCode(str, Enum):
    """Stable refusal codes. Part of the contract: never rename, only add."""

    APPEND_ONLY = "APPEND_ONLY"
    IMMUTABLE_FIELD = "IMMUTABLE_FIELD"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    LEASE_FIELDS_LOCKED = "LEASE_FIELDS_LOCKED"
    NOT_LEASED = "NOT_LEASED"
    WRONG_WORKER = "WRONG_WORKER"
    STALE_FENCING_TOKEN = "STALE_FENCING_TOKEN"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    LEASE_NOT_EXPIRED = "LEASE_NOT_EXPIRED"
    RECEIPT_REQUIRED = "RECEIPT_REQUIRED"
    STEP_NOT_FOUND = "STEP_NOT_FOUND"
    RUN_MISMATCH = "RUN_MISMATCH"
    NO_PENDING_STEPS = "NO_PENDING_STEPS"
    INVALID_SOURCE = "INVALID_SOURCE"
    INVALID_OUTCOME = "INVALID_OUTCOME"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    INVALID_TTL = "INVALID_TTL"
    INVALID_TOKEN = "INVALID_TOKEN"
    INVALID_RUN_ID = "INVALID_RUN_ID"
    INVALID_WORKER = "INVALID_WORKER"
    INVALID_INTENT = "INVALID_INTENT"
    INVALID_ORDINAL = "INVALID_ORDINAL"
    INVALID_STATUS = "INVALID_STATUS"
    INVALID_IDEMPOTENCY_KEY = "INVALID_IDEMPOTENCY_KEY"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_ID = "INVALID_ID"
    INVALID_ACTION_ID = "INVALID_ACTION_ID"
    INVALID_ACTION_TYPE = "INVALID_ACTION_TYPE"
    INVALID_PLAN_ID = "INVALID_PLAN_ID"
    INVALID_SESSION_ID = "INVALID_SESSION_ID"
    INVALID_FUNCTION_NAME = "INVALID_FUNCTION_NAME"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    INVALID_METADATA = "INVALID_METADATA"
    INVALID_SUCCESS = "INVALID_SUCCESS"
    INVALID_COST = "INVALID_COST"
    INVALID_DURATION = "INVALID_DURATION"
    INVALID_ARTIFACT = "INVALID_ARTIFACT"
    ARTIFACT_MISSING = "ARTIFACT_MISSING"
    ARTIFACT_CORRUPT = "ARTIFACT_CORRUPT"
    NOT_FOUND = "NOT_FOUND"
    KEY_ERROR = "KEY_ERROR"
    KEY_PERMISSIONS = "KEY_PERMISSIONS"
    UNSAFE_PATH = "UNSAFE_PATH"
    FILE_TOO_LARGE = "FILE_TOO_LARGE"
    INVALID_CATEGORY = "INVALID_CATEGORY"
    INVALID_POLICY = "INVALID_POLICY"
    INVALID_CHECKPOINT_ID = "INVALID_CHECKPOINT_ID"
    CHECKPOINT_MISMATCH = "CHECKPOINT_MISMATCH"
    CAUSE_AFTER_EFFECT = "CAUSE_AFTER_EFFECT"
    INVALID_PLAN_BODY = "INVALID_PLAN_BODY"
    PLAN_HASH_MISMATCH = "PLAN_HASH_MISMATCH"
    PLAN_FINISHED = "PLAN_FINISHED"
    PLAN_ALREADY_STARTED = "PLAN_ALREADY_STARTED"
    PLAN_NOT_STARTED = "PLAN_NOT_STARTED"
    PLAN_NOT_PAUSED = "PLAN_NOT_PAUSED"
    PLAN_NOT_RUNNING = "PLAN_NOT_RUNNING"
    STEP_NOT_STARTED = "STEP_NOT_STARTED"
    STEP_FINISHED = "STEP_FINISHED"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    DUPLICATE_RECEIPT = "DUPLICATE_RECEIPT"
    REFERENCE_MISSING = "REFERENCE_MISSING"
    REFERENCE_MISMATCH = "REFERENCE_MISMATCH"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    JOURNAL_REQUIRED = "JOURNAL_REQUIRED"
    JOURNAL_BROKEN = "JOURNAL_BROKEN"
    UNREADABLE_ROW = "UNREADABLE_ROW"  # a stored row or journal body a reader cannot decode
    TREE_BROKEN = "TREE_BROKEN"
    FOREIGN_TEMP_OBJECT = "FOREIGN_TEMP_OBJECT"  # a package connection with a client's TEMP object
    INVALID_SEAL = "INVALID_SEAL"
    SEAL_MISMATCH = "SEAL_MISMATCH"
    UNLAWFUL_HISTORY = "UNLAWFUL_HISTORY"  # seal: the history since the last is unlawful
    TIME_BACKWARDS = "TIME_BACKWARDS"
    INVALID_TIME = "INVALID_TIME"
    VERIFY_FAILED = "VERIFY_FAILED"
    SIGNATURE_REQUIRED = "SIGNATURE_REQUIRED"
    INVALID_ATTESTATION = "INVALID_ATTESTATION"
    BAD_SIGNATURE = "BAD_SIGNATURE"
    CONSTRAINT_VIOLATION = "CONSTRAINT_VIOLATION"
    BUSY = "BUSY"
    CANNOT_OPEN = "CANNOT_OPEN"
    NOT_A_CASSETTE = "NOT_A_CASSETTE"
    SCHEMA_TOO_NEW = "SCHEMA_TOO_NEW"
    SCHEMA_OUTDATED = "SCHEMA_OUTDATED"
    SCHEMA_UNRELEASED = "SCHEMA_UNRELEASED"  # made by a development build before the 0.1.0 baseline
    MIGRATION_FAILED = "MIGRATION_FAILED"
    DATABASE_ERROR = "DATABASE_ERROR"
    USAGE = "USAGE"  # the CLI: an unknown option, conflicting flags, a bad number
    MISSING_EXTRA = "MISSING_EXTRA"  # the command needs an optional extra not installed
    INTERRUPTED = "INTERRUPTED"  # the CLI: Ctrl-C
    PERMISSION_DENIED = "PERMISSION_DENIED"  # PostgreSQL: the session's role may not
    UNSAFE_SESSION = "UNSAFE_SESSION"  # PostgreSQL: a session in which triggers would not fire
    BACKEND_UNSUPPORTED = "BACKEND_UNSUPPORTED"  # not (yet) available on this backend


class CassetteError(Exception):
    """A refusal with a stable code. The sqlite3 error, if any, is ``__cause__``.

    The CLI maps it to an exit status at its boundary (cli/boundary.py); a refusal that
    means "could not be checked" rather than "failed" carries ``unverifiable=True``.
    """

    def __init__(self, code: ErrorCode, message: str, **detail: Any) -> None:
        # Every refusal is made here, whoever shows it (CLI, MCP, API): no password leaves
        message = redact(message)
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, **self.detail}


# Patterns, not compiled here: re compiles them (once) when a refusal first needs them,
# so a command that is never refused never pays for it.
_RAISED = r"^([A-Z][A-Z_]+): (.*)$"
_CHECK = r"^CHECK constraint failed: ([A-Z][A-Z_]+)"
_CODES = {code.value: code for code in ErrorCode}


def code_of(text: str) -> tuple[ErrorCode, str] | None:
    """The code and message of a refusal the ledger's SQL raised as 'CODE: text'."""
    raised = re.match(_RAISED, text, re.DOTALL)
    if raised and raised.group(1) in _CODES:
        return _CODES[raised.group(1)], raised.group(2)
    return None


def translate(exc: sqlite3.Error) -> CassetteError:
    """Map a sqlite3 error to a CassetteError; call as ``raise translate(e) from e``."""
    text = str(exc)
    coded = code_of(text)
    if coded is not None:
        return CassetteError(*coded)
    check = re.match(_CHECK, text)
    if check and check.group(1) in _CODES:
        return CassetteError(
            _CODES[check.group(1)], f"refused by CHECK constraint {check.group(1)}"
        )
    # Stored rows edited by hand: inputs are checked before any SQL reads them as JSON.
    if text.startswith("Could not decode to UTF-8"):  # a text column edited to bytes
        return CassetteError(ErrorCode.UNREADABLE_ROW, f"a stored text is not UTF-8 ({text})")
    if text == "malformed JSON":  # a JSON column edited to text SQLite cannot read
        return CassetteError(ErrorCode.UNREADABLE_ROW, "a stored JSON text is malformed")
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED"):
        return CassetteError(ErrorCode.BUSY, f"the database is locked ({text})")
    if name == "SQLITE_NOTADB":
        return CassetteError(ErrorCode.NOT_A_CASSETTE, "the file is not a SQLite database")
    if name == "SQLITE_CANTOPEN":
        return CassetteError(ErrorCode.CANNOT_OPEN, text)
    if isinstance(exc, sqlite3.IntegrityError):
        return CassetteError(ErrorCode.CONSTRAINT_VIOLATION, text)
    return CassetteError(ErrorCode.DATABASE_ERROR, text)
