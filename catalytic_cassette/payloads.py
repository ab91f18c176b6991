"""JSON in and out: canonical encoding, validation and the declared job shape."""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from .errors import CassetteError, ErrorCode

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
MAX_NAME_LENGTH = 200
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what a SQLite INTEGER holds
DEFAULT_INTENT = "default"


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError as exc:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"not JSON-serialisable: {exc}") from exc


def loads(text: str) -> Any:
    return orjson.loads(text)


def parse_json(data: bytes | str, what: str = "payload") -> Any:
    """Parse one JSON document of at most 16 MiB of valid UTF-8; else a coded refusal."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{what} is not valid UTF-8") from exc
    if len(data) > MAX_PAYLOAD_BYTES:
        raise CassetteError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{what} is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES}",
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{what} is not valid UTF-8") from exc
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{what} is not JSON: {exc}") from exc


def parse_object(data: bytes | str, what: str = "payload") -> dict[str, Any]:
    """Parse JSON text that must be one object; refuse anything else with INVALID_PAYLOAD."""
    return require_object(parse_json(data, what), what)


def require_object(value: Any, what: str = "payload") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CassetteError(
            ErrorCode.INVALID_PAYLOAD, f"{what} must be a JSON object, not {type(value).__name__}"
        )
    return value


def encode_object(value: Any, what: str = "payload") -> str:
    text = dumps(require_object(value, what))
    if len(text.encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise CassetteError(
            ErrorCode.PAYLOAD_TOO_LARGE, f"{what} is larger than {MAX_PAYLOAD_BYTES} bytes"
        )
    return text


class JobPlan(NamedTuple):
    intent: str
    steps: tuple[str, ...]  # canonical JSON of each step payload


def plan_jobs(payload: dict[str, Any], payload_json: str) -> list[JobPlan]:
    """The jobs and steps a message yields (LAW.md, "Message payload shape")."""
    if "jobs" not in payload:
        return [JobPlan(DEFAULT_INTENT, (payload_json,))]
    jobs = payload["jobs"]
    if not isinstance(jobs, list) or not jobs:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, '"jobs" must be a non-empty array')
    plans = []
    for index, job in enumerate(jobs):
        where = f"jobs[{index}]"
        if not isinstance(job, dict):
            raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{where} must be an object")
        intent = job.get("intent")
        if not isinstance(intent, str) or not 1 <= len(intent) <= MAX_NAME_LENGTH:
            raise CassetteError(
                ErrorCode.INVALID_PAYLOAD, f"{where}.intent must be a string of 1-200 characters"
            )
        steps = job.get("steps")
        if not isinstance(steps, list) or not steps:
            raise CassetteError(
                ErrorCode.INVALID_PAYLOAD, f"{where}.steps must be a non-empty array"
            )
        for step_index, step in enumerate(steps):
            require_object(step, f"{where}.steps[{step_index}]")
        plans.append(JobPlan(intent, tuple(dumps(step) for step in steps)))
    return plans
