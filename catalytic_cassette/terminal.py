"""Text safe to print on a terminal: stored fields cannot drive it."""

from __future__ import annotations

import re

# C0 and C1 controls (ESC starts terminal escape sequences; CR and BS overwrite text),
# bidirectional overrides and isolates, zero-width characters, lone surrogates.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control, bidi or invisible character written as an escape."""
    return _UNPRINTABLE.sub(_escape, text)
