"""The Action record: validation, row encoding and decoding."""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from . import payloads
from .errors import CassetteError, ErrorCode

ACTION_TYPES = (
    "PlanStarted",
    "PlanCompleted",
    "PlanAborted",
    "PlanPaused",
    "PlanResumed",
    "PlanStepStarted",
    "PlanStepCompleted",
    "PlanStepFailed",
    "PlanStepRetrying",
    "CapabilityCall",
    "CapabilityResult",
    "InternalStep",
)
CATEGORIES = ("conversation", "decision", "file_edit", "tool_use", "research")
REASONING_LINKS = (
    "intent_id",
    "constitutional_rule_id",
    "delegation_decision_id",
    "capability_attestation_id",
)
COST_SCALE = 1_000_000  # cost is stored as integer micro-units: no floats in hashed rows

COLUMNS = (
    "action_seq",
    "action_id",
    "parent_action_id",
    "plan_id",
    "intent_id",
    "session_id",
    "action_type",
    "function_name",
    "arguments_json",
    "arguments_artifact",
    "result_json",
    "result_artifact",
    "success",
    "error_message",
    "cost_micros",
    "duration_ms",
    "timestamp",
    "metadata_json",
    "caused_by",
    "rationale",
    "category",
)
SELECT_COLUMNS = ", ".join(COLUMNS)


def new_action_id() -> str:
    """A random (version 4) UUID as ``str(uuid.uuid4())`` spells it."""
    return format_v4(os.urandom(16))


def format_v4(random: bytes) -> str:
    """16 random bytes as a version 4 UUID string: what ``uuid.UUID(bytes=random,
    version=4)`` prints, without building and formatting a UUID object (``uuid4`` took
    about a tenth of a batched append's Python time)."""
    raw = bytearray(random)
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclass(frozen=True)
class Action:
    """One significant event of a plan. ``timestamp`` and ``action_seq`` come from the ledger."""

    plan_id: str
    intent_id: str
    action_type: str
    function_name: str
    action_id: str = field(default_factory=new_action_id)
    parent_action_id: str | None = None
    session_id: str | None = None
    arguments: list[Any] | None = None
    result: Any = None
    success: bool = True
    error_message: str | None = None
    cost: float = 0.0
    duration_ms: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    caused_by: str | None = None
    rationale: str | None = None
    category: str | None = None
    timestamp: int | None = None
    action_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def links(self) -> dict[str, Any]:
        return {k: self.metadata[k] for k in REASONING_LINKS if k in self.metadata}


FIELD_NAMES = frozenset(f.name for f in fields(Action))
# What str(uuid.UUID(...)) prints: the only spelling of an action_id the ledger accepts.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


_REQUIRED_FIELDS = ("plan_id", "intent_id", "action_type", "function_name")
_REQUIRED_SET = frozenset(_REQUIRED_FIELDS)
# Every field with its default in field order; the two factories are filled per action.
_DEFAULTS: dict[str, Any] = {
    f.name: None if f.default is MISSING else f.default for f in fields(Action)
}


def coerce(value: Action | dict[str, Any]) -> Action:
    """An Action from an Action or a dict with the same field names (unknown keys refused)."""
    return stored_action(coerce_fields(value))


def coerce_fields(value: Action | dict[str, Any]) -> dict[str, Any]:
    """The validated fields of an action, as a new dict in field order.

    A dict is checked as it is and never goes through ``Action.__init__``: the append
    path builds one Action per item, once, when the ledger has set its fields
    (``stored_action``); an Action is copied, never changed.
    """
    if isinstance(value, Action):
        values = dict(value.__dict__)
    elif isinstance(value, dict):
        if not FIELD_NAMES.issuperset(value):
            unknown = sorted(value.keys() - FIELD_NAMES)
            raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"unknown action fields: {unknown}")
        if not value.keys() >= _REQUIRED_SET:
            missing = [k for k in _REQUIRED_FIELDS if k not in value]
            raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"missing action fields: {missing}")
        values = dict(_DEFAULTS)  # existing keys keep their place: field order survives
        values.update(value)
        if "action_id" not in value:
            values["action_id"] = new_action_id()
        if "metadata" not in value:
            values["metadata"] = {}
    else:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, "an action is an object")
    _validate(values)
    return values


def stored_action(values: dict[str, Any]) -> Action:
    """An Action holding exactly ``values`` (every field, validated), without running
    ``__init__`` and its default factories again."""
    action = object.__new__(Action)
    action.__dict__.update(values)
    return action


