"""The PostgreSQL baseline migration, made from the schema files.

``sql/postgresql/schema/NN_<concern>.sql`` are the law, written by hand with each rule's
reason beside it, and are the authority. ``migrations/0001_baseline.sql`` is their text
joined in their names' order under a header, checked in because a released migration
is never edited (a later change to the law is a new migration, and the schema files
are changed with it). ``tests/test_postgres_schema.py`` fails when the checked-in file
differs from ``render()``, and proves that the schema files make the same database as
the baseline plus every later migration. Write it again with::

    python -m catalytic_cassette.postgresql.baseline
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "sql" / "postgresql"
SCHEMA = FOLDER / "schema"
BASELINE = FOLDER / "migrations" / "0001_baseline.sql"

HEADER = """\
-- The baseline of a PostgreSQL ledger (version 1, the first released schema): the
-- files of sql/postgresql/schema/ joined in their names' order by
-- catalytic_cassette/postgresql/baseline.py. Generated: change the schema files (and, once
-- this is released, add a migration), never this file. The reasons are in the schema
-- files, beside each rule.
"""


def schema_files() -> list[Path]:
    """The schema files, in the order they are applied."""
    return sorted(SCHEMA.glob("[0-9][0-9]_*.sql"))


def render() -> str:
    """The baseline migration's text."""
    parts = [HEADER]
    for path in schema_files():
        parts.append(f"-- ==== {path.name}\n\n" + path.read_text("utf-8").rstrip("\n") + "\n")
    return "\n".join(parts)


def main() -> None:
    BASELINE.write_text(render(), "utf-8")


if __name__ == "__main__":
    main()
