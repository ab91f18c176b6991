"""JSON in and out: canonical encoding, validation and the declared job shape."""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from .errors import CassetteError, ErrorCode

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
MAX_NAME_LENGTH = 200
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what a SQLite INTEGER holds
DEFAULT_INTENT = "default"
# orjson writes at most this many levels of arrays and objects (it reads 1024, the law's
# limit for any connection: LAW 3 rule 12), so a value the API stores is always read back.
MAX_WRITTEN_DEPTH = 254

# An integer beyond 64 bits has at least 19 digits (INT64_MAX has 19): only text with such a
# run pays for the token walk (LAW 3 rule 12's SQL prefilter looks for the same run). The
# run is found at C speed: every digit becomes "0", every other byte ".", then a substring
# search (a regular expression costs several times more on every write).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x2E for byte in range(256))
_LONG_RUN = b"0" * 19
# In JSON that is already known to be valid, every token outside a string that starts with
# a digit or "-" is a number; strings are skipped whole (an escaped quote included).
_STRING_OR_NUMBER = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9][0-9.eE+-]*')


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8.

    orjson writes NaN and the infinities as ``null``, which would make ``{"x": NaN}`` and
    ``{"x": null}`` the same stored value; JSON has no such numbers, so they are refused.
    Only an encoding that contains ``null`` can hide one, so the walk runs only then.
    """
    import orjson  # (in the functions that use it: `status` never loads it, docs/BENCHMARKS.md)

    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        if str(exc) == "Recursion limit reached":
            raise CassetteError(
                ErrorCode.INVALID_PAYLOAD,
                f"nested deeper than {MAX_WRITTEN_DEPTH} levels, the most the encoder writes",
            ) from exc
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"not JSON-serialisable: {exc}") from exc
    if b"null" in encoded:
        refuse_non_finite(value)
    # orjson writes unsigned 64-bit integers too (up to 2**64 - 1); the law holds signed ones.
    wide = wide_integer(encoded)
    if wide is not None:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, _WIDE.format(wide))
    return encoded.decode("utf-8")


_WIDE = "the integer {} is beyond 64 bits (JSON holds it only as a rounded double)"


def wide_integer(text: bytes | str) -> str | None:
    """The first integer literal of valid JSON ``text`` outside the signed 64-bit range.

    Parsers disagree on such a number: orjson reads it as a rounded double (so
    1180591620717411303424 would be stored as 1.1805916207174113e+21), Python's json as an
    exact int, SQLite as a double while typing it ``integer``, PostgreSQL's numeric
    exactly. The law refuses it (LAW 3 rule 12), so every reader sees the value as given.
    """
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in text.translate(_DIGITS_AS_ZEROS):
        return None
    for token in _STRING_OR_NUMBER.finditer(text):
        literal = token.group()
        if literal[:1] == b'"' or b"." in literal or b"e" in literal or b"E" in literal:
            continue
        if not INT64_MIN <= int(literal) <= INT64_MAX:
            return literal.decode("ascii")
    return None


def refuse_non_finite(value: Any) -> None:
    """INVALID_PAYLOAD if a float in ``value`` is NaN or infinite (an iterative walk)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise CassetteError(
                    ErrorCode.INVALID_PAYLOAD, f"{item!r} is not a JSON number (NaN or infinite)"
                )
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)


def require_text(value: Any, code: ErrorCode, what: str) -> str:
    """A str that SQLite can store as UTF-8 text: a lone surrogate (from undecodable
    bytes, ``surrogateescape``) is refused with ``code``, not a UnicodeEncodeError."""
    if not isinstance(value, str):
        raise CassetteError(code, f"{what} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CassetteError(code, f"{what} is not valid UTF-8 text") from None
    return value


def require_int64(value: Any, code: ErrorCode, what: str) -> int:
    """A Python int that SQLite can store (64-bit), else a coded refusal."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CassetteError(code, f"{what} must be an integer, not {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise CassetteError(code, f"{what} is outside the 64-bit integer range")
    return value


def loads(text: Any, what: str = "a stored JSON value") -> Any:
    """Decode JSON read back from the ledger: the one reader of stored JSON.

    What the API stores always decodes. Text that does not (a row or journal body edited
    by hand: not UTF-8, not JSON, nested deeper than 1024, an integer beyond 64 bits, not
    text at all) is ``UNREADABLE_ROW``, a coded answer instead of a traceback.
    """
    if isinstance(text, memoryview):
        text = bytes(text)
    if not isinstance(text, (str, bytes)):
        raise CassetteError(
            ErrorCode.UNREADABLE_ROW, f"{what} is {type(text).__name__}, not JSON text"
        )
    import orjson

    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CassetteError(
            ErrorCode.UNREADABLE_ROW, f"{what} is not readable JSON: {exc}"
        ) from exc
    wide = wide_integer(text)
    if wide is not None:
        raise CassetteError(ErrorCode.UNREADABLE_ROW, f"{what}: " + _WIDE.format(wide))
    return value


def loads_object(text: Any, what: str = "a stored JSON object") -> dict[str, Any]:
    """``loads`` of stored text that must hold one JSON object, else ``UNREADABLE_ROW``."""
    value = loads(text, what)
    if not isinstance(value, dict):
        raise CassetteError(
            ErrorCode.UNREADABLE_ROW, f"{what} is a JSON {type(value).__name__}, not an object"
        )
    return value


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
    import orjson

    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{what} is not JSON: {exc}") from exc
    wide = wide_integer(data)
    if wide is not None:
        raise CassetteError(ErrorCode.INVALID_PAYLOAD, f"{what}: " + _WIDE.format(wide))
    return value


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