_REQUIRED_TEXT = ("plan_id", "intent_id", "function_name")
_OPTIONAL_TEXT = ("parent_action_id", "session_id", "error_message", "caused_by", "rationale")
_TEXT_CODES = {
    "plan_id": ErrorCode.INVALID_PLAN_ID,
    "intent_id": ErrorCode.INVALID_INTENT,
    "function_name": ErrorCode.INVALID_FUNCTION_NAME,
    "parent_action_id": ErrorCode.REFERENCE_MISSING,
    "session_id": ErrorCode.INVALID_SESSION_ID,
    "error_message": ErrorCode.INVALID_PAYLOAD,
    "caused_by": ErrorCode.REFERENCE_MISSING,
    "rationale": ErrorCode.INVALID_PAYLOAD,
}


def _validate(action: Mapping[str, Any]) -> None:
    """Refuse fields the ledger would refuse, with the field's own code, in a fixed order."""
    if action["action_type"] not in ACTION_TYPES:
        raise CassetteError(
            ErrorCode.INVALID_ACTION_TYPE, f"action_type must be one of {', '.join(ACTION_TYPES)}"
        )
    action_id = action["action_id"]
    if not isinstance(action_id, str):
        raise CassetteError(ErrorCode.INVALID_ACTION_ID, "action_id must be a UUID string")
    if _CANONICAL_UUID.fullmatch(action_id) is None:
        _refuse_action_id(action_id)
    for name in _REQUIRED_TEXT + _OPTIONAL_TEXT:
        value = action[name]
        if type(value) is str and value.isascii():
            continue  # valid UTF-8 whatever it holds: the common case, without encoding it
        if value is None and name in _OPTIONAL_TEXT:
            continue
        payloads.require_text(value, _TEXT_CODES[name], name)
    if action["category"] is not None and action["category"] not in CATEGORIES:
        raise CassetteError(
            ErrorCode.INVALID_CATEGORY, f"category must be one of {', '.join(CATEGORIES)}"
        )
    if action["arguments"] is not None and not isinstance(action["arguments"], list):
        raise CassetteError(ErrorCode.INVALID_ARGUMENTS, "arguments must be a JSON array")
    if not isinstance(action["metadata"], dict):
        raise CassetteError(ErrorCode.INVALID_METADATA, "metadata must be a JSON object")
    if not isinstance(action["success"], bool):
        raise CassetteError(ErrorCode.INVALID_SUCCESS, "success must be true or false")
    cost = action["cost"]
    if (
        isinstance(cost, bool)
        or not isinstance(cost, (int, float))
        or not (0 <= cost <= payloads.INT64_MAX // COST_SCALE)
        or not math.isfinite(float(cost))
    ):
        raise CassetteError(
            ErrorCode.INVALID_COST,
            f"cost must be a finite number in [0, {payloads.INT64_MAX // COST_SCALE}]",
        )
    duration = action["duration_ms"]
    if (
        isinstance(duration, bool)
        or not isinstance(duration, int)
        or not 0 <= duration <= payloads.INT64_MAX
    ):
        raise CassetteError(
            ErrorCode.INVALID_DURATION, "duration_ms must be a non-negative integer"
        )


def _refuse_action_id(value: str) -> None:
    try:
        uuid.UUID(value)
    except ValueError:
        raise CassetteError(ErrorCode.INVALID_ACTION_ID, "action_id must be a UUID") from None
    raise CassetteError(ErrorCode.INVALID_ACTION_ID, "action_id must be a lowercase UUID")


def cost_micros(cost: float) -> int:
    return round(cost * COST_SCALE)


def from_row(row: tuple[Any, ...], load_artifact: Any) -> Action:
    """Decode a row in COLUMNS order; ``load_artifact(ref_json)`` returns the stored value."""
    values = dict(zip(COLUMNS, row, strict=True))
    what = f"action {values['action_id']}"
    if values["arguments_artifact"] is not None:
        arguments = load_artifact(values["arguments_artifact"])
    elif values["arguments_json"] is not None:
        arguments = payloads.loads(values["arguments_json"], f"the arguments of {what}")
    else:
        arguments = None
    if arguments is not None and not isinstance(arguments, list):  # edited by hand
        raise CassetteError(ErrorCode.UNREADABLE_ROW, f"the arguments of {what} are not an array")
    if values["result_artifact"] is not None:
        result = load_artifact(values["result_artifact"])
    elif values["result_json"] is not None:
        result = payloads.loads(values["result_json"], f"the result of {what}")
    else:
        result = None
    return Action(
        action_seq=values["action_seq"],
        action_id=values["action_id"],
        parent_action_id=values["parent_action_id"],
        plan_id=values["plan_id"],
        intent_id=values["intent_id"],
        session_id=values["session_id"],
        action_type=values["action_type"],
        function_name=values["function_name"],
        arguments=arguments,
        result=result,
        success=bool(values["success"]),
        error_message=values["error_message"],
        cost=values["cost_micros"] / COST_SCALE,
        duration_ms=values["duration_ms"],
        timestamp=values["timestamp"],
        metadata=payloads.loads_object(values["metadata_json"], f"the metadata of {what}"),
        caused_by=values["caused_by"],
        rationale=values["rationale"],
        category=values["category"],
    )
