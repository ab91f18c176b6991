"""The PostgreSQL backend: the same law, API and codes as the SQLite ledger, for many
hosts sharing one server (LAW.md, "PostgreSQL"). Needs psycopg 3
(``pip install 'catalytic-cassette[postgresql]'``); imported only when a ledger URL
names PostgreSQL."""

from __future__ import annotations

URL_PREFIXES = ("postgresql://", "postgres://")


def is_postgres_url(target: str) -> bool:
    """Whether ``--db`` / ``CASSETTE_DB`` names a PostgreSQL ledger instead of a file."""
    return target.startswith(URL_PREFIXES)
