"""Times given by people or scripts: ISO 8601 or epoch milliseconds, to ledger time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from .errors import CassetteError, ErrorCode

_MILLISECOND = timedelta(milliseconds=1)


def parse_time(value: str | int) -> int:
    """Integer UTC epoch milliseconds from an integer, a string of digits, or ISO 8601.

    An ISO time without an offset is read as UTC (the ledger's own clock is UTC), never
    as the machine's local time.
    """
    if isinstance(value, bool):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "a time is ISO 8601 or epoch ms")
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise CassetteError(
            ErrorCode.INVALID_ARGUMENT, f"not ISO 8601 or epoch milliseconds: {value!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    delta = parsed - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return delta // _MILLISECOND
