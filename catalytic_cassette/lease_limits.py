"""A lease's length: the default when the caller names none, and the cap the law holds
(LAW.md section 9a: 30 days). Its own module so the CLI can name them without importing
the API at start-up."""

from __future__ import annotations

DEFAULT_TTL_SECONDS = 300
MAX_TTL_SECONDS = 30 * 24 * 3600
