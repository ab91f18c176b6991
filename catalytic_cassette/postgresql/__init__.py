"""The PostgreSQL backend: the same law, API and codes as the SQLite ledger, for many
hosts sharing one server (LAW.md, "PostgreSQL"). Needs psycopg 3
(``pip install 'catalytic-cassette[postgresql]'``); imported only when a ledger URL
names PostgreSQL."""

from __future__ import annotations

# (which targets are PostgreSQL's is told by ``targets``, the one test of a target's kind)
from ..targets import URL_PREFIXES, is_postgres_url

__all__ = ["URL_PREFIXES", "is_postgres_url"]
