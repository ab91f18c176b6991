"""A package that ships one more PostgreSQL migration than this one (a later release), for
tests of upgrades through the migration machinery: ``sqlfiles.migrations`` gains
version n+1, and the catalog snapshot says it describes version n+1 (the migration's
objects are its own business: a test that verifies after it leaves the catalog as the
snapshot describes it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from catalytic_cassette.postgresql import catalog, sqlfiles
from catalytic_cassette.sqlfiles import Migration

from .named_sql import LATER_MIGRATIONS


@contextmanager
def later_migration(
    monkeypatch: pytest.MonkeyPatch, sql: str, name: str = "later"
) -> Iterator[Migration]:
    shipped = sqlfiles.migrations()
    later = Migration(len(shipped) + 1, name, sql)
    LATER_MIGRATIONS.add(sql)
    reference = catalog.reference

    def described(major: int) -> dict[str, Any] | None:
        found = reference(major)
        return None if found is None else {**found, "version": later.version}

    with monkeypatch.context() as patch:
        patch.setattr(sqlfiles, "migrations", lambda: (*shipped, later))
        patch.setattr(catalog, "reference", described)
        yield later
